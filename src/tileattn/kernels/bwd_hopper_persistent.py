"""Hopper backward, persistent (Gluon; ``HopperBwdConfig.persistent``): the
d <= 128 dK/dV kernel's work (``bwd_hopper.py``) walked by one program an
SM, with the program's K and V in two buffers.

A one-program-a-block grid pays, at every key block, for what no other work
hides: the program's start, the copy of its K and V (and of its first Q and
dO tiles) before the first product, and the drain of the Q/dO ring before
its dK/dV stores.  In the FA2 protocol (B·N fixed) that is the same ~4,000
blocks at every N, a fixed cost a call that the backward's time against N
showed (perf-notes v54, v55).  Here each program takes work items ``pid``,
``pid + programs``, ... of ``TOTAL``:

* an item is one key block (``2 * BLOCK_N`` keys of one kv head and batch
  element), items of a head after one another (the programs running at once
  read the Q and dO of few heads); causal, it is a mirror-image pair of key
  blocks (j and n-1-j, ``bwd_hopper._compute_paired``'s), so items cost alike;
* the load warp copies a block's K and V into buffer ``kc % 2`` (``kc``: the
  program's blocks so far) once both compute warpgroups released that buffer
  (``kv_empty``, after their last product of the block before last), then
  the block's Q and dO tiles into the ring, whose count runs on across the
  blocks: the next block's K, V and first tiles land while this one's last
  tiles run;
* a compute warpgroup runs each block as ``bwd_hopper._compute_partition``
  does (``RELEASE_KV``: it releases the buffer before its dK/dV stores, and
  waits for its dQ reduces only at the end).

With ``SPLIT_TAIL`` (``HopperBwdConfig.split_tail``, non-causal) the walk's
last round, where fewer items than programs are left (the FA2 protocol's
4,096 blocks at d = 64 are 31 rounds of 132 and 4 items), cuts each of those
items along its query tiles into ``SPLIT`` pieces, one a program: a piece
adds its partial dK (scaled) and dV into the item's float32 workspace slot
(``_compute_partition``'s ``ADD_DKDV`` into ``WS``) and ``kernels/bwd_tail.py``
rounds the slots into dK and dV after the kernel; dQ is added as always.

Plain calls only (no sinks' sums, head slices, windows or packed
sequences); the second K/V buffer fits at d = 64 (165 KB of shared memory;
d = 128 would need 256 KB).

This module imports Gluon at load time: only the Hopper launcher imports it,
lazily, so a CPU install never does.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .bwd_hopper import _compute_partition
from .bwd_hopper_common import _barriers, _ds_dq_buffers, _invalidate, _load_partition, _query_tiles, _stat_buffers


@gluon.jit
def _item(i, N_BLOCKS, N_ROWS, N_Q, N_K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """Work item ``i``: (batch element, kv head, the first block's first key,
    first query row and query tiles, the second block's (causal: the mirror
    image; ``n_m_b`` -1 where there is none))."""
    KEYS: gl.constexpr = 2 * BLOCK_N
    units = gl.cdiv(N_BLOCKS, 2) if IS_CAUSAL else N_BLOCKS
    j = i % units
    rest = i // units
    off_hk = rest % N_ROWS
    off_b = rest // N_ROWS
    start_n = j * KEYS
    m_lo, n_m = _query_tiles(start_n, N_Q, N_K, BLOCK_M, IS_CAUSAL)
    if IS_CAUSAL:
        start_b = (N_BLOCKS - 1 - j) * KEYS
        m_lo_b, n_m_b = _query_tiles(start_b, N_Q, N_K, BLOCK_M, IS_CAUSAL)
        n_m_b = gl.where(start_b > start_n, n_m_b, -1)   # the middle block of an odd count: alone
    else:
        start_b = start_n
        m_lo_b = m_lo
        n_m_b = n_m * 0 - 1
    return off_b, off_hk, start_n, m_lo, n_m, start_b, m_lo_b, n_m_b


@gluon.jit
def _blocks(i, N_BLOCKS, N_ROWS, N_Q, N_K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """How many key blocks work item ``i`` has (1, or 2 for a causal pair)."""
    n_m_b = _item(i, N_BLOCKS, N_ROWS, N_Q, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)[7]
    return gl.where(n_m_b >= 0, 2, 1)


@gluon.jit
def _block(i, blk, N_BLOCKS, N_ROWS, N_Q, N_K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
           IS_CAUSAL: gl.constexpr):
    """Block ``blk`` of work item ``i``: (batch element, kv head, first key,
    first query row, query tiles)."""
    off_b, off_hk, start_n, m_lo, n_m, start_b, m_lo_b, n_m_b = _item(i, N_BLOCKS, N_ROWS, N_Q, N_K, BLOCK_M,
                                                                      BLOCK_N, IS_CAUSAL)
    first = blk == 0
    return off_b, off_hk, gl.where(first, start_n, start_b), gl.where(first, m_lo, m_lo_b), gl.where(first, n_m, n_m_b)


@gluon.jit
def _piece(N_BLOCKS, N_ROWS, N_Q, N_K, TOTAL, MAIN, SPLIT, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """This program's piece of the split tail (non-causal; ``SPLIT`` pieces
    an item from ``MAIN`` on, program p piece p % SPLIT of item MAIN + p //
    SPLIT): (workspace slot, batch element, kv head, first key, the piece's
    first query row and its query tiles: a SPLIT-th of the block's, -1
    where the program has no piece)."""
    t = gl.program_id(0) // SPLIT
    p = gl.program_id(0) - t * SPLIT
    off_b, off_hk, start, m_lo, tiles = _block(MAIN + t, 0, N_BLOCKS, N_ROWS, N_Q, N_K, BLOCK_M, BLOCK_N, False)
    first = p * tiles // SPLIT
    mine = (p + 1) * tiles // SPLIT - first
    return t, off_b, off_hk, start, m_lo + first * BLOCK_M, gl.where(MAIN + t < TOTAL, mine, -1)


@gluon.jit
def _compute_block(WG: gl.constexpr, k_bufs, v_bufs, q_smem, do_smem, ds_smem, dq_smem, kv_ready, kv_empty, q_ready,
                   q_empty, do_ready, do_empty, ds_bars, dq_desc, DK, DV, LSE2, DELTA, stride_dkb, stride_dkh,
                   stride_dkn, stride_dvb, stride_dvh, stride_dvn, kc, t0, off_b, off_hk, start, m_lo, tiles,
                   GROUP_SIZE, N_HEADS, N_Q, N_K, qk_scale, sm_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                   DK_FROM_SMEM: gl.constexpr, lse_smem, delta_smem, stat_ready, STATS_TMA: gl.constexpr,
                   ADD_DKDV: gl.constexpr, k_base):
    """The program's ``kc``-th block (``t0`` ring tiles before it) on K/V
    buffer ``kc % 2``, released after its last product: dK and dV stored
    at ``DK``/``DV``, or with ``ADD_DKDV`` added there (float32, rows from
    ``k_base`` + key)."""
    buf = kc % 2
    _compute_partition(WG, k_bufs.index(buf), v_bufs.index(buf), q_smem, do_smem, ds_smem, dq_smem, dq_smem,
                       kv_ready.index(buf), q_ready, q_empty, do_ready, do_empty, ds_bars, dq_desc, DK, DV, LSE2,
                       DELTA, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn, off_b, off_hk,
                       off_hk * GROUP_SIZE, start, m_lo, tiles, GROUP_SIZE, N_HEADS, N_Q, N_K, qk_scale, sm_scale,
                       DELTA, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES, IS_CAUSAL, DK_FROM_SMEM, False, False, t0,
                       (kc // 2) & 1, kv_empty.index(buf), False, lse_smem, delta_smem, stat_ready, STATS_TMA,
                       ADD_DKDV, k_base=k_base, RELEASE_KV=True)


@gluon.jit
def _compute_walk(WG: gl.constexpr, k_bufs, v_bufs, q_smem, do_smem, ds_smem, dq_smem, kv_ready, kv_empty, q_ready,
                  q_empty, do_ready, do_empty, ds_bars, dq_desc, DK, DV, LSE2, DELTA,
                  stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                  GROUP_SIZE, N_HEADS, N_Q, N_K, qk_scale, sm_scale, N_BLOCKS, N_ROWS, TOTAL, MAIN, SPLIT, WS,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
                  IS_CAUSAL: gl.constexpr, DK_FROM_SMEM: gl.constexpr, lse_smem, delta_smem, stat_ready,
                  STATS_TMA: gl.constexpr, SPLIT_TAIL: gl.constexpr):
    """A compute warpgroup over the program's items (module docstring),
    then with ``SPLIT_TAIL`` its piece of the tail: the block's dK and dV
    over the piece's query tiles added into workspace slot t (float32)."""
    t0 = gl.program_id(0) * 0   # the ring's tiles before this block
    kc = t0                     # the program's blocks before this one
    for i in range(gl.program_id(0), MAIN, gl.num_programs(0)):
        for blk in range(_blocks(i, N_BLOCKS, N_ROWS, N_Q, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)):
            off_b, off_hk, start, m_lo, tiles = _block(i, blk, N_BLOCKS, N_ROWS, N_Q, N_K, BLOCK_M, BLOCK_N,
                                                       IS_CAUSAL)
            _compute_block(WG, k_bufs, v_bufs, q_smem, do_smem, ds_smem, dq_smem, kv_ready, kv_empty, q_ready,
                           q_empty, do_ready, do_empty, ds_bars, dq_desc, DK, DV, LSE2, DELTA, stride_dkb, stride_dkh,
                           stride_dkn, stride_dvb, stride_dvh, stride_dvn, kc, t0, off_b, off_hk, start, m_lo, tiles,
                           GROUP_SIZE, N_HEADS, N_Q, N_K, qk_scale, sm_scale, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES,
                           IS_CAUSAL, DK_FROM_SMEM, lse_smem, delta_smem, stat_ready, STATS_TMA, False, 0)
            t0 = t0 + GROUP_SIZE * tiles
            kc = kc + 1
    if SPLIT_TAIL:
        t, off_b, off_hk, start, m_lo, tiles = _piece(N_BLOCKS, N_ROWS, N_Q, N_K, TOTAL, MAIN, SPLIT, BLOCK_M,
                                                      BLOCK_N)
        if tiles >= 0:
            SLOT: gl.constexpr = 2 * BLOCK_N * HEAD_DIM
            ws_k = WS + t.to(gl.int64) * SLOT
            ws_v = WS + (TOTAL - MAIN + t).to(gl.int64) * SLOT
            # added into the slots (rows from the block's first key: k_base = -start puts key start + r at row r)
            _compute_block(WG, k_bufs, v_bufs, q_smem, do_smem, ds_smem, dq_smem, kv_ready, kv_empty, q_ready,
                           q_empty, do_ready, do_empty, ds_bars, dq_desc, ws_k, ws_v, LSE2, DELTA, 0, 0, HEAD_DIM, 0,
                           0, HEAD_DIM, kc, t0, off_b, off_hk, start, m_lo, tiles, GROUP_SIZE, N_HEADS, N_Q, N_K,
                           qk_scale, sm_scale, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES, IS_CAUSAL, DK_FROM_SMEM,
                           lse_smem, delta_smem, stat_ready, STATS_TMA, True, 0 - start)
    tma.store_wait(0)   # the last dQ reduces have read their staging tile


