"""The CPU path: attention in PyTorch for tensors the Triton kernels do not take.

``ops.py``'s custom ops call :func:`attention_fwd` / :func:`attention_bwd`
(and the ``*_varlen`` functions) for every call that does not run the
kernels: CPU tensors, and any device under ``use_backend("torch")``.  Two
implementations stand behind them.

*torch's fused CPU kernel* (``aten::_scaled_dot_product_flash_attention_for_cpu``
and its backward, the tiled C++ kernel that ``F.scaled_dot_product_attention``
runs on the CPU) takes the calls whose meaning it shares exactly
(``dispatch.cpu_fused_applies``): float32 CPU tensors, no variant (window, softcap,
ALiBi, block mask), one head dim for q, k and v, and either no mask or
``causal`` with Nq == Nk, where tileattn's bottom-right alignment and torch's
top-left one are the same mask.  Its lse is the natural-log log-sum-exp in
float32, tileattn's convention; a dispatched call never has a row that sees
no key.  Grouped-query calls repeat the k/v heads (O(N d) extra memory, no
N x N buffer) and sum the group's dk and dv.  Half precision stays on the
tiled path, which computes in float32: the fused kernel's bfloat16
backward rounds more than the accuracy rule allows (dv 1.4x over it at
N = 150, d = 64).  A backward with a gradient
flowing into lse (``return_lse=True`` with the lse used) takes the tiled
backward, which needs nothing but the forward's out and lse.

*The tiled implementation* below is the algorithm of the kernels written in
PyTorch: key/value blocks stream past the queries while a running max and
sum rescale a partial output (the online softmax); it never forms more than
one (Nq x block_n) slice of the score matrix.  It runs everything else:
the variants, float64, bottom-right causal with Nq != Nk, packed sequences
(``tiled_attention_varlen``), other devices.

Both take the layout of ``torch.nn.functional.scaled_dot_product_attention``:
q (B, Hq, Nq, D), k (B, Hkv, Nk, D) and v (B, Hkv, Nk, Dv) with Hq a
multiple of Hkv (the output is (B, Hq, Nq, Dv)), and
bottom-right aligned causal masking (query i sees key j iff j <= i + Nk - Nq).
The variants act on the scaled score as ``tileattn.reference`` describes.
"""
from __future__ import annotations

import torch

from . import dispatch
from .block_mask import BLOCK_K, BLOCK_Q
from .reference import _default_scale, _segments, _softcap_on, _window_pair

__all__ = ["attention_fwd", "attention_bwd", "tiled_attention", "tiled_attention_backward",
           "tiled_attention_varlen", "tiled_attention_varlen_backward", "online_softmax_step",
           "online_softmax_finish"]

# key/value block of the tiled path: extra memory Nq x 256 per head, few Python steps
BLOCK_N = 256

# ---------------------------------------------------------------------------
# torch's fused CPU kernel where its semantics match (dispatch.cpu_fused_applies), else tiled
# ---------------------------------------------------------------------------
_aten = torch.ops.aten


def _unit_inner(t: torch.Tensor) -> torch.Tensor:
    # the fused kernel addresses rows by strides but assumes a unit stride
    # along the head dim (it silently reads wrong values otherwise)
    return t if t.stride(-1) == 1 else t.contiguous()


def _expand_heads(t: torch.Tensor, group: int) -> torch.Tensor:
    return t if group == 1 else t.repeat_interleave(group, dim=1)


# Below ATen's parallel grain (32768 elements) a copy or a reduction runs on
# the calling thread.  The path's own copies stay below it: on a busy machine
# a parallel region waits for its second thread to be scheduled (~8 ms
# measured on a loaded 2-core box), longer than the copy itself.
_SERIAL = 32767


