"""Block-sparse attention layouts.

A block mask is a boolean tensor of shape (B or 1, Hq or 1, ceil(Nq /
BLOCK_Q), ceil(Nk / BLOCK_K)).  Entry (b, h, i, j) says whether the query
rows [i * BLOCK_Q, (i + 1) * BLOCK_Q) of head h attend to the keys
[j * BLOCK_K, (j + 1) * BLOCK_K) at all; a block that is off is never loaded
or computed, forward or backward.  Inside a block that is on, every pair
takes part unless ``causal`` or ``window`` hides it, so token-level structure
(a causal diagonal, a band) comes from those arguments, and the block mask
only removes whole blocks.

BLOCK_Q = BLOCK_K = 128 on every device: the kernels' tiles divide 128 and
each kernel tile looks up the entry of the block it lies in
(``start // BLOCK_Q``).

:func:`block_mask_from_fn` builds a layout from a token-level predicate
(FlexAttention's ``mask_mod`` convention: True = attend) and reports its
density; :func:`kernel_block_lists` turns a layout into the per-block lists
of visible blocks that the kernels walk.  Building the lists takes ~30 small
device ops, ~1.7 ms of host time per call on the H200 host
(docs/perf-notes.md), more than the kernel at low density, so the launchers
go through :func:`cached_kernel_block_lists`, which builds them once per
layout tensor (a model reuses one layout in every layer and step, forward
and backward).
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Callable, NamedTuple

import torch

__all__ = ["BLOCK_Q", "BLOCK_K", "BlockMask", "block_mask_from_fn", "block_mask_shape", "density",
           "KernelBlockLists", "kernel_block_lists", "cached_kernel_block_lists", "clear_block_list_cache"]

BLOCK_Q = 128  # query rows per block-mask entry
BLOCK_K = 128  # keys per block-mask entry


class BlockMask(NamedTuple):
    """A block layout and the fraction of its blocks that are on."""

    mask: torch.Tensor   # bool (B or 1, H or 1, ceil(Nq / block_q), ceil(Nk / block_k))
    density: float


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_mask_shape(batch: int, heads: int, n_q: int, n_k: int) -> tuple[int, int, int, int]:
    """Shape of a full (unbroadcast) block mask for the given problem."""
    return batch, heads, _cdiv(n_q, BLOCK_Q), _cdiv(n_k, BLOCK_K)


def density(mask: torch.Tensor) -> float:
    """Fraction of the blocks of a layout that are on."""
    return float(mask.float().mean()) if mask.numel() else 0.0


def block_mask_from_fn(mask_fn: Callable, batch: int | None, heads: int | None, n_q: int, n_k: int, *,
                       device=None, block_q: int = BLOCK_Q, block_k: int = BLOCK_K,
                       rows_per_chunk: int = 1024) -> BlockMask:
    """Evaluate ``mask_fn(b, h, q_idx, k_idx) -> bool tensor`` (True = attend)
    on broadcast index tensors and keep each (block_q x block_k) block that
    contains at least one attended pair.

    ``batch`` / ``heads`` of None build a layout broadcast over that axis
    (``mask_fn`` then sees b = 0 / h = 0).  Returns :class:`BlockMask`
    (the bool layout and its density).  ``tileattn.attention`` takes layouts
    of the default BLOCK_Q x BLOCK_K blocks; other block sizes are for
    analysis.  The predicate is evaluated ``rows_per_chunk`` query rows at a
    time, so memory stays O(B * H * rows_per_chunk * Nk).
    """
    if not callable(mask_fn):
        raise TypeError(f"mask_fn must be callable, got {type(mask_fn).__name__}")
    for name, val in (("batch", batch), ("heads", heads)):
        if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val < 1):
            raise ValueError(f"{name} must be a positive int or None, got {val!r}")
    for name, val in (("n_q", n_q), ("n_k", n_k), ("block_q", block_q), ("block_k", block_k)):
        if isinstance(val, bool) or not isinstance(val, int) or val < (0 if name.startswith("n_") else 1):
            raise ValueError(f"{name} must be a {'non-negative' if name.startswith('n_') else 'positive'} int, "
                             f"got {val!r}")
    b_n, h_n = batch or 1, heads or 1
    nqb, nkb = _cdiv(n_q, block_q), _cdiv(n_k, block_k)
    out = torch.zeros(b_n, h_n, nqb, nkb, dtype=torch.bool, device=device)
    b_idx = torch.arange(b_n, device=device)[:, None, None, None]
    h_idx = torch.arange(h_n, device=device)[None, :, None, None]
    k_idx = torch.arange(n_k, device=device)[None, None, None, :]
    pad_k = nkb * block_k - n_k
    chunk = max(block_q, (rows_per_chunk // block_q) * block_q)
    for r0 in range(0, n_q, chunk):
        r1 = min(r0 + chunk, n_q)
        q_idx = torch.arange(r0, r1, device=device)[None, None, :, None]
        keep = torch.as_tensor(mask_fn(b_idx, h_idx, q_idx, k_idx), device=device).bool()
        keep = keep.expand(b_n, h_n, r1 - r0, n_k)
        # pad to whole blocks with False and reduce each block with any()
        pad_q = _cdiv(r1 - r0, block_q) * block_q - (r1 - r0)
        keep = torch.nn.functional.pad(keep, (0, pad_k, 0, pad_q), value=False)
        keep = keep.reshape(b_n, h_n, -1, block_q, nkb, block_k).any(dim=5).any(dim=3)
        out[:, :, r0 // block_q:r0 // block_q + keep.shape[2]] = keep
    return BlockMask(out, density(out))


class KernelBlockLists(NamedTuple):
    """For each block row (query block) and block column (key block) of a
    layout, the visible blocks on the other axis, split into *full* blocks
    (every pair visible: no token mask needed) and *partial* ones (the causal
    diagonal, the window's edges, the Nk edge).  Indices are ascending and
    padded with arbitrary values past each count.  int32 tensors:

    kv_full_num, kv_part_num (B', H', nqb); kv_full_idx, kv_part_idx (B', H', nqb, nkb);
    q_full_num, q_part_num (B', H', nkb); q_full_idx, q_part_idx (B', H', nkb, nqb).
    """

    kv_full_num: torch.Tensor
    kv_full_idx: torch.Tensor
    kv_part_num: torch.Tensor
    kv_part_idx: torch.Tensor
    q_full_num: torch.Tensor
    q_full_idx: torch.Tensor
    q_part_num: torch.Tensor
    q_part_idx: torch.Tensor


def _block_visibility(n_q: int, n_k: int, causal: bool, window, device):
    """(any, all) visible pairs per (query block, key block) under causal and
    window, both (nqb, nkb) bool.  Row i sees keys [lower(i), upper(i)]; both
    bounds grow with i, so a block's visible set is decided by its corners."""
    left, right = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    if causal:
        right = 0 if right < 0 else min(right, 0)
    diag = n_k - n_q
    nqb, nkb = _cdiv(n_q, BLOCK_Q), _cdiv(n_k, BLOCK_K)
    r0 = torch.arange(nqb, device=device)[:, None] * BLOCK_Q
    r1 = torch.clamp(r0 + BLOCK_Q, max=n_q) - 1
    k0 = torch.arange(nkb, device=device)[None, :] * BLOCK_K
    k1 = torch.clamp(k0 + BLOCK_K, max=n_k) - 1
    big = n_q + n_k + 1
    lower = (lambda i: i + diag - left) if left >= 0 else (lambda i: i - big)
    upper = (lambda i: i + diag + right) if right >= 0 else (lambda i: i + big)
    any_vis = (k1 >= lower(r0)) & (k0 <= upper(r1))
    all_vis = (lower(r1) <= k0) & (k1 <= upper(r0))
    # the last key block of a ragged Nk: its tiles need the Nk mask
    all_vis = all_vis & (k0 + BLOCK_K <= n_k)
    return any_vis, all_vis


def _lists(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    num = sel.sum(dim=-1, dtype=torch.int32)
    # a stable sort of "not selected" puts the selected indices first, in order
    idx = torch.sort((~sel).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
    return num.contiguous(), idx.contiguous()


def kernel_block_lists(block_mask: torch.Tensor, n_q: int, n_k: int, *, causal: bool = False,
                       window=None) -> KernelBlockLists:
    """The per-block lists of :class:`KernelBlockLists` for a layout combined
    with causal / window masking.  Blocks that causal or window hide entirely
    are dropped too, so the kernels walk only blocks with a visible pair."""
    any_vis, all_vis = _block_visibility(n_q, n_k, causal, window, block_mask.device)
    on = block_mask.bool() & any_vis
    full = on & all_vis
    part = on & ~all_vis
    kv = _lists(full) + _lists(part)
    q = _lists(full.transpose(-1, -2)) + _lists(part.transpose(-1, -2))
    return KernelBlockLists(*kv, *q)


# (id of the layout, n_q, n_k, causal, window) -> (weak reference to the
# layout, its version counter when the lists were built, the lists)
_LIST_CACHE: "OrderedDict[tuple, tuple]" = OrderedDict()
_LIST_CACHE_SIZE = 32
_LIST_CACHE_LOCK = threading.Lock()


def _drop(key):
    def callback(_ref):
        with _LIST_CACHE_LOCK:
            entry = _LIST_CACHE.get(key)
            if entry is not None and entry[0] is _ref:
                del _LIST_CACHE[key]
    return callback


def cached_kernel_block_lists(block_mask: torch.Tensor, n_q: int, n_k: int, *, causal: bool = False,
                              window=None) -> KernelBlockLists:
    """:func:`kernel_block_lists`, remembered per layout tensor.

    An entry is used only while its layout tensor is alive and unchanged: it
    is keyed by the tensor's identity and checked against the tensor's
    version counter, which every in-place torch write bumps (``mask[...] = ...``,
    ``mask.fill_``; a write that bypasses the counter, through ``.numpy()`` or
    ``.data``, is not seen: pass a new tensor after one).  An entry is
    dropped when its tensor is freed; at most
    ``_LIST_CACHE_SIZE`` entries are kept (least recently used first out).
    Tensors without a version counter (made under ``torch.inference_mode``)
    get fresh lists on every call."""
    try:
        version = block_mask._version
    except RuntimeError:   # inference tensors track no version
        return kernel_block_lists(block_mask, n_q, n_k, causal=causal, window=window)
    key = (id(block_mask), int(n_q), int(n_k), bool(causal),
           None if window is None else (int(window[0]), int(window[1])))
    with _LIST_CACHE_LOCK:
        entry = _LIST_CACHE.get(key)
        if entry is not None and entry[0]() is block_mask and entry[1] == version:
            _LIST_CACHE.move_to_end(key)
            return entry[2]
    lists = kernel_block_lists(block_mask, n_q, n_k, causal=causal, window=window)
    with _LIST_CACHE_LOCK:
        _LIST_CACHE[key] = (weakref.ref(block_mask, _drop(key)), version, lists)
        _LIST_CACHE.move_to_end(key)
        while len(_LIST_CACHE) > _LIST_CACHE_SIZE:
            _LIST_CACHE.popitem(last=False)
    return lists


def clear_block_list_cache() -> None:
    """Forget every remembered block list."""
    with _LIST_CACHE_LOCK:
        _LIST_CACHE.clear()