@gluon.jit
def _load_block(q_desc, k_desc, v_desc, do_desc, k_bufs, v_bufs, q_smem, do_smem, kv_ready, kv_empty, q_ready,
                q_empty, do_ready, do_empty, kc, t0, off_b, off_hk, start, m_lo, tiles, GROUP_SIZE,
                BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr, lse_desc, delta_desc, lse_smem, delta_smem,
                stat_ready, STATS_TMA: gl.constexpr):
    """The program's ``kc``-th block (``t0`` ring tiles before it): its K
    and V into buffer ``kc % 2`` once both compute warpgroups released it,
    then its Q and dO tiles."""
    buf = kc % 2
    # a buffer starts empty: the first wait on each passes (phase 1)
    mbarrier.wait(kv_empty.index(buf), ((kc // 2) & 1) ^ 1)
    _load_partition(q_desc, k_desc, v_desc, do_desc, k_bufs.index(buf), v_bufs.index(buf), q_smem, do_smem,
                    kv_ready.index(buf), q_ready, q_empty, do_ready, do_empty, off_b, off_hk, off_hk * GROUP_SIZE,
                    start, m_lo, tiles, GROUP_SIZE, BLOCK_M, NUM_STAGES, q_desc, k_desc, q_smem, k_bufs, 0, t0,
                    kv_empty, False, lse_desc, delta_desc, lse_smem, delta_smem, stat_ready, STATS_TMA)


@gluon.jit
def _load_walk(q_desc, k_desc, v_desc, do_desc, k_bufs, v_bufs, q_smem, do_smem, kv_ready, kv_empty, q_ready,
               q_empty, do_ready, do_empty, GROUP_SIZE, N_Q, N_K, N_BLOCKS, N_ROWS, TOTAL, MAIN, SPLIT,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
               lse_desc, delta_desc, lse_smem, delta_smem, stat_ready, STATS_TMA: gl.constexpr,
               SPLIT_TAIL: gl.constexpr):
    """The load warp over the program's items: each block's K and V into
    buffer ``kc % 2`` once both compute warpgroups released it, then its Q
    and dO tiles (``bwd_hopper_common._load_partition``); then with
    ``SPLIT_TAIL`` its tail piece's block and query tiles."""
    t0 = gl.program_id(0) * 0
    kc = t0
    for i in range(gl.program_id(0), MAIN, gl.num_programs(0)):
        for blk in range(_blocks(i, N_BLOCKS, N_ROWS, N_Q, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)):
            off_b, off_hk, start, m_lo, tiles = _block(i, blk, N_BLOCKS, N_ROWS, N_Q, N_K, BLOCK_M, BLOCK_N,
                                                       IS_CAUSAL)
            _load_block(q_desc, k_desc, v_desc, do_desc, k_bufs, v_bufs, q_smem, do_smem, kv_ready, kv_empty, q_ready,
                        q_empty, do_ready, do_empty, kc, t0, off_b, off_hk, start, m_lo, tiles, GROUP_SIZE, BLOCK_M,
                        NUM_STAGES, lse_desc, delta_desc, lse_smem, delta_smem, stat_ready, STATS_TMA)
            t0 = t0 + GROUP_SIZE * tiles
            kc = kc + 1
    if SPLIT_TAIL:
        _, off_b, off_hk, start, m_lo, tiles = _piece(N_BLOCKS, N_ROWS, N_Q, N_K, TOTAL, MAIN, SPLIT, BLOCK_M,
                                                      BLOCK_N)
        if tiles >= 0:
            _load_block(q_desc, k_desc, v_desc, do_desc, k_bufs, v_bufs, q_smem, do_smem, kv_ready, kv_empty, q_ready,
                        q_empty, do_ready, do_empty, kc, t0, off_b, off_hk, start, m_lo, tiles, GROUP_SIZE, BLOCK_M,
                        NUM_STAGES, lse_desc, delta_desc, lse_smem, delta_smem, stat_ready, STATS_TMA)


@gluon.jit
def _attn_bwd_hopper_persistent_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, DK, DV, LSE2, DELTA,
                                       stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                                       GROUP_SIZE, N_HEADS, N_Q, N_K, qk_scale, sm_scale, N_BLOCKS, N_ROWS, TOTAL,
                                       MAIN, SPLIT, WS, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                                       BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr,
                                       DK_FROM_SMEM: gl.constexpr, STATS_TMA: gl.constexpr,
                                       SPLIT_TAIL: gl.constexpr):
    """One program an SM (at most), walking ``TOTAL`` items of ``N_BLOCKS``
    key blocks (causal: mirror-image pairs of them) of ``N_ROWS`` kv heads
    of every batch element (module docstring); the arguments are
    ``bwd_hopper._attn_bwd_hopper_kernel``'s.  With ``SPLIT_TAIL``
    (non-causal) the items from ``MAIN`` on are cut along their query tiles
    into ``SPLIT`` pieces, one a program (``_piece``), whose dK and dV go
    into ``WS``'s float32 slots for ``kernels/bwd_tail.py`` (else ``MAIN`` is
    ``TOTAL``)."""
    gl.static_assert(not (SPLIT_TAIL and IS_CAUSAL), "a split tail: non-causal items (one block each)")
    dtype: gl.constexpr = q_desc.dtype
    k_bufs = gl.allocate_shared_memory(dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [2] + v_desc.block_type.shape, v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + do_desc.block_type.shape, do_desc.layout)
    ds_smem, dq_smem = _ds_dq_buffers(dtype, dq_desc, BLOCK_M, BLOCK_N)
    kv_bar, ds_bars, q_ready, do_ready, q_empty, do_empty = _barriers(NUM_STAGES)   # kv_bar unused: kv_ready
    lse_smem, delta_smem, stat_ready = _stat_buffers(LSE2, DELTA, NUM_STAGES, STATS_TMA, dq_smem, q_ready)
    # per K/V buffer: its tiles landed (the copy engine), both compute warpgroups are done with them
    kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)

    # the argument tuples are written out: a tuple built by concatenation loses its constexpr entries (triton 3.6)
    gl.warp_specialize([
        (_compute_walk, (0, k_bufs, v_bufs, q_smem, do_smem, ds_smem, dq_smem, kv_ready, kv_empty, q_ready, q_empty,
                         do_ready, do_empty, ds_bars, dq_desc, DK, DV, LSE2, DELTA, stride_dkb, stride_dkh,
                         stride_dkn, stride_dvb, stride_dvh, stride_dvn, GROUP_SIZE, N_HEADS, N_Q, N_K, qk_scale,
                         sm_scale, N_BLOCKS, N_ROWS, TOTAL, MAIN, SPLIT, WS, BLOCK_M, BLOCK_N, HEAD_DIM,
                         NUM_STAGES, IS_CAUSAL, DK_FROM_SMEM, lse_smem, delta_smem, stat_ready, STATS_TMA,
                         SPLIT_TAIL)),
        (_compute_walk, (1, k_bufs, v_bufs, q_smem, do_smem, ds_smem, dq_smem, kv_ready, kv_empty, q_ready, q_empty,
                         do_ready, do_empty, ds_bars, dq_desc, DK, DV, LSE2, DELTA, stride_dkb, stride_dkh,
                         stride_dkn, stride_dvb, stride_dvh, stride_dvn, GROUP_SIZE, N_HEADS, N_Q, N_K, qk_scale,
                         sm_scale, N_BLOCKS, N_ROWS, TOTAL, MAIN, SPLIT, WS, BLOCK_M, BLOCK_N, HEAD_DIM,
                         NUM_STAGES, IS_CAUSAL, DK_FROM_SMEM, lse_smem, delta_smem, stat_ready, STATS_TMA,
                         SPLIT_TAIL)),
        (_load_walk, (q_desc, k_desc, v_desc, do_desc, k_bufs, v_bufs, q_smem, do_smem, kv_ready, kv_empty, q_ready,
                      q_empty, do_ready, do_empty, GROUP_SIZE, N_Q, N_K, N_BLOCKS, N_ROWS, TOTAL, MAIN, SPLIT,
                      BLOCK_M, BLOCK_N, NUM_STAGES, IS_CAUSAL, LSE2, DELTA, lse_smem, delta_smem, stat_ready,
                      STATS_TMA, SPLIT_TAIL)),
    ], [4, 1], [240, 24])

    _invalidate(kv_bar, ds_bars, q_ready, do_ready, q_empty, do_empty, NUM_STAGES, stat_ready, STATS_TMA)
    for i in gl.static_range(2):
        mbarrier.invalidate(kv_ready.index(i))
        mbarrier.invalidate(kv_empty.index(i))
