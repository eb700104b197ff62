"""KV-cache decoding in plain PyTorch: the library's path off the GPU (and with
``use_backend("torch")``), written as the same split-KV algorithm as the
Triton kernels so that ``num_splits`` means the same thing on both paths.

Conventions (shared with ``kernels/decode.py``): after the append, batch
element b holds ``n_k[b] = cache_seqlens[b] + Nnew`` keys.  Query row i has
its diagonal at key ``q_pos = i + n_k[b] - Nq`` (bottom-right alignment) and
sees key j iff ``j < n_k[b]``, ``j >= q_pos - left`` (left >= 0) and
``j <= q_pos + right`` (right >= 0; causal means right = 0).  Scores are
``scale * q.k``, softcapped to ``c * tanh(s / c)``, plus the ALiBi bias
``-slope * |q_pos - j|``.

V may be narrower or wider than K (Dv != D); the output has Dv.  With
``shared_kv`` (``v_cache = k_cache[..., :Dv]``, validation_kvcache.shares_kv)
the keys are gathered once and the values are their first Dv channels, and
the append writes k_new alone.
"""
from __future__ import annotations

import torch

from .cpu import online_softmax_finish, online_softmax_step

__all__ = ["append_kv_", "gather_kv", "kvcache_attention", "combine_splits"]

# keys per step inside one split: bounds the (rows x keys) score buffer
_STEP = 1024


