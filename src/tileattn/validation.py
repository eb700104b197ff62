"""Every argument rule and limit of the public functions, defined once.

``attention``, ``attention_varlen`` (``api.py``), ``attention_with_kvcache``
(``decode.py``), the SDPA drop-in (``sdpa.py``) and the transformers backend
check their arguments with the functions below (``attention_with_kvcache``'s
own shape rules, built from them, are in ``validation_kvcache.py``), before
anything is launched or written; a bad argument raises TypeError (wrong type)
or ValueError (wrong value) naming it.  The rules that hold for every entry
point:

* ``scale``: a finite real number, or None for 1/sqrt(D);
* ``window``: None or a pair ``(left, right)`` of ints >= -1 (-1: unbounded);
  ``causal`` sets the right side to 0 (:func:`fold_causal`);
* ``softcap``: None or 0 for none, else a finite number > 0;
* ``alibi_slopes``: a float tensor of any floating dtype, (Hq,) or (B, Hq),
  on q's device; cast to float32 (float64 for float64 inputs);
* ``sinks``: a float32 tensor (Hq,) on q's device, one logit per query head
  (float64 too for float64 inputs); differentiable;
* ``deterministic``: a bool, or None (the faster backward for the call);
* head dim 1..``MAX_HEAD_DIM``, q's = k's, v's (the output's) its own in
  1..``MAX_HEAD_DIM`` (``attention_with_kvcache``: each 1..``MAX_DECODE_HEAD_DIM``,
  and D = 576 with Dv = 512 in the absorbed MLA layout); on the kernels batch and heads at most
  ``MAX_GRID_YZ`` (CUDA grid axes y and z); float64 only off the kernels.

This module depends on nothing of tileattn but ``block_mask``; the caller
hands in the predicate that says whether a call runs the kernels
(``dispatch.uses_triton``).
"""
from __future__ import annotations

import math
import numbers
from typing import Callable

import torch

from .block_mask import BLOCK_K, BLOCK_Q, BlockMask

MAX_HEAD_DIM = 512           # training and prefill: attention, attention_varlen, the SDPA drop-in
MAX_DECODE_HEAD_DIM = 256    # attention_with_kvcache: its configs are sized up to 256
MAX_GRID_YZ = 65535          # CUDA grid axes y and z (heads, batch)
MAX_NUM_SPLITS = 256         # attention_with_kvcache's num_splits
GPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
CPU_DTYPES = GPU_DTYPES + (torch.float64,)


# ---------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------
def check_dense(name: str, t: torch.Tensor) -> None:
    """TypeError for sparse and other non-strided layouts (the kernels and the
    PyTorch path address elements by strides)."""
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")


def check_tensor(name: str, t, ndim: int, dims: str = "") -> None:
    """A dense ``torch.Tensor`` with ``ndim`` dimensions (``dims`` names them)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense(name, t)
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions{f' ({dims})' if dims else ''}, "
                         f"got shape {tuple(t.shape)}")


def check_index_tensor(name: str, t, ndim: int, what: str) -> None:
    """An int32 tensor of ``ndim`` dimensions (shape ``what``)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense(name, t)
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have shape {what}, got {tuple(t.shape)}")


def check_device(name: str, t: torch.Tensor, q: torch.Tensor) -> None:
    if t.device != q.device:
        raise ValueError(f"{name} must be on the device of q ({q.device}), got {t.device}")


def check_path_dtype(what: str, q, on_kernels: bool) -> None:
    """TypeError unless the path (kernels or PyTorch) supports ``q``'s dtype."""
    allowed = GPU_DTYPES if on_kernels else CPU_DTYPES
    if q.dtype not in allowed:
        where = "the GPU path" if on_kernels else "the CPU path"
        hint = " (float64 runs on CPU tensors)" if q.dtype == torch.float64 else ""
        raise TypeError(f"{what} dtype {q.dtype} is not supported on {where}; expected one of "
                        f"{', '.join(str(d) for d in allowed)}{hint}")


