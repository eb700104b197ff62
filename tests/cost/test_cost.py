"""IO cost model: FLOPs and HBM bytes, hand-computed values (a V head dim of
its own included) and scaling laws; the block walks in closed form against
the loops they replace; the Python API's argument checks (TypeError for a
wrong type, ValueError for a wrong value, each naming its argument) and the
unit formatting.  The hardware catalogue, the roofline and the tile solver:
``test_cost_hardware.py``; the model against measured bytes:
``test_cost_measured.py``."""
import math
import re
import time

import pytest

from tileattn.cost import (AttentionShape, attention_flops, commands, compare, default_configs, executed_pairs, flops,
                           flop_breakdown, get_hardware, resident_memory, sparse, standard_traffic, tiled_traffic,
                           visible_pairs)
from tileattn.cost.format import fmt_bytes, fmt_flops, fmt_time
from tileattn.cost.io import CacheModel, KernelConfig


# ---- FLOPs ---------------------------------------------------------------
def test_flops_hand_computed_small_case():
    # B=1, H=1, N=4, d=2: 4 * 16 pairs * 2 = 128
    assert attention_flops(1, 1, 4, 4, 2) == 128
    assert attention_flops(1, 1, 4, 4, 2, mode="bwd") == 320        # 2.5x
    assert attention_flops(1, 1, 4, 4, 2, mode="fwd_bwd") == 448    # 3.5x
    # causal N=4: 1+2+3+4 = 10 visible pairs
    assert attention_flops(1, 1, 4, 4, 2, causal=True) == 4 * 10 * 2


@pytest.mark.parametrize("nq,nk", [(1, 1), (4, 4), (5, 3), (3, 7), (128, 200), (200, 128)])
def test_visible_pairs_matches_brute_force(nq, nk):
    brute = sum(1 for i in range(nq) for j in range(nk) if j <= i + nk - nq)
    assert visible_pairs(nq, nk, True) == brute
    assert visible_pairs(nq, nk, False) == nq * nk


def test_executed_pairs_count_whole_tiles():
    # N=256, tiles 128x128, causal: the tile above the diagonal is skipped, 3 of 4 run
    assert executed_pairs(256, 256, True, 128, 128) == 3 * 128 * 128
    assert executed_pairs(256, 256, False, 128, 128) == 256 * 256
    assert executed_pairs(256, 256, True, 128, 128) >= visible_pairs(256, 256, True)


def test_flop_breakdown_terms():
    s = AttentionShape(2, 4, 512, 64)
    cfg = KernelConfig(128, 128, 4, 2)
    f = flop_breakdown(s, cfg, cfg, cfg)
    assert f.tiled_fwd_executed == f.useful_fwd == f.standard_fwd_executed
    assert f.standard_bwd_executed == pytest.approx(2.0 * f.useful_fwd)
    assert f.tiled_bwd_gradients + f.tiled_bwd_recompute == pytest.approx(f.useful_bwd)
    assert f.tiled_bwd_executed == pytest.approx(3.5 * f.useful_fwd)
    # the dK/dV and dQ kernels may use different tiles: non-causal, nothing changes
    g = flop_breakdown(s, cfg, KernelConfig(32, 128, 8, 3), KernelConfig(64, 128, 8, 3))
    assert g.tiled_bwd_executed == pytest.approx(3.5 * f.useful_fwd)


@pytest.mark.parametrize("bm,bn", [(32, 128), (64, 64), (128, 32)])
def test_dkdv_executed_pairs_match_brute_force(bm, bn):
    # the dK/dV kernel visits, per key block, the query tiles from the first one that sees it
    nq = nk = 512
    brute = 0
    for j0 in range(0, nk, bn):
        for i0 in range(0, nq, bm):
            if any(j <= i for i in range(i0, i0 + bm) for j in range(j0, j0 + bn)):
                brute += bm * bn
    assert executed_pairs(nq, nk, True, bm, bn, kernel="dkdv") == brute
    assert executed_pairs(nq, nk, False, bm, bn, kernel="dkdv") == nq * nk


