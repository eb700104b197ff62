"""Public functions.  Inputs are validated here, before anything is launched."""
from __future__ import annotations

import math
import numbers

import torch

from . import eager, ops
from .block_mask import BLOCK_K, BLOCK_Q, BlockMask

__all__ = ["attention", "attention_varlen"]

MAX_HEAD_DIM = 256
_GPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_CPU_DTYPES = _GPU_DTYPES + (torch.float64,)
_MAX_GRID_YZ = 65535  # CUDA grid axes y and z (heads, batch)


def check_dense(name: str, t: torch.Tensor) -> None:
    """TypeError for sparse and other non-strided layouts (the kernels and the
    PyTorch path address elements by strides)."""
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")


def _check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense(name, t)
    if t.dim() != 4:
        raise ValueError(f"{name} must have 4 dimensions (batch, heads, seqlen, head_dim), "
                         f"got shape {tuple(t.shape)}")


def check_path_dtype(what: str, q) -> bool:
    """TypeError unless the path that ``q`` selects (kernels or PyTorch)
    supports its dtype; returns whether the kernels run."""
    on_kernels = ops.uses_triton(q)
    allowed = _GPU_DTYPES if on_kernels else _CPU_DTYPES
    if q.dtype not in allowed:
        where = "the GPU path" if on_kernels else "the CPU path"
        hint = " (float64 runs on CPU tensors)" if q.dtype == torch.float64 else ""
        raise TypeError(f"{what} dtype {q.dtype} is not supported on {where}; expected one of "
                        f"{', '.join(str(d) for d in allowed)}{hint}")
    return on_kernels


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
    on_kernels = check_path_dtype("q, k, v", q)
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
    return _check_scale(scale, d)


def _check_scale(scale, d) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    if not math.isfinite(float(scale)):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def _check_window(window) -> tuple[int, int]:
    """(left, right) with -1 for an unbounded side."""
    if window is None:
        return -1, -1
    if isinstance(window, torch.Tensor) or not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be None or a pair (left, right) of ints, got {window!r}")
    out = []
    for side, w in zip(("left", "right"), window):
        if isinstance(w, bool) or not isinstance(w, numbers.Integral):
            raise TypeError(f"window {side} must be an int (-1 = unbounded), got {type(w).__name__}")
        if w < -1:
            raise ValueError(f"window {side} must be >= -1 (-1 = unbounded), got {w}")
        out.append(int(w))
    return out[0], out[1]


def _check_softcap(softcap) -> float:
    """The softcap as a float, 0.0 meaning off."""
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a positive real number or None, got {type(softcap).__name__}")
    c = float(softcap)
    if not math.isfinite(c) or c < 0:
        raise ValueError(f"softcap must be a finite number > 0 (or None / 0 for none), got {softcap}")
    return c


def _check_alibi(alibi_slopes, q, batch: int, hq: int):
    """Slopes as a float32 (float64 for float64 inputs) tensor of shape (Hq,) or (B, Hq)."""
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a torch.Tensor or None, got {type(alibi_slopes).__name__}")
    check_dense("alibi_slopes", alibi_slopes)
    if not alibi_slopes.is_floating_point():
        raise TypeError(f"alibi_slopes must be a floating-point tensor, got {alibi_slopes.dtype}")
    if alibi_slopes.device != q.device:
        raise ValueError(f"alibi_slopes must be on the device of q ({q.device}), got {alibi_slopes.device}")
    if tuple(alibi_slopes.shape) not in ((hq,), (batch, hq)):
        raise ValueError(f"alibi_slopes must have shape ({hq},) or ({batch}, {hq}) (query heads, or batch x "
                         f"query heads), got {tuple(alibi_slopes.shape)}")
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return alibi_slopes.detach().to(dtype).contiguous()


def _check_deterministic(deterministic) -> bool:
    """The backward to run: ``None`` means the deterministic one, the faster
    of the two on the H200 in this version (docs/perf-notes.md v11), and what
    ``torch.use_deterministic_algorithms`` asks for anyway."""
    if deterministic is None:
        return True
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool or None, got {type(deterministic).__name__}")
    return deterministic


