"""Autograd: the custom ops and the eager fast path, both over the same launchers.

``tileattn::attention_fwd`` / ``attention_bwd`` (dense batches) and
``tileattn::attention_varlen_fwd`` / ``attention_varlen_bwd`` (packed
sequences) are registered with ``torch.library.custom_op`` (with fake
implementations for tracing) so that ``torch.compile(fullgraph=True)`` sees
them as single opaque nodes.  Each op dispatches to the Triton kernels
(``launch/``) for tensors on a GPU, and to the CPU path (``cpu.py``:
torch's fused CPU kernel where its semantics match, the pure-PyTorch tiled
implementation otherwise) for the rest.

The variants travel as trailing arguments with neutral defaults
(``window_left = window_right = -1``: unbounded; ``softcap = 0``: none;
``alibi_slopes``, ``block_mask``: None), so a plain call keeps the schema's
first five arguments.  Then comes ``deterministic`` (default True): False
lets the kernels' backward add dQ with float32 atomics (see
``launch.attn_bwd``).  The forward ops take it only to hand it to their
backward; the pure-PyTorch path ignores it (it is deterministic anyway).
Last, on the dense ops, ``sinks`` (Hq,) or None: the kernels start every
row from its head's sink, and ``attention_bwd`` returns the sinks' gradient
as a fourth output (empty without sinks).  That gradient sums
delta = rowsum(dO o O) - dlse over every row (:func:`tileattn.sinks.sink_grad`),
which the 16-bit output rounds too coarsely, so ``attention_fwd(...,
remainder=True)`` with sinks on fp16/bf16 inputs also returns the output's
rounding remainder O - out (its third output, empty otherwise;
:func:`keeps_remainder`), the autograd formula saves it, and
``attention_bwd(..., out_lo=)`` takes delta from out + out_lo.  Without it
the kernels sum each row's dS over the keys, from which
``tileattn.sinks.kernel_sink_grad`` gets the exact sum_j P_ij dP_ij, and the
PyTorch path recomputes O in float32.

The eager fast path.  A ``torch.library`` custom op is what
``torch.compile``, fake tensors and ``opcheck`` need, but in plain eager
execution the dispatcher glue around a Python custom op (alias checks, the
generated autograd function, re-dispatch) costs far more host time than the
launch itself: measured on the H200 host, ~0.9 ms of a 1.5 ms
forward+backward step (docs/perf-notes.md, v2), while at N <= 1k the GPU
work of one call is 0.1-0.9 ms.  When nothing traces or transforms a dense
call (``dispatch.eager_applies``), :func:`eager_attention` runs the same
launchers through a plain ``torch.autograd.Function`` instead, for plain
calls and every variant.  Both routes call ``launch.attn_fwd`` /
``launch.attn_bwd`` with the same arguments, so their results are bitwise
identical (tested).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import cpu
from .sinks import decode_remainder, encode_remainder, remainder_like, sink_grad, with_sinks
from .dispatch import uses_triton
from .validation import check_cu_seqlens_values

_TORCH_BLOCK_N = cpu.BLOCK_N


def _like(template: Tensor, values: Tensor) -> Tensor:
    """``values`` in a fresh tensor with ``template``'s layout (the kernels write
    outputs with their input's strides; the fake impls promise the same)."""
    return torch.empty_like(template).copy_(values)


def _out_like(q: Tensor, v: Tensor) -> Tensor:
    """An empty tensor shaped like the output: q's, with v's head dim (in q's
    layout when the two head dims agree, contiguous otherwise)."""
    if v.shape[-1] == q.shape[-1]:
        return torch.empty_like(q)
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


def _lse_dtype(q: Tensor) -> torch.dtype:
    # float64 inputs keep a float64 lse inside the op so their backward stays
    # float64-exact; the public API returns float32.
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def variant_kwargs(window_left: int, window_right: int, softcap: float, alibi_slopes, block_mask=None) -> dict:
    """Keyword arguments of the launchers and the reference for the variants
    that are switched on (none for a plain call)."""
    kw = {}
    if (window_left, window_right) != (-1, -1):
        kw["window"] = (window_left, window_right)
    if softcap:
        kw["softcap"] = softcap
    if alibi_slopes is not None:
        kw["alibi_slopes"] = alibi_slopes
    if block_mask is not None:
        kw["block_mask"] = block_mask
    return kw