def test_causal_bwd_flops_follow_each_kernels_tile():
    s = AttentionShape(1, 2, 1024, 64, causal=True)
    fwd = KernelConfig(128, 128, 8, 3)
    a = flop_breakdown(s, fwd, KernelConfig(32, 128, 8, 3), KernelConfig(64, 128, 8, 3))
    mm_dkdv = 2.0 * 2 * executed_pairs(1024, 1024, True, 32, 128, kernel="dkdv") * 64
    mm_dq = 2.0 * 2 * executed_pairs(1024, 1024, True, 64, 128, kernel="dq") * 64
    assert a.tiled_bwd_executed == pytest.approx(4 * mm_dkdv + 3 * mm_dq)
    assert a.tiled_bwd_split_recompute == pytest.approx(2 * mm_dq)


# ---- bytes -----------------------------------------------------------------
def test_standard_textbook_bytes_hand_computed():
    # B=H=1, N=4, d=2, fp16: S is 32 bytes, Q/K/V/O 16 bytes
    s = AttentionShape(1, 1, 4, 2, dtype="fp16")
    t = standard_traffic(s, fusion="textbook", backward=False)
    # S = QK^T: read 32 write 32; softmax: 32 + 32; O = PV: read 32 + 16, write 16
    assert t.reads("fwd") == 32 + 32 + 48
    assert t.writes("fwd") == 32 + 32 + 16
    assert t.kernels("fwd") == 3


def _score_passes(t, sb):
    """N^2 passes of a standard estimate: bytes over one score tensor, N*d terms dropped."""
    return round(t.bytes() / sb)


@pytest.mark.parametrize("causal,textbook,eager", [(False, 11, 18), (True, 15, 30)])
def test_standard_score_passes_counted(causal, textbook, eager):
    # d = 1 and many heads: the N*d and mask terms are negligible next to the N^2 ones
    s = AttentionShape(1, 64, 4096, 1, causal=causal)
    sb = s.score_elements * s.elem_bytes
    l2 = 1e9  # the broadcast mask stays in L2
    assert _score_passes(standard_traffic(s, fusion="textbook", l2_bytes=l2), sb) == textbook
    assert _score_passes(standard_traffic(s, fusion="eager", l2_bytes=l2), sb) == eager
    fwd_only = standard_traffic(s, fusion="eager", backward=False, l2_bytes=l2)
    assert _score_passes(fwd_only, sb) == (12 if causal else 6)


def test_eager_softmax_backward_is_two_kernels():
    # aten's CUDA softmax backward: T = dP * P (elementwise), then dS = T - P * rowsum(T)
    s = AttentionShape(2, 4, 1024, 64)
    sb = s.score_elements * 2
    t = standard_traffic(s, fusion="eager")
    soft = [p for p in t.passes if "softmax backward" in p.name]
    assert [p.kernel for p in soft] == ["elementwise", "softmax"]
    assert all(p.read_bytes == 2 * sb and p.write_bytes == sb for p in soft)
    assert any("copy dK" in p.name for p in t.passes)
    gqa = standard_traffic(AttentionShape(2, 4, 1024, 64, kv_heads=2), fusion="eager")
    assert not any("copy dK" in p.name for p in gqa.passes)  # the group sum already writes k's layout
    assert t.kernels("bwd") == 8  # dP, dV, T, dS, scale, dQ, dK, copy: the 8 of the measured kernel list


def test_tiled_bytes_hand_computed_without_cache():
    # B=H=1, N=256, d=64, bf16, BLOCK_M=128: Q once, K and V twice (2 query blocks)
    s = AttentionShape(1, 1, 256, 64)
    cfg = KernelConfig(128, 64, 4, 2)
    t = tiled_traffic(s, fwd_config=cfg, bwd_config=cfg, backward=False)
    row = 64 * 2
    assert t.reads("fwd") == 256 * row + 2 * 2 * 256 * row
    assert t.writes("fwd") == 256 * row + 256 * 4