def _check_block_mask(block_mask, q, batch: int, hq: int, n_q: int, n_k: int):
    if block_mask is None:
        return None
    if isinstance(block_mask, BlockMask):
        block_mask = block_mask.mask
    if not isinstance(block_mask, torch.Tensor):
        raise TypeError(f"block_mask must be a bool torch.Tensor or None, got {type(block_mask).__name__}")
    if block_mask.dtype != torch.bool:
        raise TypeError(f"block_mask must have dtype torch.bool, got {block_mask.dtype}")
    if block_mask.device != q.device:
        raise ValueError(f"block_mask must be on the device of q ({q.device}), got {block_mask.device}")
    nqb, nkb = -(-n_q // BLOCK_Q), -(-n_k // BLOCK_K)
    shape = tuple(block_mask.shape)
    if (len(shape) != 4 or shape[0] not in (1, batch) or shape[1] not in (1, hq) or shape[2:] != (nqb, nkb)):
        raise ValueError(f"block_mask must have shape (1 or {batch}, 1 or {hq}, {nqb}, {nkb}): (batch, query "
                         f"heads, ceil(Nq / {BLOCK_Q}), ceil(Nk / {BLOCK_K})), got {shape}")
    return block_mask


def attention(q, k, v, *, causal=False, scale=None, return_lse=False, window=None, softcap=None,
              alibi_slopes=None, block_mask=None, deterministic=None):
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
        window: sliding window ``(left, right)``: query i sees key j iff
            i + Nk - Nq - left <= j <= i + Nk - Nq + right; -1 leaves a side
            unbounded.  With ``causal`` the right side is 0.  Key tiles
            outside the window are never visited.
        softcap: ``c > 0`` caps the scaled scores at c * tanh(s / c) (Gemma 2,
            Grok); None or 0 for none.
        alibi_slopes: ALiBi slopes, (Hq,) or (B, Hq) floats: the bias
            -slope * |i + Nk - Nq - j| is added to the (capped) scaled scores.
            The slopes are not differentiated.
        block_mask: block-sparse layout, bool (B or 1, Hq or 1,
            ceil(Nq / 128), ceil(Nk / 128)) (``tileattn.block_mask.BLOCK_Q``,
            ``BLOCK_K``), or the result of ``tileattn.block_mask_from_fn``:
            query block i attends to key block j only where the entry is True;
            blocks switched off are never loaded or computed.  Combines with
            ``causal`` and ``window``.
        deterministic: which backward the kernels run.  True: dK/dV and
            dQ by separate kernels, bitwise reproducible.  False: one kernel
            computes dK/dV and adds dQ into a float32 sum with atomics
            (5 instead of 7 tile matmuls; faster, but dq may differ in the
            last bits from run to run; dk and dv stay reproducible).  None
            (default): True -- on the H200 the deterministic backward is
            still the faster one (docs/perf-notes.md v11).  The pure-PyTorch path ignores it (it is
            deterministic).

    Returns:
        out (B, Hq, Nq, D) in the input dtype, or (out, lse).

    fp16, bf16 and fp32 run the Triton kernels on GPUs; on other devices (and
    for float64 on CPU) a pure-PyTorch tiled implementation of the same
    algorithm runs.
    """
    scale = validate(q, k, v, causal, scale)
    det = _check_deterministic(deterministic)
    b, hq, n_q, _ = q.shape
    left, right = _check_window(window)
    cap = _check_softcap(softcap)
    slopes = _check_alibi(alibi_slopes, q, b, hq)
    mask = _check_block_mask(block_mask, q, b, hq, n_q, k.shape[2])
    plain = (left, right, cap, slopes, mask) == (-1, -1, 0.0, None, None)
    if eager.applies(q, k, v):
        # same launchers, without the custom-op dispatch (host time; see eager.py)
        out, lse = eager.attention(q, k, v, causal, scale,
                                   None if plain else ops.variant_kwargs(left, right, cap, slopes, mask), det)
    elif plain:
        out, lse = ops.attention_fwd(q, k, v, causal, scale, deterministic=det)
    else:
        out, lse = ops.attention_fwd(q, k, v, causal, scale, left, right, cap, slopes, mask, det)
    if return_lse:
        return out, lse.float()
    return out


# ---------------------------------------------------------------------------
# Packed variable-length sequences
# ---------------------------------------------------------------------------
def _check_packed(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense(name, t)
    if t.dim() != 3:
        raise ValueError(f"{name} must have 3 dimensions (total_tokens, heads, head_dim), "
                         f"got shape {tuple(t.shape)}")


def _check_cu_seqlens(name: str, cu, q) -> None:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
    check_dense(name, cu)
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype torch.int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must be 1-D with batch + 1 entries, got shape {tuple(cu.shape)}")
    if cu.device != q.device:
        raise ValueError(f"{name} must be on the device of q ({q.device}), got {cu.device}")


def _check_max_seqlen(name: str, value) -> int:
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


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None,
                     window=None, softcap=None, alibi_slopes=None, return_lse=False, deterministic=None):
    """Exact attention over packed sequences of different lengths (no padding).

    Sequence b owns query rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` and key
    rows ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``; each attends only within
    itself, with ``causal`` and ``window`` aligned bottom-right per sequence
    (as in :func:`attention`).  Lengths 0 and 1 are allowed; a query row whose
    sequence has no keys returns 0 (lse -inf).

    Args:
        q: (total_q, Hq, D); k, v: (total_k, Hkv, D), Hq a multiple of Hkv.
        cu_seqlens_q, cu_seqlens_k: int32 (B + 1,) cumulative lengths,
            starting at 0, non-decreasing, ending at total_q / total_k.
        max_seqlen_q, max_seqlen_k: ints >= the longest sequence (they size
            the kernels' grid).
        causal, scale, window, softcap: as in :func:`attention`.
        alibi_slopes: (Hq,) or (B, Hq) floats, as in :func:`attention`.
        return_lse: also return the log-sum-exp, float32 (Hq, total_q).
        deterministic: the backward, as in :func:`attention`.

    Returns:
        out (total_q, Hq, D), or (out, lse).

    The cumulative lengths are checked before anything is launched (one
    small device-to-host copy the first time a ``cu_seqlens`` tensor is seen,
    again after it is modified in place).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_packed(name, t)
    # the dense checks on (1, H, total, D) views: dtype, device, heads, head_dim
    scale = validate(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], causal, scale)
    _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q)
    _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
                         f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    max_q = _check_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_k = _check_max_seqlen("max_seqlen_k", max_seqlen_k)
    batch = cu_seqlens_q.numel() - 1
    hq = q.shape[1]
    if ops.uses_triton(q) and batch > _MAX_GRID_YZ:
        raise ValueError(f"the number of sequences ({batch}) must be at most {_MAX_GRID_YZ} on the GPU path; "
                         f"split the call")
    left, right = _check_window(window)
    cap = _check_softcap(softcap)
    slopes = _check_alibi(alibi_slopes, q, batch, hq)
    det = _check_deterministic(deterministic)
    out, lse = ops.attention_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_q), int(max_k), causal, scale,
                                        left, right, cap, slopes, det)
    if return_lse:
        return out, lse.float()
    return out
