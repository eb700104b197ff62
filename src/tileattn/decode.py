"""KV-cache decoding: ``attention_with_kvcache``.

Appends new keys/values to a contiguous or paged cache in place, then attends
the queries to the whole cache with split-KV (flash-decoding) kernels on GPUs
and the same algorithm in plain PyTorch elsewhere.  Inputs are checked
(``validation_kvcache.check_kvcache``) before anything is launched or written.
Forward only (inference): the result carries no gradient.  V may have a head
dim of its own, and a cache whose values are the first channels of its keys
(``v_cache = k_cache[..., :Dv]``, the absorbed MLA layout at D = 576,
Dv = 512) is read once.  docs/decoding.md describes the algorithm.
"""
from __future__ import annotations

import torch

from . import dispatch, reference_decode
from .sinks import with_sinks
from . import validation as val
from . import validation_kvcache as val_kv

__all__ = ["attention_with_kvcache"]

# validated calls: _call_key -> validation_kvcache.KVCacheArgs.  A decoding
# loop makes the same call every step with new data, and the key (every
# tensor's shape, strides, dtype, device, alignment and requires_grad, whether
# v_cache starts where k_cache does and v_new where k_new does, every other
# argument with its type, the grad mode and the dispatch switch) holds all
# that the checks read, so a repeated call skips it; the same key then keys
# the call's launch plan (launch.decode.kvcache_attention).
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
    key = [dispatch._backend, torch.is_grad_enabled(), causal, type(causal), return_lse, type(return_lse),
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
        # the shared K/V layout (validation_kvcache.shares_kv) is told apart by addresses
        key.append(k_cache.data_ptr() == v_cache.data_ptr())
        key.append(k_new is not None and v_new is not None and k_new.data_ptr() == v_new.data_ptr())
        key = tuple(key)
        hash(key)
    except (TypeError, RuntimeError):   # unhashable arguments; tensors without strides or storage
        return None
    return key


def _validate(q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, causal, scale, window, softcap,
              alibi_slopes, num_splits, return_lse, check_indices) -> val_kv.KVCacheArgs:
    """The checks of one call (``validation_kvcache.check_kvcache``) on the path ``q`` selects."""
    return val_kv.check_kvcache(q, k_cache, v_cache, cache_seqlens, k_new, v_new, block_table, causal, scale, window,
                             softcap, alibi_slopes, num_splits, return_lse, check_indices,
                             uses_kernels=dispatch.uses_triton)


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, *, k_new=None, v_new=None, block_table=None,
                           causal=True, scale=None, window=None, softcap=None, alibi_slopes=None,
                           sinks=None, num_splits=0, return_lse=False, check_indices=True):
    """Attention of new queries over a KV cache, after appending new keys/values
    to it in place (incremental decoding).

    Args:
        q: (B, Hq, Nq, D) queries (Nq = 1 for one decoding step; more for
            speculative or chunked steps).
        k_cache, v_cache: the cache, modified in place when k_new is given.
            Contiguous: (B, Hkv, max_seqlen, D) and (B, Hkv, max_seqlen, Dv).
            Paged (with block_table): (num_pages, Hkv, page_size, D) and
            (..., Dv), page_size a multiple of 16.  D and Dv (V's head dim,
            the output's) each in 1..MAX_DECODE_HEAD_DIM (256).  Hq must be a multiple
            of Hkv (GQA/MQA: the query heads sharing a kv head are computed
            together, the cache is never expanded).  Any strides.
            ``v_cache = k_cache[..., :Dv]`` (a view, Dv < D) says that each
            key's first Dv channels are its value: each cached key is then
            read once, V taken from it.  That is the absorbed MLA layout of
            DeepSeek-V2/V3 decoding (D = 576, Dv = 512, one kv head), the
            only layout that takes D = 576.
        cache_seqlens: int32 (B,): valid entries of each batch element's
            cache *before* the append.
        k_new, v_new: optional (B, Hkv, Nnew, D) and (B, Hkv, Nnew, Dv):
            written to positions cache_seqlens[b] .. cache_seqlens[b] + Nnew
            - 1, then attended to.  With ``v_cache = k_cache[..., :Dv]``
            only k_new is written (its first Dv channels are the new
            values): v_new must then be None or ``k_new[..., :Dv]``; with
            ``v_cache`` the same tensor as ``k_cache``, v_new must be k_new.
            ``cache_seqlens`` itself is not changed (advance it yourself).
            Pages written by the append must not be shared between batch
            elements.
        block_table: optional int32 (B, max_blocks): logical block j of batch
            element b is page block_table[b, j].  Only the entries a sequence
            uses (j < ceil(length / page_size)) are read.
        causal: bottom-right aligned against the length after the append:
            query i sees key j iff j <= i + Nk - Nq, Nk = cache_seqlens[b] + Nnew.
        scale: softmax scale, default 1/sqrt(D) (D = q's head dim).
        window: (left, right), -1 = unbounded: query i sees keys
            i + Nk - Nq - left .. i + Nk - Nq + right (with causal, right = 0).
        softcap: c > 0: scores s = scale * q.k become c * tanh(s / c); None
            or 0 for none (as in :func:`tileattn.attention`).
        alibi_slopes: (Hq,) or (B, Hq) floats of any floating dtype (cast to
            float32): adds -slope * |i + Nk - Nq - j| to the (softcapped)
            scores.
        sinks: float32 (Hq,) attention sinks, as in :func:`tileattn.attention`:
            counted once per row, whatever ``num_splits``; the lse includes
            them, and a row that sees no key gives 0 and lse = sinks[h].
            Forward-only like the other tensors: sinks that require grad
            raise (pass ``sinks.detach()``).
        num_splits: how many programs share one (batch, kv head)'s cache
            (flash-decoding), each an equal part; 0 picks from the shape and
            the GPU's SM count (``tileattn.launch.decode.choose_splits``:
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
        out (B, Hq, Nq, Dv) in q's dtype, or (out, lse).  Rows that see no key
        (an empty cache, or a window/causal mask that hides every key) give 0
        and lse -inf (with sinks: lse = sinks[h]).

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
    # the kernels read the lengths by raw pointer: a strided view (a column of a table) as a dense copy
    cache_seqlens = cache_seqlens.contiguous()
    sinks = val.check_sinks(sinks, q, q.shape[1])   # on every call (cheap), before the cache is written
    if sinks is not None and sinks.requires_grad and torch.is_grad_enabled():
        raise ValueError("sinks requires grad, but attention_with_kvcache is forward-only (inference); use "
                         "tileattn.attention for training, pass sinks.detach() or call under torch.no_grad()")
    paged = block_table is not None
    slopes = val.cast_alibi(alibi_slopes, q)
    if check_indices:
        val_kv.check_kvcache_indices(cache_seqlens, block_table, plan.n_new, plan.capacity,
                       k_cache.shape[0] if paged else 0, k_cache.shape[2])

    with torch.no_grad():
        if plan.on_kernels:
            from .launch import decode as launch_decode
            out, lse = launch_decode.kvcache_attention(
                q, k_cache, v_cache, cache_seqlens, block_table, n_new=plan.n_new, capacity=plan.capacity,
                scale=plan.scale, window=plan.window, softcap=plan.softcap, alibi_slopes=slopes,
                num_splits=num_splits, k_new=k_new, v_new=None if plan.shared_kv else v_new,
                shared_kv=plan.shared_kv, call_key=key)
        else:
            if k_new is not None:
                reference_decode.append_kv_(k_cache, v_cache, k_new, None if plan.shared_kv else v_new,
                                            cache_seqlens, block_table)
            n_k = torch.clamp(cache_seqlens.long() + plan.n_new, 0, plan.capacity)
            out, lse = reference_decode.kvcache_attention(
                q, k_cache, v_cache, n_k, block_table, scale=plan.scale, window=plan.window,
                softcap=plan.softcap, alibi_slopes=slopes, num_splits=max(1, num_splits),
                shared_kv=plan.shared_kv)
        out, lse = with_sinks(out, lse, sinks)
    if return_lse:
        return out, lse.float()
    return out
