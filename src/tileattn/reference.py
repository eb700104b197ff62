"""Reference implementations in plain PyTorch.

``standard_attention`` is the textbook algorithm: score, mask, softmax,
weight, each a separate operation that writes its N x N result to memory.
It is the baseline of the tests, the benchmarks and the IO model.

``tiled_attention`` is the same function computed the IO-aware way: key/value
blocks stream past the queries while a running max and sum rescale a
partial output (the online softmax).  It never forms more than one
(Nq x block_n) slice of the score matrix.  With ``tiled_attention_backward``
it is also the library's CPU path.

Both take the layout of ``torch.nn.functional.scaled_dot_product_attention``:
q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D) with Hq a multiple of Hkv, and
bottom-right aligned causal masking (query i sees key j iff j <= i + Nk - Nq).
"""
from __future__ import annotations

import math

import torch

__all__ = ["standard_attention", "tiled_attention", "tiled_attention_backward", "causal_mask"]


def causal_mask(n_q: int, n_k: int, device=None) -> torch.Tensor:
    """Boolean (Nq, Nk) mask, True where key j is hidden from query i
    (bottom-right alignment: hidden iff j > i + Nk - Nq)."""
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    return j > i + (n_k - n_q)


def _default_scale(q: torch.Tensor, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def standard_attention(q, k, v, *, causal=False, scale=None, return_lse=False):
    """Materialized attention: S = scale * Q K^T, mask, P = softmax(S), O = P V.

    Computes in the inputs' dtype (so a half-precision call rounds like
    PyTorch eager does).  Rows that see no key return 0 (lse -inf), with
    finite gradients.  k/v heads are repeated for GQA (this reference may copy).
    """
    scale = _default_scale(q, scale)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    s = torch.matmul(q, k.transpose(-2, -1)) * scale          # score
    n_q, n_k = q.shape[-2], k.shape[-2]
    if causal:
        hidden = causal_mask(n_q, n_k, q.device)
        empty_rows = hidden.all(dim=-1, keepdim=True)          # rows that see nothing
        # give empty rows a finite row so softmax/logsumexp stay NaN-free, zero them after
        s = s.masked_fill(hidden & ~empty_rows, float("-inf"))  # mask
        s = s.masked_fill(empty_rows, 0.0)
        p = torch.softmax(s, dim=-1).masked_fill(empty_rows, 0.0)  # softmax
    else:
        empty_rows = None
        p = torch.softmax(s, dim=-1)
    out = torch.matmul(p, v)                                    # weight
    if not return_lse:
        return out
    lse = torch.logsumexp(s.float() if s.dtype != torch.float64 else s, dim=-1)
    if empty_rows is not None:
        lse = lse.masked_fill(empty_rows.squeeze(-1), float("-inf"))
    return out, lse


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def tiled_attention(q, k, v, *, causal=False, scale=None, block_n=128, return_lse=False):
    """Exact attention by the online softmax, one key/value block at a time.

    For each block j:  m' = max(m, rowmax(S_j));  l' = e^(m-m') l + rowsum(e^(S_j-m'));
    O' = e^(m-m') O + e^(S_j-m') V_j.  At the end O / l is softmax(S) V and
    m + log l is the log-sum-exp of the row.  Extra memory: O(Nq * block_n).
    """
    scale = _default_scale(q, scale)
    acc_t = _acc_dtype(q)
    b, hq, n_q, d = q.shape
    n_k = k.shape[2]
    hkv = k.shape[1]
    # (B, Hkv, G, Nq, D) against (B, Hkv, 1, Nk, D): heads sharing a k/v head
    # broadcast against it without copies
    qg = q.to(acc_t).reshape(b, hkv, hq // hkv, n_q, d)
    m = torch.full(qg.shape[:-1], float("-inf"), dtype=acc_t, device=q.device)
    l = torch.zeros_like(m)
    o = torch.zeros(qg.shape[:-1] + (v.shape[-1],), dtype=acc_t, device=q.device)
    rows = torch.arange(n_q, device=q.device)[:, None]
    for start in range(0, n_k, block_n):
        kj = k[:, :, start:start + block_n].to(acc_t).unsqueeze(2)
        vj = v[:, :, start:start + block_n].to(acc_t).unsqueeze(2)
        s = torch.matmul(qg, kj.transpose(-2, -1)).mul_(scale)
        if causal:
            cols = torch.arange(start, start + kj.shape[-2], device=q.device)[None, :]
            s.masked_fill_(cols > rows + (n_k - n_q), float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1))
        m_ref = torch.where(torch.isinf(m_new) & (m_new < 0), torch.zeros_like(m_new), m_new)
        p = s.sub_(m_ref[..., None]).exp_()  # in place: one (Nq x block_n) buffer per step
        alpha = torch.exp(m - m_ref)
        l = l * alpha + p.sum(dim=-1)
        o = o * alpha[..., None] + torch.matmul(p, vj)
        m = m_new
    empty = l == 0
    l_safe = torch.where(empty, torch.ones_like(l), l)
    out = (o / l_safe[..., None]).reshape(b, hq, n_q, v.shape[-1]).to(q.dtype)
    if not return_lse:
        return out
    lse = torch.where(empty, torch.full_like(m, float("-inf")), m + torch.log(l_safe))
    return out, lse.reshape(b, hq, n_q).to(acc_t if acc_t == torch.float64 else torch.float32)


def tiled_attention_backward(do, q, k, v, o, lse, *, causal=False, scale=None, dlse=None, block_n=128):
    """Gradients of ``tiled_attention`` by recomputation, one key block at a time.

    P_j = exp(S_j - lse) is rebuilt from q, k and the saved lse;
    dS_j = P_j * (dO V_j^T - delta) with delta = rowsum(dO * O) - dlse;
    dV_j = P_j^T dO, dK_j = scale dS_j^T Q, dQ += scale dS_j K_j.
    Heads that share a k/v head sum their dK/dV.
    """
    scale = _default_scale(q, scale)
    acc_t = _acc_dtype(q)
    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]
    g = hq // hkv
    qg = q.to(acc_t).reshape(b, hkv, g, n_q, d)
    dog = do.to(acc_t).reshape(b, hkv, g, n_q, do.shape[-1])
    delta = (do.to(acc_t) * o.to(acc_t)).sum(dim=-1)
    if dlse is not None:
        delta = delta - dlse.to(acc_t)
    delta = delta.reshape(b, hkv, g, n_q)
    lse_g = lse.to(acc_t).reshape(b, hkv, g, n_q)
    # rows that saw no key: P = 0 everywhere
    lse_g = torch.where(torch.isinf(lse_g) & (lse_g < 0), torch.full_like(lse_g, float("inf")), lse_g)
    dq = torch.zeros_like(qg)
    dk = torch.zeros((b, hkv, n_k, d), dtype=acc_t, device=q.device)
    dv = torch.zeros((b, hkv, n_k, v.shape[-1]), dtype=acc_t, device=q.device)
    rows = torch.arange(n_q, device=q.device)[:, None]
    for start in range(0, n_k, block_n):
        stop = min(start + block_n, n_k)
        kj = k[:, :, start:stop].to(acc_t).unsqueeze(2)
        vj = v[:, :, start:stop].to(acc_t).unsqueeze(2)
        s = torch.matmul(qg, kj.transpose(-2, -1)) * scale
        p = torch.exp(s - lse_g[..., None])
        if causal:
            cols = torch.arange(start, stop, device=q.device)[None, :]
            p = p.masked_fill(cols > rows + (n_k - n_q), 0.0)
        dv[:, :, start:stop] = torch.matmul(p.transpose(-2, -1), dog).sum(dim=2)
        dp = torch.matmul(dog, vj.transpose(-2, -1))
        ds = p * (dp - delta[..., None])
        dk[:, :, start:stop] = torch.matmul(ds.transpose(-2, -1), qg).sum(dim=2) * scale
        dq += torch.matmul(ds, kj) * scale
    return dq.reshape(b, hq, n_q, d).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