# ---- a V head dim Dv different from D -----------------------------------
# Q, K, dQ, dK rows are D wide; V, O, dO, dV rows Dv wide (the MLA training shape: D=192, Dv=128)
D, DV = 192, 128


def test_standard_textbook_bytes_with_head_dim_v_hand_computed():
    # B=H=1, N=4, fp16: S 32 bytes; Q, K 4*192*2 = 1536; V, O, dO 4*128*2 = 1024
    s = AttentionShape(1, 1, 4, D, dtype="fp16", head_dim_v=DV)
    t = standard_traffic(s, fusion="textbook")
    sb, qk, vo = 32, 1536, 1024
    # S = scale Q K^T: Q + K -> S; softmax: S -> P; O = P V: P + V -> O
    assert t.reads("fwd") == (qk + qk) + sb + (sb + vo)
    assert t.writes("fwd") == sb + sb + vo
    # dP = dO V^T, dV = P^T dO, dS (reads P, dP), dQ = dS K, dK = dS^T Q
    assert t.reads("bwd") == (vo + vo) + (sb + vo) + 2 * sb + (sb + qk) + (sb + qk)
    assert t.writes("bwd") == sb + vo + sb + qk + qk
    # the matmuls over D (S, dQ, dK) and over Dv (O, dP, dV): 2 * 16 pairs * width each
    assert t.flops("fwd") == 2 * 16 * (D + DV)
    assert t.flops("bwd") == 2 * 16 * (2 * D + 2 * DV)


def test_standard_eager_gqa_bytes_with_head_dim_v():
    """GQA: the copies and the group sum move K at D and V at Dv per row."""
    s = AttentionShape(1, 4, 8, D, kv_heads=2, head_dim_v=DV)
    t = standard_traffic(s, fusion="eager")
    expand, = [p for p in t.passes if p.name.startswith("expand K, V")]
    reduce, = [p for p in t.passes if p.name.startswith("sum dK, dV")]
    own, per_q = 2 * 8 * (D + DV) * 2, 4 * 8 * (D + DV) * 2
    assert (expand.read_bytes, expand.write_bytes) == (own, per_q)
    assert (reduce.read_bytes, reduce.write_bytes) == (per_q, own)


def test_tiled_bytes_with_head_dim_v_hand_computed():
    # B=H=1, N=256, bf16, every kernel at BLOCK_M=128, BLOCK_N=64, no L2 model
    s = AttentionShape(1, 1, 256, D, head_dim_v=DV)
    cfg = KernelConfig(128, 64, 4, 2)
    t = tiled_traffic(s, fwd_config=cfg, bwd_config=cfg, dq_config=cfg)
    n, q_row, v_row, lse = 256, D * 2, DV * 2, 4
    fwd, pre, dkdv, dq = t.passes
    # forward: Q once, K and V once per query block (2 of them); O and lse written
    assert fwd.read_bytes == n * q_row + 2 * n * (q_row + v_row)
    assert fwd.write_bytes == n * v_row + n * lse
    # preprocess: O and dO, lse -> delta, lse2
    assert (pre.read_bytes, pre.write_bytes) == (2 * n * v_row + n * lse, 2 * n * lse)
    # dK/dV: K, V once; Q, dO, lse2, delta once per key block (4 of them); dK, dV written
    assert dkdv.read_bytes == n * (q_row + v_row) + 4 * n * (q_row + v_row + 2 * lse)
    assert dkdv.write_bytes == n * (q_row + v_row)
    # dQ: Q, dO, lse2, delta once; K and V once per query block (2); dQ written
    assert dq.read_bytes == n * (q_row + v_row + 2 * lse) + 2 * n * (q_row + v_row)
    assert dq.write_bytes == n * q_row
    pairs = n * n
    assert fwd.flops == 2 * pairs * (D + DV)                 # S, O
    assert dkdv.flops == 2 * pairs * (2 * D + 2 * DV)        # S, dK | dP, dV
    assert dq.flops == 2 * pairs * (2 * D + DV)              # S, dQ | dP


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d,dv", [(192, 128), (64, 256), (128, 128)], ids=["d192-dv128", "d64-dv256", "d128-dv128"])
def test_passes_add_up_to_the_flop_breakdown_with_head_dim_v(d, dv, causal):
    s = AttentionShape(2, 8, 1000, d, seqlen_k=1200, kv_heads=2, causal=causal, head_dim_v=dv)
    f = flop_breakdown(s)
    tiled = tiled_traffic(s)
    assert tiled.flops("fwd") == pytest.approx(f.tiled_fwd_executed)
    assert tiled.flops("bwd") == pytest.approx(f.tiled_bwd_executed)
    std = standard_traffic(s, fusion="textbook")
    assert std.flops("fwd") == pytest.approx(f.standard_fwd_executed)
    assert std.flops("bwd") == pytest.approx(f.standard_bwd_executed)


