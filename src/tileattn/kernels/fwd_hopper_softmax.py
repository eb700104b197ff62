"""The Hopper forward's softmax side (Gluon; the kernel is ``fwd_hopper.py``):
the running softmax of a key tile (the rows' max, optionally as a tree, the
exp2 and the rows' sums, a thread's own with ``ROW_TREE``), and the two
ways a warpgroup's rows end: the epilogue (the sink folded in, lse, O
normalised and staged for the copy engine, the remainder's code) or, for a
stream-K piece short of its whole unit, the partial softmax stored to a
workspace slot for ``stream_k.py``'s combine.

This module imports Gluon at load time: only the Hopper kernels import it.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

from .remainder import encode_remainder

LN2: gl.constexpr = gl.constexpr(0.6931471805599453)
LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)


@gluon.jit
def _row_max(x, s_layout: gl.constexpr, SPLIT: gl.constexpr):
    """Each row's max of ``x`` (M, N); with ``SPLIT`` > 1 as a tree: the N
    columns as SPLIT blocks of N / SPLIT, their element-wise max first (a
    thread's own registers: a warpgroup MMA's accumulator holds columns
    8 i + 2 t + {0, 1}, so blocks of whole 8-column groups stay in the
    thread), then along each row of that; a thread's chain of dependent max
    instructions is SPLIT - 1 + N / (4 SPLIT) - 1 long instead of N / 4 - 1."""
    if SPLIT > 1:
        M: gl.constexpr = x.shape[0]
        N: gl.constexpr = x.shape[1]
        y = gl.max(gl.reshape(x, [M, SPLIT, N // SPLIT]), 1)
        r = gl.convert_layout(gl.max(y, 1), gl.SliceLayout(1, s_layout), assert_trivial=True)   # no data moves
    else:
        r = gl.max(x, 1)
    return r


@gluon.jit
def _lane_sums(x):
    """Each row's sum of ``x`` (M, N) over a thread's own columns: (M, 4),
    one partial sum per thread of the row's four (a warpgroup MMA's
    accumulator gives lane t of a row's quad the columns 8 i + 2 t + {0, 1}),
    no shuffle; :func:`_row_total` adds the four once, after the key tiles."""
    M: gl.constexpr = x.shape[0]
    N: gl.constexpr = x.shape[1]
    return gl.sum(gl.sum(gl.reshape(x, [M, N // 8, 4, 2]), 3), 1)


@gluon.jit
def _row_total(l_i, s_layout: gl.constexpr, ROW_TREE: gl.constexpr):
    """The row sums in the rows' layout: with ``ROW_TREE`` from the four
    lanes' partial sums (:func:`_lane_sums`), else as they are."""
    if ROW_TREE:
        total = gl.convert_layout(gl.sum(l_i, 1), gl.SliceLayout(1, s_layout), assert_trivial=True)
    else:
        total = l_i
    return total


