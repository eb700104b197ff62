"""Reference implementations in plain PyTorch.

``standard_attention`` is the textbook algorithm: score, mask, softmax,
weight, each a separate operation that writes its N x N result to memory.
It is the baseline of the tests, the benchmarks and the IO model.

``tiled_attention`` is the same function computed the IO-aware way: key/value
blocks stream past the queries while a running max and sum rescale a
partial output (the online softmax).  It never forms more than one
(Nq x block_n) slice of the score matrix.  With ``tiled_attention_backward``
(and the ``*_varlen`` pair for packed sequences) it is also the library's
CPU path, for every variant.

Both take the layout of ``torch.nn.functional.scaled_dot_product_attention``:
q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D) with Hq a multiple of Hkv, and
bottom-right aligned causal masking (query i sees key j iff j <= i + Nk - Nq).

Variants, in the order they act on the scaled score ``s = scale * q_i . k_j``:

* ``softcap=c``: ``s <- c * tanh(s / c)``;
* ``alibi_slopes``: ``s <- s - slope * |i + Nk - Nq - j|`` (slopes (Hq,) or (B, Hq));
* masks, all bottom-right aligned with ``r = j - (i + Nk - Nq)``: ``causal``
  hides ``r > 0``; ``window=(left, right)`` hides ``r < -left`` and
  ``r > right`` (-1 = unbounded on that side); ``block_mask`` hides whole
  (BLOCK_Q x BLOCK_K) blocks whose entry is False (see ``tileattn.block_mask``).

The mask and bias builders below (``causal_mask``, ``window_mask``,
``block_mask_dense``, ``alibi_bias``, ``varlen_mask``, ``varlen_alibi_bias``)
write each of these out as an explicit tensor; ``standard_attention`` takes
the result as ``mask=`` / ``bias=``, so tests can compare against a
reference that shares no code with the tiled paths' masking.
"""
from __future__ import annotations

import math

import torch

from .block_mask import BLOCK_K, BLOCK_Q

__all__ = ["standard_attention", "tiled_attention", "tiled_attention_backward", "tiled_attention_varlen",
           "tiled_attention_varlen_backward", "standard_attention_varlen", "causal_mask", "window_mask",
           "block_mask_dense", "alibi_bias", "varlen_mask", "varlen_alibi_bias", "attention_mask"]

# ---------------------------------------------------------------------------
# Explicit masks and biases (True = hidden)
# ---------------------------------------------------------------------------
def causal_mask(n_q: int, n_k: int, device=None) -> torch.Tensor:
    """Boolean (Nq, Nk) mask, True where key j is hidden from query i
    (bottom-right alignment: hidden iff j > i + Nk - Nq)."""
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    return j > i + (n_k - n_q)


def _window_pair(window):
    if window is None:
        return -1, -1
    left, right = window
    return int(left), int(right)


def window_mask(n_q: int, n_k: int, window, device=None) -> torch.Tensor:
    """Boolean (Nq, Nk) mask of a sliding window ``(left, right)``: True where
    ``j < i + Nk - Nq - left`` or ``j > i + Nk - Nq + right``; -1 leaves that
    side unbounded."""
    left, right = _window_pair(window)
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    rel = j - (i + (n_k - n_q))
    hidden = torch.zeros(n_q, n_k, dtype=torch.bool, device=device)
    if left >= 0:
        hidden |= rel < -left
    if right >= 0:
        hidden |= rel > right
    return hidden


def block_mask_dense(block_mask: torch.Tensor, n_q: int, n_k: int, block_q: int = BLOCK_Q,
                     block_k: int = BLOCK_K) -> torch.Tensor:
    """Token-level hidden mask (B', H', Nq, Nk) of a (B', H', ceil(Nq/bq),
    ceil(Nk/bk)) block layout: True where the block of (i, j) is switched off."""
    rows = torch.arange(n_q, device=block_mask.device) // block_q
    cols = torch.arange(n_k, device=block_mask.device) // block_k
    return ~block_mask.bool()[:, :, rows][:, :, :, cols]


def attention_mask(n_q: int, n_k: int, *, causal=False, window=None, block_mask=None, device=None):
    """The union of the causal, window and block masks (True = hidden), of shape
    (Nq, Nk), or (B', H', Nq, Nk) with a block mask; None if nothing is hidden."""
    hidden = None
    if causal:
        hidden = causal_mask(n_q, n_k, device)
    if window is not None and _window_pair(window) != (-1, -1):
        w = window_mask(n_q, n_k, window, device)
        hidden = w if hidden is None else hidden | w
    if block_mask is not None:
        bm = block_mask_dense(block_mask, n_q, n_k)
        hidden = bm if hidden is None else hidden | bm
    return hidden