def check_head_dim(d: int, what: str = "q, k, v", limit: int = MAX_HEAD_DIM, where: str = "") -> None:
    if d == 0 or d > limit:
        raise ValueError(f"head_dim (last dimension of {what}) must be in 1..{limit}{where}, got {d}")


def check_grid(on_kernels: bool, what: str, *sizes: int) -> None:
    """ValueError for a batch / head count the kernels' grid cannot hold."""
    if on_kernels and any(n > MAX_GRID_YZ for n in sizes):
        raise ValueError(f"{what} must each be at most {MAX_GRID_YZ} on the GPU path; split the call")


def check_qkv(q, k, v, causal, scale, uses_kernels: Callable) -> float:
    """The dense (B, H, N, D) checks of ``attention``; returns the softmax
    scale.  ``uses_kernels(q)`` says whether the call runs the kernels (asked
    once q is known to be a tensor)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, 4, "batch, heads, seqlen, head_dim")
    check_bool("causal", causal)
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q, k and v must share one dtype, got q={q.dtype}, k={k.dtype}, v={v.dtype}")
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"q, k and v must be on one device, got q on {q.device}, k on {k.device}, "
                         f"v on {v.device}")
    on_kernels = uses_kernels(q)
    check_path_dtype("q, k, v", q, on_kernels)
    b, hq, n_q, d = q.shape
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"batch size must agree: q has {b}, k has {k.shape[0]}, v has {v.shape[0]}")
    if k.shape[3] != d:
        raise ValueError(f"head_dim must agree: q has {d}, k has {k.shape[3]}")
    check_head_dim(d, "q, k")
    # v may have its own head dim Dv (the output's)
    check_head_dim(v.shape[3], "v")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same sequence length, got k {k.shape[2]} and v {v.shape[2]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same number of heads, got k {k.shape[1]} and v {v.shape[1]}")
    check_heads(hq, k.shape[1])
    if on_kernels and (hq > MAX_GRID_YZ or b > MAX_GRID_YZ):
        raise ValueError(f"batch ({b}) and query heads ({hq}) must each be at most {MAX_GRID_YZ} "
                         f"on the GPU path; split the call")
    return check_scale(scale, d)


def check_heads(hq: int, hkv: int, where: str = "") -> None:
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"the number of query heads ({hq}) must be a multiple of the number of "
                         f"key/value heads{where} ({hkv})")


# ---------------------------------------------------------------------------
# Scalars and the variants
# ---------------------------------------------------------------------------
def check_bool(name: str, flag) -> None:
    if not isinstance(flag, bool):
        raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")


def is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_scale(scale, d: int) -> float:
    """The softmax scale: ``scale`` as a float, 1/sqrt(d) for None."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    if not math.isfinite(float(scale)):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def check_window(window) -> tuple[int, int]:
    """(left, right) with -1 for an unbounded side."""
    if window is None:
        return -1, -1
    if isinstance(window, torch.Tensor) or not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be None or a pair (left, right) of ints, got {window!r}")
    out = []
    for side, w in zip(("left", "right"), window):
        if not is_int(w):
            raise TypeError(f"window {side} must be an int (-1 = unbounded), got {type(w).__name__}")
        if w < -1:
            raise ValueError(f"window {side} must be >= -1 (-1 = unbounded), got {w}")
        out.append(int(w))
    return out[0], out[1]


def fold_causal(causal: bool, left: int, right: int) -> tuple[int, int]:
    """The window with ``causal`` folded in: a causal query sees no key to its
    right, so the right side is 0 (the kernels then need no causal switch)."""
    return left, (0 if causal else right)


def check_softcap(softcap) -> float:
    """The softcap as a float, 0.0 meaning off (None and 0 both switch it off)."""
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a positive real number or None, got {type(softcap).__name__}")
    c = float(softcap)
    if not math.isfinite(c) or c < 0:
        raise ValueError(f"softcap must be a finite number > 0 (or None / 0 for none), got {softcap}")
    return c