@gluon.jit
def _softmax_step(qk, m_i, l_i, j, offs_m, N_Q, N_K, qk_scale, s_layout: gl.constexpr, BLOCK_N: gl.constexpr,
                  IS_CAUSAL: gl.constexpr, MASKED: gl.constexpr, ROW_TREE: gl.constexpr, WIN_LEFT=None,
                  WIN_RIGHT=None, WIN_ROWS: gl.constexpr = False):
    """The running softmax of key tile ``j``: (p, alpha, m_new, l_new).

    The max runs over the raw scores and is scaled once per row, so each
    score costs one fused multiply-add before its exp2: exp2(s * c - m * c)
    (c = scale * log2 e > 0, so the max commutes with the scaling).  As in
    ``kernels.common.online_softmax_step``, a row that has seen no visible
    key keeps max -inf and subtracts 0, so exp2 gives 0, not NaN."""
    if MASKED:
        if WIN_LEFT is None:   # one compare an element: the tile's columns against each row's last key (v60)
            cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            first = j * BLOCK_N
            if IS_CAUSAL:
                last = gl.minimum(offs_m + (N_K - N_Q), N_K - 1) - first
                qk = gl.where(cols[None, :] <= last[:, None], qk, float("-inf"))
            else:
                qk = gl.where((cols < N_K - first)[None, :], qk, float("-inf"))
        else:   # a sliding window (causal folded into its right side, so IS_CAUSAL is off)
            offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            visible = (offs_n < N_K)[None, :]
            if WIN_ROWS:   # each row's first and last key: no (row, key) offset tile held in registers
                lo = offs_m + (N_K - N_Q - WIN_LEFT)
                hi = offs_m + (N_K - N_Q + WIN_RIGHT)
                visible = visible & (offs_n[None, :] >= lo[:, None]) & (offs_n[None, :] <= hi[:, None])
            else:
                rel = offs_n[None, :] - (offs_m[:, None] + (N_K - N_Q))
                visible = visible & (rel >= -WIN_LEFT) & (rel <= WIN_RIGHT)
            qk = gl.where(visible, qk, float("-inf"))
    SPLIT: gl.constexpr = 4 if ROW_TREE else 1
    m_new = gl.maximum(m_i, _row_max(qk, s_layout, SPLIT) * qk_scale)
    if MASKED:
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_ref = m_new
    p = gl.exp2(qk * qk_scale - m_ref[:, None])
    alpha = gl.exp2(m_i - m_ref)
    if ROW_TREE:   # a thread's partial sums; the four lanes of a row are added once, after the key tiles
        alpha_l = gl.convert_layout(alpha, gl.SliceLayout(1, l_i.type.layout), assert_trivial=True)
        l_i = l_i * alpha_l[:, None] + _lane_sums(p)
    else:
        l_i = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_i


@gluon.jit
def _softmax_tile(qk, m_i, l_i, j, n_full, offs_m, N_Q, N_K, qk_scale, s_layout: gl.constexpr,
                  BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, ROW_TREE: gl.constexpr, full_lo=None,
                  WIN_LEFT=None, WIN_RIGHT=None, row0=None, EVEN_K: gl.constexpr = False):
    """:func:`_softmax_step` with the mask where tile ``j`` needs one: from
    ``n_full`` on, and with a sliding window (``WIN_LEFT`` not None) also
    before ``full_lo``; or, given ``row0`` (the persistent walk, where no
    bound is kept live through the loop), wherever a key of the tile lies
    outside the window of one of the rows [row0, row0 + BLOCK_M) or past N_K.
    ``EVEN_K`` (non-causal, no window, N_K a multiple of BLOCK_N): no tile
    needs it, and the build holds the unmasked step alone (a loop body of
    about half the instructions, perf-notes v57)."""
    if EVEN_K:
        p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i, j, offs_m, N_Q, N_K, qk_scale, s_layout, BLOCK_N,
                                           IS_CAUSAL, False, ROW_TREE)
    else:
        if WIN_LEFT is None:
            unmasked = j < n_full
        elif row0 is None:
            unmasked = (j >= full_lo) & (j < n_full)
        else:
            first = j * BLOCK_N
            diag = N_K - N_Q
            unmasked = ((first >= row0 + (offs_m.shape[0] - 1) + diag - WIN_LEFT)
                        & (first + BLOCK_N - 1 <= row0 + diag + WIN_RIGHT) & (first + BLOCK_N <= N_K))
        if unmasked:
            p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i, j, offs_m, N_Q, N_K, qk_scale, s_layout, BLOCK_N,
                                               IS_CAUSAL, False, ROW_TREE)
        else:
            p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i, j, offs_m, N_Q, N_K, qk_scale, s_layout, BLOCK_N,
                                               IS_CAUSAL, True, ROW_TREE, WIN_LEFT, WIN_RIGHT, row0 is not None)
    return p, alpha, m_i, l_i


@gluon.jit
def _stage_o(out16, q2, q_tile, o_desc, off_b, off_h, row):
    """O's rows from ``row``: the Q tile is dead, so O is staged in its
    buffer (as wide as V) and copied out by the copy engine (not waited on)."""
    q2.store(out16)
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [off_b, off_h, row, 0], q_tile)


