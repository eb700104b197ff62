"""Attention sinks (``sinks=``): one extra logit per head in every row's
softmax denominator, differentiable, on every entry point.

The float64 reference is ``standard_attention`` with an explicit sink column
(``reference.standard_attention(..., sinks=)``); out, lse, dq, dk, dv and
dsinks follow the accuracy rule.  Cases: causal and not, Nq != Nk, rows that
see no key (output 0, lse = sink), GQA, large logits, dominant and negligible
sinks, the variants, the atomic backward, packed sequences, KV-cache decoding with any number of
splits, and bad input rejected before anything runs or is written.
"""
import functools
import math

import pytest
import torch
import triton
import triton.language as tl

import tileattn
from tileattn.kernels import remainder as remainder_kernels
from tileattn.reference import standard_attention, standard_attention_varlen
from tileattn.sinks import decode_remainder, encode_remainder, sink_sums_grad
from tileattn.testing import DEVICE, DT_NAME, SEED_OFFSET, case_number, check_accuracy, check_remainder

from conftest import INTERPRETED

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# name: (b, hq, hkv, nq, nk, d, causal, sink scale, extra attention kwargs)
CASES = {
    "full-37x50": (2, 4, 2, 37, 50, 32, False, 1.0, {}),
    "causal-64x64": (1, 4, 4, 64, 64, 64, True, 1.0, {}),
    "causal-rows-see-nothing-70x20": (1, 2, 1, 70, 20, 32, True, 1.0, {}),
    "gqa4-causal-33x130": (1, 8, 2, 33, 130, 16, True, 1.0, {}),
    "sink-dominant": (1, 2, 2, 40, 40, 32, False, 30.0, {}),
    "sink-negligible": (1, 2, 2, 40, 40, 32, True, -30.0, {}),
    "window": (1, 2, 2, 90, 90, 32, True, 1.0, {"window": (20, 0)}),
    "softcap": (1, 2, 2, 50, 61, 32, False, 1.0, {"softcap": 5.0}),
    "alibi": (1, 4, 2, 45, 45, 32, True, 1.0, {"alibi_slopes": "alibi"}),
}