def test_head_dim_v_equal_to_head_dim_changes_nothing():
    one = AttentionShape(2, 8, 1024, 128, kv_heads=2, causal=True)
    both = AttentionShape(2, 8, 1024, 128, kv_heads=2, causal=True, head_dim_v=128)
    cache = CacheModel(50e6, 132, 228 * 1024)
    assert tiled_traffic(one, cache=cache) == tiled_traffic(both, cache=cache)
    assert standard_traffic(one) == standard_traffic(both)


def test_narrower_v_moves_fewer_bytes():
    wide = AttentionShape(1, 16, 4096, 192)
    narrow = AttentionShape(1, 16, 4096, 192, head_dim_v=128)
    for fn in (tiled_traffic, standard_traffic):
        for ph in ("fwd", "bwd"):
            assert fn(narrow).bytes(ph) < fn(wide).bytes(ph)


def test_tiled_causal_skips_tiles():
    s = AttentionShape(1, 1, 1024, 64, causal=True)
    cfg = KernelConfig(128, 128, 4, 2)
    full = tiled_traffic(AttentionShape(1, 1, 1024, 64), fwd_config=cfg, bwd_config=cfg).bytes()
    assert tiled_traffic(s, fwd_config=cfg, bwd_config=cfg).bytes() < 0.7 * full


def test_gqa_reuse_option_divides_kv_reads():
    s = AttentionShape(1, 8, 1024, 64, kv_heads=2)
    cfg = KernelConfig(128, 64, 4, 2)
    a = tiled_traffic(s, fwd_config=cfg, bwd_config=cfg, backward=False)
    b = tiled_traffic(s, fwd_config=cfg, bwd_config=cfg, backward=False, gqa_reuse=True)
    assert b.reads() < a.reads()


def test_seed_example_256_gib():
    s = AttentionShape(batch=8, heads=32, seqlen_q=16384, head_dim=128, dtype="bf16")
    assert resident_memory(s, "standard").peak_extra_bytes == 256 * 2 ** 30
    assert resident_memory(s, "tiled").saved_for_backward_bytes == 8 * 32 * 16384 * 4


def test_bytes_saved_grow_as_n_squared_and_kv_bytes_as_n():
    hw = get_hardware("nvidia-h200")
    saved, tiled = [], []
    for n in (1024, 2048, 4096, 8192):
        c = compare(AttentionShape(1, 16, n, 64), hw)
        saved.append(c.standard_pred["fwd"].bytes - c.tiled_pred["fwd"].bytes)
        tiled.append(c.tiled_pred["fwd"].bytes)
    for a, b in zip(saved, saved[1:]):
        assert b / a == pytest.approx(4.0, rel=0.05)
    for a, b in zip(tiled, tiled[1:]):
        assert b / a == pytest.approx(2.0, rel=0.05)


