"""KV-cache decoding: ``attention_with_kvcache``.

Appends new keys/values to a contiguous or paged cache in place, then attends
the queries to the whole cache with split-KV (flash-decoding) kernels on GPUs
and the same algorithm in plain PyTorch elsewhere.  Inputs are validated here,
before anything is launched or written.  Forward only (inference): the
result carries no gradient.  docs/decoding.md describes the algorithm.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Optional

import torch

from . import ops, reference_decode
from .api import check_dense, check_path_dtype

__all__ = ["attention_with_kvcache"]

MAX_HEAD_DIM = 256
MAX_NUM_SPLITS = 256
_MAX_GRID_YZ = 65535


@dataclasses.dataclass(frozen=True)
class _Plan:
    scale: float
    window: tuple[int, int]       # (left, right), causal folded in (right = 0); -1 = unbounded
    softcap: Optional[float]
    n_new: int
    capacity: int                 # keys one batch element can hold
    on_kernels: bool


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_4d(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense(name, t)
    if t.dim() != 4:
        raise ValueError(f"{name} must have 4 dimensions, got shape {tuple(t.shape)}")


def _check_index_tensor(name: str, t, dim: int, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense(name, t)
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if t.dim() != dim:
        raise ValueError(f"{name} must have shape {what}, got {tuple(t.shape)}")


def _check_real(name: str, x) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    if not math.isfinite(float(x)):
        raise ValueError(f"{name} must be finite, got {x}")
    return float(x)


def _validate(q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, causal, scale, window,
              softcap, alibi_slopes, num_splits, return_lse, check_indices) -> _Plan:
    """Check every argument (shapes, dtypes, devices, values); the contents of
    cache_seqlens and block_table are checked by :func:`_check_indices`."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_4d(name, t)
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new and v_new must be given together (or neither)")
    if k_new is not None:
        _check_4d("k_new", k_new)
        _check_4d("v_new", v_new)
    for name, flag in (("causal", causal), ("return_lse", return_lse), ("check_indices", check_indices)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")

    tensors = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)]
    if k_new is not None:
        tensors += [("k_new", k_new), ("v_new", v_new)]
    for name, t in tensors[1:]:
        if t.dtype != q.dtype:
            raise TypeError(f"{name} dtype {t.dtype} differs from q dtype {q.dtype}; q, k_cache, v_cache, "
                            f"k_new and v_new must share one dtype")
    on_kernels = check_path_dtype("q", q)

    _check_index_tensor("cache_seqlens", cache_seqlens, 1, "(batch,)")
    if block_table is not None:
        _check_index_tensor("block_table", block_table, 2, "(batch, max_blocks)")
    indexed = [("cache_seqlens", cache_seqlens)] + ([("block_table", block_table)] if block_table is not None else [])
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor):
            raise TypeError(f"alibi_slopes must be a torch.Tensor, got {type(alibi_slopes).__name__}")
        check_dense("alibi_slopes", alibi_slopes)
        if alibi_slopes.dtype != torch.float32:
            raise TypeError(f"alibi_slopes must be float32, got {alibi_slopes.dtype}")
        indexed.append(("alibi_slopes", alibi_slopes))
    for name, t in tensors[1:] + indexed:
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; all tensors must be on one device")

    b, hq, n_q, d = q.shape
    if d == 0 or d > MAX_HEAD_DIM:
        raise ValueError(f"head_dim (last dimension of q) must be in 1..{MAX_HEAD_DIM}, got {d}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    hkv = k_cache.shape[1]
    if k_cache.shape[3] != d:
        raise ValueError(f"head_dim must agree: q has {d}, k_cache/v_cache have {k_cache.shape[3]}")
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"the number of query heads ({hq}) must be a multiple of the number of "
                         f"key/value heads in k_cache ({hkv})")
    if cache_seqlens.shape[0] != b:
        raise ValueError(f"cache_seqlens must have shape (batch,) = ({b},), got {tuple(cache_seqlens.shape)}")

    if block_table is None:
        if k_cache.shape[0] != b:
            raise ValueError(f"k_cache/v_cache batch size ({k_cache.shape[0]}) must equal q's ({b}); "
                             f"a paged cache needs block_table")
        capacity = k_cache.shape[2]
    else:
        page_size = k_cache.shape[2]
        if page_size == 0 or page_size % 16:
            raise ValueError(f"page size (k_cache.shape[2] with block_table) must be a positive multiple of 16, "
                             f"got {page_size}")
        if k_cache.shape[0] == 0:
            raise ValueError("a paged k_cache/v_cache needs at least one page (shape[0] >= 1)")
        if block_table.shape[0] != b:
            raise ValueError(f"block_table must have shape (batch, max_blocks) with batch = {b}, got "
                             f"{tuple(block_table.shape)}")
        capacity = block_table.shape[1] * page_size

    n_new = 0
    if k_new is not None:
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new and v_new must have the same shape, got {tuple(k_new.shape)} and "
                             f"{tuple(v_new.shape)}")
        if k_new.shape[0] != b or k_new.shape[1] != hkv or k_new.shape[3] != d:
            raise ValueError(f"k_new/v_new must have shape (batch, kv_heads, n_new, head_dim) = "
                             f"({b}, {hkv}, n_new, {d}), got {tuple(k_new.shape)}")
        n_new = k_new.shape[2]
        if n_new > capacity:
            raise ValueError(f"the cache is too small for k_new: {n_new} new tokens exceed its capacity "
                             f"of {capacity} tokens")

    if torch.is_grad_enabled():
        for name, t in tensors:
            if t.requires_grad:
                raise ValueError(f"{name} requires grad, but attention_with_kvcache is forward-only "
                                 f"(inference); use tileattn.attention for training or call under "
                                 f"torch.no_grad()")

    # the kernels' grids put the batch on a grid dimension of at most 65535
    # programs (kv heads x query blocks go on the first, which takes 2**31 - 1)
    if on_kernels and b > _MAX_GRID_YZ:
        raise ValueError(f"batch ({b}) must be at most {_MAX_GRID_YZ} on the GPU path; split the call")

    if scale is None:
        scale = 1.0 / math.sqrt(d)
    else:
        scale = _check_real("scale", scale)

    if window is None:
        left, right = -1, -1
    else:
        if not isinstance(window, (tuple, list)) or len(window) != 2 or not all(_is_int(w) for w in window):
            raise TypeError(f"window must be None or a pair of ints (left, right), got {window!r}")
        left, right = int(window[0]), int(window[1])
        if left < -1 or right < -1:
            raise ValueError(f"window sizes must be >= 0, or -1 for unbounded, got {window!r}")
    if causal:
        right = 0

    if softcap is not None:
        softcap = _check_real("softcap", softcap)
        if softcap <= 0:
            raise ValueError(f"softcap must be positive (or None for no softcap), got {softcap}")

    if alibi_slopes is not None and tuple(alibi_slopes.shape) not in ((hq,), (b, hq)):
        raise ValueError(f"alibi_slopes must have shape (num_heads,) = ({hq},) or (batch, num_heads) = "
                         f"({b}, {hq}), got {tuple(alibi_slopes.shape)}")

    if not _is_int(num_splits):
        raise TypeError(f"num_splits must be an int, got {type(num_splits).__name__}")
    if not 0 <= num_splits <= MAX_NUM_SPLITS:
        raise ValueError(f"num_splits must be in 0..{MAX_NUM_SPLITS} (0: chosen from the shape), got {num_splits}")

    return _Plan(scale=scale, window=(left, right), softcap=softcap, n_new=n_new, capacity=capacity,
                 on_kernels=on_kernels)


