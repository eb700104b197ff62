"""Public functions.  Inputs are validated here, before anything is launched."""
from __future__ import annotations

import math
import numbers

import torch

from . import ops

__all__ = ["attention"]

MAX_HEAD_DIM = 256
_GPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_CPU_DTYPES = _GPU_DTYPES + (torch.float64,)
_MAX_GRID_YZ = 65535  # CUDA grid axes y and z (heads, batch)


def _check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise ValueError(f"{name} must have 4 dimensions (batch, heads, seqlen, head_dim), "
                         f"got shape {tuple(t.shape)}")


def validate(q, k, v, causal, scale) -> float:
    """Check arguments; return the softmax scale to use."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q, k and v must share one dtype, got q={q.dtype}, k={k.dtype}, v={v.dtype}")
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"q, k and v must be on one device, got q on {q.device}, k on {k.device}, "
                         f"v on {v.device}")
    on_kernels = ops.uses_triton(q)
    allowed = _GPU_DTYPES if on_kernels else _CPU_DTYPES
    if q.dtype not in allowed:
        where = "the GPU path" if on_kernels else "the CPU path"
        hint = " (float64 runs on CPU tensors)" if q.dtype == torch.float64 else ""
        raise TypeError(f"q, k, v dtype {q.dtype} is not supported on {where}; expected one of "
                        f"{', '.join(str(d) for d in allowed)}{hint}")
    b, hq, n_q, d = q.shape
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"batch size must agree: q has {b}, k has {k.shape[0]}, v has {v.shape[0]}")
    if k.shape[3] != d or v.shape[3] != d:
        raise ValueError(f"head_dim must agree: q has {d}, k has {k.shape[3]}, v has {v.shape[3]}")
    if d == 0 or d > MAX_HEAD_DIM:
        raise ValueError(f"head_dim (last dimension of q, k, v) must be in 1..{MAX_HEAD_DIM}, got {d}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same sequence length, got k {k.shape[2]} and v {v.shape[2]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same number of heads, got k {k.shape[1]} and v {v.shape[1]}")
    hkv = k.shape[1]
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"the number of query heads ({hq}) must be a multiple of the number of "
                         f"key/value heads ({hkv})")
    if on_kernels and (hq > _MAX_GRID_YZ or b > _MAX_GRID_YZ):
        raise ValueError(f"batch ({b}) and query heads ({hq}) must each be at most {_MAX_GRID_YZ} "
                         f"on the GPU path; split the call")
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    if not math.isfinite(float(scale)):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def attention(q, k, v, *, causal=False, scale=None, return_lse=False):
    """Exact attention, softmax(scale * q k^T) v, computed tile by tile.

    Args:
        q: (B, Hq, Nq, D) queries.
        k, v: (B, Hkv, Nk, D) keys and values; Hq must be a multiple of Hkv
            (grouped-query / multi-query attention, no copies of k and v).
            Any strides; no copies are made.
        causal: bottom-right aligned causal mask: query i sees key j iff
            j <= i + Nk - Nq (as FlashAttention >= 2.1).  A row that sees no
            key returns 0 and lse -inf.
        scale: softmax scale, default 1/sqrt(D).
        return_lse: also return the natural-log log-sum-exp of the scaled
            scores, float32 (B, Hq, Nq).  It is differentiable.

    Returns:
        out (B, Hq, Nq, D) in the input dtype, or (out, lse).

    fp16, bf16 and fp32 run the Triton kernels on GPUs; on other devices (and
    for float64 on CPU) a pure-PyTorch tiled implementation of the same
    algorithm runs.  The backward is deterministic.
    """
    scale = validate(q, k, v, causal, scale)
    out, lse = ops.attention_fwd(q, k, v, causal, scale)
    if return_lse:
        return out, lse.float()
    return out