def test_no_cache_tile_loads_grow_as_n_squared():
    cfg = KernelConfig(128, 64, 4, 2)
    b = [tiled_traffic(AttentionShape(1, 1, n, 64), fwd_config=cfg, backward=False).tile_reads() for n in (4096, 8192)]
    assert b[1] / b[0] == pytest.approx(4.0, rel=0.1)


# ---- 7. units -------------------------------------------------------------------------
@pytest.mark.parametrize("value,binary,want", [
    (999.5 * 1024, True, "1000 KiB"), (1023.7 * 1024, True, "1 MiB"), (1024, True, "1 KiB"), (1000, True, "1000 B"),
    (999.7e3, False, "1 MB"), (999.4e3, False, "999 kB"), (999.5, False, "1 kB"), (12, False, "12 B"),
    (3.55e18, True, "3153 PiB"),
], ids=lambda x: str(x))
def test_fmt_bytes_no_exponent(value, binary, want):
    assert fmt_bytes(value, binary) == want


def test_fmt_time_and_flops_no_exponent():
    assert fmt_time(0.0009996) == "1 ms" and fmt_time(0.9996) == "1 s" and fmt_time(0.0009994) == "999 µs"
    assert fmt_time(999.6) == "1000 s" and fmt_time(9.996e-7) == "1 µs"
    assert fmt_flops(999.6e12) == "1 PFLOP" and fmt_flops(999.6e9) == "1 TFLOP"
    for k in range(-9, 22):
        for m in (0.9996, 0.99951, 1.0, 1.0234, 9.9996):
            x = m * 10.0 ** k
            for text in (fmt_bytes(x), fmt_bytes(x, True), fmt_time(x), fmt_flops(x)):
                assert "e+" not in text and "e-" not in text, (x, text)


def test_io_prints_no_exponent_units(capsys):
    assert commands.main(["io", "--seqlen", "1000", "--seqlen-k", "10", "--causal"]) == 0
    out = capsys.readouterr().out
    assert not re.search(r"e\+\d+ (B|kB|MB|GB|KiB|MiB|GiB|µs|ms|s|[MGTP]?FLOP)\b", out), out
    assert "1000 KiB" in out


# ---- 8. argument checks ---------------------------------------------------------
def test_attention_flops_head_dim_agrees_with_shape():
    with pytest.raises(ValueError, match="head_dim=1000 exceeds 512"):
        attention_flops(1, 1, 10, head_dim=1000)
    with pytest.raises(ValueError, match="head_dim=1000 exceeds 512"):
        AttentionShape(1, 1, 10, 1000)
    with pytest.raises(ValueError, match="head_dim_v=600 exceeds 512"):
        attention_flops(1, 1, 10, head_dim=64, head_dim_v=600)
    assert attention_flops(1, 1, 10, head_dim=512) == 4 * 100 * 512


@pytest.mark.parametrize("kw,exc,arg", [
    (dict(batch=float("inf")), ValueError, "batch"), (dict(seqlen_q=float("nan")), ValueError, "seqlen_q"),
    (dict(heads=2.5), ValueError, "heads"), (dict(batch="4"), TypeError, "batch"),
    (dict(seqlen_q=None), TypeError, "seqlen_q"), (dict(causal="false"), TypeError, "causal"),
    (dict(causal=1), TypeError, "causal"),
], ids=["inf", "nan", "fraction", "str", "none", "causal-str", "causal-int"])
def test_attention_flops_bad_arguments(kw, exc, arg):
    args = dict(batch=1, heads=1, seqlen_q=10)
    args.update(kw)
    with pytest.raises(exc, match=arg):
        attention_flops(**args)


