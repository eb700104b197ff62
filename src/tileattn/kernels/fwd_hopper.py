"""Hopper forward kernel (Gluon): warp-specialized, 128 query rows per program.

Three partitions share one CTA and talk through mbarriers:

* the **load partition** (one warp, 24 registers) issues TMA copies: the two
  64-row Q tiles once, then K and V tiles into a ring of ``NUM_STAGES``
  shared-memory slots.  Slot ``s`` has four barriers: ``k_ready[s]`` and
  ``v_ready[s]`` (the copy engine completes them with the tile's bytes),
  ``k_empty[s]`` and ``v_empty[s]`` (both softmax partitions arrive once
  their Q Kᵀ, respectively P V, product has read the tile), so the next K
  tile can land while the last P V product still reads its V tile;
* two **softmax partitions** (4 warps, 240 registers each; warpgroup ``WG``
  owns rows [start + 64 WG, +64)) run S = Q Kᵀ and O += P V as warpgroup MMAs
  (wgmma) straight from shared memory, with P fed from registers, and keep
  the running softmax (row max, row sum, rescaled accumulator) in
  registers.  With ``OVERLAP`` the products of tile j (Q K_jᵀ) and tile j-1
  (P_{j-1} V_{j-1}) are issued together and the softmax of tile j runs while
  the second is still on the tensor cores.  With ``PINGPONG`` two more
  mbarriers make the warpgroups take turns issuing their products, so one's
  softmax runs under the other's matmuls.

With ``PERSISTENT`` (d <= 128, no tail) the grid is one program per SM at
most, and each walks work units (``TOTAL`` of them, programs taking every
``num_programs``-th) in a head-major order that keeps the running programs
on the same heads' K and V; a causal unit pairs a head's k-th heaviest and
k-th lightest query tiles, so that units cost alike (``fwd_hopper_load.py``).
Q has two pairs of buffers, the loader copies the next item's Q into the
other pair once both softmax warpgroups released it (``q_empty``, after O's
copy out of it), and the ring's and the turns' counts run on across items,
so the next item's first tiles land while this one's epilogue runs.  With
``DEFER_O`` (``HopperFwdConfig.defer_o``) a softmax warpgroup does not wait for O's copy
out of its Q buffer (nor the remainder's out of its tile) at the end of an
item: the next item's first tile does, and hands the buffer back then (the
loader needs it only for the item after next).

With ``ROW_TREE`` (``HopperFwdConfig.row_tree``, on in the d = 64 and 128
tables) each row's max over a key tile is reduced as a tree: a thread's
share of the row as four blocks of whole column groups, combined
element-wise, then the block's columns (a chain of 3 + 7 dependent
instructions at 128 keys where the plain reduction's is 31; the max sits
between the S product's wait and the first exp2 of every tile); and its
running sum stays one partial sum a thread of the row's four, added across
them once after the key tiles instead of with two shuffles every tile.

The math is the portable kernel's (``fwd.py``): log2-unit scores
(``qk_scale = scale * log2 e``), the same masked/unmasked split of the key
tiles, rows that see no key return 0 and lse -inf.  With ``HAS_SINKS`` the
head's sink logit is folded into each row after the key tiles, as a second
partial softmax of one score (the loop is the one without sinks), so the lse
includes it and a row that sees no key returns 0 and lse = sink.  With
``WRITE_REMAINDER`` (a sinks call that will be differentiated) the output's
rounding remainder O - round(O) is stored too, as one int8 a value in units
of 2^-8 of the rounded value's last place (``tileattn.sinks``): the
backward's rowsum(dO o O) from both is exact enough for the sinks' gradient.  Tensors are addressed
through rank-4 (B, H, N, D) TMA descriptors, so rows past N read as zeros and
stores past N are clipped by the copy engine; masking handles the key edge
and the causal diagonal.  Q and K are ``HEAD_DIM`` wide, V and O
``HEAD_DIM_V``.  A copy box is a power of two wide, so a QK head dim that is
not one (192 = 128 + 64, MLA) comes as two pieces, V's width and a
``TAIL_DIM`` tail, each with its own descriptors and buffers, and S = Q Kᵀ
is two products into one accumulator; O is staged in the first piece's
buffer.

This module imports Gluon at load time: only the Hopper launcher imports it,
lazily, so a CPU install never does.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma_wait

from .fwd_hopper_load import _grid_coords, _key_tiles, _load_partition, _unit_size, _unit_tile
from .fwd_hopper_mma import _issue_pv, _issue_qk, _wait_pv
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
                  IS_CAUSAL: gl.constexpr, MASKED: gl.constexpr, ROW_TREE: gl.constexpr):
    """The running softmax of key tile ``j``: (p, alpha, m_new, l_new).

    The max runs over the raw scores and is scaled once per row, so each
    score costs one fused multiply-add before its exp2: exp2(s * c - m * c)
    (c = scale * log2 e > 0, so the max commutes with the scaling).  As in
    ``kernels.common.online_softmax_step``, a row that has seen no visible
    key keeps max -inf and subtracts 0, so exp2 gives 0, not NaN."""
    if MASKED:
        offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        visible = (offs_n < N_K)[None, :]
        if IS_CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + (N_K - N_Q))
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
                  BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, ROW_TREE: gl.constexpr):
    """:func:`_softmax_step` with the mask where tile ``j`` needs one."""
    if j < n_full:
        p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i, j, offs_m, N_Q, N_K, qk_scale, s_layout, BLOCK_N,
                                           IS_CAUSAL, False, ROW_TREE)
    else:
        p, alpha, m_i, l_i = _softmax_step(qk, m_i, l_i, j, offs_m, N_Q, N_K, qk_scale, s_layout, BLOCK_N,
                                           IS_CAUSAL, True, ROW_TREE)
    return p, alpha, m_i, l_i


@gluon.jit
def _my_turn(turns, i, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Wait until the other warpgroup has issued its products of step i-1
    (warpgroup 0 goes first: its first wait passes)."""
    if PINGPONG:
        mbarrier.wait(turns.index(WG), (i & 1) ^ (1 - WG))