def _in_layout(template: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``src`` with ``template``'s strides (as ``torch.empty_like(template)``
    lays it out), copied piece by piece when they differ."""
    dst = torch.empty_like(template)
    if src.stride() == dst.stride():
        return src
    if src.numel() <= _SERIAL:
        return dst.copy_(src)
    rows = max(1, _SERIAL // max(1, src.shape[-1]))
    for b in range(src.shape[0]):
        for h in range(src.shape[1]):
            d, s = dst[b, h], src[b, h]
            for r in range(0, s.shape[0], rows):
                d[r:r + rows].copy_(s[r:r + rows])
    return dst


def _nonzero(t: torch.Tensor) -> bool:
    flat = t.reshape(-1)
    return any(bool(piece.any()) for piece in flat.split(_SERIAL))


def _fused_fwd(q, k, v, causal: bool, scale: float):
    g = q.shape[1] // k.shape[1]
    out, lse = _aten._scaled_dot_product_flash_attention_for_cpu(
        _unit_inner(q), _expand_heads(_unit_inner(k), g), _expand_heads(_unit_inner(v), g), 0.0, causal, scale=scale)
    # the kernel writes out in the query's layout and lse as a (B, N, H) one
    return _in_layout(q, out), _in_layout(lse.new_empty(lse.shape), lse)


def _fused_bwd(dout, q, k, v, out, lse, causal: bool, scale: float):
    b, hkv, n_k, d = k.shape
    g = q.shape[1] // hkv
    dq, dk, dv = _aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout.contiguous(), _unit_inner(q), _expand_heads(_unit_inner(k), g), _expand_heads(_unit_inner(v), g),
        _unit_inner(out), lse.float(), 0.0, causal, scale=scale)
    if g > 1:  # the query heads of a group share one k/v head: sum their gradients
        dk = dk.reshape(b, hkv, g, n_k, d).sum(dim=2)
        dv = dv.reshape(b, hkv, g, n_k, v.shape[-1]).sum(dim=2)
    # the kernel writes gradients in a (B, N, H, D) layout; ops.py hands them on in the inputs'
    return _in_layout(q, dq), _in_layout(k, dk), _in_layout(v, dv)


def _fused(q, k, v, causal: bool, variants: dict) -> bool:
    # the fused kernel needs one head dim for q, k and v ("Q/K/V should have
    # the same head size"): a separate V head dim takes the tiled path
    return v.shape[-1] == q.shape[-1] and dispatch.cpu_fused_applies(q, k, causal, variants)


def attention_fwd(q, k, v, causal: bool, scale: float, *, block_n: int = BLOCK_N, **variants):
    """(out, lse) of one dense call; lse is float32 (float64 for float64 inputs)."""
    if _fused(q, k, v, causal, variants):
        return _fused_fwd(q, k, v, causal, scale)
    return tiled_attention(q, k, v, causal=causal, scale=scale, block_n=block_n, return_lse=True, **variants)


def attention_bwd(dout, q, k, v, out, lse, causal: bool, scale: float, *, dlse=None, block_n: int = BLOCK_N,
                  **variants):
    """(dq, dk, dv) of one dense call from the forward's out and lse.  A dlse
    of zeros (what autograd hands the op when the lse was not used) adds
    nothing and does not keep a call off the fused kernel."""
    if (dlse is None or not _nonzero(dlse)) and _fused(q, k, v, causal, variants):
        return _fused_bwd(dout, q, k, v, out, lse, causal, scale)
    return tiled_attention_backward(dout, q, k, v, out, lse, causal=causal, scale=scale, dlse=dlse, block_n=block_n,
                                    **variants)


# ---------------------------------------------------------------------------
# The tiled implementation
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
        self.acc_t = acc_t = _acc_dtype(q)
        self.batch = b
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

    def grouped(self, x: torch.Tensor) -> torch.Tensor:
        """A (B, Hq, Nq, D) tensor as (B, Hkv, G, Nq, D) in the accumulation
        dtype: heads sharing a k/v head broadcast against it without copies."""
        return x.to(self.acc_t).reshape(self.batch, self.hkv, self.g, self.n_q, x.shape[-1])

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

    def visible_blocks(self, block_n: int):
        """(start, stop) of every key block to compute, in order."""
        for start in range(0, self.n_k, block_n):
            stop = min(start + block_n, self.n_k)
            if self.block_visible(start, stop):
                yield start, stop

    def load(self, qg, k, v, start: int, stop: int):
        """One key block: (kj, vj, s, t, hidden) with kj, vj the block's keys and
        values in the accumulation dtype, s its finished scores, t the softcap's
        tanh (or None) and hidden its hidden pairs (or None)."""
        kj = k[:, :, start:stop].to(qg.dtype).unsqueeze(2)
        vj = v[:, :, start:stop].to(qg.dtype).unsqueeze(2)
        s, t = self.finish(self.raw(qg, kj), start, stop)
        return kj, vj, s, t, self.hidden(start, stop)

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
    b, hq, n_q = q.shape[:3]
    sc = _Scores(q, k, causal=causal, scale=scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                 block_mask=block_mask)
    block_n = sc.key_block(block_n)
    qg = sc.grouped(q)  # (B, Hkv, G, Nq, D) against (B, Hkv, 1, Nk, D)
    m = torch.full(qg.shape[:-1], float("-inf"), dtype=acc_t, device=q.device)
    l = torch.zeros_like(m)
    o = torch.zeros(qg.shape[:-1] + (v.shape[-1],), dtype=acc_t, device=q.device)
    for start, stop in sc.visible_blocks(block_n):
        _, vj, s, _, hidden = sc.load(qg, k, v, start, stop)
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
    qg, dog = sc.grouped(q), sc.grouped(do)
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
    for start, stop in sc.visible_blocks(block_n):
        kj, vj, s, t, hidden = sc.load(qg, k, v, start, stop)
        p = torch.exp(s - lse_g[..., None])
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


def _sequences(cu_seqlens_q, cu_seqlens_k):
    """(b, q0, q1, k0, k1) of every packed sequence with rows and keys; the
    others keep their zero output and gradients (and lse -inf)."""
    for b, ((q0, q1), (k0, k1)) in enumerate(zip(_segments(cu_seqlens_q), _segments(cu_seqlens_k))):
        if q1 > q0 and k1 > k0:
            yield b, q0, q1, k0, k1


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
    for b, q0, q1, k0, k1 in _sequences(cu_seqlens_q, cu_seqlens_k):
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
    for b, q0, q1, k0, k1 in _sequences(cu_seqlens_q, cu_seqlens_k):
        dl = None if dlse is None else dlse[:, q0:q1][None]
        g = tiled_attention_backward(_seq_view(do, q0, q1), _seq_view(q, q0, q1), _seq_view(k, k0, k1),
                                     _seq_view(v, k0, k1), _seq_view(o, q0, q1), lse[:, q0:q1][None],
                                     causal=causal, scale=scale, dlse=dl, block_n=block_n, window=window,
                                     softcap=softcap, alibi_slopes=_seq_slopes(alibi_slopes, b))
        dq[q0:q1] = g[0][0].transpose(0, 1)
        dk[k0:k1] = g[1][0].transpose(0, 1)
        dv[k0:k1] = g[2][0].transpose(0, 1)
    return dq, dk, dv
