"""The accuracy rule used by the tests and by ``tileattn check``.

A result is accepted when its error against a float64 reference is at most
twice the error of standard (materialized) attention computed in the same
low precision, plus a tiny floor:

    max|tileattn - ref64| <= 2 * max|standard_lowprec - ref64| + floor

Infinities must sit where the reference has them (lse of rows that see no key
is -inf); a NaN where the reference has none always fails.

The named cases of the tests live here too, so that every test folder builds
them one way: dense batches (``Case``, ``run_case``, ``assert_case``), the
variants on dense batches (``VariantCase``, ``assert_variant_case``) and
packed sequences (``VarlenCase``, ``assert_varlen_case``); the decoding
tests' cases and their cache builders are ``tileattn.testing_decode``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import zlib

import torch

from .block_mask import BLOCK_K, BLOCK_Q, block_mask_from_fn
from .reference import (alibi_bias, block_mask_dense, causal_mask, standard_attention, varlen_alibi_bias, varlen_mask,
                        window_mask)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# TILEATTN_TEST_SEED shifts every case's seed (fresh inputs for a repeated run)
SEED_OFFSET = int(os.environ.get("TILEATTN_TEST_SEED", "0"))
DT_NAME = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}

# Absolute floors per input dtype: a few units in the last place of an O(1) value.
FLOOR = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-4, torch.bfloat16: 1e-3}


def max_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest absolute difference over entries where ``ref`` is finite; inf if
    the non-finite entries of ``got`` and ``ref`` disagree."""
    got = got.detach().to(torch.float64).cpu()
    ref = ref.detach().to(torch.float64).cpu()
    if got.shape != ref.shape:
        raise AssertionError(f"shape {tuple(got.shape)} != reference shape {tuple(ref.shape)}")
    finite = torch.isfinite(ref)
    if not torch.equal(got[~finite].nan_to_num(nan=0.5), ref[~finite].nan_to_num(nan=0.5)):
        return float("inf")
    if finite.any():
        diff = (got[finite] - ref[finite]).abs()
        if torch.isnan(diff).any():
            return float("inf")
        return float(diff.max())
    return 0.0


def check_remainder(out: torch.Tensor, out_lo: torch.Tensor) -> None:
    """``out_lo`` is the int8 code of what rounding a float32 result to
    ``out`` dropped (the forward's ``remainder=True`` output,
    ``tileattn.sinks``): in ``out``'s layout, no row and no column of the
    last two dimensions mostly -128 (the launchers' poison, which a bf16
    code takes for ~0.4 % of values), not all zero, and out plus the
    decoded remainder rounds back to out at every element (|remainder| <=
    half a unit in out's last place)."""
    from .sinks import REMAINDER_DTYPE, decode_remainder
    assert out_lo.dtype == REMAINDER_DTYPE and out_lo.shape == out.shape and out_lo.stride() == out.stride()
    poison = (out_lo == -128).float()
    if out.dtype == torch.float16:
        assert not poison.any(), "an fp16 remainder code of -128: an element the kernel did not write"
    for dim in (-1, -2):
        if out_lo.shape[dim] >= 8:
            worst = poison.mean(dim).max().item()
            assert worst <= 0.5, f"a {'row' if dim == -1 else 'column'} of remainder codes {worst:.0%} -128: " \
                                 "elements the kernel did not write"
    assert (out_lo != 0).any(), "the remainder is all zero"
    full = decode_remainder(out, out_lo)
    moved = (full.to(out.dtype) != out).sum().item()
    assert moved == 0, f"{moved} elements whose remainder is more than half a unit in out's last place"


def _worst_index(got, ref):
    diff = (got.detach().double().cpu() - ref.detach().double().cpu()).abs().nan_to_num(nan=float("inf"))
    diff = torch.where(torch.isfinite(ref.detach().double().cpu()), diff, torch.zeros_like(diff))
    idx = int(diff.argmax())
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(idx), diff.shape))