@gluon.jit
def _your_turn(turns, WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turns.index(1 - WG), count=1)


@gluon.jit
def _release_q(q_empty, prev_qi, DEFER_O: gl.constexpr):
    """``DEFER_O``: once O's copy out of Q buffer ``prev_qi`` (the previous
    work item's, -1 for none) has read it, hand the buffer back to the loader."""
    if DEFER_O:
        if prev_qi >= 0:
            tma.store_wait(0)
            mbarrier.arrive(q_empty.index(prev_qi), count=1)


@gluon.jit
def _softmax_rows(WG: gl.constexpr, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready,
                  k_empty, v_empty, turns,
                  o_desc, LSE, SINKS, lse_row0, off_b, off_h, start_m, n_tiles, N_Q, N_K, qk_scale,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                  HEAD_DIM_V: gl.constexpr, TAIL_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
                  IS_CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, ROW_TREE: gl.constexpr,
                  HAS_SINKS: gl.constexpr, olo_desc, WRITE_REMAINDER: gl.constexpr, lo_smem,
                  qi, q_phase, kc, tc, q_empty, prev_qi, DEFER_O: gl.constexpr):
    """Rows [start_m + WG * BLOCK_M, +BLOCK_M) of one query tile, whose Q
    is buffer ``qi`` (landed in phase ``q_phase``), whose first key tile is
    the ring's ``kc``-th and whose first turn is the ``tc``-th.  Both
    warpgroups run every key tile of the query tile (the loader's ring is
    shared), each with its own mask boundary ``n_full``.  With
    ``WRITE_REMAINDER`` the output's rounding remainder O - round(O) goes
    through ``olo_desc`` too, as its int8 code (``kernels/remainder.py``), staged
    in this warpgroup's tile of ``lo_smem``.  With ``DEFER_O`` (persistent)
    the copies of O out of the Q tile and of the remainder out of its tile are
    not waited on here: the next item's first tile waits for them and
    releases the buffer (``prev_qi``: the buffer this item releases so), so
    the remainder's tile is free again before this epilogue's next turn.  The sink
    (``HAS_SINKS``) enters after the key tiles."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM_V, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    row0 = start_m + WG * BLOCK_M
    n_full, _ = _key_tiles(row0, N_Q, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
    offs_m = row0 + gl.arange(0, BLOCK_M, layout=row_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_layout)
    if ROW_TREE:   # partial sums, one a lane of the row's quad
        l_i = _lane_sums(gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout))
    else:
        l_i = gl.zeros([BLOCK_M], gl.float32, row_layout)
    acc = gl.zeros([BLOCK_M, HEAD_DIM_V], gl.float32, o_layout)

    q_tile = q_smem.index(qi)
    mbarrier.wait(q_bars.index(qi), q_phase)
    q2 = q_tile.reshape([BLOCK_M, HEAD_DIM - TAIL_DIM])
    if TAIL_DIM > 0:
        qt2 = qt_smem.index(qi).reshape([BLOCK_M, TAIL_DIM])
    else:
        qt2 = q2
    if OVERLAP:
        # Software pipeline across key tiles: S_j = Q K_j^T and O += P_{j-1} V_{j-1}
        # are issued together, then the softmax of tile j runs while the
        # P V product is still on the tensor cores.  wgmma groups retire in
        # order, so waiting with one group outstanding returns S_j.
        if n_tiles > 0:
            _my_turn(turns, tc, WG, PINGPONG)
            qk = _issue_qk(q2, qt2, k_smem, kt_smem, k_ready, kc, s_layout, BLOCK_M, BLOCK_N, HEAD_DIM,
                           TAIL_DIM, NUM_STAGES)
            _your_turn(turns, WG, PINGPONG)
            qk = warpgroup_mma_wait(0, deps=[qk])
            mbarrier.arrive(k_empty.index(kc % NUM_STAGES), count=1)
            _release_q(q_empty, prev_qi, DEFER_O)
            p, alpha, m_i, l_i = _softmax_tile(qk, m_i, l_i, 0, n_full, offs_m, N_Q, N_K, qk_scale, s_layout,
                                               BLOCK_N, IS_CAUSAL, ROW_TREE)
            for j in range(1, n_tiles):
                _my_turn(turns, tc + j, WG, PINGPONG)
                qk = _issue_qk(q2, qt2, k_smem, kt_smem, k_ready, kc + j, s_layout, BLOCK_M, BLOCK_N, HEAD_DIM,
                               TAIL_DIM, NUM_STAGES)
                acc = _issue_pv(p, acc, v_smem, v_ready, kc + j - 1, o_layout, BLOCK_N, HEAD_DIM_V, NUM_STAGES)
                _your_turn(turns, WG, PINGPONG)
                qk = warpgroup_mma_wait(1, deps=[qk])
                mbarrier.arrive(k_empty.index((kc + j) % NUM_STAGES), count=1)
                p, alpha, m_i, l_i = _softmax_tile(qk, m_i, l_i, j, n_full, offs_m, N_Q, N_K, qk_scale, s_layout,
                                                   BLOCK_N, IS_CAUSAL, ROW_TREE)
                acc = _wait_pv(acc)
                mbarrier.arrive(v_empty.index((kc + j - 1) % NUM_STAGES), count=1)
                acc = acc * gl.convert_layout(alpha, o_row_layout)[:, None]
            _my_turn(turns, tc + n_tiles, WG, PINGPONG)
            acc = _issue_pv(p, acc, v_smem, v_ready, kc + n_tiles - 1, o_layout, BLOCK_N, HEAD_DIM_V, NUM_STAGES)
            _your_turn(turns, WG, PINGPONG)
            acc = _wait_pv(acc)
            mbarrier.arrive(v_empty.index((kc + n_tiles - 1) % NUM_STAGES), count=1)
    else:
        for j in range(n_tiles):
            _my_turn(turns, tc + 2 * j, WG, PINGPONG)
            qk = _issue_qk(q2, qt2, k_smem, kt_smem, k_ready, kc + j, s_layout, BLOCK_M, BLOCK_N, HEAD_DIM,
                           TAIL_DIM, NUM_STAGES)
            _your_turn(turns, WG, PINGPONG)
            qk = warpgroup_mma_wait(0, deps=[qk])
            mbarrier.arrive(k_empty.index((kc + j) % NUM_STAGES), count=1)
            if j == 0:
                _release_q(q_empty, prev_qi, DEFER_O)
            p, alpha, m_i, l_i = _softmax_tile(qk, m_i, l_i, j, n_full, offs_m, N_Q, N_K, qk_scale, s_layout,
                                               BLOCK_N, IS_CAUSAL, ROW_TREE)
            acc = acc * gl.convert_layout(alpha, o_row_layout)[:, None]
            _my_turn(turns, tc + 2 * j + 1, WG, PINGPONG)
            acc = _issue_pv(p, acc, v_smem, v_ready, kc + j, o_layout, BLOCK_N, HEAD_DIM_V, NUM_STAGES)
            _your_turn(turns, WG, PINGPONG)
            acc = _wait_pv(acc)
            mbarrier.arrive(v_empty.index((kc + j) % NUM_STAGES), count=1)

    if DEFER_O:
        if n_tiles == 0:   # no tile released the previous item's buffer
            _release_q(q_empty, prev_qi, DEFER_O)
    l_i = _row_total(l_i, s_layout, ROW_TREE)
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
    out16 = out.to(q_smem.dtype)
    # the Q tile is dead: stage O in its buffer (as wide as V) for the TMA store
    q2.store(out16)
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [off_b, off_h, row0, 0], q_tile)
    if WRITE_REMAINDER:   # O - O rounded as its int8 code, staged in a tile of its own
        lo_tile = lo_smem.index(WG)
        lo_tile.reshape([BLOCK_M, HEAD_DIM_V]).store(encode_remainder(out, out16))
        fence_async_shared()
        tma.async_copy_shared_to_global(olo_desc, [off_b, off_h, row0, 0], lo_tile)
    if not DEFER_O:
        tma.store_wait(0)


@gluon.jit
def _softmax_partition(WG: gl.constexpr, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready,
                       k_empty, v_empty, turns,
                       o_desc, LSE, SINKS, lse_row0, off_b, off_h, start_m, n_tiles, N_Q, N_K, qk_scale,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                       HEAD_DIM_V: gl.constexpr, TAIL_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
                       IS_CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, ROW_TREE: gl.constexpr,
                       HAS_SINKS: gl.constexpr, olo_desc, WRITE_REMAINDER: gl.constexpr, lo_smem,
                       q_empty, stride_lb, stride_lh, N_M_TILES, N_HEADS, TOTAL,
                       PERSISTENT: gl.constexpr, DEFER_O: gl.constexpr):
    """Softmax warpgroup ``WG``: its rows of the program's query tile, or
    with ``PERSISTENT`` of each of the program's work items in turn (Q
    buffers alternate between two pairs, released on ``q_empty`` once O's
    copy has read the buffer; the ring's and the turns' counts run on;
    ``DEFER_O``: the next item's first tile waits for that copy)."""
    if PERSISTENT:
        kc = gl.program_id(0) * 0
        tc = kc
        it = kc
        prev_qi = kc - 1   # DEFER_O: the Q buffer whose O copy is still to be waited on
        for unit in range(gl.program_id(0), TOTAL, gl.num_programs(0)):
            bh, k, n_half = _unit_size(unit, N_M_TILES, IS_CAUSAL)
            for half in range(n_half):
                t_b, t_h, t_m, t_n = _unit_tile(bh, k, half, N_M_TILES, N_HEADS, N_Q, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
                t_row0 = t_b.to(gl.int64) * stride_lb + t_h.to(gl.int64) * stride_lh
                qi = 2 * (it % 2) + WG
                _softmax_rows(WG, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready, k_empty,
                              v_empty, turns, o_desc, LSE, SINKS, t_row0, t_b, t_h, t_m, t_n, N_Q, N_K, qk_scale,
                              BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, TAIL_DIM, NUM_STAGES, IS_CAUSAL, OVERLAP,
                              PINGPONG, ROW_TREE, HAS_SINKS, olo_desc, WRITE_REMAINDER, lo_smem, qi, (it // 2) & 1,
                              kc, tc, q_empty, prev_qi, DEFER_O)
                if DEFER_O:
                    prev_qi = qi
                else:
                    mbarrier.arrive(q_empty.index(qi), count=1)   # O's copy has read the buffer (store_wait)
                kc += t_n
                if OVERLAP:   # a turn for each product pair of the pipeline: n + 1 where there is a tile
                    tc += gl.where(t_n > 0, t_n + 1, 0)
                else:
                    tc += 2 * t_n
                it += 1
        if DEFER_O:   # the last item's O copy
            tma.store_wait(0)
    else:
        _softmax_rows(WG, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                      turns, o_desc, LSE, SINKS, lse_row0, off_b, off_h, start_m, n_tiles, N_Q, N_K, qk_scale,
                      BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, TAIL_DIM, NUM_STAGES, IS_CAUSAL, OVERLAP,
                      PINGPONG, ROW_TREE, HAS_SINKS, olo_desc, WRITE_REMAINDER, lo_smem, WG, 0, 0, 0, q_empty, -1,
                      False)


@gluon.jit
def _attn_fwd_hopper_kernel(q_desc, k_desc, v_desc, o_desc, LSE, SINKS, stride_lb, stride_lh,
                            GROUP_SIZE, N_Q, N_K, qk_scale,
                            HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                            IS_CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr, OVERLAP: gl.constexpr,
                            PINGPONG: gl.constexpr, HAS_SINKS: gl.constexpr, HEAD_DIM_V: gl.constexpr,
                            TAIL_DIM: gl.constexpr = 0, qt_desc=None, kt_desc=None, olo_desc=None,
                            WRITE_REMAINDER: gl.constexpr = False,
                            PERSISTENT: gl.constexpr = False, N_M_TILES=1, N_HEADS=1, TOTAL=1,
                            GROUPED: gl.constexpr = False, DEFER_O: gl.constexpr = False,
                            ROW_TREE: gl.constexpr = False):
    """A program runs 2 * BLOCK_M query rows: BLOCK_M per softmax warpgroup.
    ``q_desc``/``k_desc`` cover the first HEAD_DIM - TAIL_DIM columns of Q
    and K (V's width), ``qt_desc``/``kt_desc`` the last TAIL_DIM (none
    without a tail); ``olo_desc`` (with ``WRITE_REMAINDER``) the int8 code of
    O's rounding remainder, shaped and boxed like ``o_desc``, staged in two
    tiles of its own (half of O's bytes), so that it needs not wait for O's
    copy.  With ``PERSISTENT`` the grid is one program
    per SM (or fewer) over ``TOTAL`` work units of ``N_M_TILES`` query
    tiles of ``N_HEADS`` heads of each batch element (``_unit_size``), each
    program's units ``program_id``, + ``num_programs``, ...; Q gets two
    pairs of buffers so the next tile's lands while this one runs (no tail:
    shared memory)."""
    gl.static_assert(HEAD_DIM - TAIL_DIM == HEAD_DIM_V, "O is staged in the Q tile: Q's first piece is V's width")
    gl.static_assert(not PERSISTENT or TAIL_DIM == 0, "a persistent program's two pairs of Q buffers need no tail")
    gl.static_assert(not DEFER_O or PERSISTENT, "DEFER_O: a persistent program's")
    # heaviest causal tiles (last rows) first: better tail balance
    block, off_h, off_b, n_blocks = _grid_coords(N_HEADS, GROUPED)
    pid_m = n_blocks - 1 - block
    off_hk = off_h // GROUP_SIZE
    start_m = pid_m * (2 * BLOCK_M)
    _, n_tiles = _key_tiles(start_m, N_Q, N_K, 2 * BLOCK_M, BLOCK_N, IS_CAUSAL)
    lse_row0 = off_b.to(gl.int64) * stride_lb + off_h.to(gl.int64) * stride_lh

    dtype: gl.constexpr = q_desc.dtype
    Q_BUFS: gl.constexpr = 4 if PERSISTENT else 2
    q_smem = gl.allocate_shared_memory(dtype, [Q_BUFS] + q_desc.block_type.shape, q_desc.layout)
    if WRITE_REMAINDER:   # a tile a softmax warpgroup
        lo_smem = gl.allocate_shared_memory(olo_desc.dtype, [2] + olo_desc.block_type.shape, olo_desc.layout)
    else:   # unused
        lo_smem = q_smem
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + v_desc.block_type.shape, v_desc.layout)
    if TAIL_DIM > 0:
        qt_smem = gl.allocate_shared_memory(dtype, [2] + qt_desc.block_type.shape, qt_desc.layout)
        kt_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + kt_desc.block_type.shape, kt_desc.layout)
    else:   # unused
        qt_smem = q_smem
        kt_smem = k_smem
    q_bars = gl.allocate_shared_memory(gl.int64, [Q_BUFS, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(turns.index(i), count=1)
    if PERSISTENT:   # the second pair's; a softmax warpgroup arrives on q_empty once O's copy has read its Q buffer
        q_empty = gl.allocate_shared_memory(gl.int64, [Q_BUFS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(Q_BUFS):
            if i >= 2:
                mbarrier.init(q_bars.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=1)
    else:   # unused
        q_empty = q_bars
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        # both softmax warpgroups read every tile
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)

    # the two softmax partitions' argument tuples are written out: a tuple
    # built by concatenation in the kernel loses its constexpr entries (triton 3.6)
    gl.warp_specialize([
        (_softmax_partition, (0, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready, k_empty,
                              v_empty, turns, o_desc,
                              LSE, SINKS, lse_row0, off_b, off_h, start_m, n_tiles, N_Q, N_K, qk_scale,
                              BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, TAIL_DIM, NUM_STAGES, IS_CAUSAL, OVERLAP,
                              PINGPONG, ROW_TREE, HAS_SINKS, olo_desc, WRITE_REMAINDER, lo_smem, q_empty,
                              stride_lb, stride_lh, N_M_TILES, N_HEADS, TOTAL, PERSISTENT, DEFER_O)),
        (_softmax_partition, (1, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready, k_empty,
                              v_empty, turns, o_desc,
                              LSE, SINKS, lse_row0, off_b, off_h, start_m, n_tiles, N_Q, N_K, qk_scale,
                              BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, TAIL_DIM, NUM_STAGES, IS_CAUSAL, OVERLAP,
                              PINGPONG, ROW_TREE, HAS_SINKS, olo_desc, WRITE_REMAINDER, lo_smem, q_empty,
                              stride_lb, stride_lh, N_M_TILES, N_HEADS, TOTAL, PERSISTENT, DEFER_O)),
        (_load_partition, (q_desc, k_desc, v_desc, qt_desc, kt_desc, q_smem, k_smem, v_smem, qt_smem, kt_smem,
                           q_bars, k_ready, v_ready, k_empty, v_empty, turns, off_b, off_h, off_hk, start_m, n_tiles,
                           BLOCK_M, BLOCK_N, NUM_STAGES, TAIL_DIM, q_empty, GROUP_SIZE, N_Q, N_K, N_M_TILES,
                           N_HEADS, TOTAL, IS_CAUSAL, PERSISTENT)),
    ], [4, 1], [240, 24])

    for i in gl.static_range(2):
        mbarrier.invalidate(q_bars.index(i))
        mbarrier.invalidate(turns.index(i))
    if PERSISTENT:
        for i in gl.static_range(Q_BUFS):
            if i >= 2:
                mbarrier.invalidate(q_bars.index(i))
            mbarrier.invalidate(q_empty.index(i))
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(k_ready.index(i))
        mbarrier.invalidate(v_ready.index(i))
        mbarrier.invalidate(k_empty.index(i))
        mbarrier.invalidate(v_empty.index(i))
