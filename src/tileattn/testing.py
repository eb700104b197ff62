"""The accuracy rule used by the tests and by ``tileattn check``.

A result is accepted when its error against a float64 reference is at most
twice the error of standard (materialized) attention computed in the same
low precision, plus a tiny floor:

    max|tileattn - ref64| <= 2 * max|standard_lowprec - ref64| + floor

Infinities must sit where the reference has them (lse of rows that see no key
is -inf); a NaN where the reference has none always fails.
"""
from __future__ import annotations

import torch

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