def check_accuracy(name: str, got: torch.Tensor, ref64: torch.Tensor, ref_lowp: torch.Tensor,
                   dtype: torch.dtype, floor: float | None = None, factor: float = 2.0) -> tuple[float, float]:
    """Assert the accuracy rule for one tensor; return (error, allowed)."""
    floor = FLOOR[dtype] if floor is None else floor
    err = max_error(got, ref64)
    base = max_error(ref_lowp, ref64)
    if base == float("inf"):  # the low-precision baseline itself broke (e.g. overflow)
        base = 0.0
    allowed = factor * base + floor
    if not err <= allowed:
        where = _worst_index(got, ref64) if err != float("inf") else "non-finite mismatch"
        raise AssertionError(f"{name}: error {err:.3e} exceeds {factor:g} x {base:.3e} + {floor:.0e} = {allowed:.3e} "
                             f"(worst at {where})")
    return err, allowed


# ---------------------------------------------------------------------------
# Named cases of the dense tests
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    b: int
    hq: int
    hkv: int
    nq: int
    nk: int
    d: int
    causal: bool
    dtype: torch.dtype
    layout: str = "bhnd"  # "bnhd": a (B, N, H, D) tensor transposed to (B, H, N, D)

    @property
    def id(self) -> str:
        return (f"B{self.b}-H{self.hq}x{self.hkv}-Nq{self.nq}-Nk{self.nk}-D{self.d}-"
                f"{'causal' if self.causal else 'full'}-{DT_NAME[self.dtype]}-{self.layout}")


def variant_id_parts(window, softcap, alibi) -> list[str]:
    """The id parts of a case's window, softcap and ALiBi (none where off)."""
    parts = []
    if window is not None:
        parts.append(f"win{window[0]}_{window[1]}")
    if softcap is not None:
        parts.append(f"cap{softcap:g}")
    if alibi:
        parts.append(f"alibi-{alibi}")
    return parts


def case_number(case_id) -> int:
    """A number of a case's id that is the same in every process (``hash`` of a
    str is not: it would draw other inputs on every run); ids that are not
    strings count by their ``repr``."""
    return zlib.crc32((case_id if isinstance(case_id, str) else repr(case_id)).encode())


def seed_case(case_id: str) -> None:
    """Seed torch from a case's id (and TILEATTN_TEST_SEED)."""
    torch.manual_seed(case_number(case_id) + SEED_OFFSET)


def forbidden(message: str = "a kernel was launched for bad input"):
    """A stand-in for a function that must not run: it raises AssertionError."""
    def call(*args, **kwargs):
        raise AssertionError(message)
    return call


def make_tensor(b, h, n, d, dtype, layout, scale=1.0, device=None):
    device = DEVICE if device is None else device
    if layout == "bnhd":
        x = torch.randn(b, n, h, d, device=device).mul_(scale).to(dtype).transpose(1, 2)
    else:
        x = torch.randn(b, h, n, d, device=device).mul_(scale).to(dtype)
    return x.detach().requires_grad_()


def output_loss(out, lse, do, dlse=None):
    """sum(out * do) + sum(lse * dlse): a loss whose gradients reach every
    output (rows that see no key have lse = -inf and are left out)."""
    loss = (out.to(do.dtype) * do).sum()
    if dlse is None:
        return loss
    return loss + (torch.where(torch.isinf(lse), torch.zeros_like(lse), lse) * dlse.to(lse.dtype)).sum()


def _references(ref, q, k, v, do):
    """``ref(q, k, v, do)`` in the inputs' precision, and in float64 on the
    PyTorch path."""
    import tileattn
    lowp = ref(q, k, v, do)
    with tileattn.use_backend("torch"):
        ref64 = ref(*(t.detach().double().requires_grad_() for t in (q, k, v)), do.double())
    return lowp, ref64


