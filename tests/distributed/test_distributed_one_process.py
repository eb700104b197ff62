"""Ring attention without a second process: the ring schedule against the
global causal mask (and zigzag's balance of causal work), the shard helpers,
the merge identity of key blocks, world size 1 (plain attention), argument
checks and the need for a process group; on a GPU, world size 1 over NCCL
(the kernels, the merge and CUDA-event timing).
"""
from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

import tileattn
from tileattn import ops
from tileattn.cost import visible_pairs
from tileattn.distributed import LAYOUTS, RingProfile, ring_attention, ring_plan, shard_sequence, unshard_sequence
from tileattn.distributed.ring import _merge_
from tileattn.reference import standard_attention
from tileattn.testing import FLOOR, forbidden, max_error


# ---------------------------------------------------------------------------
# The schedule, without processes
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_plan_covers_the_global_mask_exactly(world, causal, layout):
    """Over all steps, each rank computes exactly the (query, key) pairs the
    global causal mask allows: nothing twice, nothing missing."""
    n_local = 6
    pos = [shard_sequence(torch.arange(world * n_local), r, world, layout, dim=0) for r in range(world)]
    for rank in range(world):
        covered = torch.zeros(n_local, world * n_local, dtype=torch.int64)
        for p in ring_plan(layout, causal, rank, world, n_local):
            block = torch.zeros(n_local, n_local, dtype=torch.int64)
            if p.computes:
                sub = torch.ones(p.n_q, p.n_k, dtype=torch.int64)
                if p.causal:
                    sub = torch.tril(sub)
                block[p.q_start:p.q_stop, p.k_start:p.k_stop] = sub
            covered[:, pos[p.source]] += block
        want = (pos[rank][:, None] >= torch.arange(world * n_local)[None, :]) if causal else \
            torch.ones(n_local, world * n_local, dtype=torch.bool)
        assert torch.equal(covered, want.to(torch.int64)), f"rank {rank}"


@pytest.mark.parametrize("world", [2, 4, 8])
def test_zigzag_balances_causal_work(world):
    n_local = 64
    work = [sum(p.pairs() for p in ring_plan("zigzag", True, r, world, n_local)) for r in range(world)]
    assert len(set(work)) == 1
    assert sum(work) == visible_pairs(world * n_local, world * n_local, True)
    contiguous = [sum(p.pairs() for p in ring_plan("contiguous", True, r, world, n_local)) for r in range(world)]
    assert sum(contiguous) == sum(work) and contiguous[-1] > 2 * contiguous[0]


# ---------------------------------------------------------------------------
# Shard helpers
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_shard_unshard_round_trip(world, layout, dim):
    shape = [2, 3, 4, 5]
    shape[dim] = 2 * world * 3
    x = torch.randn(shape)
    parts = [shard_sequence(x, r, world, layout, dim=dim) for r in range(world)]
    assert all(p.shape[dim] == x.shape[dim] // world for p in parts)
    assert torch.equal(unshard_sequence(parts, layout, dim=dim), x)
    if layout == "contiguous":  # views, no copies
        assert all(p.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for p in parts)


def test_zigzag_shard_positions():
    pos = [shard_sequence(torch.arange(16), r, 4, "zigzag", dim=0).tolist() for r in range(4)]
    assert pos == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]
    assert shard_sequence(torch.arange(12), 2, 3, "contiguous", dim=0).tolist() == [8, 9, 10, 11]


@pytest.mark.parametrize("call,exc,match", [
    (lambda: shard_sequence(torch.zeros(10), 0, 3, "contiguous", dim=0), ValueError, "multiple of 3"),
    (lambda: shard_sequence(torch.zeros(12), 0, 4, "zigzag", dim=0), ValueError, "multiple of 8"),
    (lambda: shard_sequence(torch.zeros(8), 4, 4, "zigzag", dim=0), ValueError, "rank must be in 0..3"),
    (lambda: shard_sequence(torch.zeros(8), 0, 0, "zigzag", dim=0), ValueError, "world_size must be >= 1"),
    (lambda: shard_sequence(torch.zeros(8), 0, 2, "ring", dim=0), ValueError, "layout must be one of"),
    (lambda: shard_sequence(torch.zeros(8), 0, 2, 1, dim=0), TypeError, "layout must be a string"),
    (lambda: shard_sequence(torch.zeros(8), 0.0, 2, dim=0), TypeError, "rank must be an int"),
    (lambda: shard_sequence(torch.zeros(8), 0, 2, dim=3), ValueError, "dim=3 is out of range"),
    (lambda: shard_sequence([1, 2], 0, 2, dim=0), TypeError, "x must be a torch.Tensor"),
    (lambda: unshard_sequence([], "zigzag"), ValueError, "one tensor per rank"),
    (lambda: unshard_sequence(torch.zeros(2, 4), "zigzag", dim=1), TypeError, "parts must be a list"),
    (lambda: unshard_sequence([torch.zeros(4), torch.zeros(6)], "contiguous", dim=0), ValueError, "one shape"),
    (lambda: unshard_sequence([torch.zeros(3), torch.zeros(3)], "zigzag", dim=0), ValueError, "must be even"),
], ids=["indivisible-contig", "indivisible-zigzag", "rank-range", "world-0", "layout-name", "layout-type",
        "rank-type", "dim-range", "x-type", "parts-empty", "parts-tensor", "parts-shapes", "parts-odd"])
