"""Cases that only a GPU can run in reasonable time and memory: a tensor of
more than 2^31 elements (64-bit offsets), N = 16384, 100 repeated
deterministic backward passes compared bitwise, the atomic backward at
N = 1000 with the copy engine's bulk reduce."""
import functools

import pytest
import torch

import tileattn
from tileattn.launch import runtime
from tileattn.reference import standard_attention
from tileattn.testing import check_accuracy

from conftest import HAS_CUDA

pytestmark = pytest.mark.skipif(not HAS_CUDA, reason="GPU-only case: needs a CUDA device")


def _grads(fn, q, k, v, do, causal):
    out = fn(q, k, v, causal=causal)
    return (out,) + torch.autograd.grad(out, (q, k, v), do)


def _check_slice(name, q, k, v, do, got, causal):
    """Compare a batch slice of a big call with float64 and low-precision
    standard attention computed on that slice alone."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    low = _grads(standard_attention, *leaves, do, causal)
    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = _grads(standard_attention, *leaves64, do.double(), causal)
    for part, g, r, lo in zip(("out", "dq", "dk", "dv"), got, ref, low):
        check_accuracy(f"{name} {part}", g, r, lo, q.dtype)


@pytest.mark.gpu_exclusive
def test_more_than_2_pow_31_elements():
    b, h, n, d = 2100, 16, 512, 128  # 2.2e9 elements per tensor
    assert b * h * n * d > 2**31
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
    launch = tileattn.launch
    runtime.POISON_OUTPUTS = True
    got = _grads(tileattn.attention, q, k, v, do, True)
    for sl in (slice(0, 1), slice(b - 2, b)):  # first batch, and the last ones past 2^31
        _check_slice(f"batch[{sl.start}:{sl.stop}]", q[sl], k[sl], v[sl], do[sl], [t[sl] for t in got], True)
    del got


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_seqlen_16384(causal):
    torch.manual_seed(1)
    b, h, n, d = 1, 2, 16384, 128
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
    got = _grads(tileattn.attention, q, k, v, do, causal)
    _check_slice(f"N16384-{causal}", q, k, v, do, got, causal)


def test_hundred_backward_passes_bitwise_equal():
    torch.manual_seed(2)
    q = torch.randn(4, 16, 1024, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(4, 4, 1024, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(4, 4, 1024, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn_like(q)
    out = tileattn.attention(q, k, v, causal=True, deterministic=True)
    first = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    for i in range(100):
        again = torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), f"{name} differs on repeat {i}"


@pytest.mark.parametrize("b,hq,hkv,n,causal", [(2, 8, 8, 1000, True), (2, 8, 2, 1000, False), (1, 16, 4, 777, True)],
                         ids=["B2-H8-N1000-causal", "B2-H8x2-N1000-full", "B1-H16x4-N777-causal"])
def test_atomic_backward_accuracy(b, hq, hkv, n, causal):
    """deterministic=False (dQ by float32 atomics, TMA bulk reduce for bf16)
    under the accuracy rule, plain and grouped-query."""
    torch.manual_seed(4)
    d = 128
    q = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn_like(q)
    tileattn.launch.runtime.POISON_OUTPUTS = True
    try:
        got = _grads(functools.partial(tileattn.attention, deterministic=False), q, k, v, do, causal)
    finally:
        tileattn.launch.runtime.POISON_OUTPUTS = False
    _check_slice(f"atomic-{b}x{hq}x{hkv}x{n}", q, k, v, do, got, causal)


def test_atomic_backward_plans_start_from_a_zero_accumulator(monkeypatch):
    """Replayed launch plans of the portable atomic backward allocate a fresh
    zeroed accumulator: dq stays what the first call gave (to rounding), and
    dk, dv stay bitwise (they take no atomics).  The Hopper backward, which
    such calls take on sm_90, records no plans: it is switched off here."""
    monkeypatch.setattr(tileattn.dispatch, "HOPPER_BWD", False)
    launch = tileattn.launch
    torch.manual_seed(5)
    q, k, v, do = (torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, lse = launch.attn_fwd(q, k, v, True, 0.125)
    runtime.PLANS.clear()
    first = launch.attn_bwd(do, q, k, v, o, lse, True, 0.125, deterministic=False)
    for _ in range(4):   # the later calls launch directly, then from the plan
        again = launch.attn_bwd(do, q, k, v, o, lse, True, 0.125, deterministic=False)
        assert (again[0].float() - first[0].float()).abs().max() <= 1e-2 * first[0].float().abs().max()
        assert torch.equal(again[1], first[1]) and torch.equal(again[2], first[2])
    if runtime._DIRECT_SUPPORTED:
        assert any(key[0] == "bwd" for key in runtime.PLANS), "no call replayed a plan"


def _fwd_bwd_launchers(q, k, v, do, causal, dlse=None):
    launch = tileattn.launch
    o, lse = launch.attn_fwd(q, k, v, causal, q.shape[-1] ** -0.5)
    return (o, lse) + launch.attn_bwd(do, q, k, v, o, lse, causal, q.shape[-1] ** -0.5, dlse=dlse)


def test_direct_launches_match_regular_launches(monkeypatch):
    """Later calls of a specialisation skip Triton's binder (runtime.run) and,
    from the third call of a plain shape on, replay a launch plan; the
    outputs must be bitwise those of regular launches, also when calls of
    other specialisations (length not a multiple of 16, strided views, fp16,
    causal, an lse gradient, q, k and v one tensor) come in between and share
    the caches."""
    launch = tileattn.launch
    if not runtime._DIRECT_SUPPORTED:
        pytest.skip("direct launches are off on this Triton version (runtime.DIRECT_LAUNCH_VERSIONS)")
    monkeypatch.setattr(runtime, "POISON_OUTPUTS", True)
    # the portable kernels' launch machinery: keep plain forwards off the
    # Hopper kernel (it launches through Triton's binder, no plans)
    monkeypatch.setattr(tileattn.dispatch, "HOPPER_FWD", False)
    torch.manual_seed(3)

    def make(n, dtype, strided):
        if strided:  # (B, N, H, D) memory seen as (B, H, N, D)
            return [torch.randn(2, n, 4, 64, device="cuda", dtype=dtype).transpose(1, 2) for _ in range(4)]
        return [torch.randn(2, 4, n, 64, device="cuda", dtype=dtype) for _ in range(4)]

    cases = {f"{n}-{str(dt)[6:]}-{'strided' if st else 'dense'}-{'causal' if c else 'full'}":
             (make(n, dt, st), c, None)
             for n, dt, st, c in ((128, torch.bfloat16, False, False), (100, torch.bfloat16, False, True),
                                  (128, torch.float16, True, False), (257, torch.float16, True, True))}
    q, k, v, do = make(128, torch.bfloat16, False)
    cases["128-bfloat16-dense-full-self"] = ([q, q, q, do], False, None)   # the plan of the case above
    cases["128-bfloat16-dense-full-dlse"] = ([q, k, v, do], False, torch.randn(2, 4, 128, device="cuda"))
    monkeypatch.setenv("TILEATTN_DIRECT_LAUNCH", "0")
    want = {name: _fwd_bwd_launchers(*t, c, dlse) for name, (t, c, dlse) in cases.items()}
    monkeypatch.setenv("TILEATTN_DIRECT_LAUNCH", "1")
    runtime._DIRECT.clear()
    runtime.PLANS.clear()
    for _ in range(4):   # first round fills the caches, the others launch directly, then from plans
        for name, (t, c, dlse) in cases.items():
            got = _fwd_bwd_launchers(*t, c, dlse)
            for part, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want[name]):
                assert torch.equal(g, w), f"{name} {part}"
    assert runtime._DIRECT, "no call took the direct path"
    assert {key[0] for key in runtime.PLANS} == {"fwd", "bwd"}, "no call replayed a plan"