def run_case(c: Case, input_scale=1.0, with_lse_grad=True, device=None, deterministic=None):
    """Forward + backward of tileattn (with ``deterministic`` passed on),
    standard attention in c.dtype and in float64."""
    import functools

    import tileattn
    device = DEVICE if device is None else device
    seed_case(c.id)
    q = make_tensor(c.b, c.hq, c.nq, c.d, c.dtype, c.layout, input_scale, device)
    k = make_tensor(c.b, c.hkv, c.nk, c.d, c.dtype, c.layout, input_scale, device)
    v = make_tensor(c.b, c.hkv, c.nk, c.d, c.dtype, c.layout, device=device)
    do = torch.randn(c.b, c.hq, c.nq, c.d, device=device).to(c.dtype)
    dlse = torch.randn(c.b, c.hq, c.nq, device=device) if with_lse_grad else None

    def fwd_bwd(fn, qq, kk, vv, g):
        out, lse = fn(qq, kk, vv, causal=c.causal, return_lse=True)
        grads = torch.autograd.grad(output_loss(out, lse, g, dlse), (qq, kk, vv))
        return (out, lse) + grads

    mine = fwd_bwd(functools.partial(tileattn.attention, deterministic=deterministic), q, k, v, do)
    return (mine,) + _references(functools.partial(fwd_bwd, standard_attention), q, k, v, do)


def assert_case(c: Case, logit_floor=False, **kw):
    mine, lowp, ref = run_case(c, **kw)
    assert mine[0].dtype == c.dtype and mine[0].shape == (c.b, c.hq, c.nq, c.d)
    assert mine[1].dtype == torch.float32 and mine[1].shape == (c.b, c.hq, c.nq)
    smax = None
    if logit_floor:
        # float32 with scores near 1e3: P is recomputed from the saved lse, and
        # an exponent of size |s| carries |s| * 2^-24 of rounding that no
        # float32 kernel can avoid; the floor grows with it
        lse = ref[1][torch.isfinite(ref[1])]
        smax = float(lse.abs().max())
    for name, got, r64, rlp in zip(("out", "lse", "dq", "dk", "dv"), mine, ref, lowp):
        floor = None
        if smax is not None:
            floor = 4 * 2.0**-24 * smax * float(r64[torch.isfinite(r64)].abs().max())
        check_accuracy(f"{c.id} {name}", got, r64, rlp, c.dtype, floor=floor)


