"""The block-sparse term of the cost model: FlashAttention Prop. 4 (bytes
Theta(N d + s N^2 d^2 / M)), FLOPs scaled by density, ``tileattn io --density``."""
import json

import pytest

from tileattn.cost import commands, io, sparse
from tileattn.cost.hardware import get_hardware

SHAPE = io.AttentionShape(batch=2, heads=8, seqlen_q=4096, head_dim=128, kv_heads=2)


def test_density_one_is_dense():
    dense = io.tiled_traffic(SHAPE)
    one = sparse.block_sparse_traffic(SHAPE, 1.0)
    for ph in ("fwd", "bwd", None):
        assert one.bytes(ph) == pytest.approx(dense.bytes(ph))
        assert one.flops(ph) == pytest.approx(dense.flops(ph))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_streamed_term_scales_with_density(causal):
    """bytes(s) = own + s * streamed: linear in s, with the per-row terms as intercept."""
    shape = io.AttentionShape(batch=1, heads=4, seqlen_q=8192, head_dim=64, causal=causal)
    b = {s: sparse.block_sparse_traffic(shape, s) for s in (0.1, 0.4, 1.0)}
    for ph in ("fwd", "bwd"):
        slope = (b[1.0].bytes(ph) - b[0.4].bytes(ph)) / 0.6
        assert b[0.1].bytes(ph) == pytest.approx(b[0.4].bytes(ph) - 0.3 * slope)
        assert b[0.1].bytes(ph) < b[0.4].bytes(ph) < b[1.0].bytes(ph)
        assert b[0.1].flops(ph) == pytest.approx(0.1 * b[1.0].flops(ph))
    # the intercept is the Theta(N d) part: Q read and O, lse written once in the forward
    row = 64 * 2
    own_fwd = 4 * 8192 * (2 * row + io.LSE_BYTES)
    slope_fwd = (b[1.0].bytes("fwd") - b[0.4].bytes("fwd")) / 0.6
    assert b[0.1].bytes("fwd") - 0.1 * slope_fwd == pytest.approx(own_fwd, rel=1e-9)


def test_streamed_term_with_head_dim_v():
    """D=192, Dv=128: the forward's intercept is Q read at D, O written at Dv,
    lse; the dQ kernel's own reads are Q at D, dO at Dv, lse2 and delta; the
    FLOPs are the density times those of the two widths."""
    shape = io.AttentionShape(batch=1, heads=4, seqlen_q=8192, head_dim=192, head_dim_v=128)
    b = {s: sparse.block_sparse_traffic(shape, s) for s in (0.4, 1.0)}
    slope_fwd = (b[1.0].bytes("fwd") - b[0.4].bytes("fwd")) / 0.6
    rows = 4 * 8192
    assert b[0.4].bytes("fwd") - 0.4 * slope_fwd == pytest.approx(rows * (192 * 2 + 128 * 2 + io.LSE_BYTES),
                                                                  rel=1e-9)
    assert sparse._own_read_bytes(shape, "dq") == rows * (192 * 2 + 128 * 2 + 2 * io.LSE_BYTES)
    assert sparse._own_read_bytes(shape, "dkdv") == 4 * 8192 * (192 + 128) * 2
    assert sparse.block_sparse_flops(shape, 0.25, "fwd") == pytest.approx(
        0.25 * io.attention_flops(1, 4, 8192, 8192, 192, head_dim_v=128))


def test_sparse_flops_and_bound():
    assert sparse.block_sparse_flops(SHAPE, 0.25, "fwd_bwd") == pytest.approx(
        0.25 * io.attention_flops(2, 8, 4096, 4096, 128, mode="fwd_bwd"))
    n, d, m = 4096, 64, 100 * 1024 // 2
    assert sparse.sparse_io_bound(n, d, m, 1.0) == pytest.approx(n * d + n * n * d * d / m)
    assert sparse.sparse_io_bound(n, d, m, 0.5) - n * d == pytest.approx((sparse.sparse_io_bound(n, d, m, 1.0) - n * d)
                                                                         / 2)


@pytest.mark.parametrize("bad", [0, -0.5, 1.5, "x", True])
def test_bad_density(bad):
    with pytest.raises(ValueError, match="density"):
        sparse.block_sparse_traffic(SHAPE, bad)


def test_io_density_cli(capsys):
    argv = ["io", "--batch", "2", "--heads", "4", "--seqlen", "4096", "--head-dim", "64", "--density", "0.25"]
    assert commands.main(argv) == 0
    assert "block-sparse tiled kernels, density s = 0.25" in capsys.readouterr().out
    assert commands.main(argv + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)["block_sparse"]
    fwd = d["phases"][0]
    assert d["density"] == 0.25 and fwd["sparse_flops"] == pytest.approx(0.25 * fwd["dense_flops"])
    assert fwd["sparse_time_s"] < fwd["dense_time_s"]
    with pytest.raises(SystemExit):
        commands.main(argv[:-1] + ["0"])
    assert "must be in (0, 1]" in capsys.readouterr().err


