"""Hopper forward kernel (Gluon): warp-specialized, 128 (or 192) query rows per program.

The partitions share one CTA and talk through mbarriers:

* the **load partition** (one warp, 24 registers) issues TMA copies: the
  64-row Q tiles once, then K and V tiles into a ring of ``NUM_STAGES``
  shared-memory slots.  Slot ``s`` has four barriers: ``k_ready[s]`` and
  ``v_ready[s]`` (the copy engine completes them with the tile's bytes),
  ``k_empty[s]`` and ``v_empty[s]`` (every softmax partition arrives once
  its Q Kᵀ, respectively P V, product has read the tile), so the next K
  tile can land while the last P V product still reads its V tile;
* ``NUM_WG`` **softmax partitions** (4 warps each: two of 240 registers, or
  three of 160 at d = 64, ``HopperFwdConfig.warpgroups``; warpgroup ``WG``
  owns rows [start + 64 WG, +64)) run S = Q Kᵀ and O += P V as warpgroup MMAs
  (wgmma) straight from shared memory, with P fed from registers, and keep
  the running softmax (row max, row sum, rescaled accumulator) in
  registers.  With ``OVERLAP`` the products of tile j (Q K_jᵀ) and tile j-1
  (P_{j-1} V_{j-1}) are issued together and the softmax of tile j runs while
  the second is still on the tensor cores (``EARLY_P``: P is made 16-bit
  once the previous P V has completed, not at the next one's issue, so
  fewer registers are live at once: what lets three warpgroups overlap at
  160 registers).  With ``PINGPONG`` one more mbarrier a warpgroup makes
  them take turns issuing their products, round the warpgroups, so one's
  softmax runs under the others' matmuls.

With ``PERSISTENT`` (d <= 128, no tail) the grid is one program per SM at
most, and each walks work units (``TOTAL`` of them, programs taking every
``num_programs``-th) in a head-major order that keeps the running programs
on the same heads' K and V; a causal unit pairs a head's k-th heaviest and
k-th lightest query tiles, so that units cost alike (``fwd_hopper_load.py``).
Q has two sets of buffers (the next item's Q lands in the other set once
every softmax warpgroup released its own, ``q_empty``, after O's copy out of
it) and the ring's and turns' counts run on, so the next item's first tiles
land during this one's epilogue.  ``DEFER_O``: a softmax warpgroup leaves
O's copy out of its Q buffer (and the remainder's) to the next item's first
tile, which hands the buffer back (the loader needs it for the item after
next).  With ``STREAM_K
(``HopperFwdConfig.stream_k``, non-causal, opt-in) the walk's last two
waves are cut into one even range of key tiles a program; a piece short of
its unit stores a partial softmax that ``stream_k.py`` merges after the
kernel (``fwd_hopper_load._work``, ``launch/stream_k.py``).  A sliding
window (``WIN_LEFT`` / ``WIN_RIGHT``, causal folded into the right bound;
one program a tile, or persistent without the stream-K cut) copies and runs
only the key tiles a query tile's rows can see, the mask on the tiles at
either edge (``fwd_hopper_load._window_tiles``).  Packed sequences
(``IS_VARLEN``, one program a tile): the grid's batch axis runs over them.
``TRACE`` (int64, ``benchmarks/walk_trace.py``): a persistent program's SM, start and work ends.

With ``ROW_TREE`` (``HopperFwdConfig.row_tree``) a row's max over a key tile
is a tree (``_row_max``: 3 + 7 dependent instructions at 128 keys, not 31)
and its running sum one partial sum a thread of the row's four, added once
after the key tiles.

The math is the portable kernel's (``fwd.py``): log2-unit scores
(``qk_scale = scale * log2 e``), the same masked/unmasked split of the key
tiles (``EVEN_K``: non-causal, no window, N_K a multiple of BLOCK_N, so no
masked step is built), rows that see no key return 0 and lse -inf.  With ``HAS_SINKS`` the
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

Gluon is imported at load time: only the Hopper launcher imports this module, lazily.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma_wait

from .fwd_hopper_load import (_grid_coords, _key_tiles, _load_partition, _n_work, _sequence, _tile_range, _unit_size,
                               _unit_tile, _window_tiles, _work)
from .fwd_hopper_mma import (TRACE_SLOTS, _issue_pv, _issue_qk, _mark, _my_turn, _overlap_step, _p16, _release_q,
                             _wait_pv, _your_turn)
from .fwd_hopper_softmax import _epilogue, _lane_sums, _row_total, _softmax_tile, _store_partial


@gluon.jit
def _softmax_rows(WG: gl.constexpr, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready,
                  k_empty, v_empty, turns,
                  o_desc, LSE, SINKS, lse_row0, off_b, off_h, start_m, n_tiles, N_Q, N_K, qk_scale,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                  HEAD_DIM_V: gl.constexpr, TAIL_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
                  IS_CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, ROW_TREE: gl.constexpr,
                  HAS_SINKS: gl.constexpr, olo_desc, WRITE_REMAINDER: gl.constexpr, lo_smem,
                  qi, q_phase, kc, tc, q_empty, prev_qi, DEFER_O: gl.constexpr,
                  j0=0, slot=-1, WS_O=None, WS_ML=None, STREAM_K: gl.constexpr = False, WIN_LEFT=None,
                  WIN_RIGHT=None, WIN_ROWS: gl.constexpr = False, q_base=0, O=None, stride_on=0, stride_oh=0,
                  NUM_WG: gl.constexpr = 2, EARLY_P: gl.constexpr = False, EVEN_K: gl.constexpr = False):
    """Rows [start_m + WG * BLOCK_M, +BLOCK_M) of one query tile, whose Q
    is buffer ``qi`` (landed in phase ``q_phase``), whose first key tile is
    the ring's ``kc``-th and whose first turn is the ``tc``-th.  Every
    warpgroup runs every key tile of the query tile (the loader's ring is
    shared), each with its own mask boundary ``n_full``.  With
    ``WRITE_REMAINDER`` the output's rounding remainder O - round(O) goes
    through ``olo_desc`` too, as its int8 code (``kernels/remainder.py``), staged
    in this warpgroup's tile of ``lo_smem``.  With ``DEFER_O`` (persistent)
    the copies of O out of the Q tile and of the remainder out of its tile are
    not waited on here: the next item's first tile waits for them and
    releases the buffer (``prev_qi``: the buffer this item releases so), so
    the remainder's tile is free again before this epilogue's next turn.  The sink
    (``HAS_SINKS``) enters after the key tiles.  ``STREAM_K``: the tile's
    key tiles are j0, ..., j0 + n_tiles - 1, and where ``slot`` >= 0 (a
    piece short of all of them) the rows' partial softmax goes to that
    workspace slot instead of the epilogue (:func:`_store_partial`).  A
    sliding window (``WIN_LEFT`` not None): the key tiles are j0, ... as
    well, masked outside this warpgroup's [full_lo, n_full).  A packed
    sequence's rows start at ``q_base``; ``O`` (its pointer, not None) stores
    rows that end inside the tile (:func:`_epilogue`).  ``EARLY_P``: the
    overlapped loop makes P a 16-bit operand once the previous tile's P V
    product has completed, so that P in float32 is dead while the next
    tile's S arrives (else at that P V's issue).  ``EVEN_K``: no key tile
    needs the mask (``fwd_hopper_softmax._softmax_tile``)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM_V, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    row0 = start_m + WG * BLOCK_M
    tile_row0 = None   # WIN_ROWS: each tile's mask decided from row0, no bound live through the loop
    if WIN_LEFT is None:
        n_full, _ = _key_tiles(row0, N_Q, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
        full_lo = None
    elif WIN_ROWS:
        full_lo = None
        n_full = None
        tile_row0 = row0
    else:
        _, full_lo, n_full, _ = _window_tiles(row0, N_Q, N_K, WIN_LEFT, WIN_RIGHT, BLOCK_M, BLOCK_N)
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
            _your_turn(turns, WG, PINGPONG, NUM_WG)
            qk = warpgroup_mma_wait(0, deps=[qk])
            mbarrier.arrive(k_empty.index(kc % NUM_STAGES), count=1)
            _release_q(q_empty, prev_qi, DEFER_O)
            p, alpha, m_i, l_i = _softmax_tile(qk, m_i, l_i, j0, n_full, offs_m, N_Q, N_K, qk_scale, s_layout,
                                               BLOCK_N, IS_CAUSAL, ROW_TREE, full_lo, WIN_LEFT, WIN_RIGHT, tile_row0,
                                               EVEN_K)
            if EARLY_P:
                p = _p16(p, v_smem.dtype, o_layout)
            for j in range(1, n_tiles):
                p, acc, m_i, l_i = _overlap_step(
                    j, p, acc, m_i, l_i, q2, qt2, k_smem, kt_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turns,
                    kc, tc, j0, n_full, offs_m, N_Q, N_K, qk_scale, s_layout, o_layout, BLOCK_M, BLOCK_N, HEAD_DIM,
                    HEAD_DIM_V, TAIL_DIM, NUM_STAGES, IS_CAUSAL, ROW_TREE, WG, PINGPONG, NUM_WG, EARLY_P, full_lo,
                    WIN_LEFT, WIN_RIGHT, tile_row0, EVEN_K)
            _my_turn(turns, tc + n_tiles, WG, PINGPONG)
            acc = _issue_pv(p, acc, v_smem, v_ready, kc + n_tiles - 1, o_layout, BLOCK_N, HEAD_DIM_V, NUM_STAGES)
            _your_turn(turns, WG, PINGPONG, NUM_WG)
            acc = _wait_pv(acc)
            mbarrier.arrive(v_empty.index((kc + n_tiles - 1) % NUM_STAGES), count=1)
    else:
        for j in range(n_tiles):
            _my_turn(turns, tc + 2 * j, WG, PINGPONG)
            qk = _issue_qk(q2, qt2, k_smem, kt_smem, k_ready, kc + j, s_layout, BLOCK_M, BLOCK_N, HEAD_DIM,
                           TAIL_DIM, NUM_STAGES)
            _your_turn(turns, WG, PINGPONG, NUM_WG)
            qk = warpgroup_mma_wait(0, deps=[qk])
            mbarrier.arrive(k_empty.index((kc + j) % NUM_STAGES), count=1)
            if j == 0:
                _release_q(q_empty, prev_qi, DEFER_O)
            p, alpha, m_i, l_i = _softmax_tile(qk, m_i, l_i, j0 + j, n_full, offs_m, N_Q, N_K, qk_scale, s_layout,
                                               BLOCK_N, IS_CAUSAL, ROW_TREE, full_lo, WIN_LEFT, WIN_RIGHT, tile_row0,
                                               EVEN_K)
            acc = acc * gl.convert_layout(alpha, o_row_layout)[:, None]
            _my_turn(turns, tc + 2 * j + 1, WG, PINGPONG)
            acc = _issue_pv(p, acc, v_smem, v_ready, kc + j, o_layout, BLOCK_N, HEAD_DIM_V, NUM_STAGES)
            _your_turn(turns, WG, PINGPONG, NUM_WG)
            acc = _wait_pv(acc)
            mbarrier.arrive(v_empty.index((kc + j) % NUM_STAGES), count=1)

    if DEFER_O:
        if n_tiles == 0:   # no tile released the previous item's buffer
            _release_q(q_empty, prev_qi, DEFER_O)
    l_i = _row_total(l_i, s_layout, ROW_TREE)
    if STREAM_K:
        if slot >= 0:
            _store_partial(acc, m_i, l_i, WS_O, WS_ML, slot, WG, BLOCK_M, HEAD_DIM_V, o_layout, row_layout)
        else:
            _epilogue(acc, m_i, l_i, offs_m, row0, q2, q_tile, lo_smem, o_desc, olo_desc, LSE, SINKS, lse_row0, off_b,
                      off_h, N_Q, o_row_layout, WG, BLOCK_M, HEAD_DIM_V, HAS_SINKS, WRITE_REMAINDER, DEFER_O)
    else:
        _epilogue(acc, m_i, l_i, offs_m, row0, q2, q_tile, lo_smem, o_desc, olo_desc, LSE, SINKS, lse_row0, off_b,
                  off_h, N_Q, o_row_layout, WG, BLOCK_M, HEAD_DIM_V, HAS_SINKS, WRITE_REMAINDER, DEFER_O, q_base, O,
                  stride_on, stride_oh)


@gluon.jit
def _softmax_unit(WG: gl.constexpr, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready, k_empty,
                  v_empty, turns, o_desc, LSE, SINKS, N_Q, N_K, qk_scale, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, HEAD_DIM_V: gl.constexpr, TAIL_DIM: gl.constexpr,
                  NUM_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr,
                  ROW_TREE: gl.constexpr, HAS_SINKS: gl.constexpr, olo_desc, WRITE_REMAINDER: gl.constexpr, lo_smem,
                  q_empty, stride_lb, stride_lh, N_M_TILES, N_HEADS, DEFER_O: gl.constexpr,
                  unit, j0, n_sk, slot, kc, tc, it, prev_qi, WS_O, WS_ML, STREAM_K: gl.constexpr, WIN_LEFT=None,
                  WIN_RIGHT=None, NUM_WG: gl.constexpr = 2, EARLY_P: gl.constexpr = False,
                  EVEN_K: gl.constexpr = False):
    """A persistent program's work (``fwd_hopper_load._work``: key tiles
    [j0, j0 + n_sk) of ``unit``, all where n_sk < 0; a sliding window's
    from ``_unit_tile``) for warpgroup ``WG``; returns the ring's, the
    turns' and the items' counts after it and the Q buffer whose O copy is
    pending (``DEFER_O``)."""
    bh, k, n_half = _unit_size(unit, N_M_TILES, IS_CAUSAL)
    for half in range(n_half):
        t_b, t_h, t_m, t_n, t_j0 = _unit_tile(bh, k, half, N_M_TILES, N_HEADS, N_Q, N_K, NUM_WG * BLOCK_M, BLOCK_N,
                                              IS_CAUSAL, WIN_LEFT, WIN_RIGHT)
        t_n = gl.where(n_sk >= 0, n_sk, t_n)
        if WIN_LEFT is None:
            t_first = j0
        else:
            t_first = t_j0
        t_row0 = t_b.to(gl.int64) * stride_lb + t_h.to(gl.int64) * stride_lh
        qi = NUM_WG * (it % 2) + WG
        _softmax_rows(WG, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready, k_empty,
                      v_empty, turns, o_desc, LSE, SINKS, t_row0, t_b, t_h, t_m, t_n, N_Q, N_K, qk_scale,
                      BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, TAIL_DIM, NUM_STAGES, IS_CAUSAL, OVERLAP,
                      PINGPONG, ROW_TREE, HAS_SINKS, olo_desc, WRITE_REMAINDER, lo_smem, qi, (it // 2) & 1,
                      kc, tc, q_empty, prev_qi, DEFER_O, t_first, slot, WS_O, WS_ML, STREAM_K, WIN_LEFT, WIN_RIGHT,
                      True, NUM_WG=NUM_WG, EARLY_P=EARLY_P, EVEN_K=EVEN_K)
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
    return kc, tc, it, prev_qi


@gluon.jit
def _softmax_partition(WG: gl.constexpr, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready,
                       k_empty, v_empty, turns,
                       o_desc, LSE, SINKS, lse_row0, off_b, off_h, start_m, n_tiles, N_Q, N_K, qk_scale,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                       HEAD_DIM_V: gl.constexpr, TAIL_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
                       IS_CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, ROW_TREE: gl.constexpr,
                       HAS_SINKS: gl.constexpr, olo_desc, WRITE_REMAINDER: gl.constexpr, lo_smem,
                       q_empty, stride_lb, stride_lh, N_M_TILES, N_HEADS, TOTAL,
                       PERSISTENT: gl.constexpr, DEFER_O: gl.constexpr, SK_TILES, WS_O, WS_ML,
                       STREAM_K: gl.constexpr, TRACE, j0, WIN_LEFT, WIN_RIGHT, q_base, O, stride_on, stride_oh,
                       NUM_WG: gl.constexpr, EARLY_P: gl.constexpr, EVEN_K: gl.constexpr):
    """Softmax warpgroup ``WG`` of ``NUM_WG``: its rows of the program's query tile, or
    with ``PERSISTENT`` of each of the program's work items in turn (Q
    buffers alternate between two sets of NUM_WG, released on ``q_empty``
    once O's copy has read the buffer; the ring's and the turns' counts run on;
    ``DEFER_O``: the next item's first tile waits for that copy; ``STREAM_K``:
    the walk's last key tiles cut into a range a program,
    ``fwd_hopper_load._work``; ``TRACE``: the program's SM, its start and
    each work's end, :func:`_mark`; one program a tile: its key tiles from
    ``j0``, a sliding window where ``WIN_LEFT`` is not None, a packed
    sequence's rows from ``q_base``, ``O`` not None)."""
    if PERSISTENT:
        kc = gl.program_id(0) * 0
        tc = kc
        it = kc
        prev_qi = kc - 1   # DEFER_O: the Q buffer whose O copy is still to be waited on
        _mark(TRACE, 0, WG, True)
        _mark(TRACE, 1, WG)
        if STREAM_K:
            for w in range(_n_work(TOTAL, STREAM_K)):
                unit, j0, n_sk, slot = _work(w, TOTAL, SK_TILES, N_K, BLOCK_N, STREAM_K)
                if n_sk != 0:
                    kc, tc, it, prev_qi = _softmax_unit(
                        WG, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                        turns, o_desc, LSE, SINKS, N_Q, N_K, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V,
                        TAIL_DIM, NUM_STAGES, IS_CAUSAL, OVERLAP, PINGPONG, ROW_TREE, HAS_SINKS, olo_desc,
                        WRITE_REMAINDER, lo_smem, q_empty, stride_lb, stride_lh, N_M_TILES, N_HEADS, DEFER_O,
                        unit, j0, n_sk, slot, kc, tc, it, prev_qi, WS_O, WS_ML, STREAM_K, NUM_WG=NUM_WG,
                        EARLY_P=EARLY_P, EVEN_K=EVEN_K)
                _mark(TRACE, 2 + w, WG)
        else:
            for unit in range(gl.program_id(0), TOTAL, gl.num_programs(0)):
                kc, tc, it, prev_qi = _softmax_unit(
                    WG, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                    turns, o_desc, LSE, SINKS, N_Q, N_K, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V,
                    TAIL_DIM, NUM_STAGES, IS_CAUSAL, OVERLAP, PINGPONG, ROW_TREE, HAS_SINKS, olo_desc,
                    WRITE_REMAINDER, lo_smem, q_empty, stride_lb, stride_lh, N_M_TILES, N_HEADS, DEFER_O,
                    unit, 0, -1, -1, kc, tc, it, prev_qi, WS_O, WS_ML, STREAM_K, WIN_LEFT, WIN_RIGHT, NUM_WG, EARLY_P,
                    EVEN_K)
                _mark(TRACE, 2 + (unit - gl.program_id(0)) // gl.num_programs(0), WG)
        if DEFER_O:   # the last item's O copy
            tma.store_wait(0)
    else:
        _softmax_rows(WG, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready, k_empty, v_empty,
                      turns, o_desc, LSE, SINKS, lse_row0, off_b, off_h, start_m, n_tiles, N_Q, N_K, qk_scale,
                      BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, TAIL_DIM, NUM_STAGES, IS_CAUSAL, OVERLAP,
                      PINGPONG, ROW_TREE, HAS_SINKS, olo_desc, WRITE_REMAINDER, lo_smem, WG, 0, 0, 0, q_empty, -1,
                      False, j0, WIN_LEFT=WIN_LEFT, WIN_RIGHT=WIN_RIGHT, q_base=q_base, O=O, stride_on=stride_on,
                      stride_oh=stride_oh, NUM_WG=NUM_WG, EARLY_P=EARLY_P, EVEN_K=EVEN_K)


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
                            ROW_TREE: gl.constexpr = False, STREAM_K: gl.constexpr = False, SK_TILES=0, WS_O=None,
                            WS_ML=None, TRACE=None, WIN_LEFT=None, WIN_RIGHT=None, IS_VARLEN: gl.constexpr = False,
                            CU_SEQLENS_Q=None, CU_SEQLENS_K=None, O=None, stride_on=0, stride_oh=0, V=None,
                            stride_vh=0, stride_vn=0, NUM_WG: gl.constexpr = 2, EARLY_P: gl.constexpr = False,
                            EVEN_K: gl.constexpr = False):
    """A program runs NUM_WG * BLOCK_M query rows: BLOCK_M per softmax
    warpgroup (two of 240 registers a thread, or three of 160).
    ``q_desc``/``k_desc`` cover the first HEAD_DIM - TAIL_DIM columns of Q
    and K (V's width), ``qt_desc``/``kt_desc`` the last TAIL_DIM (none
    without a tail); ``olo_desc`` (with ``WRITE_REMAINDER``) the int8 code of
    O's rounding remainder, shaped and boxed like ``o_desc``, staged in a
    tile of its own a warpgroup (half of O's bytes), so that it needs not
    wait for O's copy.  ``PERSISTENT``: one program an SM at most over
    ``TOTAL`` units of ``N_M_TILES`` query tiles of ``N_HEADS`` heads a batch
    element (``_unit_size``), taking every ``num_programs``-th; Q in two sets
    of buffers (no tail: shared memory).  ``STREAM_K`` (persistent, non-causal): the units from
    ``TOTAL`` on are the tail, their ``SK_TILES`` key tiles cut evenly over
    the programs; pieces short of a whole unit leave partial softmaxes in
    ``WS_O`` / ``WS_ML`` for ``kernels/stream_k.py``'s combine.  A sliding
    window (``WIN_LEFT``, ``WIN_RIGHT``: ``kernels.common``'s bounds, causal
    folded into the right one; no stream-K cut) loads and runs only the key
    tiles a query tile's rows can see (:func:`_window_tiles`).  Packed
    sequences (``IS_VARLEN``, (1, H, total, D) tensors): a grid batch index a
    sequence (:func:`_sequence`; keys past it masked, its last value tile read
    through ``V``), its last tile's O stored through ``O``, masked.
    ``EVEN_K``: no key tile is masked."""
    gl.static_assert(not STREAM_K or (PERSISTENT and not IS_CAUSAL and NUM_WG == 2),
                     "STREAM_K: a non-causal persistent walk's, two softmax warpgroups")
    gl.static_assert(HEAD_DIM - TAIL_DIM == HEAD_DIM_V, "O is staged in the Q tile: Q's first piece is V's width")
    gl.static_assert(not PERSISTENT or TAIL_DIM == 0, "a persistent program's two sets of Q buffers need no tail")
    gl.static_assert(not DEFER_O or PERSISTENT, "DEFER_O: a persistent program's")
    gl.static_assert(not EVEN_K or not (IS_CAUSAL or IS_VARLEN or WIN_LEFT is not None), "EVEN_K: full key tiles")
    gl.static_assert(WIN_LEFT is None or not (STREAM_K or IS_CAUSAL), "a window: no stream-K cut, causal folded")
    gl.static_assert(not IS_VARLEN or not (PERSISTENT or GROUPED or WRITE_REMAINDER or HAS_SINKS or TAIL_DIM > 0),
                     "packed sequences: one program a tile, plain grid, QK = V head dim, sinks applied after")
    # heaviest causal tiles (last rows) first: better tail balance
    block, off_h, off_b, n_blocks = _grid_coords(N_HEADS, GROUPED)
    pid_m = n_blocks - 1 - block
    off_hk = off_h // GROUP_SIZE
    start_m = pid_m * (NUM_WG * BLOCK_M)
    if IS_VARLEN:
        off_b, q_base, N_Q, k_base, N_K = _sequence(CU_SEQLENS_Q, CU_SEQLENS_K, off_b, N_Q, N_K, IS_VARLEN)
        if start_m >= N_Q:   # past this sequence's rows
            return
    else:
        q_base: gl.constexpr = 0
        k_base: gl.constexpr = 0
    j0, n_tiles = _tile_range(start_m, N_Q, N_K, NUM_WG * BLOCK_M, BLOCK_N, IS_CAUSAL, WIN_LEFT, WIN_RIGHT)
    lse_row0 = off_b.to(gl.int64) * stride_lb + off_h.to(gl.int64) * stride_lh + q_base

    dtype: gl.constexpr = q_desc.dtype
    Q_BUFS: gl.constexpr = 2 * NUM_WG if PERSISTENT else NUM_WG
    q_smem = gl.allocate_shared_memory(dtype, [Q_BUFS] + q_desc.block_type.shape, q_desc.layout)
    if WRITE_REMAINDER:   # a tile a softmax warpgroup
        lo_smem = gl.allocate_shared_memory(olo_desc.dtype, [NUM_WG] + olo_desc.block_type.shape, olo_desc.layout)
    else:   # unused
        lo_smem = q_smem
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + v_desc.block_type.shape, v_desc.layout)
    if TAIL_DIM > 0:
        qt_smem = gl.allocate_shared_memory(dtype, [NUM_WG] + qt_desc.block_type.shape, qt_desc.layout)
        kt_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + kt_desc.block_type.shape, kt_desc.layout)
    else:   # unused
        qt_smem = q_smem
        kt_smem = k_smem
    q_bars = gl.allocate_shared_memory(gl.int64, [Q_BUFS, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_WG):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(turns.index(i), count=1)
    if PERSISTENT:   # the second set's; a softmax warpgroup arrives on q_empty once O's copy has read its Q buffer
        q_empty = gl.allocate_shared_memory(gl.int64, [Q_BUFS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(Q_BUFS):
            if i >= NUM_WG:
                mbarrier.init(q_bars.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=1)
    else:   # unused
        q_empty = q_bars
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        # every softmax warpgroup reads every tile
        mbarrier.init(k_empty.index(i), count=NUM_WG)
        mbarrier.init(v_empty.index(i), count=NUM_WG)

    # argument tuples written out: a tuple built in the kernel loses its constexpr entries (triton 3.6)
    if NUM_WG == 2:
        gl.warp_specialize([
            (_softmax_partition, (0, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready, k_empty,
                                  v_empty, turns, o_desc, LSE, SINKS, lse_row0, off_b, off_h, start_m, n_tiles, N_Q,
                                  N_K, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, TAIL_DIM, NUM_STAGES,
                                  IS_CAUSAL, OVERLAP, PINGPONG, ROW_TREE, HAS_SINKS, olo_desc, WRITE_REMAINDER, lo_smem,
                                  q_empty, stride_lb, stride_lh, N_M_TILES, N_HEADS, TOTAL, PERSISTENT, DEFER_O,
                                  SK_TILES, WS_O, WS_ML, STREAM_K, TRACE, j0, WIN_LEFT, WIN_RIGHT, q_base, O, stride_on,
                                  stride_oh, NUM_WG, EARLY_P, EVEN_K)),
            (_softmax_partition, (1, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready, k_empty,
                                  v_empty, turns, o_desc, LSE, SINKS, lse_row0, off_b, off_h, start_m, n_tiles, N_Q,
                                  N_K, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, TAIL_DIM, NUM_STAGES,
                                  IS_CAUSAL, OVERLAP, PINGPONG, ROW_TREE, HAS_SINKS, olo_desc, WRITE_REMAINDER, lo_smem,
                                  q_empty, stride_lb, stride_lh, N_M_TILES, N_HEADS, TOTAL, PERSISTENT, DEFER_O,
                                  SK_TILES, WS_O, WS_ML, STREAM_K, TRACE, j0, WIN_LEFT, WIN_RIGHT, q_base, O, stride_on,
                                  stride_oh, NUM_WG, EARLY_P, EVEN_K)),
            (_load_partition, (q_desc, k_desc, v_desc, qt_desc, kt_desc, q_smem, k_smem, v_smem, qt_smem, kt_smem,
                               q_bars, k_ready, v_ready, k_empty, v_empty, turns, off_b, off_h, off_hk, start_m,
                               n_tiles, BLOCK_M, BLOCK_N, NUM_STAGES, TAIL_DIM, q_empty, GROUP_SIZE, N_Q, N_K,
                               N_M_TILES, N_HEADS, TOTAL, IS_CAUSAL, PERSISTENT, SK_TILES, STREAM_K, j0, WIN_LEFT,
                               WIN_RIGHT, q_base, k_base, V, stride_vh, stride_vn, NUM_WG)),
        ], [4, 1], [240, 24])
    else:   # 4 warpgroups at launch (maxnreg 128): 3 x 160 + 24 registers a thread
        gl.warp_specialize([
            (_softmax_partition, (0, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready, k_empty,
                                  v_empty, turns, o_desc, LSE, SINKS, lse_row0, off_b, off_h, start_m, n_tiles, N_Q,
                                  N_K, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, TAIL_DIM, NUM_STAGES,
                                  IS_CAUSAL, OVERLAP, PINGPONG, ROW_TREE, HAS_SINKS, olo_desc, WRITE_REMAINDER, lo_smem,
                                  q_empty, stride_lb, stride_lh, N_M_TILES, N_HEADS, TOTAL, PERSISTENT, DEFER_O,
                                  SK_TILES, WS_O, WS_ML, STREAM_K, TRACE, j0, WIN_LEFT, WIN_RIGHT, q_base, O, stride_on,
                                  stride_oh, NUM_WG, EARLY_P, EVEN_K)),
            (_softmax_partition, (1, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready, k_empty,
                                  v_empty, turns, o_desc, LSE, SINKS, lse_row0, off_b, off_h, start_m, n_tiles, N_Q,
                                  N_K, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, TAIL_DIM, NUM_STAGES,
                                  IS_CAUSAL, OVERLAP, PINGPONG, ROW_TREE, HAS_SINKS, olo_desc, WRITE_REMAINDER, lo_smem,
                                  q_empty, stride_lb, stride_lh, N_M_TILES, N_HEADS, TOTAL, PERSISTENT, DEFER_O,
                                  SK_TILES, WS_O, WS_ML, STREAM_K, TRACE, j0, WIN_LEFT, WIN_RIGHT, q_base, O, stride_on,
                                  stride_oh, NUM_WG, EARLY_P, EVEN_K)),
            (_softmax_partition, (2, q_smem, k_smem, v_smem, qt_smem, kt_smem, q_bars, k_ready, v_ready, k_empty,
                                  v_empty, turns, o_desc, LSE, SINKS, lse_row0, off_b, off_h, start_m, n_tiles, N_Q,
                                  N_K, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, HEAD_DIM_V, TAIL_DIM, NUM_STAGES,
                                  IS_CAUSAL, OVERLAP, PINGPONG, ROW_TREE, HAS_SINKS, olo_desc, WRITE_REMAINDER, lo_smem,
                                  q_empty, stride_lb, stride_lh, N_M_TILES, N_HEADS, TOTAL, PERSISTENT, DEFER_O,
                                  SK_TILES, WS_O, WS_ML, STREAM_K, TRACE, j0, WIN_LEFT, WIN_RIGHT, q_base, O, stride_on,
                                  stride_oh, NUM_WG, EARLY_P, EVEN_K)),
            (_load_partition, (q_desc, k_desc, v_desc, qt_desc, kt_desc, q_smem, k_smem, v_smem, qt_smem, kt_smem,
                               q_bars, k_ready, v_ready, k_empty, v_empty, turns, off_b, off_h, off_hk, start_m,
                               n_tiles, BLOCK_M, BLOCK_N, NUM_STAGES, TAIL_DIM, q_empty, GROUP_SIZE, N_Q, N_K,
                               N_M_TILES, N_HEADS, TOTAL, IS_CAUSAL, PERSISTENT, SK_TILES, STREAM_K, j0, WIN_LEFT,
                               WIN_RIGHT, q_base, k_base, V, stride_vh, stride_vn, NUM_WG)),
        ], [4, 4, 1], [160, 160, 24])

    for i in gl.static_range(NUM_WG):
        mbarrier.invalidate(q_bars.index(i))
        mbarrier.invalidate(turns.index(i))
    if PERSISTENT:
        for i in gl.static_range(Q_BUFS):
            if i >= NUM_WG:
                mbarrier.invalidate(q_bars.index(i))
            mbarrier.invalidate(q_empty.index(i))
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(k_ready.index(i))
        mbarrier.invalidate(v_ready.index(i))
        mbarrier.invalidate(k_empty.index(i))
        mbarrier.invalidate(v_empty.index(i))