def check_alibi(alibi_slopes, q, batch: int, hq: int):
    """Slopes of any floating dtype as a float32 (float64 for float64 inputs)
    contiguous tensor of shape (Hq,) or (B, Hq); None stays None."""
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a torch.Tensor or None, got {type(alibi_slopes).__name__}")
    check_dense("alibi_slopes", alibi_slopes)
    if not alibi_slopes.is_floating_point():
        raise TypeError(f"alibi_slopes must be a floating-point tensor, got {alibi_slopes.dtype}")
    check_device("alibi_slopes", alibi_slopes, q)
    if tuple(alibi_slopes.shape) not in ((hq,), (batch, hq)):
        raise ValueError(f"alibi_slopes must have shape ({hq},) or ({batch}, {hq}) (query heads, or batch x "
                         f"query heads), got {tuple(alibi_slopes.shape)}")
    return cast_alibi(alibi_slopes, q)


def cast_alibi(alibi_slopes, q):
    """The slopes in the dtype the paths compute them in (no copy when they already are)."""
    if alibi_slopes is None:
        return None
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return alibi_slopes.detach().to(dtype).contiguous()


def check_sinks(sinks, q, hq: int):
    """Attention sinks: a float32 tensor (Hq,) on q's device (float64 too for
    float64 inputs), one logit per query head; None stays None.  Not cast, so
    the caller's tensor keeps its gradient; a strided view comes back as a
    dense copy (differentiable: the kernels read the logits by raw pointer)."""
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a torch.Tensor or None, got {type(sinks).__name__}")
    allowed = (torch.float32, torch.float64) if q.dtype == torch.float64 else (torch.float32,)
    if sinks.dtype not in allowed:
        raise TypeError(f"sinks must be a float32 tensor (one logit per query head), got {sinks.dtype}")
    check_device("sinks", sinks, q)
    if tuple(sinks.shape) != (hq,):
        raise ValueError(f"sinks must have shape ({hq},) (one logit per query head), got {tuple(sinks.shape)}")
    return sinks.contiguous()


def check_deterministic(deterministic):
    """The backward to run: True, False, or None for "the faster one for the
    call" (``dispatch.default_deterministic`` resolves it once the call's
    path is known)."""
    if deterministic is None or isinstance(deterministic, bool):
        return deterministic
    raise TypeError(f"deterministic must be a bool or None, got {type(deterministic).__name__}")


