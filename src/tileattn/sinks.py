"""Attention sinks: one extra logit per head in every row's softmax
denominator (gpt-oss), as plain tensor math on a finished (out, lse).

The sink carries no value, so it only rescales each row of a result computed
without it, and its gradient needs only the backward's per-row
delta = rowsum(dO o O) - dlse and the lse:

* :func:`with_sinks` folds the sinks into (out, lse) -- the path of every
  call whose kernel does not start its rows from the sink itself
  (decoding, packed sequences, ring attention, the CPU path); autograd
  differentiates it where gradients are wanted;
* :func:`sink_grad` is the sinks' gradient from a per-row delta (the
  dense ops' PyTorch path), :func:`kernel_sink_grad` the same from the
  backward kernels' dS row sums (where the forward kept the output's
  rounding remainder, the backward's preprocess kernel forms it instead).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["with_sinks", "sink_grad", "kernel_sink_grad", "sink_sums_grad", "encode_remainder", "decode_remainder",
           "remainder_like"]

# The output's rounding remainder O - round(O), which a forward whose sinks
# will be differentiated keeps for the backward, is stored as one int8 a
# value: the distance between O's float32 bits and those of its 16-bit
# rounding out (as float32), in steps of 2^s float32 units in the last place,
# s = 15 - out's mantissa bits (8 for bf16, 5 for fp16),
#     c = (bits(O) - bits(out) + 2^(s-1)) >> s,   O ~ float32 with bits bits(out) + c * 2^s.
# Rounding to nearest keeps |bits(O) - bits(out)| <= 2^(s+7), so c lies in
# [-128, 128] and holds 8 more bits of O (2^-16 relative in bf16, 2^-19 in
# fp16) for half the bytes of a 16-bit remainder; integer steps cross
# binades as the bits do.  The stored code:
# - bf16: c modulo 256, which is byte 1 of bits(O) + 2^7 (bf16 rounding drops
#   exactly the low 16 bits, so bits(out) does not enter): two integer
#   instructions a value in the kernels' epilogue.  c = +-128 (O within
#   2^-8 of a unit of the halfway point, ~0.4 % of values) both read -128;
# - fp16: c clamped to +-127 (fp16 subnormals and overflow need the clamp:
#   there the decoded value lies between out and O).
# Code -128 decodes as out itself.  The kernels compute the same bits
# (kernels/remainder.py, which the Gluon forward calls too).
REMAINDER_DTYPE = torch.int8


def _shift(dtype: torch.dtype) -> int:
    if dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"out: the remainder is kept for float16 or bfloat16 outputs, not {dtype}")
    return 15 - (10 if dtype == torch.float16 else 7)


def encode_remainder(out32: Tensor, out: Tensor) -> Tensor:
    """The int8 code of ``out32`` beside ``out`` (``out32`` rounded to 16
    bits to nearest): the difference of their float32 bit patterns in steps
    of 2^s units in the last place (s = 8 for bf16, 5 for fp16), rounded to
    nearest (ties up); modulo 256 for bf16 (byte 1 of bits(out32) + 2^7),
    clamped to +-127 for fp16."""
    s = _shift(out.dtype)
    bits = out32.float().view(torch.int32)
    if out.dtype == torch.bfloat16:
        c = (bits + (1 << (s - 1))) >> s
        return (((c + 128) & 0xFF) - 128).to(REMAINDER_DTYPE)   # the low byte, signed
    c = (bits - out.float().view(torch.int32) + (1 << (s - 1))) >> s
    return c.clamp(-127, 127).to(REMAINDER_DTYPE)


def remainder_like(out: Tensor) -> Tensor:
    """An empty int8 remainder code for ``out``, in ``out``'s layout."""
    return torch.empty_like(out, dtype=REMAINDER_DTYPE)


def decode_remainder(out: Tensor, code: Tensor) -> Tensor:
    """float32 with bits bits(``out``) + ``code`` * 2^s (code -128 as 0):
    the forward's float32 output to ~2^-16 relative (bf16), from ``out``
    and its remainder's code."""
    s = _shift(out.dtype)
    c = code.to(torch.int32)
    c = torch.where(c == -128, 0, c)
    return (out.float().view(torch.int32) + (c << s)).view(torch.float32)