def test_shard_helpers_reject_bad_arguments(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ---------------------------------------------------------------------------
# The merge identity
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_merge_of_key_blocks_is_exact(dtype):
    """Attention over keys [0, a) merged with attention over [a, n) equals
    attention over [0, n); rows that saw no key in either part stay empty."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, 9, 16, generator=g, dtype=torch.float64) for _ in range(3))
    ref_out, ref_lse = standard_attention(q, k, v, return_lse=True)
    scale = 16 ** -0.5
    # the op keeps a float64 lse for float64 inputs (the public one is float32)
    out, lse, _ = ops.attention_fwd(q.to(dtype), k[:, :, :4].to(dtype), v[:, :, :4].to(dtype), False, scale)
    out2, lse2, _ = ops.attention_fwd(q.to(dtype), k[:, :, 4:].to(dtype), v[:, :, 4:].to(dtype), False, scale)
    acc_out, acc_lse = out.double(), lse.double()
    _merge_(acc_out, acc_lse, out2, lse2)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert max_error(acc_out, ref_out) < tol and max_error(acc_lse, ref_lse) < tol
    # both halves empty (lse -inf): out stays 0, lse -inf, no NaN
    empty_out, empty_lse = torch.zeros(1, 1, 2, 4), torch.full((1, 1, 2), float("-inf"))
    _merge_(empty_out, empty_lse, torch.zeros(1, 1, 2, 4), torch.full((1, 1, 2), float("-inf")))
    assert torch.equal(empty_out, torch.zeros(1, 1, 2, 4)) and torch.isneginf(empty_lse).all()
    # one side empty: the other passes through unchanged
    some_out, some_lse = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2)
    keep_out, keep_lse = some_out.clone(), some_lse.clone()
    _merge_(some_out, some_lse, torch.zeros(1, 1, 2, 4), torch.full((1, 1, 2), float("-inf")))
    assert torch.allclose(some_out, keep_out, atol=1e-7) and torch.allclose(some_lse, keep_lse)


# ---------------------------------------------------------------------------
# One process: world size 1 and argument checks
# ---------------------------------------------------------------------------
@pytest.fixture
def single_rank_group():
    if dist.is_initialized():
        pytest.fail("a default process group is already initialized in this test process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize("sinks", [False, True], ids=["plain", "sinks"])
@pytest.mark.parametrize("dv", [8, 6], ids=["Dv8", "Dv6"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_world_size_one_is_plain_attention(layout, causal, dv, sinks, single_rank_group):
    """float64 in, float64 out: exact against tileattn.attention, the sinks
    folded into the float64 lse (the public lse float32 for every dtype)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 4 // h, 10, d, generator=g, dtype=torch.float64).requires_grad_()
               for h, d in ((1, 8), (2, 8), (2, dv)))
    s = torch.randn(4, generator=g).requires_grad_() if sinks else None
    leaves = (q, k, v) + ((s,) if sinks else ())
    out, lse = ring_attention(q, k, v, causal=causal, layout=layout, return_lse=True, sinks=s)
    ref_out, ref_lse = tileattn.attention(q, k, v, causal=causal, return_lse=True, sinks=s)
    assert lse.dtype == ref_lse.dtype == torch.float32
    assert max_error(out, ref_out) <= FLOOR[torch.float64] and max_error(lse, ref_lse) == 0
    grads = torch.autograd.grad((out.sum() + lse.sum()), leaves)
    ref_grads = torch.autograd.grad((ref_out.sum() + ref_lse.sum()), leaves)
    for a, b in zip(grads, ref_grads):
        assert max_error(a, b) <= FLOOR[torch.float64]