# validated calls: _call_key -> _Plan.  A decoding loop makes
# the same call every step with new data, and the key (every tensor's
# shape, strides, dtype, device, alignment and requires_grad, every other
# argument with its type, the grad mode and the dispatch switch) holds all
# that _validate reads, so a repeated call skips it; the same key then keys
# the call's launch plan (launch_decode.kvcache_attention).
_VALIDATED: dict = {}
_VALIDATED_MAX = 256


def _call_key(q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, causal, scale, window, softcap,
              alibi_slopes, num_splits, return_lse, check_indices):
    """The key of a call whose tensors are all plain ``torch.Tensor``s, or None
    (then the call is validated in full)."""
    if type(q) is not torch.Tensor:
        return None
    if window is not None:
        if type(window) not in (tuple, list) or len(window) != 2:
            return None
        window = (type(window[0]), window[0], type(window[1]), window[1])
    key = [ops._backend, torch.is_grad_enabled(), causal, type(causal), return_lse, type(return_lse),
           check_indices, type(check_indices), scale, type(scale), softcap, type(softcap),
           num_splits, type(num_splits), window]
    try:
        for t in (q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, alibi_slopes):
            if t is None:
                key.append(None)
            elif type(t) is torch.Tensor:
                key += (t.shape, t.stride(), t.dtype, t.device, t.requires_grad, t.data_ptr() % 16 == 0)
            else:
                return None
        key = tuple(key)
        hash(key)
    except (TypeError, RuntimeError):   # unhashable arguments; tensors without strides or storage
        return None
    return key