def with_sinks(out: Tensor, lse: Tensor, sinks: Optional[Tensor], head_dim: int = 1) -> tuple[Tensor, Tensor]:
    """(out, lse) of attention with one extra logit per head in every row's
    softmax denominator, from (out, lse) of the same call without it:

        lse' = log(exp(lse) + exp(sink)),   out' = out * exp(lse - lse').

    The sink carries no value, so it only rescales each row; a row that saw no
    key (out 0, lse -inf) gets out 0 and lse' = sink.  Plain torch operations,
    so autograd differentiates them: the kernels' backward then receives the
    gradients of the sink-free (out, lse), and ``sinks`` its own,
    d sink_h = -sum_i exp(sink_h - lse'_i) * (rowsum(dO'_i * out'_i) - dlse'_i).
    ``head_dim``: the axis of ``lse`` that indexes heads (1 for (B, Hq, Nq),
    0 for packed (Hq, total)); ``out`` has the same leading axes as ``lse``
    (packed: transposed, (total, Hq, Dv))."""
    if sinks is None:
        return out, lse
    shape = [1] * lse.dim()
    shape[head_dim] = -1
    # a sink of -inf (no sink) as the lowest finite logit: a row that saw no key
    # then gets ratio exp(-inf - lowest) = 0, not exp(-inf + inf) = NaN, and no
    # NaN gradient; its lse' is put back to -inf below
    lowest = torch.finfo(lse.dtype).min
    sink = sinks.to(lse.dtype).clamp(min=lowest).reshape(shape)
    lse_s = torch.logaddexp(lse, sink)
    ratio = torch.exp(lse - lse_s)
    lse_s = torch.where(lse_s == lowest, lse, lse_s)
    if head_dim == 0:   # packed: out (total, Hq, Dv) against lse (Hq, total)
        ratio_rows = ratio.transpose(0, 1)
    else:
        ratio_rows = ratio
    scaled = out.to(ratio.dtype) * ratio_rows[..., None]
    return scaled.to(out.dtype), lse_s


def _p_sink(sinks: Tensor, lse: Tensor) -> Tensor:
    """Each row's sink probability exp(sink_h - lse_i), ``lse`` (B, Hq, N)
    including the sinks; 0 where lse is -inf (a row that saw no key beside a
    sink of -inf: no probability at all, as the kernels take it)."""
    return torch.exp(sinks.to(lse.dtype)[None, :, None] - lse).masked_fill(lse == float("-inf"), 0.0)


def sink_grad(sinks: Tensor, lse: Tensor, delta: Tensor) -> Tensor:
    """d sink_h = -sum over (b, i) of exp(sink_h - lse_bhi) * delta_bhi: the
    sink's probability in each row times the row's rowsum(dO o O) - dlse
    (``delta``); ``lse`` (B, Hq, N) includes the sinks.  In ``sinks``'s dtype."""
    p_sink = _p_sink(sinks, lse)
    return (-(p_sink * delta.to(lse.dtype)).sum(dim=(0, 2))).to(sinks.dtype)


def kernel_sink_grad(sinks: Tensor, lse: Tensor, dlse: Optional[Tensor], delta: Optional[Tensor],
                     ds_sum: Optional[Tensor]) -> Tensor:
    """d sink_h = -sum_i p_sink_i (sum_j P_ij dP_ij - dlse_i), p_sink_i =
    exp(sink_h - lse_i), from the backward kernels' per-row results when the
    forward kept no rounding remainder (with one, the preprocess kernel forms
    the gradient itself).  The kernels summed each row's dS_ij = P_ij (dP_ij
    - delta_i) over the keys (``ds_sum``) with the delta they used, so
    sum_j P_ij dP_ij = ds_sum_i + delta_i (1 - p_sink_i) exactly, as sum_j
    P_ij = 1 - p_sink_i: products of float32 tiles, where the rowsum(dO o O)
    of the rounded output would lose digits.  ``ds_sum`` is None when no key
    was visited (P = 0)."""
    lse = lse.float()
    p_dp = torch.zeros_like(lse)
    if ds_sum is not None:
        p_dp += ds_sum + delta * (1.0 - _p_sink(sinks.float(), lse))
    if dlse is not None:
        p_dp -= dlse.float()
    return sink_grad(sinks.float(), lse, p_dp).to(sinks.dtype)


def sink_sums_grad(sinks: Tensor, lse: Tensor, dlse: Optional[Tensor], sink_sums: Tensor) -> Tensor:
    """d sink_h = -sum_i p_sink_i (sum_j P_ij dP_ij - dlse_i) from the
    per-head sums sum_i p_sink_i sum_j P_ij dP_ij (``sink_sums``, float32
    (Hq,), over every batch element and row: the Hopper backward's
    ``sink_sums`` route, formed from float32 product tiles, so no
    rowsum(dO o O) of a rounded output is needed), p_sink_i =
    exp(sink_h - lse_i); the dlse term is added here."""
    grad = -sink_sums.float()
    if dlse is not None:
        grad = grad + (_p_sink(sinks.float(), lse.float()) * dlse.float()).sum(dim=(0, 2))
    return grad.to(sinks.dtype)