def _inputs(case, dtype, logit_scale=1.0):
    b, hq, hkv, nq, nk, d, causal, sink_scale, extra = CASES[case]
    g = torch.Generator().manual_seed(case_number(case) % 10_000 + SEED_OFFSET)

    def make(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(DEVICE, dtype).requires_grad_()
    q, k, v = make(b, hq, nq, d, scale=logit_scale), make(b, hkv, nk, d, scale=logit_scale), make(b, hkv, nk, d)
    if sink_scale in (30.0, -30.0):
        sinks = torch.full((hq,), sink_scale) + torch.randn(hq, generator=g)
    else:
        sinks = torch.randn(hq, generator=g) * sink_scale
    sinks = sinks.to(DEVICE).requires_grad_()
    kw = dict(extra)
    if kw.get("alibi_slopes") == "alibi":
        kw["alibi_slopes"] = torch.rand(hq, generator=g).to(DEVICE)
    do = torch.randn(b, hq, nq, d, generator=g).to(DEVICE, dtype)
    dlse = torch.randn(b, hq, nq, generator=g).to(DEVICE)
    return (q, k, v, sinks), causal, kw, do, dlse


def _fwd_bwd(fn, leaves, causal, kw, do, dlse):
    q, k, v, sinks = leaves
    out, lse = fn(q, k, v, causal=causal, sinks=sinks, return_lse=True, **kw)
    loss = (out.to(do.dtype) * do).sum() + (lse.float() * dlse).sum()
    return (out, lse) + torch.autograd.grad(loss, leaves)


def _references(leaves, causal, kw, do, dlse):
    """(standard attention in the inputs' precision, the same in float64)."""
    lowp = _fwd_bwd(standard_attention, leaves, causal, kw, do, dlse)
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    kw64 = {n: (t.double() if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    with tileattn.use_backend("torch"):
        ref = _fwd_bwd(standard_attention, leaves64, causal, kw64, do.double(), dlse.double())
    return lowp, ref


def _check(name, mine, lowp, ref, dtype):
    for part, got, r64, rlp in zip(("out", "lse", "dq", "dk", "dv", "dsinks"), mine, ref, lowp):
        check_accuracy(f"{name} {part}", got, r64, rlp, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=[DT_NAME[d] for d in DTYPES])
@pytest.mark.parametrize("case", list(CASES))
def test_dense_against_float64(case, dtype, path):
    leaves, causal, kw, do, dlse = _inputs(case, dtype)
    mine = _fwd_bwd(tileattn.attention, leaves, causal, kw, do, dlse)
    assert mine[0].dtype == dtype and mine[1].dtype == torch.float32
    _check(f"{case}-{DT_NAME[dtype]}", mine, *_references(leaves, causal, kw, do, dlse), dtype)


@pytest.mark.parametrize("case", ["full-37x50", "gqa4-causal-33x130", "softcap"])
def test_atomic_backward_against_float64(case, kernels):
    """deterministic=False: the dK/dV kernel adds dQ and each row's dS sum with
    atomics; key counts that are not a multiple of the tile leave keys past N_K
    in the last tile, which must stay out of the sinks' sums."""
    leaves, causal, kw, do, dlse = _inputs(case, torch.float32)
    mine = _fwd_bwd(functools.partial(tileattn.attention, deterministic=False), leaves, causal, kw, do, dlse)
    _check(f"{case}-atomic", mine, *_references(leaves, causal, kw, do, dlse), torch.float32)


@pytest.mark.parametrize("logit_scale", [30.0], ids=["large-logits"])
def test_large_logits(logit_scale, path):
    leaves, causal, kw, do, dlse = _inputs("causal-64x64", torch.float16, logit_scale)
    mine = _fwd_bwd(tileattn.attention, leaves, causal, kw, do, dlse)
    lowp = _fwd_bwd(standard_attention, leaves, causal, kw, do, dlse)
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    ref = _fwd_bwd(standard_attention, leaves64, causal, kw, do.double(), dlse.double())
    _check("large-logits", mine, lowp, ref, torch.float16)


def test_rows_that_see_nothing_return_zero_and_the_sink(path):
    (q, k, v, sinks), *_ = _inputs("causal-rows-see-nothing-70x20", torch.float32)
    out, lse = tileattn.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    blind = 70 - 20   # rows 0..49 see no key (bottom-right causal)
    assert torch.equal(out[:, :, :blind], torch.zeros_like(out[:, :, :blind]))
    # lse = sink up to float32 rounding (the kernels keep it in log2 units)
    torch.testing.assert_close(lse[:, :, :blind], sinks.detach()[None, :, None].expand(1, -1, blind),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=DT_NAME.get)
def test_strided_sinks_equal_dense_ones(dtype, path):
    """sinks given as a strided view (every other entry of a longer tensor)
    give the dense tensor's out, lse and gradients, the sinks' included
    (fp16: the backward that takes the forward's output remainder)."""
    torch.manual_seed(31)
    q, k, v = (torch.randn(1, 4, 37, 16, device=DEVICE).to(dtype) for _ in range(3))
    do = torch.randn(1, 4, 37, 16, device=DEVICE).to(dtype)
    table = torch.randn(8, device=DEVICE)
    results = []
    for strided in (True, False):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        base = (table if strided else table[::2].clone()).requires_grad_()
        sinks = base[::2] if strided else base
        assert sinks.is_contiguous() != strided
        out, lse = tileattn.attention(*leaves, causal=True, sinks=sinks, return_lse=True)
        grads = torch.autograd.grad((out * do).sum() + lse.sum(), [*leaves, base])
        results.append([out, lse, *grads[:3], grads[3][::2] if strided else grads[3]])
    for name, got, want in zip(("out", "lse", "dq", "dk", "dv", "dsinks"), *results):
        assert torch.equal(got, want), name


def test_a_sink_of_minus_inf_on_rows_that_see_nothing(path):
    """A sink of -inf is no sink: rows that see no key return 0 and lse -inf
    (not NaN from exp(-inf + inf)), the dense call's gradients are finite and
    the -inf sink's is 0; decoding from an empty cache likewise."""
    torch.manual_seed(33)
    sinks = torch.tensor([float("-inf"), 0.5], device=DEVICE, requires_grad=True)
    q = torch.randn(1, 2, 5, 16, device=DEVICE, requires_grad=True)
    k, v = (torch.randn(1, 2, 3, 16, device=DEVICE) for _ in range(2))
    out, lse = tileattn.attention(q, k, v, causal=True, sinks=sinks, return_lse=True)
    blind = 5 - 3   # rows 0, 1 see no key (bottom-right causal)
    assert torch.equal(out[:, :, :blind], torch.zeros_like(out[:, :, :blind]))
    assert torch.isneginf(lse[0, 0, :blind]).all() and torch.isfinite(lse[0, 0, blind:]).all()
    torch.testing.assert_close(lse[0, 1, :blind], torch.full((blind,), 0.5, device=DEVICE))
    dq, dsinks = torch.autograd.grad((out * torch.randn_like(out)).sum(), (q, sinks))
    assert torch.isfinite(dq).all() and dsinks[0] == 0 and torch.isfinite(dsinks[1])
    cache = torch.randn(1, 1, 16, 16, device=DEVICE)
    out, lse = tileattn.attention_with_kvcache(torch.randn(1, 2, 1, 16, device=DEVICE), cache, cache.clone(),
                                               torch.zeros(1, dtype=torch.int32, device=DEVICE),
                                               sinks=sinks.detach(), return_lse=True)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isneginf(lse[0, 0]).all() and lse[0, 1].item() == 0.5


def test_varlen_against_float64(path):
    g = torch.Generator().manual_seed(5 + SEED_OFFSET)
    lens_q, lens_k = [5, 0, 33, 17], [9, 4, 33, 1]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(lens_q), 4, 32, generator=g).to(DEVICE, torch.float16).requires_grad_()
    k, v = (torch.randn(sum(lens_k), 2, 32, generator=g).to(DEVICE, torch.float16).requires_grad_()
            for _ in range(2))
    sinks = torch.randn(4, generator=g).to(DEVICE).requires_grad_()
    do = torch.randn(q.shape, generator=g).to(DEVICE, torch.float16)

    def run(fn, tensors, **kw):
        qq, kk, vv, ss = tensors
        out = fn(qq, kk, vv, cu_q, cu_k, causal=True, sinks=ss, **kw)
        return (out,) + torch.autograd.grad((out.to(do.dtype) * do).sum(), tensors)

    def varlen(qq, kk, vv, cq, ck, **kw):
        return tileattn.attention_varlen(qq, kk, vv, cq, ck, max(lens_q), max(lens_k), **kw)
    mine = run(varlen, (q, k, v, sinks))
    lowp = run(standard_attention_varlen, (q, k, v, sinks))
    ref = run(standard_attention_varlen, [t.detach().double().requires_grad_() for t in (q, k, v, sinks)])
    for part, got, r64, rlp in zip(("out", "dq", "dk", "dv", "dsinks"), mine, ref, lowp):
        check_accuracy(f"varlen {part}", got, r64, rlp, torch.float16)


def _paged(cache, page, perm):
    """(B, H, cap, D) as pages of ``page`` tokens in the order ``perm``, and its block table."""
    b, h, cap, d = cache.shape
    blocks = cache.reshape(b, h, cap // page, page, d).permute(0, 2, 1, 3, 4).reshape(-1, h, page, d)
    pages = torch.empty_like(blocks)
    pages[perm] = blocks
    return pages, perm.reshape(b, cap // page).to(torch.int32)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("num_splits", [1, 3], ids=["one-split", "three-splits"])
def test_kvcache_counts_the_sink_once(num_splits, paged, path):
    g = torch.Generator().manual_seed(9 + SEED_OFFSET)
    b, hq, hkv, d, cap = 2, 8, 2, 64, 320
    lens = torch.tensor([0, 257], dtype=torch.int32, device=DEVICE)   # an empty cache: 0 and lse = sink
    k_cache, v_cache = (torch.randn(b, hkv, cap, d, generator=g).to(DEVICE, torch.float16) for _ in range(2))
    q = torch.randn(b, hq, 1, d, generator=g).to(DEVICE, torch.float16)
    sinks = torch.randn(hq, generator=g).to(DEVICE)
    caches, table = (k_cache, v_cache), None
    if paged:   # 32-token pages in shuffled order
        perm = torch.randperm(b * cap // 32, generator=g).to(DEVICE)
        (kp, table), (vp, _) = _paged(k_cache, 32, perm), _paged(v_cache, 32, perm)
        caches = (kp, vp)
    out, lse = tileattn.attention_with_kvcache(q, *caches, lens, sinks=sinks, num_splits=num_splits,
                                               block_table=table, return_lse=True)
    for i, n in enumerate(lens.tolist()):
        kk, vv = k_cache[i:i + 1, :, :n], v_cache[i:i + 1, :, :n]
        ref, ref_lse = standard_attention(q[i:i + 1].double(), kk.double(), vv.double(), causal=True,
                                          sinks=sinks.double(), return_lse=True)
        low, low_lse = standard_attention(q[i:i + 1], kk, vv, causal=True, sinks=sinks, return_lse=True)
        check_accuracy(f"kvcache[{i}] out", out[i:i + 1], ref, low, torch.float16)
        check_accuracy(f"kvcache[{i}] lse", lse[i:i + 1], ref_lse, low_lse, torch.float16)
    torch.testing.assert_close(lse[0, :, 0], sinks, rtol=1e-6, atol=1e-6)


BAD = {   # name: (the sinks, on q's device unless said, the error, its message)
    "not-a-tensor": (lambda: [0.0] * 4, TypeError, "sinks must be a torch.Tensor"),
    "bf16": (lambda: torch.zeros(4, dtype=torch.bfloat16, device=DEVICE), TypeError, "float32"),
    "int": (lambda: torch.zeros(4, dtype=torch.int64, device=DEVICE), TypeError, "float32"),
    "wrong-shape": (lambda: torch.zeros(2, device=DEVICE), ValueError, r"shape \(4,\)"),
    "per-batch": (lambda: torch.zeros(1, 4, device=DEVICE), ValueError, r"shape \(4,\)"),
    "other-device": (lambda: torch.zeros(4, device="meta"), ValueError, "device"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_sinks(case):
    make, exc, msg = BAD[case]
    sinks = make()
    q = torch.randn(1, 4, 8, 16, device=DEVICE)
    with pytest.raises(exc, match=msg):
        tileattn.attention(q, q[:, :2], q[:, :2], sinks=sinks)
    with pytest.raises(exc, match=msg):
        tileattn.attention_varlen(q[0].transpose(0, 1), q[0].transpose(0, 1), q[0].transpose(0, 1),
                                  torch.tensor([0, 8], dtype=torch.int32, device=DEVICE),
                                  torch.tensor([0, 8], dtype=torch.int32, device=DEVICE), 8, 8, sinks=sinks)


def test_bad_sinks_leave_the_cache_unwritten():
    k_cache = torch.zeros(1, 2, 32, 16, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    q = torch.randn(1, 4, 1, 16, device=DEVICE)
    new = torch.ones(1, 2, 1, 16, device=DEVICE)
    with pytest.raises(ValueError, match="sinks must have shape"):
        tileattn.attention_with_kvcache(q, k_cache, v_cache, torch.tensor([3], dtype=torch.int32, device=DEVICE),
                                        k_new=new, v_new=new, sinks=torch.zeros(2, device=DEVICE))
    assert not k_cache.any() and not v_cache.any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_custom_ops_with_sinks_pass_opcheck(dtype, kernels):
    """The dense ops carry the sinks (forward: into the kernels, and with
    remainder=True the output's rounding remainder where it is 16-bit;
    backward: their gradient as the fourth output, from the remainder where
    it is given)."""
    torch.manual_seed(12 + SEED_OFFSET)
    q, k, v = (torch.randn(1, 2, 40, 16, device=DEVICE, dtype=dtype) for _ in range(3))
    sinks = torch.randn(2, device=DEVICE)
    fwd = torch.ops.tileattn.attention_fwd
    for remainder in (False, True):
        torch.library.opcheck(fwd.default, (q, k, v, True, 0.25, -1, -1, 0.0, None, None, True, sinks, remainder))
    out, lse, out_lo = fwd(q, k, v, True, 0.25, -1, -1, 0.0, None, None, True, sinks, True)
    assert out_lo.shape == (out.shape if dtype == torch.float16 else (0,))
    args = (torch.randn_like(out), q, k, v, out, lse, None, True, 0.25, -1, -1, 0.0, None, None, True, sinks)
    torch.library.opcheck(torch.ops.tileattn.attention_bwd.default, args)
    torch.library.opcheck(torch.ops.tileattn.attention_bwd.default, args + (out_lo,))


@triton.jit
def _remainder_round_trip_kernel(X, OUT, CODE, BACK, n, BLOCK: tl.constexpr):
    """kernels/remainder.py on a flat block: the code of X beside OUT, and OUT decoded with it."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    x = tl.load(X + offs, mask=ok, other=0.0)
    out = tl.load(OUT + offs, mask=ok, other=0.0)
    code = remainder_kernels.encode_remainder(x, out)
    tl.store(CODE + offs, code, mask=ok)
    tl.store(BACK + offs, remainder_kernels.decode_remainder(out.to(tl.float32), code,
                                                             OUT.dtype.element_ty.fp_mantissa_width), mask=ok)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_remainder_code_round_trip(dtype):
    """The remainder's int8 code (``tileattn.sinks``): float32 values over
    many binades, their 16-bit rounding, zeros, ties and values below the
    smallest normal: out plus the decoded code within half a step (2^(s-1)
    float32 units in the last place, i.e. ulp(out) / 512 or less) of the
    float32 value where out is normal (a whole step where fp16's code was
    clamped to +-127), never farther than out itself, code 0 where the value
    is 0; code -128 (decoded as out) only in bf16, only for values within
    2^-8 of a unit of the halfway point (ties included), ~0.4 % of random
    values; and the kernels' helper (kernels/remainder.py) bit for bit the
    same where it can run."""
    torch.manual_seed(41 + SEED_OFFSET)
    finfo = torch.finfo(dtype)
    mags = torch.exp2(torch.empty(20000).uniform_(math.log2(finfo.tiny) - 4, math.log2(finfo.max) - 1))
    x = (mags * torch.randn(20000).sign()).float()
    out = x.to(dtype)
    ties = (out.float() + (torch.nextafter(out, torch.full_like(out, float("inf"))).float() - out.float()) / 2)
    x, out = torch.cat([x, ties, torch.zeros(4)]), torch.cat([out, ties.to(dtype), torch.zeros(4, dtype=dtype)])
    code = encode_remainder(x, out)
    assert code.dtype == torch.int8
    assert (code[x == 0] == 0).all()
    back = decode_remainder(out, code)
    err, err_out = (back.double() - x.double()).abs(), (out.double() - x.double()).abs()
    assert (err <= err_out).all(), "the decoded remainder moved a value away"
    mant = 10 if dtype == torch.float16 else 7
    normal = out.float().abs() >= max(finfo.tiny, 2.0 ** (mant + 9 - 127))
    _, exp = torch.frexp(out.float().abs().clamp_min(finfo.tiny))   # |out| = m 2^exp, m in [0.5, 1)
    ulp = torch.ldexp(torch.ones_like(x), exp - 1 - mant)
    _, exp_x = torch.frexp(x.abs().clamp_min(finfo.tiny))   # x's own binade (below out's where out is 2^k)
    ulp_x = torch.ldexp(torch.ones_like(x), exp_x - 1 - mant)
    halfway = code == -128
    if dtype == torch.float16:
        assert not halfway.any(), "an fp16 code of -128"
    else:
        assert halfway[:20000].float().mean() < 0.01, "too many bf16 codes of -128"
        assert (err[halfway] == err_out[halfway]).all()
        assert (err_out[halfway & normal] >= (ulp_x / 2 - ulp_x / 256)[halfway & normal].double()).all(), \
            "code -128 away from the halfway point"
    bound = ulp / 256 * torch.where(code.abs() == 127, 1.0, 0.5)
    worst = (err - bound.double())[normal & ~halfway].max().item()
    assert worst <= 0, f"decoded remainder off by {worst:.3g} beyond its unit"
    assert err[normal & ~halfway].sum() < err_out[normal & ~halfway].sum() / 100
    # the kernels' helper: the same bits (bf16 only where bf16 conversions run: not under the interpreter)
    if dtype == torch.bfloat16 and INTERPRETED:
        return
    x, out = x.to(DEVICE), out.to(DEVICE)
    got_code, got_back = torch.full_like(out, 77, dtype=torch.int8), torch.full_like(x, float("nan"))
    _remainder_round_trip_kernel[(triton.cdiv(x.numel(), 1024),)](X=x, OUT=out, CODE=got_code, BACK=got_back,
                                                                   n=x.numel(), BLOCK=1024)
    assert torch.equal(got_code.cpu(), code), "kernels/remainder.py's code differs from tileattn.sinks'"
    assert torch.equal(got_back.cpu().view(torch.int32), back.view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_remainder_is_the_rounding_of_the_output(dtype, path):
    """attention_fwd(..., remainder=True) with sinks: out_lo is the int8 code
    of what rounding the float32 result to out dropped.  On the kernels out
    is that result rounded, so the code is nonzero and decodes to at most
    half a unit in out's last place; the PyTorch path computes such an out
    from a float32 recomputation, so out plus the decoded remainder is close
    to float64 there (on the kernels P is rounded before P V, so their
    float32 result is not)."""
    (q, k, v, sinks), causal, kw, _, _ = _inputs("gqa4-causal-33x130", dtype)
    q, k, v, sinks = (t.detach() for t in (q, k, v, sinks))
    scale = q.shape[-1] ** -0.5
    out, lse, out_lo = torch.ops.tileattn.attention_fwd(q, k, v, causal, scale, -1, -1, 0.0, None, None, True, sinks,
                                                        True)
    check_remainder(out, out_lo)
    if path == "kernels":
        return
    with tileattn.use_backend("torch"):
        ref = standard_attention(q.double(), k.double(), v.double(), causal=causal, sinks=sinks.double())
    rounded = (out.double() - ref).abs()
    both = (decode_remainder(out, out_lo).double() - ref).abs()
    # on average far closer (a bf16 code of -128, ~0.4 % of values, decodes as out: never farther)
    assert both.mean() < rounded.mean() / 16, (rounded.mean(), both.mean())
    assert both.max() <= rounded.max() * 1.001 + 1e-12, (rounded.max(), both.max())


def test_the_sinks_gradient_takes_the_remainder(kernels, monkeypatch):
    """A 16-bit call with sinks that needs gradients keeps the remainder, and
    its backward then runs the kernels without their dS row sums; a call
    without the remainder (the op called directly) still sums dS, and both
    gradients follow the accuracy rule."""
    from tileattn.launch import attention as launch_attention
    sums = []
    launch = launch_attention._attn_bwd_launch

    def spy(*args, **kwargs):
        sums.append(args[16] if len(args) > 16 else kwargs.get("ds_sum"))
        return launch(*args, **kwargs)
    monkeypatch.setattr(launch_attention, "_attn_bwd_launch", spy)
    leaves, causal, kw, do, dlse = _inputs("full-37x50", torch.float16)
    lowp, ref = _references(leaves, causal, kw, do, dlse)
    mine = _fwd_bwd(tileattn.attention, leaves, causal, kw, do, dlse)
    assert sums and sums[-1] is None, "the kernels summed dS although the forward kept the remainder"
    _check("with-remainder", mine, lowp, ref, torch.float16)
    q, k, v, sinks = (t.detach() for t in leaves)
    scale = q.shape[-1] ** -0.5
    out, lse, out_lo = torch.ops.tileattn.attention_fwd(q, k, v, causal, scale, -1, -1, 0.0, None, None, True, sinks)
    assert out_lo.numel() == 0
    dsinks = torch.ops.tileattn.attention_bwd(do, q, k, v, out, lse, dlse, causal, scale, -1, -1, 0.0, None, None,
                                              True, sinks)[3]
    assert sums[-1] is not None, "without the remainder the kernels must sum dS"
    check_accuracy("without-remainder dsinks", dsinks, ref[5], lowp[5], torch.float16)


def test_compiled_graph_differentiates_the_sinks(path):
    torch.manual_seed(13 + SEED_OFFSET)
    q, k, v = (torch.randn(1, 4, 24, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    sinks = torch.randn(4, device=DEVICE, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v, s: tileattn.attention(q, k, v, causal=True, sinks=s).sum(),
                             fullgraph=True)
    got = torch.autograd.grad(compiled(q, k, v, sinks), (q, k, v, sinks))
    want = torch.autograd.grad(tileattn.attention(q, k, v, causal=True, sinks=sinks).sum(), (q, k, v, sinks))
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), got, want):
        torch.testing.assert_close(a, b, msg=name)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sinks_gradient_from_per_head_sums(causal):
    """The Hopper backward's ``sink_sums`` route, its contract in float64:
    the sums over (batch, row) of p_sink_i sum_j P_ij dP_ij (what its
    kernel adds up, P with the sink in the denominator, dP = dO V^T) and
    dlse give the sinks' gradient that autograd gives, GQA 2, Nq > Nk
    (causal: rows that see no key, whose P is 0)."""
    torch.manual_seed(41 + SEED_OFFSET)
    q = torch.randn(2, 4, 19, 8, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 13, 8, dtype=torch.float64) for _ in range(2))
    sinks = torch.linspace(-1.5, 2.0, 4, dtype=torch.float64, requires_grad=True)
    do, dlse = torch.randn_like(q), torch.randn(2, 4, 19, dtype=torch.float64)
    out, lse = standard_attention(q, k, v, causal=causal, sinks=sinks, return_lse=True)
    want = torch.autograd.grad((out * do).sum() + (lse * dlse).sum(), sinks)[0]
    kk, vv = (t.repeat_interleave(2, dim=1) for t in (k, v))
    s = q @ kk.transpose(-1, -2) * 8 ** -0.5
    if causal:   # bottom-right: row i sees key j iff j <= i + Nk - Nq
        s = s.masked_fill(torch.ones(19, 13, dtype=torch.bool).triu(13 - 19 + 1), float("-inf"))
    p = torch.exp(s - lse.detach()[..., None])
    p_sink = torch.exp(sinks.detach()[None, :, None] - lse.detach())
    sums = (p_sink * (p * (do @ vv.transpose(-1, -2))).sum(-1)).sum(dim=(0, 2))
    got = sink_sums_grad(sinks.detach(), lse.detach(), dlse, sums.float())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["table-sink-sums", "table-row-sums", "deterministic"])
def test_forward_keeps_no_remainder_for_the_sink_sums_route(case, monkeypatch):
    """A differentiated 16-bit call with sinks keeps its output's remainder,
    except where its backward will be the Hopper kernel with the table's
    ``sink_sums`` (the per-head sums need none): the choice that reaches the
    forward, with the Hopper backward's eligibility stubbed (CPU)."""
    import dataclasses

    from tileattn import api, configs, dispatch, ops
    table = configs.HOPPER_BWD[(64, 64)]
    monkeypatch.setitem(configs.HOPPER_BWD, (64, 64), dataclasses.replace(table, sink_sums=case != "table-row-sums"))
    monkeypatch.setattr(dispatch, "hopper_bwd_eligible", lambda *args, **kwargs: True)
    seen = []

    def spy_fwd(*args, **kwargs):
        seen.append(args[-1])
        raise StopIteration
    monkeypatch.setattr(ops, "attention_fwd", spy_fwd)
    monkeypatch.setattr(ops, "eager_attention", spy_fwd)
    q, k, v = (torch.randn(1, 2, 16, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    sinks = torch.zeros(2, requires_grad=True)
    with pytest.raises(StopIteration):
        api.attention(q, k, v, sinks=sinks, deterministic=case == "deterministic")
    assert seen == [case != "table-sink-sums"]