def _check_indices(cache_seqlens, block_table, n_new: int, capacity: int, num_pages: int, page_size: int) -> None:
    """cache_seqlens + n_new must fit the cache and every page the call touches
    must exist.  Reads the index tensors on the host: one device sync."""
    seq = cache_seqlens.long()
    bad_len = (seq < 0) | (seq + n_new > capacity)
    flags = [bad_len.any()]
    if block_table is not None:
        used = torch.clamp((seq + n_new + page_size - 1) // page_size, 0, block_table.shape[1])
        cols = torch.arange(block_table.shape[1], device=seq.device)
        touched = cols[None, :] < used[:, None]
        bad_page = touched & ((block_table < 0) | (block_table >= num_pages))
        flags.append(bad_page.any())
    flags = torch.stack(flags).tolist()
    if flags[0]:
        i = int(bad_len.nonzero()[0, 0])
        n = int(seq[i])
        if n < 0:
            raise ValueError(f"cache_seqlens[{i}] = {n} is negative")
        raise ValueError(f"the cache is too small for k_new: cache_seqlens[{i}] = {n} plus {n_new} new tokens "
                         f"exceeds the capacity of {capacity} tokens" if n_new else
                         f"cache_seqlens[{i}] = {n} exceeds the cache capacity of {capacity} tokens")
    if len(flags) > 1 and flags[1]:
        i, j = (int(x) for x in bad_page.nonzero()[0])
        raise ValueError(f"block_table[{i}, {j}] = {int(block_table[i, j])} is out of range: the paged cache has "
                         f"{num_pages} pages (entries a sequence uses must be in 0..{num_pages - 1})")


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, *, k_new=None, v_new=None, block_table=None,
                           causal=True, scale=None, window=None, softcap=None, alibi_slopes=None,
                           num_splits=0, return_lse=False, check_indices=True):
    """Attention of new queries over a KV cache, after appending new keys/values
    to it in place (incremental decoding).

    Args:
        q: (B, Hq, Nq, D) queries (Nq = 1 for one decoding step; more for
            speculative or chunked steps).
        k_cache, v_cache: the cache, modified in place when k_new is given.
            Contiguous: (B, Hkv, max_seqlen, D).  Paged (with block_table):
            (num_pages, Hkv, page_size, D), page_size a multiple of 16.
            Hq must be a multiple of Hkv (GQA/MQA: the query heads sharing a
            kv head are computed together, the cache is never expanded).
            Any strides.
        cache_seqlens: int32 (B,): valid entries of each batch element's
            cache *before* the append.
        k_new, v_new: optional (B, Hkv, Nnew, D): written to positions
            cache_seqlens[b] .. cache_seqlens[b] + Nnew - 1, then attended to.
            ``cache_seqlens`` itself is not changed (advance it yourself).
            Pages written by the append must not be shared between batch
            elements.
        block_table: optional int32 (B, max_blocks): logical block j of batch
            element b is page block_table[b, j].  Only the entries a sequence
            uses (j < ceil(length / page_size)) are read.
        causal: bottom-right aligned against the length after the append:
            query i sees key j iff j <= i + Nk - Nq, Nk = cache_seqlens[b] + Nnew.
        scale: softmax scale, default 1/sqrt(D).
        window: (left, right), -1 = unbounded: query i sees keys
            i + Nk - Nq - left .. i + Nk - Nq + right (with causal, right = 0).
        softcap: c > 0: scores s = scale * q.k become c * tanh(s / c).
        alibi_slopes: float32 (Hq,) or (B, Hq): adds -slope * |i + Nk - Nq - j|
            to the (softcapped) scores.
        num_splits: how many programs share one (batch, kv head)'s cache
            (flash-decoding), each an equal part; 0 picks from the shape and
            the GPU's SM count (``tileattn.launch_decode.choose_splits``:
            even splits, or on long caches where one split fills the SMs
            once, a leading split that takes most of each cache).  Any value
            gives the same result up to rounding.
        return_lse: also return the log-sum-exp of the scores, float32
            (B, Hq, Nq).
        check_indices: check the *contents* of cache_seqlens and block_table
            (lengths within the cache, pages in range) before launching:
            one host-device sync.  With False nothing waits for the GPU (and
            the call can be captured in a CUDA graph); out-of-range indices
            then give undefined results, but never access memory outside the
            cache (indices are clamped in the kernels).

    Returns:
        out (B, Hq, Nq, D) in q's dtype, or (out, lse).  Rows that see no key
        (an empty cache, or a window/causal mask that hides every key) give 0
        and lse -inf.

    fp16, bf16 and fp32 run Triton kernels on GPUs; elsewhere (and for
    float64 on CPU) the same split-KV algorithm runs in PyTorch.
    """
    args = (q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, causal, scale, window, softcap,
            alibi_slopes, num_splits, return_lse, check_indices)
    key = _call_key(*args)
    plan = _VALIDATED.get(key) if key is not None else None
    if plan is None:
        plan = _validate(*args)
        if key is not None:
            if len(_VALIDATED) >= _VALIDATED_MAX:
                _VALIDATED.clear()
            _VALIDATED[key] = plan
    paged = block_table is not None
    if check_indices:
        _check_indices(cache_seqlens, block_table, plan.n_new, plan.capacity,
                       k_cache.shape[0] if paged else 0, k_cache.shape[2])

    with torch.no_grad():
        if plan.on_kernels:
            from . import launch_decode
            out, lse = launch_decode.kvcache_attention(
                q, k_cache, v_cache, cache_seqlens, block_table, n_new=plan.n_new, capacity=plan.capacity,
                scale=plan.scale, window=plan.window, softcap=plan.softcap, alibi_slopes=alibi_slopes,
                num_splits=num_splits, k_new=k_new, v_new=v_new, call_key=key)
        else:
            if k_new is not None:
                reference_decode.append_kv_(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table)
            n_k = torch.clamp(cache_seqlens.long() + plan.n_new, 0, plan.capacity)
            out, lse = reference_decode.kvcache_attention(
                q, k_cache, v_cache, n_k, block_table, scale=plan.scale, window=plan.window,
                softcap=plan.softcap, alibi_slopes=alibi_slopes, num_splits=max(1, num_splits))
    if return_lse:
        return out, lse.float()
    return out
