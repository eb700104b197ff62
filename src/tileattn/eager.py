"""The eager-mode fast path to the Triton kernels.

``tileattn::attention_fwd`` / ``tileattn::attention_bwd`` are
``torch.library`` custom ops: that is what ``torch.compile``, fake tensors
and ``opcheck`` need.  In plain eager execution the dispatcher glue around a
Python custom op (alias checks, the generated autograd function,
re-dispatch) costs far more host time than the launch itself: measured on
the H200 host, ~0.9 ms of a 1.5 ms forward+backward step (docs/perf-notes.md,
v2).  At N <= 1k the GPU work of one call is 0.1-0.9 ms, so the kernels
waited for Python.

When nothing traces or transforms the call (no ``torch.compile``, no
dispatch mode such as fake tensors, no ``torch.func`` transform, only plain
tensors), :func:`attention` runs the same
launchers through a plain ``torch.autograd.Function`` instead, for plain
calls and for the sliding-window, softcap, ALiBi and block-sparse variants.  Both routes
call ``launch.attn_fwd`` / ``launch.attn_bwd`` with the same arguments, so
their results are bitwise identical (tested).
"""
from __future__ import annotations

import torch

from . import ops

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _no_dispatch_mode() -> bool:
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode
    except ImportError:  # pragma: no cover - a torch without it: stay on the custom op
        return False
    return _get_current_dispatch_mode() is None


def _no_functorch() -> bool:
    # torch.func transforms (grad, vmap, ...) hand wrapper tensors that have
    # no storage for a kernel; leave such calls to the custom op (which
    # raises torch's own error for transforms it does not support)
    check = getattr(torch._C, "_are_functorch_transforms_active", None)
    return check is not None and not check()


def applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether a dense call can take the eager fast path."""
    return (type(q) in _PLAIN and type(k) in _PLAIN and type(v) in _PLAIN
            and ops.uses_triton(q) and not torch.compiler.is_compiling() and _no_dispatch_mode()
            and _no_functorch())


class _KernelAttention(torch.autograd.Function):
    # The classic forward(ctx, ...) form on purpose: with a separate
    # setup_context, Function.apply binds the arguments through
    # inspect.signature on every call (tens of microseconds of host time).
    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float, variants: dict, deterministic: bool):
        from . import launch
        out, lse = launch.attn_fwd(q, k, v, causal, scale, **variants)
        ctx.save_for_backward(q, k, v, out, lse)
        # the variants' tensors (ALiBi slopes, block layout) get no gradient
        ctx.causal, ctx.scale, ctx.variants, ctx.deterministic = causal, scale, variants, deterministic
        # an unused lse gets no gradient (None), not a tensor of zeros
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        from . import launch
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv = launch.attn_bwd(dout, q, k, v, out, lse, ctx.causal, ctx.scale, dlse=dlse,
                                     deterministic=ctx.deterministic, **ctx.variants)
        return dq, dk, dv, None, None, None, None


_NO_VARIANTS: dict = {}


def attention(q, k, v, causal: bool, scale: float, variants: dict | None = None, deterministic: bool = True):
    """(out, lse) of the dense kernels without the custom-op dispatch.
    ``variants``: the launchers' keyword arguments (``window``, ``softcap``,
    ``alibi_slopes``, ``block_mask``), as ``ops.variant_kwargs`` builds them;
    ``deterministic`` picks the backward (see ``launch.attn_bwd``)."""
    return _KernelAttention.apply(q, k, v, causal, scale, variants or _NO_VARIANTS, deterministic)