def keeps_remainder(q: Tensor, sinks: Optional[Tensor], remainder: bool) -> bool:
    """Whether ``attention_fwd(..., remainder=True)`` returns the output's
    rounding remainder: only with sinks (their gradient needs it) and a
    16-bit output (a float32 one is exact enough)."""
    return remainder and sinks is not None and q.dtype in (torch.float16, torch.bfloat16)


def wants_remainder(q: Tensor, k: Tensor, v: Tensor, sinks: Optional[Tensor]) -> bool:
    """Whether a call with sinks will be differentiated, so that its forward
    should keep the output's rounding remainder for the sinks' gradient."""
    return (sinks is not None and torch.is_grad_enabled()
            and any(t.requires_grad for t in (q, k, v, sinks)))


# ---------------------------------------------------------------------------
# Dense batches: q (B, Hq, Nq, D), k/v (B, Hkv, Nk, D)
# ---------------------------------------------------------------------------
@torch.library.custom_op("tileattn::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, window_left: int = -1,
                  window_right: int = -1, softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                  block_mask: Optional[Tensor] = None, deterministic: bool = True,
                  sinks: Optional[Tensor] = None, remainder: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """(out, lse, out_lo): out_lo is the output's rounding remainder where
    :func:`keeps_remainder`, else empty."""
    kw = variant_kwargs(window_left, window_right, softcap, alibi_slopes, block_mask)
    keep = keeps_remainder(q, sinks, remainder)
    if uses_triton(q):
        from . import launch
        res = launch.attn_fwd(q, k, v, causal, scale, sinks=sinks, remainder=keep, **kw)
        return res if keep else res + (q.new_empty(0),)
    out, lse = cpu.attention_fwd(q, k, v, causal, scale, block_n=_TORCH_BLOCK_N, **kw)
    out, lse = with_sinks(out, lse.to(_lse_dtype(q)), sinks)
    out = _in_layout(_out_like(q, v), out)
    out_lo = q.new_empty(0)
    if keep:   # the output from float32, rounded as the kernels round theirs, and its remainder's int8 code
        out32, _ = with_sinks(*_fwd_float32(q, k, v, causal, scale, kw), sinks)
        out.copy_(out32)
        out_lo = remainder_like(out).copy_(encode_remainder(out32, out))
    return out, lse.contiguous(), out_lo


def _fwd_float32(q, k, v, causal, scale, kw):
    return cpu.attention_fwd(q.float(), k.float(), v.float(), causal, scale, block_n=_TORCH_BLOCK_N, **kw)


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, causal, scale, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                        block_mask=None, deterministic=True, sinks=None, remainder=False):
    b, h, n, _ = q.shape
    out = _out_like(q, v)
    out_lo = remainder_like(out) if keeps_remainder(q, sinks, remainder) else q.new_empty(0)
    return out, q.new_empty((b, h, n), dtype=_lse_dtype(q)), out_lo