def test_integral_floats_still_accepted():
    assert attention_flops(1.0, 2, 10.0, head_dim=64) == attention_flops(1, 2, 10, head_dim=64)
    assert AttentionShape(1, 4, 1024.0, 64).seqlen_q == 1024


def test_shape_causal_must_be_bool():
    with pytest.raises(TypeError, match="causal='false' must be a bool"):
        AttentionShape(1, 4, 10, 64, causal="false")
    assert AttentionShape(1, 4, 10, 64, causal=True).causal is True
    np = pytest.importorskip("numpy")
    assert AttentionShape(1, 4, 10, 64, causal=np.bool_(True)).causal is True


def test_compare_takes_a_name_or_hardware():
    shape = AttentionShape(1, 4, 1024, 64)
    by_name = compare(shape, "nvidia-h200")
    assert by_name.hardware.name == "nvidia-h200"
    assert by_name.tiled_pred["fwd"].time_s == compare(shape, get_hardware("nvidia-h200")).tiled_pred["fwd"].time_s
    with pytest.raises(TypeError, match="hw=42"):
        compare(shape, 42)
    with pytest.raises(ValueError, match="unknown hardware 'gpu-9000'"):
        compare(shape, "gpu-9000")
    with pytest.raises(TypeError, match="shape="):
        compare((1, 4, 1024, 64), "nvidia-h200")


@pytest.mark.parametrize("call,exc,arg", [
    (lambda: executed_pairs(10, 10, False, 0, 64), ValueError, "block_m=0"),
    (lambda: executed_pairs(10, 10, False, 64, -1), ValueError, "block_n=-1"),
    (lambda: executed_pairs(-1, 10, False, 64, 64), ValueError, "seqlen_q=-1"),
    (lambda: executed_pairs(10, 10, "yes", 64, 64), TypeError, "causal"),
    (lambda: visible_pairs(-5, 10, False), ValueError, "seqlen_q=-5"),
    (lambda: visible_pairs(5, -10, True), ValueError, "seqlen_k=-10"),
    (lambda: visible_pairs(5, 10, None), TypeError, "causal"),
    (lambda: default_configs(0), ValueError, "head_dim=0"),
    (lambda: default_configs(513), ValueError, "head_dim=513"),
    (lambda: default_configs(64, 3), ValueError, "elem_bytes=3"),
    (lambda: default_configs(64, 2, 0), ValueError, "smem_per_block=0"),
    (lambda: default_configs(64, 2, None, 0), ValueError, "head_dim_v=0"),
], ids=["exec-bm", "exec-bn", "exec-nq", "exec-causal", "vis-nq", "vis-nk", "vis-causal", "cfg-d0", "cfg-d513",
        "cfg-elem", "cfg-smem", "cfg-dv"])
def test_exported_helpers_check_arguments(call, exc, arg):
    with pytest.raises(exc, match=re.escape(arg)):
        call()


def test_zero_length_has_no_pairs():
    assert visible_pairs(0, 10, True) == visible_pairs(10, 0, True) == 0
    assert executed_pairs(0, 10, True, 64, 64) == executed_pairs(10, 0, False, 64, 64, "dkdv") == 0
    assert math.isfinite(attention_flops(1, 1, 1))