def _t(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


BAD_CALLS = {
    "layout-name": (lambda: (_t(1, 2, 8, 4),) * 3, {"layout": "striped"}, ValueError, "layout must be one of"),
    "layout-type": (lambda: (_t(1, 2, 8, 4),) * 3, {"layout": None}, TypeError, "layout must be a string"),
    "zigzag-odd-length": (lambda: (_t(1, 2, 7, 4),) * 3, {}, ValueError, "local sequence length must be even"),
    "kv-length": (lambda: (_t(1, 2, 8, 4), _t(1, 2, 6, 4), _t(1, 2, 6, 4)), {}, ValueError,
                  "k, v: ring attention shards one sequence"),
    "q-not-tensor": (lambda: (None, _t(1, 2, 8, 4), _t(1, 2, 8, 4)), {}, TypeError, "q must be a torch.Tensor"),
    "heads": (lambda: (_t(1, 3, 8, 4), _t(1, 2, 8, 4), _t(1, 2, 8, 4)), {}, ValueError, "multiple"),
    "causal-type": (lambda: (_t(1, 2, 8, 4),) * 3, {"causal": "yes"}, TypeError, "causal must be a bool"),
    "profile-type": (lambda: (_t(1, 2, 8, 4),) * 3, {"profile": {}}, TypeError, "profile must be"),
    "check-type": (lambda: (_t(1, 2, 8, 4),) * 3, {"check_shards": 1}, TypeError, "check_shards must be a bool"),
    "group-type": (lambda: (_t(1, 2, 8, 4),) * 3, {"group": "world"}, TypeError, "group must be"),
    "empty": (lambda: (_t(1, 2, 0, 4),) * 3, {"layout": "contiguous"}, ValueError, "local shard is empty"),
    "v-head-dim-limit": (lambda: (_t(1, 2, 8, 4), _t(1, 2, 8, 4), _t(1, 2, 8, 513)), {}, ValueError,
                         r"head_dim \(last dimension of v\) must be in 1\.\.512"),
}


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bad_arguments_raise_naming_them(name, single_rank_group, monkeypatch):
    make, kwargs, exc, match = BAD_CALLS[name]
    import tileattn.distributed.ring as ring_mod
    monkeypatch.setattr(ring_mod, "_block_forward", forbidden("computed on bad input"))
    with pytest.raises(exc, match=match):
        ring_attention(*make(), **kwargs)


def test_needs_a_process_group():
    assert not dist.is_initialized(), "a default process group leaked into this test process"
    x = _t(1, 2, 8, 4)
    with pytest.raises(ValueError, match="init_process_group"):
        ring_attention(x, x, x)


# ---------------------------------------------------------------------------
# CUDA path (world size 1 over NCCL: the kernels, the merge and CUDA-event
# timing; several GPUs: benchmarks/ring_bench.py)
# ---------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU-only case: needs a CUDA device")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_single_gpu_ring_over_nccl(layout):
    assert not dist.is_initialized()
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=dev,
                            timeout=datetime.timedelta(seconds=60))
    try:
        g = torch.Generator(device=dev).manual_seed(11)
        q, k, v = (torch.randn(2, h, 1024, 128, generator=g, device=dev).to(torch.bfloat16).requires_grad_()
                   for h in (8, 2, 2))
        do = torch.randn(2, 8, 1024, 128, generator=g, device=dev).to(torch.bfloat16)
        prof = RingProfile()
        out, lse = ring_attention(q, k, v, causal=True, layout=layout, return_lse=True, profile=prof)
        grads = torch.autograd.grad(out, (q, k, v), do)
        # the ring's blocks take the deterministic backward
        ref_out, ref_lse = tileattn.attention(q, k, v, causal=True, return_lse=True, deterministic=True)
        ref_grads = torch.autograd.grad(ref_out, (q, k, v), do)
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), (out, lse) + grads, (ref_out, ref_lse) + ref_grads):
            assert max_error(a, b) <= FLOOR[torch.float32], name  # one block: the same kernels, the same result
        recs = prof.records()
        assert [(r.phase, r.kind) for r in recs] == [("forward", "diagonal"), ("backward", "diagonal")]
        assert all(r.compute_ms > 0 for r in recs)
    finally:
        dist.destroy_process_group()
