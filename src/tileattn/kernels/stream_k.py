"""The combine of a stream-K forward's tail (``fwd_hopper.py`` with
``STREAM_K``): the units from ``TOTAL`` on, whose key tiles were cut into
one contiguous range a program, left each piece's partial softmax (the
unnormalised accumulator, the rows' max in log2 units and their sum) in a
workspace slot; this kernel merges a unit's pieces into its output and lse,
with the sink and the output's remainder code where the call has them.

The walk is ``fwd_hopper_load._work``'s: S = ``SK_TILES`` tail key tiles
(T a unit, in unit order) over P programs, program p's range
[p S / P, (p + 1) S / P), its piece in unit lo // T + k in slot 3 p + k.
Program p's range holds tile t iff p = ((t + 1) P - 1) // S (the last p
whose range starts at or before t), so unit i's pieces are those of
programs ((i T + 1) P - 1) // S ... (((i + 1) T) P - 1) // S (two at most:
a range is at least T tiles).  A unit one program covered whole was
finished by the kernel itself.  A unit's query tile is the kernel's: a
head's tiles are walked last first (``fwd_hopper_load._unit_tile``).

Pure ``@triton.jit`` code, no torch: it runs under the interpreter too.
"""
import triton
import triton.language as tl

from .common import LN2, LOG2E
from .remainder import encode_remainder


@triton.jit
def _stream_k_combine_kernel(WS_O, WS_ML, O, O_LO, LSE, SINKS,
                             stride_ob, stride_oh, stride_om, stride_lb, stride_lh,
                             N_Q, N_HEADS, N_M_TILES, TOTAL, SK_TILES, T, P,
                             BLOCK_M: tl.constexpr, HEAD_DIM_V: tl.constexpr, HAS_SINKS: tl.constexpr,
                             WRITE_REMAINDER: tl.constexpr):
    """Program (i, wg): rows [64 wg, +BLOCK_M) of tail unit i's query tile
    (2 BLOCK_M rows: the kernel's two softmax warpgroups)."""
    i = tl.program_id(0)
    wg = tl.program_id(1)
    unit = TOTAL + i
    bh = unit // N_M_TILES
    off_b = bh // N_HEADS
    off_h = bh % N_HEADS
    row0 = (N_M_TILES - 1 - (unit - bh * N_M_TILES)) * (2 * BLOCK_M) + wg * BLOCK_M
    first = i * T
    p_lo = ((first + 1) * P - 1) // SK_TILES
    p_hi = ((first + T) * P - 1) // SK_TILES
    if p_lo < p_hi:   # else one program ran the whole unit and wrote it
        rows = tl.arange(0, BLOCK_M)
        cols = tl.arange(0, HEAD_DIM_V)
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_V], tl.float32)
        for p in range(p_lo, p_hi + 1):
            lo = p * SK_TILES // P   # no range is empty: each holds T..2T tiles
            cell = ((3 * p + i - lo // T) * 2 + wg).to(tl.int64)
            m_p = tl.load(WS_ML + cell * (2 * BLOCK_M) + rows)
            l_p = tl.load(WS_ML + cell * (2 * BLOCK_M) + BLOCK_M + rows)
            a_p = tl.load(WS_O + cell * (BLOCK_M * HEAD_DIM_V) + rows[:, None] * HEAD_DIM_V + cols[None, :])
            # every piece holds at least one visible key a row (non-causal): its max is finite
            m_new = tl.maximum(m, m_p)
            alpha = tl.exp2(m - m_new)
            beta = tl.exp2(m_p - m_new)
            l = l * alpha + l_p * beta
            acc = acc * alpha[:, None] + a_p * beta[:, None]
            m = m_new
        if HAS_SINKS:   # the head's sink, once a row, as in the kernel's epilogue
            sink = tl.load(SINKS + off_h) * LOG2E
            m_f = tl.maximum(m, sink)
            rescale = tl.exp2(m - m_f)
            l = l * rescale + tl.exp2(sink - m_f)
            acc = acc * rescale[:, None]
            m = m_f
        lse = (m + tl.log2(l)) * LN2
        offs_m = row0 + rows
        ok = offs_m < N_Q
        tl.store(LSE + off_b.to(tl.int64) * stride_lb + off_h.to(tl.int64) * stride_lh + offs_m, lse, mask=ok)
        out = acc / l[:, None]
        out16 = out.to(O.dtype.element_ty)
        offs = (off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
                + offs_m.to(tl.int64)[:, None] * stride_om + cols[None, :])
        tl.store(O + offs, out16, mask=ok[:, None])
        if WRITE_REMAINDER:   # the code is in O's layout
            tl.store(O_LO + offs, encode_remainder(out, out16), mask=ok[:, None])