def check_block_mask(block_mask, q, batch: int, hq: int, n_q: int, n_k: int):
    if block_mask is None:
        return None
    if isinstance(block_mask, BlockMask):
        block_mask = block_mask.mask
    if not isinstance(block_mask, torch.Tensor):
        raise TypeError(f"block_mask must be a bool torch.Tensor or None, got {type(block_mask).__name__}")
    if block_mask.dtype != torch.bool:
        raise TypeError(f"block_mask must have dtype torch.bool, got {block_mask.dtype}")
    check_device("block_mask", block_mask, q)
    nqb, nkb = -(-n_q // BLOCK_Q), -(-n_k // BLOCK_K)
    shape = tuple(block_mask.shape)
    if (len(shape) != 4 or shape[0] not in (1, batch) or shape[1] not in (1, hq) or shape[2:] != (nqb, nkb)):
        raise ValueError(f"block_mask must have shape (1 or {batch}, 1 or {hq}, {nqb}, {nkb}): (batch, query "
                         f"heads, ceil(Nq / {BLOCK_Q}), ceil(Nk / {BLOCK_K})), got {shape}")
    return block_mask


# ---------------------------------------------------------------------------
# Packed sequences
# ---------------------------------------------------------------------------
def check_cu_seqlens(name: str, cu, q) -> None:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
    check_dense(name, cu)
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype torch.int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must be 1-D with batch + 1 entries, got shape {tuple(cu.shape)}")
    check_device(name, cu, q)


def check_max_seqlen(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, torch.SymInt)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def check_cu_seqlens_values(cu_seqlens_q, cu_seqlens_k, total_q: int, total_k: int, max_seqlen_q: int,
                            max_seqlen_k: int) -> None:
    """The value checks of ``attention_varlen``'s cumulative lengths (run by
    the op itself, before anything is launched: one small device-to-host
    copy).  A tensor that passed is marked with its version counter, so the
    layers of a model that share one ``cu_seqlens`` pay for the copy once,
    and an in-place change is checked again."""
    for name, cu, total, max_name, max_len in (
            ("cu_seqlens_q", cu_seqlens_q, total_q, "max_seqlen_q", max_seqlen_q),
            ("cu_seqlens_k", cu_seqlens_k, total_k, "max_seqlen_k", max_seqlen_k)):
        stamp = (cu._version, cu.data_ptr(), total, max_len)
        if getattr(cu, "_tileattn_checked", None) == stamp:
            continue
        vals = cu.tolist()
        if vals[0] != 0:
            raise ValueError(f"{name} must start at 0, got {vals[0]}")
        lens = [b - a for a, b in zip(vals, vals[1:])]
        bad = next((i for i, n in enumerate(lens) if n < 0), None)
        if bad is not None:
            raise ValueError(f"{name} must be non-decreasing: entry {bad + 1} ({vals[bad + 1]}) < entry {bad} "
                             f"({vals[bad]})")
        if vals[-1] != total:
            raise ValueError(f"{name}[-1] = {vals[-1]} must equal the number of packed tokens ({total})")
        longest = max(lens, default=0)
        if longest > max_len:
            raise ValueError(f"{max_name} = {max_len} is smaller than the longest sequence in {name} "
                             f"({longest}, sequence {lens.index(longest)})")
        cu._tileattn_checked = stamp


# ---------------------------------------------------------------------------
# The SDPA drop-in (torch's signature)
# ---------------------------------------------------------------------------
def check_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> None:
    """The checks of the SDPA drop-in that torch would fail with an opaque
    RuntimeError, as TypeError/ValueError naming the argument (before anything runs)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., seqlen, head_dim), "
                             f"got shape {tuple(t.shape)}")
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    check_bool("is_causal", is_causal)
    check_bool("enable_gqa", enable_gqa)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a real number, got {type(dropout_p).__name__}")
    if not 0.0 <= float(dropout_p) <= 1.0:
        raise ValueError(f"dropout_p must be in [0, 1], got {dropout_p}")
    if scale is not None:
        check_scale(scale, 1)
    if query.dtype != key.dtype or query.dtype != value.dtype:
        raise TypeError(f"query, key and value must share one dtype, got query={query.dtype}, "
                        f"key={key.dtype}, value={value.dtype}")
    if not query.dtype.is_floating_point:
        raise TypeError(f"query, key and value must be floating-point tensors, got {query.dtype}")
    if query.device != key.device or query.device != value.device:
        raise ValueError(f"query, key and value must be on one device, got query on {query.device}, "
                         f"key on {key.device}, value on {value.device}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query and key must have the same head dim (last dimension), got "
                         f"query {query.shape[-1]} and key {key.shape[-1]}")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"key and value must have the same sequence length (dimension -2), got "
                         f"key {key.shape[-2]} and value {value.shape[-2]}")
    if enable_gqa and query.dim() >= 3 and key.dim() >= 3 and value.dim() >= 3:
        hq, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
        # torch repeats key and value heads each on their own, so they may differ (not accelerated)
        if hk == 0 or hv == 0 or hq % hk != 0 or hq % hv != 0:
            raise ValueError(f"enable_gqa=True needs key and value head counts (dimension -3) that divide the "
                             f"query heads, got query {hq}, key {hk}, value {hv}")