# ---- the block walks in closed form --------------------------------------------------
# The key rows each forward / dQ program loads, the query rows each dK/dV program
# loads, the executed pairs and the sliding-window pairs equal the block-by-block
# loops they replace; a sequence of 10^9 tokens is modelled at once.
def _cdiv(a, b):
    return -(-a // b)


# The loops as the model ran them before the closed forms (kernel bounds per block).
def _keys_loaded(start_m, nq, nk, bm, bn, causal):
    if not causal:
        return nk
    hi = max(min(start_m + bm + nk - nq, nk), 0)
    return min(nk, _cdiv(hi, bn) * bn)


def _query_start(start_n, nq, nk, bm, causal):
    if not causal:
        return 0
    lo = max(start_n - (nk - nq), 0)
    return min(nq, (lo // bm) * bm)


def _loop_executed(nq, nk, causal, bm, bn, kernel):
    total = 0
    if kernel == "dkdv":
        for kb in range(_cdiv(nk, bn)):
            start = _query_start(kb * bn, nq, nk, bm, causal)
            total += bn * _cdiv(nq - start, bm) * bm
        return total
    for qb in range(_cdiv(nq, bm)):
        total += bm * _cdiv(_keys_loaded(qb * bm, nq, nk, bm, bn, causal), bn) * bn
    return total


def _loop_window_pairs(nq, nk, causal, window):
    left, right = (-1, -1) if window is None else window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    diag, total = nk - nq, 0
    for i in range(nq):
        lo = 0 if left < 0 else max(0, i + diag - left)
        hi = nk - 1 if right < 0 else min(nk - 1, i + diag + right)
        total += max(0, hi - lo + 1)
    return total


LENGTHS = [1, 2, 3, 7, 16, 17, 31, 64, 65, 100, 128, 129, 255, 300]
BLOCKS = [(16, 16), (16, 64), (32, 128), (64, 32), (64, 64), (128, 64), (128, 128), (3, 5)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("bm,bn", BLOCKS, ids=lambda x: str(x))
def test_rows_loaded_equal_the_loops(bm, bn, causal):
    for nq in LENGTHS:
        for nk in LENGTHS:
            fwd = sum(_keys_loaded(i * bm, nq, nk, bm, bn, causal) for i in range(_cdiv(nq, bm)))
            dkdv = sum(nq - _query_start(j * bn, nq, nk, bm, causal) for j in range(_cdiv(nk, bn)))
            assert flops._fwd_key_rows(nq, nk, bm, bn, causal) == fwd, (nq, nk)
            assert flops._dkdv_query_rows(nq, nk, bm, bn, causal) == dkdv, (nq, nk)
            for kernel in ("fwd", "dq", "dkdv"):
                assert executed_pairs(nq, nk, causal, bm, bn, kernel) == _loop_executed(nq, nk, causal, bm, bn,
                                                                                        kernel), (nq, nk, kernel)


def test_floor_sum_equals_the_sum():
    for n in range(0, 12):
        for m in (1, 2, 3, 7, 64):
            for a in (-9, -1, 0, 1, 5, 64, 130):
                for b in (-70, -3, 0, 2, 63, 200):
                    assert flops._floor_sum(n, m, a, b) == sum((a * i + b) // m for i in range(n))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("window", [None, (0, 0), (3, -1), (-1, 2), (5, 7), (100, 100), (1, 0)],
                         ids=lambda x: str(x))
def test_window_pairs_equal_the_loop(causal, window):
    for nq in [0, 1, 2, 5, 9, 16, 23]:
        for nk in [0, 1, 3, 8, 16, 30]:
            assert sparse.window_pairs(nq, nk, causal, window) == _loop_window_pairs(nq, nk, causal, window), (nq, nk)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_billion_tokens_are_quick(causal):
    """`tileattn io --seqlen 1000000000 --batch 1 --heads 1` took 35 s when each
    block was walked in Python; the closed forms take no time."""
    start = time.perf_counter()
    c = compare(AttentionShape(1, 1, 10 ** 9, 128, causal=causal), get_hardware("nvidia-h200"))
    assert sparse.window_pairs(10 ** 7, 10 ** 7, causal, (4096, 0)) > 0   # the loop: seconds
    assert time.perf_counter() - start < 2.0
    assert c.tiled_pred["fwd_bwd"].time_s > 0
    # the forward streams K/V once per 128-row query block: N / 128 * N rows (half when causal)
    loads = flops._fwd_key_rows(10 ** 9, 10 ** 9, 128, 128, causal)
    want = _cdiv(10 ** 9, 128) * 10 ** 9
    assert loads == want if not causal else abs(loads / want - 0.5) < 1e-6