def assert_compiled_matches(fn, inputs, **compile_kwargs):
    """``torch.compile(fn, fullgraph=True)`` gives the loss and the gradients
    (w.r.t. ``inputs``) that ``fn`` run eagerly gives, within 1e-5."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, **compile_kwargs)
    loss = compiled(*inputs)
    grads = torch.autograd.grad(loss, inputs)
    ref_loss = fn(*inputs)
    ref_grads = torch.autograd.grad(ref_loss, inputs)
    assert torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, rtol=1e-5, atol=1e-5)


def _check_outputs(case_id, mine, ref64, lowp, dtype):
    for name, got, r64, rlp in zip(("out", "lse", "dq", "dk", "dv"), mine, ref64, lowp):
        check_accuracy(f"{case_id} {name}", got, r64, rlp, dtype)


# ---------------------------------------------------------------------------
# Named cases of the variants: window, softcap, ALiBi, block-sparse layouts
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class VariantCase:
    b: int
    hq: int
    hkv: int
    nq: int
    nk: int
    d: int
    dtype: torch.dtype
    causal: bool = False
    window: tuple | None = None
    softcap: float | None = None
    alibi: str | None = None      # "h": slopes (Hq,); "bh": slopes (B, Hq)
    blocks: str | None = None     # "rand-B1": random (B, 1, ...) layout, "rand-1H", "rand-BH", "band"
    block_density: float = 0.5

    @property
    def id(self) -> str:
        parts = [f"B{self.b}-H{self.hq}x{self.hkv}-Nq{self.nq}-Nk{self.nk}-D{self.d}-{DT_NAME[self.dtype]}"]
        if self.causal:
            parts.append("causal")
        parts += variant_id_parts(self.window, self.softcap, self.alibi)
        if self.blocks:
            parts.append(f"blocks-{self.blocks}" + (f"{self.block_density:g}" if self.blocks.startswith("rand")
                                                    else ""))
        return "-".join(parts)


def variant_layout(c: VariantCase):
    """The block layout of a case (None without block sparsity)."""
    nqb, nkb = -(-c.nq // BLOCK_Q), -(-c.nk // BLOCK_K)
    if c.blocks is None:
        return None
    if c.blocks == "band":
        # keys within 150 positions before the aligned diagonal
        diag = c.nk - c.nq
        return block_mask_from_fn(lambda b, h, i, j: (j <= i + diag) & (j >= i + diag - 150), None, c.hq,
                                  c.nq, c.nk, device=DEVICE).mask
    shape = {"rand-B1": (c.b, 1, nqb, nkb), "rand-1H": (1, c.hq, nqb, nkb), "rand-BH": (c.b, c.hq, nqb, nkb)}
    return torch.rand(shape[c.blocks], device=DEVICE) < c.block_density


def variant_inputs(c: VariantCase, device=DEVICE):
    """q, k, v, the output and lse gradients, the ALiBi slopes and the block
    layout of a case (slopes and layout None where off)."""
    seed_case(c.id)
    q = torch.randn(c.b, c.hq, c.nq, c.d, device=device).to(c.dtype).requires_grad_()
    k = torch.randn(c.b, c.hkv, c.nk, c.d, device=device).to(c.dtype).requires_grad_()
    v = torch.randn(c.b, c.hkv, c.nk, c.d, device=device).to(c.dtype).requires_grad_()
    do = torch.randn(c.b, c.hq, c.nq, c.d, device=device).to(c.dtype)
    dlse = torch.randn(c.b, c.hq, c.nq, device=device)
    slopes = None
    if c.alibi == "h":
        slopes = torch.rand(c.hq, device=device) * 0.5 + 0.01
    elif c.alibi == "bh":
        slopes = torch.rand(c.b, c.hq, device=device) * 0.5 + 0.01
    return q, k, v, do, dlse, slopes, variant_layout(c)


def variant_mask(c: VariantCase, layout):
    """Hidden pairs of a case, written out token by token."""
    hidden = torch.zeros(c.nq, c.nk, dtype=torch.bool, device=DEVICE)
    if c.causal:
        hidden |= causal_mask(c.nq, c.nk, DEVICE)
    if c.window is not None:
        hidden |= window_mask(c.nq, c.nk, c.window, DEVICE)
    if layout is not None:
        hidden = hidden | block_mask_dense(layout, c.nq, c.nk)
    return hidden


def run_variant_case(c: VariantCase, deterministic=None):
    """Forward + backward of tileattn, of standard attention with the mask and
    bias written out in c.dtype, and of the same in float64."""
    import tileattn
    q, k, v, do, dlse, slopes, layout = variant_inputs(c)
    out, lse = tileattn.attention(q, k, v, causal=c.causal, window=c.window, softcap=c.softcap,
                                  alibi_slopes=slopes, block_mask=layout, return_lse=True,
                                  deterministic=deterministic)
    mine = (out, lse) + torch.autograd.grad(output_loss(out, lse, do, dlse), (q, k, v))
    mask = variant_mask(c, layout)

    def ref(qq, kk, vv, g):
        bias = None if slopes is None else alibi_bias(slopes.to(qq.dtype), c.nq, c.nk)
        o, l = standard_attention(qq, kk, vv, softcap=c.softcap, mask=mask, bias=bias, return_lse=True)
        return (o, l) + torch.autograd.grad(output_loss(o, l, g, dlse), (qq, kk, vv))

    return (mine,) + _references(ref, q, k, v, do)


def assert_variant_case(c: VariantCase, deterministic=None):
    mine, lowp, ref64 = run_variant_case(c, deterministic)
    assert mine[0].shape == (c.b, c.hq, c.nq, c.d) and mine[0].dtype == c.dtype
    assert mine[1].shape == (c.b, c.hq, c.nq) and mine[1].dtype == torch.float32
    _check_outputs(c.id, mine, ref64, lowp, c.dtype)


# ---------------------------------------------------------------------------
# Named cases of packed sequences (attention_varlen)
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class VarlenCase:
    lens_q: tuple
    lens_k: tuple | None   # None: same as lens_q
    hq: int
    hkv: int
    d: int
    dtype: torch.dtype
    causal: bool = False
    window: tuple | None = None
    softcap: float | None = None
    alibi: str | None = None
    layout: str = "packed"  # "strided": q/k/v slices of a wider buffer

    @property
    def lk(self):
        return self.lens_q if self.lens_k is None else self.lens_k

    @property
    def id(self) -> str:
        lq = "_".join(map(str, self.lens_q))
        parts = [f"q{lq}" + ("" if self.lens_k is None else "-k" + "_".join(map(str, self.lens_k))),
                 f"H{self.hq}x{self.hkv}-D{self.d}-{DT_NAME[self.dtype]}"]
        if self.causal:
            parts.append("causal")
        parts += variant_id_parts(self.window, self.softcap, self.alibi)
        if self.layout != "packed":
            parts.append(self.layout)
        return "-".join(parts)


def cu_seqlens(lens, device=DEVICE):
    """The int32 offsets [0, l0, l0 + l1, ...] of packed sequences."""
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=device)


def _packed(total, h, d, dtype, layout):
    if layout == "strided":  # every other head of a buffer with twice the heads
        return torch.randn(total, 2 * h, d, device=DEVICE).to(dtype)[:, ::2].requires_grad_()
    return torch.randn(total, h, d, device=DEVICE).to(dtype).requires_grad_()


def run_varlen_case(c: VarlenCase, deterministic=None):
    """Forward + backward of ``attention_varlen``, of standard attention over
    the packed tokens with the mask and bias written out in c.dtype, and of
    the same in float64."""
    import tileattn
    seed_case(c.id)
    tq, tk = sum(c.lens_q), sum(c.lk)
    q = _packed(tq, c.hq, c.d, c.dtype, c.layout)
    k = _packed(tk, c.hkv, c.d, c.dtype, c.layout)
    v = _packed(tk, c.hkv, c.d, c.dtype, c.layout)
    do = torch.randn(tq, c.hq, c.d, device=DEVICE).to(c.dtype)
    dlse = torch.randn(c.hq, tq, device=DEVICE)
    nb = len(c.lens_q)
    slopes = {None: None, "h": torch.rand(c.hq, device=DEVICE) * 0.5 + 0.01,
              "bh": torch.rand(nb, c.hq, device=DEVICE) * 0.5 + 0.01}[c.alibi]
    cu_q, cu_k = cu_seqlens(c.lens_q), cu_seqlens(c.lk)
    out, lse = tileattn.attention_varlen(q, k, v, cu_q, cu_k, max(c.lens_q), max(c.lk), causal=c.causal,
                                         window=c.window, softcap=c.softcap, alibi_slopes=slopes, return_lse=True,
                                         deterministic=deterministic)
    mine = (out, lse) + torch.autograd.grad(output_loss(out, lse, do, dlse), (q, k, v))
    mask = varlen_mask(cu_q, cu_k, causal=c.causal, window=c.window, device=DEVICE)

    def ref(qq, kk, vv, g):
        bias = None if slopes is None else varlen_alibi_bias(slopes.to(qq.dtype), cu_q, cu_k)[None]
        o, l = standard_attention(qq.transpose(0, 1)[None], kk.transpose(0, 1)[None], vv.transpose(0, 1)[None],
                                  softcap=c.softcap, mask=mask, bias=bias, return_lse=True)
        o, l = o[0].transpose(0, 1), l[0]
        return (o, l) + torch.autograd.grad(output_loss(o, l, g, dlse), (qq, kk, vv))

    return (mine,) + _references(ref, q, k, v, do)


def assert_varlen_case(c: VarlenCase, deterministic=None):
    mine, lowp, ref64 = run_varlen_case(c, deterministic)
    tq = sum(c.lens_q)
    assert mine[0].shape == (tq, c.hq, c.d) and mine[1].shape == (c.hq, tq)
    assert mine[0].dtype == c.dtype and mine[1].dtype == torch.float32
    _check_outputs(c.id, mine, ref64, lowp, c.dtype)


# ---------------------------------------------------------------------------
# Shapes of the Hopper kernels' tests (forward and backward share them)
# ---------------------------------------------------------------------------
HOPPER_CASES = {
    # name: (b, hq, hkv, n_q, n_k, d)
    "square-1000": (2, 4, 4, 1000, 1000, 128),
    "odd-1": (1, 2, 2, 1, 1, 128),
    "odd-17x129": (1, 2, 2, 17, 129, 64),
    "odd-333": (2, 3, 3, 333, 333, 64),
    "nq<nk-129x1000": (1, 4, 4, 129, 1000, 128),
    "nq>nk-1000x129": (1, 4, 4, 1000, 129, 128),   # causal: the first rows see no key
    "gqa4-777": (2, 8, 2, 777, 777, 128),
    "gqa8-512": (1, 16, 2, 512, 512, 64),
    "tiles-even-2048": (1, 2, 2, 2048, 2048, 128),
}


@contextlib.contextmanager
def counting_calls(module, name: str, plans: bool = False):
    """Replace ``module.name`` by a wrapper for the block's duration and yield a
    list that gets one entry per call, its (args, kwargs) (e.g. which
    launches a dispatch takes, and with what).  Launch plans are off for the
    block (a replayed plan would skip the launchers it counts) unless
    ``plans``: to count the calls a plan saved."""
    from .launch import runtime
    calls = []
    real, plans_on = getattr(module, name), runtime.PLANS_ON

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)
    setattr(module, name, spy)
    runtime.PLANS_ON = plans_on and plans
    try:
        yield calls
    finally:
        setattr(module, name, real)
        runtime.PLANS_ON = plans_on


def hopper_inputs(b, hq, hkv, n_q, n_k, d, dtype, seed, layout="bhnd", logit_scale=1.0, dv=None):
    """(q, k, v, do) on the GPU; ``layout="bnhd"``: (B, N, H, D) storage
    viewed as (B, H, N, D); q scaled by ``logit_scale``; v and do ``dv``
    wide (default ``d``)."""
    g = torch.Generator(device="cuda").manual_seed(seed + SEED_OFFSET)
    dv = d if dv is None else dv

    def make(h, n, width):
        if layout == "bnhd":
            return torch.randn(b, n, h, width, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
        return torch.randn(b, h, n, width, device="cuda", dtype=dtype, generator=g)
    return make(hq, n_q, d) * logit_scale, make(hkv, n_k, d), make(hkv, n_k, dv), make(hq, n_q, dv)


# ---------------------------------------------------------------------------
# Token batches for the transformers tests (tests/integration)
# ---------------------------------------------------------------------------
def token_ids(*shape, seed: int, vocab: int, device=None) -> torch.Tensor:
    """Random token ids in [3, vocab) (0..2 left to special tokens), seeded."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, shape, generator=g).to(device or DEVICE)


def left_padding(batch: int, length: int, pads=(5, 0, 2), device=None) -> torch.Tensor:
    """(batch, length) attention mask: row r starts with ``pads[r]`` zeros."""
    mask = torch.ones(batch, length, dtype=torch.long)
    for row, p in enumerate(pads[:batch]):
        mask[row, :p] = 0
    return mask.to(device or DEVICE)