def test_sparse_summary_uses_comparison_configs():
    from tileattn.cost.roofline import compare
    comp = compare(SHAPE, get_hardware("nvidia-h200"))
    d = sparse.sparse_summary(comp, 1.0)
    for r in d["phases"]:
        assert r["sparse_bytes"] == pytest.approx(r["dense_bytes"])
        assert r["sparse_time_s"] == pytest.approx(r["dense_time_s"])


@pytest.mark.parametrize("nq,nk,causal,window", [(100, 130, True, None), (130, 100, True, (5, -1)),
                                                 (50, 50, False, (3, 7)), (60, 40, False, (-1, 0)),
                                                 (40, 60, True, (0, 0)), (30, 30, False, (1000, 1000))],
                         ids=lambda x: str(x))
def test_window_pairs_match_mask(nq, nk, causal, window):
    from tileattn.reference import attention_mask
    hidden = attention_mask(nq, nk, causal=causal, window=window)
    visible = nq * nk if hidden is None else int((~hidden).sum())
    assert sparse.window_pairs(nq, nk, causal, window) == visible
    if window is None:
        assert visible == io.visible_pairs(nq, nk, causal)


def test_varlen_flops_sum_of_sequences():
    lens = [5, 0, 17, 1]
    want = sum(io.attention_flops(1, 4, n, n, 32, causal=True, mode="fwd_bwd") for n in lens if n)
    assert sparse.varlen_flops(lens, lens, 4, 32, causal=True, mode="fwd_bwd") == pytest.approx(want)


# ---- L2 reuse: the once-per-head reads are not scaled by the density ----------------
H200_CACHE = io.CacheModel(50 * 1024 ** 2, 132, 228 * 1024)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_l2_once_per_head_reads_not_scaled_by_density(causal):
    """N = 4096, one head per program group: with L2 reuse the dense forward reads
    each K/V tile from DRAM once per head; at s = 0.25 nearly every K/V block is
    still needed by one of the 32 query blocks (1 - 0.75^32 > 0.9998), so the
    forward's DRAM bytes stay within 1% of dense while the FLOPs drop 4x."""
    shape = io.AttentionShape(batch=2, heads=8, seqlen_q=4096, head_dim=128, causal=causal)
    dense = io.tiled_traffic(shape, cache=H200_CACHE)
    sp = sparse.block_sparse_traffic(shape, 0.25, cache=H200_CACHE)
    for ph in ("fwd", "bwd"):
        assert sp.bytes(ph) > 0.99 * dense.bytes(ph)
        assert sp.bytes(ph) <= dense.bytes(ph)
        assert sp.flops(ph) == pytest.approx(0.25 * dense.flops(ph))
        assert sp.tile_reads(ph) < 0.5 * dense.tile_reads(ph)   # the tile loads do scale


def test_l2_streamed_term_follows_the_needed_fraction():
    """Non-causal forward, one wave: streamed DRAM = dense K/V reads x (1 - (1 - s)^q),
    q = 64-row query blocks per head x 64/128 (two of them share a layout row)."""
    shape = io.AttentionShape(batch=1, heads=1, seqlen_q=512, head_dim=64)
    cfg = io.KernelConfig(64, 64, 4, 2)
    kw = dict(cache=H200_CACHE, fwd_config=cfg, bwd_config=cfg, dq_config=cfg, backward=False)
    dense = io.tiled_traffic(shape, **kw)
    own = sparse._own_read_bytes(shape, "fwd")
    kv_dense = dense.reads("fwd") - own
    assert kv_dense == 512 * 2 * 64 * 2                          # K and V once
    for s in (0.05, 0.25, 0.5, 1.0):
        sp = sparse.block_sparse_traffic(shape, s, **kw)
        want = kv_dense * (1 - (1 - s) ** (8 * 64 / 128))
        assert sp.reads("fwd") - own == pytest.approx(want)
        assert sp.reads("fwd") - own <= s * (dense.tile_reads("fwd") - own) + 1e-6


def test_no_l2_scales_the_streamed_reads():
    """--no-l2 (no cache model): every tile load is a DRAM read, s times the dense ones."""
    shape = io.AttentionShape(batch=1, heads=4, seqlen_q=4096, head_dim=64)
    dense = io.tiled_traffic(shape)
    sp = sparse.block_sparse_traffic(shape, 0.25)
    own = sparse._own_read_bytes(shape, "fwd")
    assert sp.reads("fwd") - own == pytest.approx(0.25 * (dense.reads("fwd") - own))


def test_io_density_with_l2(capsys):
    argv = ["io", "--hw", "nvidia-h200", "--batch", "2", "--heads", "4", "--seqlen", "4096", "--head-dim", "64",
            "--density", "0.25", "--json"]
    assert commands.main(argv) == 0
    fwd = json.loads(capsys.readouterr().out)["block_sparse"]["phases"][0]
    assert fwd["sparse_bytes"] > 0.99 * fwd["dense_bytes"]
    assert commands.main(argv + ["--no-l2"]) == 0
    fwd = json.loads(capsys.readouterr().out)["block_sparse"]["phases"][0]
    assert fwd["sparse_bytes"] < 0.5 * fwd["dense_bytes"]