@gluon.jit
def _epilogue(acc, m_i, l_i, offs_m, row0, q2, q_tile, lo_smem, o_desc, olo_desc, LSE, SINKS, lse_row0, off_b, off_h,
              N_Q, o_row_layout: gl.constexpr, WG: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_DIM_V: gl.constexpr,
              HAS_SINKS: gl.constexpr, WRITE_REMAINDER: gl.constexpr, DEFER_O: gl.constexpr, q_base=0, O=None,
              stride_on=0, stride_oh=0):
    """A query tile's end for warpgroup ``WG``'s rows: the sink folded in,
    the lse stored, O normalised and staged in the (dead) Q tile ``q2`` for
    the copy engine, the remainder's code in its own tile.  A packed
    sequence (rows from ``q_base``; ``O`` its pointer, not None) whose rows
    end inside this tile stores them from registers, masked, instead: the
    copy engine's box would write into the next sequence's rows."""
    if HAS_SINKS:
        # the head's sink, one more score of every row, folded in as a second partial softmax of one score
        sink = gl.load(SINKS + off_h) * LOG2E
        m_f = gl.maximum(m_i, sink)
        m_f_ref = gl.where(m_f == float("-inf"), 0.0, m_f)   # no key and a sink of -inf: l stays 0
        rescale = gl.exp2(m_i - m_f_ref)
        l_i = l_i * rescale + gl.exp2(sink - m_f_ref)
        acc = acc * gl.convert_layout(rescale, o_row_layout)[:, None]
        m_i = m_f
    # rows that saw no key: output 0, lse -inf (never 0/0)
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe)) * LN2)
    gl.store(LSE + lse_row0 + offs_m, lse, mask=offs_m < N_Q)
    out = acc / gl.convert_layout(l_safe, o_row_layout)[:, None]
    out16 = out.to(q2.dtype)
    if O is None:
        _stage_o(out16, q2, q_tile, o_desc, off_b, off_h, row0)
    elif row0 + BLOCK_M > N_Q:   # a packed sequence's last rows
        rows = row0 + gl.arange(0, BLOCK_M, layout=o_row_layout)
        cols = gl.arange(0, HEAD_DIM_V, layout=gl.SliceLayout(0, out16.type.layout))
        ptrs = O + off_h.to(gl.int64) * stride_oh + (q_base + rows).to(gl.int64)[:, None] * stride_on + cols[None, :]
        gl.store(ptrs, out16, mask=(rows < N_Q)[:, None])
    else:
        _stage_o(out16, q2, q_tile, o_desc, off_b, off_h, q_base + row0)
    if WRITE_REMAINDER:   # O - O rounded as its int8 code, staged in a tile of its own
        lo_tile = lo_smem.index(WG)
        lo_tile.reshape([BLOCK_M, HEAD_DIM_V]).store(encode_remainder(out, out16))
        fence_async_shared()
        tma.async_copy_shared_to_global(olo_desc, [off_b, off_h, row0, 0], lo_tile)
    if not DEFER_O:
        tma.store_wait(0)


@gluon.jit
def _store_partial(acc, m_i, l_i, WS_O, WS_ML, slot, WG: gl.constexpr, BLOCK_M: gl.constexpr,
                   HEAD_DIM_V: gl.constexpr, o_layout: gl.constexpr, row_layout: gl.constexpr):
    """A stream-K piece's partial softmax of warpgroup ``WG``'s rows, float32
    into workspace ``slot``: the unnormalised accumulator (BLOCK_M, HEAD_DIM_V)
    at ``WS_O``, the rows' max (log2 units) and sum at ``WS_ML``
    (``kernels/stream_k.py`` combines the pieces)."""
    cell = (slot * 2 + WG).to(gl.int64)
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, HEAD_DIM_V, layout=gl.SliceLayout(0, o_layout))
    gl.store(WS_O + cell * (BLOCK_M * HEAD_DIM_V) + rows[:, None] * HEAD_DIM_V + cols[None, :], acc)
    r = gl.arange(0, BLOCK_M, layout=row_layout)
    gl.store(WS_ML + cell * (2 * BLOCK_M) + r, m_i)
    gl.store(WS_ML + cell * (2 * BLOCK_M) + BLOCK_M + r, l_i)
