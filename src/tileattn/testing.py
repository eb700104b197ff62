"""The accuracy rule used by the tests and by ``tileattn check``.

A result is accepted when its error against a float64 reference is at most
twice the error of standard (materialized) attention computed in the same
low precision, plus a tiny floor:

    max|tileattn - ref64| <= 2 * max|standard_lowprec - ref64| + floor

Infinities must sit where the reference has them (lse of rows that see no key
is -inf); a NaN where the reference has none always fails.

The named cases of the dense tests live here too (``Case``, ``run_case``,
``assert_case``), so that every test folder builds them one way.
"""
from __future__ import annotations

import dataclasses
import os
import zlib

import torch

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


def make_tensor(b, h, n, d, dtype, layout, scale=1.0, device=None):
    device = DEVICE if device is None else device
    if layout == "bnhd":
        x = torch.randn(b, n, h, d, device=device).mul_(scale).to(dtype).transpose(1, 2)
    else:
        x = torch.randn(b, h, n, d, device=device).mul_(scale).to(dtype)
    return x.detach().requires_grad_()


def run_case(c: Case, input_scale=1.0, with_lse_grad=True, device=None, deterministic=None):
    """Forward + backward of tileattn (with ``deterministic`` passed on),
    standard attention in c.dtype and in float64."""
    import functools

    import tileattn
    from tileattn.reference import standard_attention
    device = DEVICE if device is None else device
    torch.manual_seed(zlib.crc32(c.id.encode()) + SEED_OFFSET)
    q = make_tensor(c.b, c.hq, c.nq, c.d, c.dtype, c.layout, input_scale, device)
    k = make_tensor(c.b, c.hkv, c.nk, c.d, c.dtype, c.layout, input_scale, device)
    v = make_tensor(c.b, c.hkv, c.nk, c.d, c.dtype, c.layout, device=device)
    do = torch.randn(c.b, c.hq, c.nq, c.d, device=device).to(c.dtype)
    dlse = torch.randn(c.b, c.hq, c.nq, device=device) if with_lse_grad else None

    def fwd_bwd(fn, qq, kk, vv, g):
        out, lse = fn(qq, kk, vv, causal=c.causal, return_lse=True)
        loss = (out.to(g.dtype) * g).sum()
        if dlse is not None:
            # rows that see no key have lse = -inf: leave them out of the loss
            loss = loss + (torch.where(torch.isinf(lse), torch.zeros_like(lse), lse) * dlse.to(lse.dtype)).sum()
        grads = torch.autograd.grad(loss, (qq, kk, vv))
        return (out, lse) + grads

    mine = fwd_bwd(functools.partial(tileattn.attention, deterministic=deterministic), q, k, v, do)
    lowp = fwd_bwd(standard_attention, q, k, v, do)
    with tileattn.use_backend("torch"):
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref = fwd_bwd(standard_attention, q64, k64, v64, do.double())
    return mine, lowp, ref


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
