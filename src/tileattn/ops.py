"""Custom ops and autograd.

``tileattn::attention_fwd`` and ``tileattn::attention_bwd`` are registered with
``torch.library.custom_op`` (with fake implementations for tracing) so that
``torch.compile(fullgraph=True)`` sees them as single opaque nodes.  Each op
dispatches to the Triton kernels (``launch.py``) for tensors on a GPU, and to
the pure-PyTorch tiled implementation (``reference.py``) otherwise.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch import Tensor

from . import reference

# key/value block of the PyTorch path: extra memory Nq x 256 per head, few Python steps
_TORCH_BLOCK_N = 256
_BACKENDS = ("auto", "triton", "torch")
_backend = "auto"


@contextlib.contextmanager
def use_backend(name: str):
    """Force a path inside a block: ``"triton"`` (the kernels; on CPU tensors this
    needs ``TRITON_INTERPRET=1`` set before tileattn is imported), ``"torch"``
    (the pure-PyTorch tiled path) or ``"auto"`` (kernels on GPUs, torch elsewhere)."""
    global _backend
    if name not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {name!r}")
    previous, _backend = _backend, name
    try:
        yield
    finally:
        _backend = previous


def uses_triton(t: Tensor) -> bool:
    """Whether a call with ``t`` as query runs the Triton kernels."""
    if _backend == "torch":
        return False
    if _backend == "triton":
        return True
    return t.is_cuda and _triton_importable()


def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _like(template: Tensor, values: Tensor) -> Tensor:
    """``values`` in a fresh tensor with ``template``'s layout (the kernels write
    outputs with their input's strides; the fake impls promise the same)."""
    return torch.empty_like(template).copy_(values)


def _lse_dtype(q: Tensor) -> torch.dtype:
    # float64 inputs keep a float64 lse inside the op so their backward stays
    # float64-exact; the public API returns float32.
    return torch.float64 if q.dtype == torch.float64 else torch.float32


@torch.library.custom_op("tileattn::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    if uses_triton(q):
        from . import launch
        return launch.attn_fwd(q, k, v, causal, scale)
    out, lse = reference.tiled_attention(q, k, v, causal=causal, scale=scale, block_n=_TORCH_BLOCK_N,
                                           return_lse=True)
    return _like(q, out), lse.to(_lse_dtype(q)).contiguous()


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, causal, scale):
    b, h, n, _ = q.shape
    return torch.empty_like(q), q.new_empty((b, h, n), dtype=_lse_dtype(q))


@torch.library.custom_op("tileattn::attention_bwd", mutates_args=())
def attention_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                  dlse: Optional[Tensor], causal: bool, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    if uses_triton(q):
        from . import launch
        return launch.attn_bwd(dout, q, k, v, out, lse, causal, scale, dlse=dlse)
    dq, dk, dv = reference.tiled_attention_backward(dout, q, k, v, out, lse, causal=causal, scale=scale,
                                                    dlse=dlse, block_n=_TORCH_BLOCK_N)
    return _like(q, dq), _like(k, dk), _like(v, dv)


@attention_bwd.register_fake
def _attention_bwd_fake(dout, q, k, v, out, lse, dlse, causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal = causal
    ctx.scale = scale


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = attention_bwd(dout, q, k, v, out, lse, dlse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


attention_fwd.register_autograd(_backward, setup_context=_setup_context)
