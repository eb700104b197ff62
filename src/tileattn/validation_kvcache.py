"""The argument rules of ``attention_with_kvcache``, built from the shared
ones of ``validation.py``; checked before anything is launched or written.

Head dims: q and k_cache (and k_new) have D, v_cache (and v_new, and the
output) Dv, each in 1..``MAX_DECODE_HEAD_DIM`` (the decoding configs are
sized up to it; training and prefill go to ``MAX_HEAD_DIM``).  The one exception is the absorbed
MLA layout (DeepSeek-V2/V3 decoding with the up-projections absorbed into the
query and the output): a single 576-wide cache whose first 512 channels of
every key are its value, passed as ``v_cache = k_cache[..., :512]``.  D = 576
(and Dv = 512, above ``MAX_DECODE_HEAD_DIM``) is accepted in that layout
only.  More generally, whenever v_cache is a view of the first Dv < D
channels of k_cache (:func:`shares_kv`: the same first element and strides),
the kernels read each cached key once and take V from it; the appended
values are then k_new's first Dv channels (v_new None, or that view of
k_new).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch

from .validation import (MAX_DECODE_HEAD_DIM, MAX_GRID_YZ, MAX_NUM_SPLITS, check_alibi, check_bool, check_device,
                         check_head_dim, check_heads, check_index_tensor, check_path_dtype, check_scale,
                         check_softcap, check_tensor, check_window, fold_causal, is_int)

# the absorbed MLA layout: q and k_cache of MLA_HEAD_DIM, v_cache = k_cache[..., :MLA_HEAD_DIM_V]
MLA_HEAD_DIM = 576
MLA_HEAD_DIM_V = 512


def shares_kv(k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether ``v`` is ``k[..., :Dv]`` for a Dv below k's head dim: one
    storage, the same first element, the same strides and leading sizes (so
    that every key's first Dv channels are its value).  Reads no data."""
    return (v.shape[-1] < k.shape[-1] and v.shape[:-1] == k.shape[:-1] and v.stride() == k.stride()
            and v.numel() > 0 and v.data_ptr() == k.data_ptr() and v.device == k.device)


@dataclasses.dataclass(frozen=True)
class KVCacheArgs:
    """What the checks of ``attention_with_kvcache`` derive from its arguments."""
    scale: float
    window: tuple[int, int]       # (left, right), causal folded in (right = 0); -1 = unbounded
    softcap: Optional[float]      # None: off
    n_new: int
    capacity: int                 # keys one batch element can hold
    on_kernels: bool
    shared_kv: bool = False       # v_cache is k_cache[..., :Dv] (shares_kv): K read once, V taken from it