def alibi_bias(slopes: torch.Tensor, n_q: int, n_k: int) -> torch.Tensor:
    """ALiBi bias ``-slope * |i + Nk - Nq - j|`` of shape (B' , Hq, Nq, Nk) for
    slopes (Hq,) (B' = 1) or (B, Hq), in the slopes' dtype."""
    if slopes.dim() == 1:
        slopes = slopes[None]
    i = torch.arange(n_q, device=slopes.device)[:, None]
    j = torch.arange(n_k, device=slopes.device)[None, :]
    dist = (i + (n_k - n_q) - j).abs().to(slopes.dtype)
    return -slopes[:, :, None, None] * dist


def _segments(cu_seqlens) -> list[tuple[int, int]]:
    cu = [int(x) for x in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)]
    return [(cu[b], cu[b + 1]) for b in range(len(cu) - 1)]


def varlen_mask(cu_seqlens_q, cu_seqlens_k, *, causal=False, window=None, device=None) -> torch.Tensor:
    """Boolean (total_q, total_k) mask of packed sequences: a query sees only keys
    of its own sequence, with causal/window aligned bottom-right per sequence."""
    seg_q, seg_k = _segments(cu_seqlens_q), _segments(cu_seqlens_k)
    total_q, total_k = seg_q[-1][1] if seg_q else 0, seg_k[-1][1] if seg_k else 0
    hidden = torch.ones(total_q, total_k, dtype=torch.bool, device=device)
    for (q0, q1), (k0, k1) in zip(seg_q, seg_k):
        inner = attention_mask(q1 - q0, k1 - k0, causal=causal, window=window, device=device)
        hidden[q0:q1, k0:k1] = False if inner is None else inner
    return hidden


def varlen_alibi_bias(slopes: torch.Tensor, cu_seqlens_q, cu_seqlens_k) -> torch.Tensor:
    """(Hq, total_q, total_k) ALiBi bias of packed sequences (zero across
    sequences, where the mask hides everything); slopes (Hq,) or (B, Hq)."""
    seg_q, seg_k = _segments(cu_seqlens_q), _segments(cu_seqlens_k)
    per_seq = slopes.dim() == 2
    hq = slopes.shape[-1]
    total_q, total_k = seg_q[-1][1] if seg_q else 0, seg_k[-1][1] if seg_k else 0
    bias = torch.zeros(hq, total_q, total_k, dtype=slopes.dtype, device=slopes.device)
    for b, ((q0, q1), (k0, k1)) in enumerate(zip(seg_q, seg_k)):
        sl = slopes[b] if per_seq else slopes
        bias[:, q0:q1, k0:k1] = alibi_bias(sl, q1 - q0, k1 - k0)[0]
    return bias


def _default_scale(q: torch.Tensor, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def _softcap_on(softcap) -> bool:
    return softcap is not None and float(softcap) != 0.0


# ---------------------------------------------------------------------------
# Standard (materialized) attention
# ---------------------------------------------------------------------------
def standard_attention(q, k, v, *, causal=False, scale=None, return_lse=False, window=None, softcap=None,
                       alibi_slopes=None, block_mask=None, mask=None, bias=None):
    """Materialized attention: S = scale * Q K^T, [softcap], [+ bias], mask,
    P = softmax(S), O = P V.

    ``mask`` (True = hidden) and ``bias`` are explicit tensors broadcastable
    to (B, Hq, Nq, Nk); ``causal``, ``window``, ``block_mask`` and
    ``alibi_slopes`` are turned into such tensors by the builders above and
    combined with them.  Computes in the inputs' dtype (so a half-precision
    call rounds like PyTorch eager does).  Rows that see no key return 0
    (lse -inf), with finite gradients.  k/v heads are repeated for GQA (this
    reference may copy).
    """
    scale = _default_scale(q, scale)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    s = torch.matmul(q, k.transpose(-2, -1)) * scale          # score
    n_q, n_k = q.shape[-2], k.shape[-2]
    if _softcap_on(softcap):
        c = float(softcap)
        s = torch.tanh(s / c) * c
    if alibi_slopes is not None:
        s = s + alibi_bias(alibi_slopes.to(s.dtype), n_q, n_k)
    if bias is not None:
        s = s + bias.to(s.dtype)
    hidden = attention_mask(n_q, n_k, causal=causal, window=window, block_mask=block_mask, device=q.device)
    if mask is not None:
        hidden = mask.bool() if hidden is None else hidden | mask.bool()
    if hidden is not None:
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
        lse = lse.masked_fill(empty_rows.squeeze(-1).expand(lse.shape), float("-inf"))
    return out, lse


def standard_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None,
                              return_lse=False, window=None, softcap=None, alibi_slopes=None):
    """Packed sequences as one materialized problem: q (total_q, Hq, D) against
    k, v (total_k, Hkv, D) with the block-diagonal :func:`varlen_mask` (and
    :func:`varlen_alibi_bias`).  Returns out (total_q, Hq, D) and optionally
    lse (Hq, total_q)."""
    mask = varlen_mask(cu_seqlens_q, cu_seqlens_k, causal=causal, window=window, device=q.device)
    bias = None
    if alibi_slopes is not None:
        bias = varlen_alibi_bias(alibi_slopes, cu_seqlens_q, cu_seqlens_k)
    res = standard_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                             scale=scale, softcap=softcap, mask=mask, bias=bias, return_lse=return_lse)
    if not return_lse:
        return res[0].transpose(0, 1)
    return res[0][0].transpose(0, 1), res[1][0]


