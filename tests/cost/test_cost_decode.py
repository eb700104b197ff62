"""The cost model of a decoding step (``tileattn.cost.decode``): bytes and FLOPs
against hand-computed numbers per named case (a V head dim of its own, the
absorbed MLA layout with K read once, splits, appends, pages), and whether
absorbed decoding is memory- or compute-bound on the H200."""
from __future__ import annotations

import pytest

from tileattn.cost import DecodeShape, crossover_heads, decode_bound, decode_cache_bytes, decode_flops, decode_traffic
from tileattn.cost import get_hardware

# name -> (shape, {pass: (read bytes, write bytes)}, FLOPs); every number worked out by hand below
CASES = {
    # the decoding benchmark's shape: K and V 2 x 16 x 8 x 4096 x 128 x 2 = 268,435,456 (256 MiB);
    # Q 16 x 32 x 128 x 2 = 131,072; lengths 16 x 4; out 131,072 + lse 16 x 32 x 4 = 2,048
    "bench-B16-H32x8-L4096-D128-bf16": (
        DecodeShape(16, 32, 8, 4096),
        {"decode": (268_435_456 + 131_072 + 64, 131_072 + 2_048)},
        2 * 16 * 32 * 4096 * (128 + 128)),
    # K 2 x 2 x 1000 x 192 x 2 = 1,536,000, V 2 x 2 x 1000 x 128 x 2 = 1,024,000, Q 2 x 8 x 192 x 2 = 6,144,
    # out 2 x 8 x 128 x 2 = 4,096, lse 64
    "dv-B2-H8x2-L1000-D192-Dv128-fp16": (
        DecodeShape(2, 8, 2, 1000, 192, 128, dtype="fp16"),
        {"decode": (1_536_000 + 1_024_000 + 6_144 + 8, 4_096 + 64)},
        2 * 2 * 8 * 1000 * (192 + 128)),
    # absorbed MLA: K 4 x 8192 x 576 x 2 = 37,748,736 and no V; Q 4 x 128 x 576 x 2 = 589,824;
    # out 4 x 128 x 512 x 2 = 524,288, lse 2,048
    "mla-B4-H128-L8192-bf16": (
        DecodeShape.absorbed_mla(4, 128, 8192),
        {"decode": (37_748_736 + 589_824 + 16, 524_288 + 2_048)},
        2 * 4 * 128 * 8192 * (576 + 512)),
    # the same with V materialised as a copy (what SDPA reads): + 4 x 8192 x 512 x 2 = 33,554,432
    "mla-copy-B4-H128-L8192-bf16": (
        DecodeShape(4, 128, 1, 8192, 576, 512),
        {"decode": (37_748_736 + 33_554_432 + 589_824 + 16, 524_288 + 2_048)},
        2 * 4 * 128 * 8192 * (576 + 512)),
    # absorbed, 16 heads, one appended token (k_new alone: 2 x 576 x 2 = 2,304), 64-token pages
    # (ceil(1000 / 64) = 16 entries x 2 x 4 = 128 bytes), 4 splits: partials 2 x 16 x 4 x 513 x 4 = 262,656,
    # out 2 x 16 x (512 x 2 + 4) = 32,896; K 2 x 1000 x 576 x 2 = 2,304,000; Q 2 x 16 x 576 x 2 = 36,864
    "mla-B2-H16-L1000-new1-page64-split4": (
        DecodeShape.absorbed_mla(2, 16, 1000, n_new=1, page_size=64, num_splits=4),
        {"append": (2_304 + 8, 2_304),
         "decode": (2_304_000 + 36_864 + 8 + 128, 262_656),
         "combine": (262_656, 32_896)},
        2 * 2 * 16 * 1000 * 1088),
    # three causal query tokens over 10 keys see 8 + 9 + 10 = 27 pairs; an unshared append writes K and V:
    # 1 x 2 x 3 x (32 + 16) x 4 = 1,152
    "dv-causal-Nq3-L10-new3-fp32": (
        DecodeShape(1, 4, 2, 10, 32, 16, seqlen_q=3, dtype="fp32", n_new=3),
        {"append": (1_152 + 4, 1_152),
         "decode": (1 * 2 * 10 * 48 * 4 + 1 * 4 * 3 * 32 * 4 + 4, 1 * 4 * 3 * (16 * 4 + 4))},
        2 * 1 * 4 * 27 * (32 + 16)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_decode_bytes_and_flops(name):
    shape, passes, flops = CASES[name]
    t = decode_traffic(shape)
    assert {p.name: (p.read_bytes, p.write_bytes) for p in t.passes} == passes
    assert decode_flops(shape) == t.flops() == flops
    assert next(p for p in t.passes if p.name == "decode").flops == flops   # the partial kernel does them all


def test_absorbed_cache_is_read_once():
    """A shared cache reads K's D channels a key, not D + Dv; with 128 heads
    (two query blocks of 64 rows) its tiles load twice, from L2 the second
    time (tile reads, not DRAM bytes)."""
    mla = DecodeShape.absorbed_mla(4, 128, 8192)
    assert decode_cache_bytes(mla) == 4 * 8192 * 576 * 2
    assert decode_cache_bytes(DecodeShape(4, 128, 1, 8192, 576, 512)) == 4 * 8192 * (576 + 512) * 2
    assert mla.query_blocks == 2 and DecodeShape.absorbed_mla(4, 16, 8192).query_blocks == 1
    (p,) = decode_traffic(mla).passes
    assert p.tile_reads - p.read_bytes == 4 * 8192 * 576 * 2


@pytest.mark.parametrize("basis,ridge", [("datasheet", 206.1), ("measured", 187.4)])
@pytest.mark.parametrize("cache_len", [4096, 65536])
def test_absorbed_mla_on_the_h200(basis, ridge, cache_len):
    """Absorbed decoding, one token, bf16: 16 heads are memory-bound (30 FLOP a
    byte), 128 heads compute-bound (~240 FLOP a byte against the ridge of 206 by
    the datasheet, 187 measured)."""
    h200 = get_hardware("nvidia-h200")
    small = decode_bound(DecodeShape.absorbed_mla(8, 16, cache_len), h200, basis)
    large = decode_bound(DecodeShape.absorbed_mla(8, 128, cache_len), h200, basis)
    assert small.ridge == pytest.approx(ridge, abs=0.05)
    assert small.bound == "memory" and 29 < small.intensity < 30.3
    assert large.bound == "compute" and 220 < large.intensity < 241.8   # 128 x 1088 / 576 = 241.8 at most
    assert small.time_s < large.time_s


def test_crossover_heads():
    h200 = get_hardware("nvidia-h200")
    # ridge x 576 x 2 / (2 x 1088)
    assert crossover_heads(h200) == pytest.approx(989.4 / 4.8 * 1152 / 2176, rel=1e-9)
    assert crossover_heads(h200, basis="measured") == pytest.approx(789 / 4.21 * 1152 / 2176, rel=1e-9)
    # a copied V costs 512 more bytes a key: the crossover moves up by (576 + 512) / 576
    assert crossover_heads(h200, shared_kv=False) == pytest.approx(crossover_heads(h200) * 1088 / 576)


def test_decode_shape_rules():
    with pytest.raises(ValueError, match="shared_kv needs head_dim_v < head_dim"):
        DecodeShape(1, 16, 1, 100, 128, 128, shared_kv=True)
    with pytest.raises(ValueError, match="kv_heads=3 must divide heads=16"):
        DecodeShape(1, 16, 3, 100)
    with pytest.raises(ValueError, match="n_new=5 exceeds cache_len=4"):
        DecodeShape(1, 16, 1, 4, n_new=5)
    assert DecodeShape(1, 8, 8, 0).as_dict()["head_dim_v"] == 128