@torch.library.custom_op("tileattn::attention_bwd", mutates_args=())
def attention_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                  dlse: Optional[Tensor], causal: bool, scale: float, window_left: int = -1,
                  window_right: int = -1, softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                  block_mask: Optional[Tensor] = None, deterministic: bool = True,
                  sinks: Optional[Tensor] = None, out_lo: Optional[Tensor] = None
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dsinks); dsinks is empty without sinks.  ``out_lo``: the
    forward's rounding remainder of ``out`` (see :func:`attention_fwd`), or
    None."""
    kw = variant_kwargs(window_left, window_right, softcap, alibi_slopes, block_mask)
    if out_lo is not None and (sinks is None or out_lo.shape != out.shape):
        out_lo = None   # no sinks to differentiate, or no remainder kept
    if uses_triton(q):
        from . import launch
        grads = launch.attn_bwd(dout, q, k, v, out, lse, causal, scale, dlse=dlse, deterministic=deterministic,
                                sinks=sinks, o_lo=out_lo, **kw)
        return grads if sinks is not None else grads + (q.new_empty(0, dtype=torch.float32),)
    dsinks = q.new_empty(0, dtype=torch.float32)
    out_hi = out
    if sinks is not None:
        if out_lo is not None:
            out_hi = decode_remainder(out, out_lo)
        elif out.dtype in (torch.float16, torch.bfloat16):
            # rowsum(dO o O) from the rounded output loses digits the sinks'
            # gradient needs (it sums them over every row): O again in float32
            out_hi, _ = with_sinks(*_fwd_float32(q, k, v, causal, scale, kw), sinks)
        delta = (dout.to(lse.dtype) * out_hi.to(lse.dtype)).sum(-1)
        dsinks = sink_grad(sinks, lse, delta if dlse is None else delta - dlse.to(lse.dtype))
    # with sinks dQ, dK take delta from that O too (as the kernels do from the remainder)
    dq, dk, dv = cpu.attention_bwd(dout, q, k, v, out_hi, lse, causal, scale, dlse=dlse, block_n=_TORCH_BLOCK_N, **kw)
    return _in_layout(q, dq), _in_layout(k, dk), _in_layout(v, dv), dsinks


@attention_bwd.register_fake
def _attention_bwd_fake(dout, q, k, v, out, lse, dlse, causal, scale, window_left=-1, window_right=-1,
                        softcap=0.0, alibi_slopes=None, block_mask=None, deterministic=True, sinks=None,
                        out_lo=None):
    dsinks = q.new_empty(0, dtype=torch.float32) if sinks is None else torch.empty_like(sinks)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks


_SINKS_SLOT = 6   # of the trailing arguments: window_left, window_right, softcap, alibi_slopes,
#                  block_mask, deterministic, sinks, remainder (each where given)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, *variants = inputs
    out, lse, out_lo = output
    ctx.save_for_backward(q, k, v, out, lse, out_lo)
    ctx.causal = causal
    ctx.scale = scale
    ctx.n_inputs = len(inputs)
    ctx.variants = tuple(variants[:_SINKS_SLOT + 1])   # attention_bwd's trailing arguments, up to the sinks


def _backward(ctx, dout, dlse, _dout_lo):
    q, k, v, out, lse, out_lo = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    sinks = ctx.variants[_SINKS_SLOT] if len(ctx.variants) > _SINKS_SLOT else None
    extra = () if sinks is None else (out_lo if out_lo.numel() else None,)
    dq, dk, dv, dsinks = attention_bwd(dout, q, k, v, out, lse, dlse, ctx.causal, ctx.scale, *ctx.variants, *extra)
    grads = [dq, dk, dv] + [None] * (ctx.n_inputs - 3)
    if sinks is not None:
        grads[5 + _SINKS_SLOT] = dsinks
    return tuple(grads)


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------
# Packed sequences: q (total_q, Hq, D), k/v (total_k, Hkv, D)
# ---------------------------------------------------------------------------
def _as_batch(x: Tensor) -> Tensor:
    """(total, H, D) as a (1, H, total, D) view: the layout the kernels index."""
    return x.transpose(0, 1).unsqueeze(0)


def _in_layout(template: Tensor, values: Tensor) -> Tensor:
    """``values`` if it already has the layout the fake impl promises (that of
    ``torch.empty_like(template)``), else a copy in that layout."""
    return values if values.stride() == template.stride() else _like(template, values)


def _check_values(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    check_cu_seqlens_values(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k)


@torch.library.custom_op("tileattn::attention_varlen_fwd", mutates_args=())
def attention_varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                         max_seqlen_q: int, max_seqlen_k: int, causal: bool, scale: float, window_left: int = -1,
                         window_right: int = -1, softcap: float = 0.0,
                         alibi_slopes: Optional[Tensor] = None, deterministic: bool = True) -> tuple[Tensor, Tensor]:
    _check_values(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    kw = variant_kwargs(window_left, window_right, softcap, alibi_slopes)
    if uses_triton(q):
        from . import launch
        out, lse = launch.attn_fwd(_as_batch(q), _as_batch(k), _as_batch(v), causal, scale,
                                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                   max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, **kw)
        return _in_layout(_out_like(q, v), out[0].transpose(0, 1)), lse[0].contiguous()
    out, lse = cpu.tiled_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, scale=scale,
                                          block_n=_TORCH_BLOCK_N, return_lse=True, **kw)
    return _like(_out_like(q, v), out), lse.to(_lse_dtype(q)).contiguous()


@attention_varlen_fwd.register_fake
def _attention_varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                               window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, deterministic=True):
    return _out_like(q, v), q.new_empty((q.shape[1], q.shape[0]), dtype=_lse_dtype(q))


@torch.library.custom_op("tileattn::attention_varlen_bwd", mutates_args=())
def attention_varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                         dlse: Optional[Tensor], cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                         max_seqlen_k: int, causal: bool, scale: float, window_left: int = -1,
                         window_right: int = -1, softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                         deterministic: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    kw = variant_kwargs(window_left, window_right, softcap, alibi_slopes)
    if uses_triton(q):
        from . import launch
        dq, dk, dv = launch.attn_bwd(_as_batch(dout), _as_batch(q), _as_batch(k), _as_batch(v), _as_batch(out),
                                     lse[None], causal, scale, dlse=None if dlse is None else dlse[None],
                                     cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                     max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                     deterministic=deterministic, **kw)
        return (_in_layout(q, dq[0].transpose(0, 1)), _in_layout(k, dk[0].transpose(0, 1)),
                _in_layout(v, dv[0].transpose(0, 1)))
    dq, dk, dv = cpu.tiled_attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                                     causal=causal, scale=scale, dlse=dlse,
                                                     block_n=_TORCH_BLOCK_N, **kw)
    return _like(q, dq), _like(k, dk), _like(v, dv)


@attention_varlen_bwd.register_fake
def _attention_varlen_bwd_fake(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                               max_seqlen_k, causal, scale, window_left=-1, window_right=-1, softcap=0.0,
                               alibi_slopes=None, deterministic=True):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context_varlen(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, *variants = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.args = (max_q, max_k, causal, scale, *variants)


def _backward_varlen(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = attention_varlen_bwd(dout, q, k, v, out, lse, dlse, cu_q, cu_k, *ctx.args)
    return (dq, dk, dv) + (None,) * (2 + len(ctx.args))


attention_varlen_fwd.register_autograd(_backward_varlen, setup_context=_setup_context_varlen)


# ---------------------------------------------------------------------------
# The eager fast path (dense batches on the kernels; see the module docstring)
# ---------------------------------------------------------------------------
class _KernelAttention(torch.autograd.Function):
    # The classic forward(ctx, ...) form on purpose: with a separate
    # setup_context, Function.apply binds the arguments through
    # inspect.signature on every call (tens of microseconds of host time).
    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float, variants: dict, deterministic: bool, sinks=None,
                remainder: bool = False):
        from . import launch
        out, lse, *out_lo = launch.attn_fwd(q, k, v, causal, scale, sinks=sinks, remainder=remainder, **variants)
        ctx.save_for_backward(q, k, v, out, lse, *out_lo)
        # the variants' tensors (ALiBi slopes, block layout) get no gradient; the sinks do
        ctx.causal, ctx.scale, ctx.variants, ctx.deterministic = causal, scale, variants, deterministic
        ctx.sinks = sinks
        # an unused lse gets no gradient (None), not a tensor of zeros
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        from . import launch
        q, k, v, out, lse, *out_lo = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        grads = launch.attn_bwd(dout, q, k, v, out, lse, ctx.causal, ctx.scale, dlse=dlse,
                                deterministic=ctx.deterministic, sinks=ctx.sinks, o_lo=out_lo[0] if out_lo else None,
                                **ctx.variants)
        dsinks = grads[3] if ctx.sinks is not None else None
        return grads[0], grads[1], grads[2], None, None, None, None, dsinks, None


_NO_VARIANTS: dict = {}


def eager_attention(q, k, v, causal: bool, scale: float, variants: dict | None = None, deterministic: bool = True,
                    sinks: Optional[Tensor] = None, remainder: bool = False):
    """(out, lse) of the dense kernels without the custom-op dispatch.
    ``variants``: the launchers' keyword arguments (``window``, ``softcap``,
    ``alibi_slopes``, ``block_mask``), as :func:`variant_kwargs` builds them;
    ``deterministic`` picks the backward (see ``launch.attn_bwd``); ``sinks``
    (Hq,) get their gradient, from the output's rounding remainder where
    ``remainder`` (:func:`keeps_remainder`) has the forward keep it."""
    remainder = keeps_remainder(q, sinks, remainder)
    return _KernelAttention.apply(q, k, v, causal, scale, variants or _NO_VARIANTS, deterministic, sinks, remainder)