# ---------------------------------------------------------------------------
# Tiled attention (the CPU path)
# ---------------------------------------------------------------------------
def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class _Scores:
    """Builds the (B, Hkv, G, Nq, cols) score slice of one key block with every
    variant applied: the one place the tiled paths define S."""

    def __init__(self, q, k, *, causal, scale, window, softcap, alibi_slopes, block_mask):
        b, hq, n_q, d = q.shape
        self.hkv, self.n_k = k.shape[1], k.shape[2]
        self.g = hq // self.hkv
        self.n_q = n_q
        self.scale = scale
        self.causal = causal
        left, right = _window_pair(window)
        self.left, self.right = left, right
        self.softcap = float(softcap) if _softcap_on(softcap) else None
        self.device = q.device
        acc_t = _acc_dtype(q)
        self.slopes = None
        if alibi_slopes is not None:
            sl = alibi_slopes.to(acc_t)
            sl = sl[None] if sl.dim() == 1 else sl
            self.slopes = sl.reshape(sl.shape[0], self.hkv, self.g, 1, 1)
        self.block_mask = None
        if block_mask is not None:
            bm = block_mask.bool()
            hb = bm.shape[1]
            self.block_mask = bm.reshape(bm.shape[0], self.hkv if hb > 1 else 1, self.g if hb > 1 else 1,
                                         bm.shape[2], bm.shape[3])
        self.rows = torch.arange(n_q, device=q.device)[:, None]
        if self.block_mask is not None:
            # (B', Hkv', G', Nq, nkb): the block row of every query
            self.bm_rows = self.block_mask[..., self.rows[:, 0] // BLOCK_Q, :]

    def key_block(self, block_n: int) -> int:
        """The key block size to step with: with a block mask, one that divides
        BLOCK_K, so that a step never straddles a switched-off block."""
        if self.block_mask is not None and BLOCK_K % block_n:
            return BLOCK_K
        return block_n

    def block_visible(self, start: int, stop: int) -> bool:
        """False when the block mask switches every (query, key) pair of the key
        columns [start, stop) off: the block is skipped (never computed)."""
        if self.block_mask is None:
            return True
        return bool(self.block_mask[..., start // BLOCK_K:(stop - 1) // BLOCK_K + 1].any())

    def hidden(self, start: int, stop: int):
        """Hidden pairs of key columns [start, stop), or None."""
        cols = torch.arange(start, stop, device=self.device)[None, :]
        rel = cols - (self.rows + (self.n_k - self.n_q))
        hidden = None

        def add(h):
            return h if hidden is None else hidden | h
        if self.causal:
            hidden = add(rel > 0)
        if self.left >= 0:
            hidden = add(rel < -self.left)
        if self.right >= 0:
            hidden = add(rel > self.right)
        if self.block_mask is not None:
            hidden = add(~self.bm_rows[..., cols[0] // BLOCK_K])
        return hidden

    def raw(self, qg, kj):
        """scale * q k^T, before softcap."""
        return torch.matmul(qg, kj.transpose(-2, -1)).mul_(self.scale)

    def finish(self, s, start: int, stop: int):
        """Apply softcap and ALiBi to raw scores in place; return (s, tanh) where
        tanh is the softcap's tanh(s/c) (None without softcap)."""
        t = None
        if self.softcap is not None:
            t = torch.tanh(s / self.softcap)
            s = t * self.softcap
        if self.slopes is not None:
            cols = torch.arange(start, stop, device=self.device)[None, :]
            dist = (self.rows + (self.n_k - self.n_q) - cols).abs().to(s.dtype)
            s = s - self.slopes * dist
        return s, t


def tiled_attention(q, k, v, *, causal=False, scale=None, block_n=128, return_lse=False, window=None,
                    softcap=None, alibi_slopes=None, block_mask=None):
    """Exact attention by the online softmax, one key/value block at a time.

    For each block j:  m' = max(m, rowmax(S_j));  l' = e^(m-m') l + rowsum(e^(S_j-m'));
    O' = e^(m-m') O + e^(S_j-m') V_j.  At the end O / l is softmax(S) V and
    m + log l is the log-sum-exp of the row.  Extra memory: O(Nq * block_n).
    S_j carries every variant (see the module docstring); key blocks that the
    block mask switches off for every query are skipped.
    """
    scale = _default_scale(q, scale)
    acc_t = _acc_dtype(q)
    b, hq, n_q, d = q.shape
    n_k = k.shape[2]
    hkv = k.shape[1]
    sc = _Scores(q, k, causal=causal, scale=scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                 block_mask=block_mask)
    block_n = sc.key_block(block_n)
    # (B, Hkv, G, Nq, D) against (B, Hkv, 1, Nk, D): heads sharing a k/v head
    # broadcast against it without copies
    qg = q.to(acc_t).reshape(b, hkv, hq // hkv, n_q, d)
    m = torch.full(qg.shape[:-1], float("-inf"), dtype=acc_t, device=q.device)
    l = torch.zeros_like(m)
    o = torch.zeros(qg.shape[:-1] + (v.shape[-1],), dtype=acc_t, device=q.device)
    for start in range(0, n_k, block_n):
        stop = min(start + block_n, n_k)
        if not sc.block_visible(start, stop):
            continue
        kj = k[:, :, start:stop].to(acc_t).unsqueeze(2)
        vj = v[:, :, start:stop].to(acc_t).unsqueeze(2)
        s, _ = sc.finish(sc.raw(qg, kj), start, stop)
        hidden = sc.hidden(start, stop)
        if hidden is not None:
            s = s.masked_fill(hidden, float("-inf"))
        m, l, o = online_softmax_step(m, l, o, s, vj)
    out, lse = online_softmax_finish(m, l, o)
    out = out.reshape(b, hq, n_q, v.shape[-1]).to(q.dtype)
    if not return_lse:
        return out
    return out, lse.reshape(b, hq, n_q).to(acc_t if acc_t == torch.float64 else torch.float32)


def online_softmax_step(m, l, o, s, vj):
    """One key block of the running softmax: row max ``m``, row sum ``l`` and
    unnormalised output ``o`` updated with the block's masked scores ``s``
    (-inf where hidden; consumed in place) and values ``vj``.  A row with
    nothing visible yet keeps m = -inf and subtracts 0, so exp gives 0."""
    m_new = torch.maximum(m, s.amax(dim=-1))
    m_ref = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    p = s.sub_(m_ref[..., None]).exp_()  # in place: one (Nq x block_n) buffer per step
    alpha = torch.exp(m - m_ref)
    return m_new, l * alpha + p.sum(dim=-1), o * alpha[..., None] + torch.matmul(p, vj)


def online_softmax_finish(m, l, o):
    """(output, lse) from the running state; rows that saw no key give 0 and -inf."""
    empty = l == 0
    l_safe = torch.where(empty, torch.ones_like(l), l)
    lse = torch.where(empty, torch.full_like(m, float("-inf")), m + torch.log(l_safe))
    return o / l_safe[..., None], lse


def tiled_attention_backward(do, q, k, v, o, lse, *, causal=False, scale=None, dlse=None, block_n=128,
                             window=None, softcap=None, alibi_slopes=None, block_mask=None):
    """Gradients of ``tiled_attention`` by recomputation, one key block at a time.

    P_j = exp(S_j - lse) is rebuilt from q, k and the saved lse;
    dS_j = P_j * (dO V_j^T - delta) with delta = rowsum(dO * O) - dlse;
    dV_j = P_j^T dO, dK_j = scale dS_j^T Q, dQ += scale dS_j K_j.
    With a softcap the chain rule through c * tanh(x / c) multiplies dS_j by
    1 - tanh^2; the ALiBi bias and the masks are constants.
    Heads that share a k/v head sum their dK/dV.
    """
    scale = _default_scale(q, scale)
    acc_t = _acc_dtype(q)
    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]
    g = hq // hkv
    sc = _Scores(q, k, causal=causal, scale=scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                 block_mask=block_mask)
    block_n = sc.key_block(block_n)
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
    for start in range(0, n_k, block_n):
        stop = min(start + block_n, n_k)
        if not sc.block_visible(start, stop):
            continue
        kj = k[:, :, start:stop].to(acc_t).unsqueeze(2)
        vj = v[:, :, start:stop].to(acc_t).unsqueeze(2)
        s, t = sc.finish(sc.raw(qg, kj), start, stop)
        p = torch.exp(s - lse_g[..., None])
        hidden = sc.hidden(start, stop)
        if hidden is not None:
            p = p.masked_fill(hidden, 0.0)
        dv[:, :, start:stop] = torch.matmul(p.transpose(-2, -1), dog).sum(dim=2)
        dp = torch.matmul(dog, vj.transpose(-2, -1))
        ds = p * (dp - delta[..., None])
        if t is not None:
            ds = ds * (1.0 - t * t)
        dk[:, :, start:stop] = torch.matmul(ds.transpose(-2, -1), qg).sum(dim=2) * scale
        dq += torch.matmul(ds, kj) * scale
    return dq.reshape(b, hq, n_q, d).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _seq_view(x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows [start, stop) of a packed (total, H, D) tensor as a (1, H, n, D) view."""
    return x[start:stop].transpose(0, 1).unsqueeze(0)


def _seq_slopes(alibi_slopes, b):
    if alibi_slopes is None or alibi_slopes.dim() == 1:
        return alibi_slopes
    return alibi_slopes[b]


def tiled_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None, block_n=128,
                           return_lse=False, window=None, softcap=None, alibi_slopes=None):
    """:func:`tiled_attention` over packed sequences, one sequence at a time:
    q (total_q, Hq, D), k/v (total_k, Hkv, D), int cumulative lengths (B + 1,).
    Returns out (total_q, Hq, D) and optionally lse (Hq, total_q)."""
    scale = _default_scale(q, scale)
    acc_t = _acc_dtype(q)
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64 if acc_t == torch.float64
                     else torch.float32, device=q.device)
    for b, ((q0, q1), (k0, k1)) in enumerate(zip(_segments(cu_seqlens_q), _segments(cu_seqlens_k))):
        if q1 == q0 or k1 == k0:
            continue  # no rows, or rows that see nothing: out 0, lse -inf
        o_b, lse_b = tiled_attention(_seq_view(q, q0, q1), _seq_view(k, k0, k1), _seq_view(v, k0, k1),
                                     causal=causal, scale=scale, block_n=block_n, return_lse=True,
                                     window=window, softcap=softcap, alibi_slopes=_seq_slopes(alibi_slopes, b))
        out[q0:q1] = o_b[0].transpose(0, 1)
        lse[:, q0:q1] = lse_b[0]
    return (out, lse) if return_lse else out


def tiled_attention_varlen_backward(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None,
                                    dlse=None, block_n=128, window=None, softcap=None, alibi_slopes=None):
    """Gradients of :func:`tiled_attention_varlen`, one sequence at a time;
    lse and dlse are (Hq, total_q)."""
    scale = _default_scale(q, scale)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for b, ((q0, q1), (k0, k1)) in enumerate(zip(_segments(cu_seqlens_q), _segments(cu_seqlens_k))):
        if q1 == q0 or k1 == k0:
            continue
        dl = None if dlse is None else dlse[:, q0:q1][None]
        g = tiled_attention_backward(_seq_view(do, q0, q1), _seq_view(q, q0, q1), _seq_view(k, k0, k1),
                                     _seq_view(v, k0, k1), _seq_view(o, q0, q1), lse[:, q0:q1][None],
                                     causal=causal, scale=scale, dlse=dl, block_n=block_n, window=window,
                                     softcap=softcap, alibi_slopes=_seq_slopes(alibi_slopes, b))
        dq[q0:q1] = g[0][0].transpose(0, 1)
        dk[k0:k1] = g[1][0].transpose(0, 1)
        dv[k0:k1] = g[2][0].transpose(0, 1)
    return dq, dk, dv