def _check_head_dims(d: int, dv: int, shared: bool) -> None:
    if shared and (d, dv) == (MLA_HEAD_DIM, MLA_HEAD_DIM_V):
        return
    if d == MLA_HEAD_DIM:
        raise ValueError(f"head_dim {MLA_HEAD_DIM} is only supported for decoding with v_cache = "
                         f"k_cache[..., :{MLA_HEAD_DIM_V}] (the absorbed MLA layout: one cache, each key's first "
                         f"{MLA_HEAD_DIM_V} channels its value); got q and k_cache of head dim {d} and a v_cache "
                         f"of head dim {dv} {'(a view of k_cache)' if shared else '(not a view of k_cache)'}")
    where = " in attention_with_kvcache (MAX_DECODE_HEAD_DIM)"
    check_head_dim(d, "q, k_cache", MAX_DECODE_HEAD_DIM, where)
    if dv == MLA_HEAD_DIM_V:
        raise ValueError(f"v_cache head dim {dv} is only supported as v_cache = k_cache[..., :{dv}] with "
                         f"k_cache of head dim {MLA_HEAD_DIM} (the absorbed MLA layout), got k_cache head dim {d}")
    check_head_dim(dv, "v_cache", MAX_DECODE_HEAD_DIM, where)


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are one view of one memory (same first element,
    shape, strides and device; reads no data)."""
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.device == b.device)


def _check_new(k_new, v_new, b: int, hkv: int, d: int, dv: int, shared: bool, same_cache: bool = False) -> int:
    """The new tokens' shapes; returns Nnew.  ``same_cache``: v_cache is
    k_cache itself, so v_new must be k_new."""
    if k_new.shape[0] != b or k_new.shape[1] != hkv or k_new.shape[3] != d:
        raise ValueError(f"k_new/v_new must have shape (batch, kv_heads, n_new, head_dim) = "
                         f"({b}, {hkv}, n_new, {d}) for k_new, got {tuple(k_new.shape)}")
    if v_new is None:
        return k_new.shape[2]
    if same_cache and not _same_view(k_new, v_new):
        raise ValueError("v_new must be k_new itself (the same tensor) when v_cache is k_cache (one cache, each key "
                         "its own value): both appends would write the same cache rows, the values over the keys")
    if shared and not shares_kv(k_new, v_new):
        raise ValueError(f"v_new must be None or k_new[..., :{dv}] when v_cache is k_cache[..., :{dv}] (the values "
                         f"are the keys' first {dv} channels, appended with k_new), got a v_new of shape "
                         f"{tuple(v_new.shape)} that is not that view of k_new")
    if v_new.shape[:3] != k_new.shape[:3]:
        raise ValueError(f"k_new and v_new must have the same shape but for the head dim, got "
                         f"{tuple(k_new.shape)} and {tuple(v_new.shape)}")
    if v_new.shape[3] != dv:
        raise ValueError(f"v_new's head dim ({v_new.shape[3]}) must equal v_cache's ({dv})")
    return k_new.shape[2]


def check_kvcache(q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, causal, scale, window,
                  softcap, alibi_slopes, num_splits, return_lse, check_indices, *,
                  uses_kernels: Callable) -> KVCacheArgs:
    """Every argument of ``attention_with_kvcache`` (shapes, dtypes, devices,
    values); the contents of cache_seqlens and block_table are checked by
    :func:`check_kvcache_indices`.  ``uses_kernels(q)``: as for
    ``validation.check_qkv``."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, t, 4)
    shared = shares_kv(k_cache, v_cache)
    if v_new is not None and k_new is None or k_new is not None and v_new is None and not shared:
        raise ValueError("k_new and v_new must be given together (or neither); v_new may be left out only when "
                         "v_cache is k_cache[..., :Dv]")
    if k_new is not None:
        check_tensor("k_new", k_new, 4)
    if v_new is not None:
        check_tensor("v_new", v_new, 4)
    for name, flag in (("causal", causal), ("return_lse", return_lse), ("check_indices", check_indices)):
        check_bool(name, flag)

    tensors = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k_new", k_new), ("v_new", v_new)]
    tensors = [(name, t) for name, t in tensors if t is not None]
    for name, t in tensors[1:]:
        if t.dtype != q.dtype:
            raise TypeError(f"{name} dtype {t.dtype} differs from q dtype {q.dtype}; q, k_cache, v_cache, "
                            f"k_new and v_new must share one dtype")
    on_kernels = uses_kernels(q)
    check_path_dtype("q", q, on_kernels)

    check_index_tensor("cache_seqlens", cache_seqlens, 1, "(batch,)")
    if block_table is not None:
        check_index_tensor("block_table", block_table, 2, "(batch, max_blocks)")
    for name, t in tensors[1:] + [("cache_seqlens", cache_seqlens), ("block_table", block_table)]:
        if t is not None:
            check_device(name, t, q)

    b, hq, n_q, d = q.shape
    if k_cache.shape[3] != d:
        raise ValueError(f"head_dim must agree: q has {d}, k_cache has {k_cache.shape[3]}")
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(f"k_cache and v_cache must have the same shape but for the head dim, got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    dv = v_cache.shape[3]
    _check_head_dims(d, dv, shared)
    hkv = k_cache.shape[1]
    check_heads(hq, hkv, " in k_cache")
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
        n_new = _check_new(k_new, v_new, b, hkv, d, dv, shared, _same_view(k_cache, v_cache))
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
    if on_kernels and b > MAX_GRID_YZ:
        raise ValueError(f"batch ({b}) must be at most {MAX_GRID_YZ} on the GPU path; split the call")
    scale = check_scale(scale, d)
    left, right = fold_causal(causal, *check_window(window))
    cap = check_softcap(softcap)
    check_alibi(alibi_slopes, q, b, hq)
    if not is_int(num_splits):
        raise TypeError(f"num_splits must be an int, got {type(num_splits).__name__}")
    if not 0 <= num_splits <= MAX_NUM_SPLITS:
        raise ValueError(f"num_splits must be in 0..{MAX_NUM_SPLITS} (0: chosen from the shape), got {num_splits}")
    return KVCacheArgs(scale=scale, window=(left, right), softcap=cap or None, n_new=n_new, capacity=capacity,
                       on_kernels=on_kernels, shared_kv=shared)


def check_kvcache_indices(cache_seqlens, block_table, n_new: int, capacity: int, num_pages: int,
                          page_size: int) -> None:
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
