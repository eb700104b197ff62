"""IO cost model: FLOPs and HBM bytes, hand-computed values (a V head dim of
its own included) and scaling laws.  The hardware catalogue, the roofline
and the tile solver: ``test_cost_hardware.py``; the model against measured
bytes: ``test_cost_measured.py``."""
import pytest

from tileattn.cost import (AttentionShape, attention_flops, compare, executed_pairs, flop_breakdown, get_hardware,
                           resident_memory, standard_traffic, tiled_traffic, visible_pairs)
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
