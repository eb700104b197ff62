"""Reference implementations in plain PyTorch, for tests, docs and benchmarks.

``standard_attention`` is the textbook algorithm: score, mask, softmax,
weight, each a separate operation that writes its N x N result to memory.
It is the baseline of the tests, the benchmarks and the IO model.  The
library's own CPU path, the tiled (online-softmax) implementation, lives in
``tileattn.cpu``.

``standard_attention`` takes the layout of ``torch.nn.functional.scaled_dot_product_attention``:
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

__all__ = ["standard_attention", "standard_attention_varlen", "causal_mask", "window_mask", "block_mask_dense",
           "alibi_bias", "varlen_mask", "varlen_alibi_bias", "attention_mask"]

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
                       alibi_slopes=None, block_mask=None, mask=None, bias=None, sinks=None):
    """Materialized attention: S = scale * Q K^T, [softcap], [+ bias], mask,
    P = softmax(S), O = P V.

    ``sinks`` (Hq,): one extra logit per head, an explicit column of S that
    no mask hides and that carries no value: row i of head h uses the
    denominator sum_j exp(s_ij) + exp(sinks[h]), the lse includes it, and a
    row that sees no key returns 0 with lse = sinks[h].  Differentiable.
    q (B, Hq, Nq, Dk), k (B, Hkv, Nk, Dk), v (B, Hkv, Nk, Dv): the output is
    (B, Hq, Nq, Dv).

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
    if sinks is not None:
        if hidden is not None:
            s = s.masked_fill(hidden, float("-inf"))
        sink = sinks.to(s.dtype)[None, :, None, None].expand(*s.shape[:-1], 1)
        s_all = torch.cat([s, sink], dim=-1)                   # the sink column: never hidden
        p = torch.softmax(s_all, dim=-1)[..., :-1]
        out = torch.matmul(p, v)
        if not return_lse:
            return out
        return out, torch.logsumexp(s_all.float() if s_all.dtype != torch.float64 else s_all, dim=-1)
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
                              return_lse=False, window=None, softcap=None, alibi_slopes=None, sinks=None):
    """Packed sequences as one materialized problem: q (total_q, Hq, D) against
    k (total_k, Hkv, D), v (total_k, Hkv, Dv) with the block-diagonal
    :func:`varlen_mask` (and :func:`varlen_alibi_bias`).  Returns out
    (total_q, Hq, Dv) and optionally lse (Hq, total_q)."""
    mask = varlen_mask(cu_seqlens_q, cu_seqlens_k, causal=causal, window=window, device=q.device)
    bias = None
    if alibi_slopes is not None:
        bias = varlen_alibi_bias(alibi_slopes, cu_seqlens_q, cu_seqlens_k)
    res = standard_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                             scale=scale, softcap=softcap, mask=mask, bias=bias, return_lse=return_lse, sinks=sinks)
    if not return_lse:
        return res[0].transpose(0, 1)
    return res[0][0].transpose(0, 1), res[1][0]