def append_kv_(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table=None) -> None:
    """Write k_new/v_new[b, :, t] at cache position cache_seqlens[b] + t, in
    place; v_new None writes k_new alone (v_cache a view of k_cache's first
    channels)."""
    b, _, n_new, _ = k_new.shape
    if n_new == 0 or b == 0:
        return
    dev = k_cache.device
    pos = cache_seqlens.to(device=dev, dtype=torch.long)[:, None] + torch.arange(n_new, device=dev)  # (B, Nnew)
    if block_table is None:
        first = torch.arange(b, device=dev)[:, None].expand(b, n_new)
        row = pos
    else:
        page_size = k_cache.shape[2]
        first = block_table.to(device=dev, dtype=torch.long).gather(1, pos // page_size)
        row = pos % page_size
    # (pages or batch, rows, heads, D) views of the caches; index_put_ writes through them
    k_cache.transpose(1, 2)[first, row] = k_new.transpose(1, 2).to(k_cache.dtype)
    if v_new is not None:
        v_cache.transpose(1, 2)[first, row] = v_new.transpose(1, 2).to(v_cache.dtype)


def gather_kv(cache: torch.Tensor, block_table, n_keys: int) -> torch.Tensor:
    """The first ``n_keys`` logical positions of every batch element as a
    (B, Hkv, n_keys, head dim) tensor (a view for a contiguous cache, a copy for a
    paged one).  Positions past a batch element's length hold whatever the
    cache holds there; callers mask them."""
    if block_table is None:
        return cache[:, :, :n_keys]
    page_size = cache.shape[2]
    n_pages = -(-n_keys // page_size)
    pages = block_table[:, :n_pages].to(device=cache.device, dtype=torch.long)
    # in-range page numbers for the entries past a sequence's end (never read unmasked)
    pages = pages.clamp(0, cache.shape[0] - 1)
    g = cache[pages]                                  # (B, n_pages, Hkv, P, D)
    b, _, h, _, d = g.shape
    g = g.permute(0, 2, 1, 3, 4).reshape(b, h, n_pages * page_size, d)
    return g[:, :, :n_keys]


def combine_splits(outs: list[torch.Tensor], lses: list[torch.Tensor]):
    """Merge partial results by their log-sum-exp: out = sum_s w_s out_s with
    w_s = exp(lse_s - lse), lse = log sum_s exp(lse_s).  Splits (and rows)
    with lse = -inf weigh 0; a row with no key at all gets out 0, lse -inf."""
    lse_all = torch.stack(lses)                                    # (S, ...)
    m = lse_all.amax(dim=0)
    m_ref = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w = torch.exp(lse_all - m_ref)                                 # -inf -> 0
    total = w.sum(dim=0)
    acc = sum(wi[..., None] * oi for wi, oi in zip(w, outs))
    empty = total == 0
    t_safe = torch.where(empty, torch.ones_like(total), total)
    out = acc / t_safe[..., None]
    lse = torch.where(empty, torch.full_like(m, float("-inf")), m_ref + torch.log(t_safe))
    return out, lse


def _partial(qg, k, v, start, stop, n_k, n_q, scale, window, softcap, slopes):
    """Online softmax over keys [start, stop) for all rows: (out, lse) with
    out normalised by its own sum (0 and -inf where the split saw nothing)."""
    acc_t = qg.dtype
    b, hkv, g, _, d = qg.shape
    left, right = window
    m = torch.full((b, hkv, g, n_q), float("-inf"), dtype=acc_t, device=qg.device)
    l = torch.zeros_like(m)
    o = torch.zeros((b, hkv, g, n_q, v.shape[-1]), dtype=acc_t, device=qg.device)
    q_pos = (torch.arange(n_q, device=qg.device)[None, :] + (n_k - n_q)[:, None])  # (B, Nq)
    q_pos = q_pos[:, None, None, :, None]                                         # (B, 1, 1, Nq, 1)
    n_k5 = n_k[:, None, None, None, None]
    for s0 in range(start, stop, _STEP):
        s1 = min(s0 + _STEP, stop)
        kj = k[:, :, s0:s1].to(acc_t).unsqueeze(2)
        vj = v[:, :, s0:s1].to(acc_t).unsqueeze(2)
        s = torch.matmul(qg, kj.transpose(-2, -1)) * scale
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        cols = torch.arange(s0, s1, device=qg.device)
        if slopes is not None:
            s = s - slopes * (q_pos - cols).abs().to(acc_t)
        visible = cols < n_k5
        if left >= 0:
            visible = visible & (cols >= q_pos - left)
        if right >= 0:
            visible = visible & (cols <= q_pos + right)
        # keys past n_k may hold anything (even NaN): zero them before P @ V
        vj = torch.where((cols < n_k[:, None])[:, None, None, :, None], vj, torch.zeros((), dtype=acc_t))
        s = s.masked_fill(~visible, float("-inf"))
        m, l, o = online_softmax_step(m, l, o, s, vj)
    return online_softmax_finish(m, l, o)


def kvcache_attention(q, k_cache, v_cache, n_k, block_table=None, *, scale, window=(-1, -1), softcap=None,
                      alibi_slopes=None, num_splits=1, shared_kv=False):
    """Attention of q (B, Hq, Nq, D) over the first n_k[b] cached keys of each
    batch element (the append already done); values of v_cache's head dim Dv
    (with ``shared_kv`` the first Dv channels of the gathered keys).  ``window`` is (left, right)
    with causal already folded in (right = 0).  The keys [0, max n_k) are cut
    into ``num_splits`` equal ranges, each computed on its own and merged by
    :func:`combine_splits`, as the kernels do.  Returns (out (B, Hq, Nq, Dv)
    in q's dtype, lse float32 (float64 for float64 q) of shape (B, Hq, Nq))."""
    b, hq, n_q, d = q.shape
    dv = v_cache.shape[-1]
    hkv = k_cache.shape[1]
    acc_t = torch.float64 if q.dtype == torch.float64 else torch.float32
    n_k = n_k.to(device=q.device, dtype=torch.long)
    n_max = int(n_k.max()) if b > 0 else 0
    k = gather_kv(k_cache, block_table, n_max)
    v = k[..., :dv] if shared_kv else gather_kv(v_cache, block_table, n_max)
    qg = q.to(acc_t).reshape(b, hkv, hq // hkv, n_q, d)
    slopes = None
    if alibi_slopes is not None:
        sl = alibi_slopes.to(device=q.device, dtype=acc_t)
        sl = sl.expand(b, hq) if sl.dim() == 1 else sl
        slopes = sl.reshape(b, hkv, hq // hkv, 1, 1)
    num_splits = max(1, int(num_splits))
    step = -(-n_max // num_splits) if n_max else 0
    outs, lses = [], []
    for i in range(num_splits):
        start, stop = min(i * step, n_max), min((i + 1) * step, n_max)
        o, lse = _partial(qg, k, v, start, stop, n_k, n_q, scale, window, softcap, slopes)
        outs.append(o)
        lses.append(lse)
    out, lse = combine_splits(outs, lses) if num_splits > 1 else (outs[0], lses[0])
    lse_t = torch.float64 if q.dtype == torch.float64 else torch.float32
    return out.reshape(b, hq, n_q, dv).to(q.dtype), lse.reshape(b, hq, n_q).to(lse_t)
