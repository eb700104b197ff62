"""What the Hopper backward kernels (Gluon; ``bwd_hopper.py``,
``bwd_hopper_wide.py`` for a V head dim narrower than QK's and
``bwd_hopper_split.py`` for 256) share: the copy engine's bulk reduce, the
causal range of a key block's query tiles, a tile's coordinates in a compute
warpgroup's walk, the K/V tiles and the Q/dO ring in shared memory, the load
partition (the program's K and V tiles once, then the Q and dO tiles, and
with ``STATS_TMA`` lse₂ and Δ, of every query tile into a ring), the
mbarriers, Pᵀ from the saved log-sum-exp, and the d <= 128 kernel's
adds: a dQ tile's (by the copy engine), dS's row sums and the sinks' sums.

This module imports Gluon at load time: only the Hopper kernels import it.
"""
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from .fwd_hopper_load import _edge_descriptor, _load_rows


@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add the shared-memory tile ``src`` into global memory at ``coord``
    through the copy engine (cp.reduce.async.bulk.tensor; waited on like a
    TMA store, with ``tma.store_wait``)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _query_tiles(start_n, N_Q, N_K, BLOCK_M: gl.constexpr, IS_CAUSAL: gl.constexpr, WIN_LEFT=None,
                 WIN_RIGHT=None, KEYS: gl.constexpr = 0):
    """(m_lo, n_m): the program's query tiles start at row m_lo (a multiple
    of BLOCK_M) and there are n_m of them.  Bottom-right causal: row i sees
    key j iff j <= i + N_K - N_Q, so rows before start_n - (N_K - N_Q) see
    none of the program's keys.  A sliding window (``WIN_LEFT`` not None,
    the program's ``KEYS`` keys from start_n): row i sees keys [i + diag -
    WIN_LEFT, i + diag + WIN_RIGHT], so only rows [start_n - diag -
    WIN_RIGHT, last key - diag + WIN_LEFT] see any of them."""
    if WIN_LEFT is not None:
        diag = N_K - N_Q
        m_lo = (gl.minimum(gl.maximum(start_n - diag - WIN_RIGHT, 0), N_Q) // BLOCK_M) * BLOCK_M
        hi = gl.minimum(gl.maximum(gl.minimum(start_n + KEYS, N_K) - 1 - diag + WIN_LEFT + 1, 0), N_Q)
        return m_lo, gl.maximum(gl.cdiv(hi - m_lo, BLOCK_M), 0)
    if IS_CAUSAL:
        first = gl.maximum(start_n - (N_K - N_Q), 0)
        m_lo = (first // BLOCK_M) * BLOCK_M
    else:
        m_lo = start_n * 0
    n_m = gl.maximum(gl.cdiv(N_Q - m_lo, BLOCK_M), 0)
    return m_lo, n_m


@gluon.jit
def _tile_at(t, n_m, m_lo, hq0, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr):
    """Tile ``t`` of a compute warpgroup's walk (``n_m`` query tiles a head
    from row ``m_lo``, heads from ``hq0``): (query head, first row, ring
    slot, the phase that slot completes)."""
    g = t // n_m
    m = m_lo + (t - g * n_m) * BLOCK_M
    return hq0 + g, m, t % NUM_STAGES, (t // NUM_STAGES) & 1


@gluon.jit
def _ring_buffers(q_desc, k_desc, v_desc, do_desc, NUM_STAGES: gl.constexpr):
    """The program's K and V tiles and the Q and dO ring's slots in shared memory."""
    dtype: gl.constexpr = q_desc.dtype
    k_smem = gl.allocate_shared_memory(dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + do_desc.block_type.shape, do_desc.layout)
    return k_smem, v_smem, q_smem, do_smem


@gluon.jit
def _load_partition(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready, q_empty,
                    do_ready, do_empty, off_b, off_hk, hq0, start_n, m_lo, n_m, HEADS,
                    BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr, qt_desc, kt_desc, qt_smem, kt_smem,
                    TAIL_DIM: gl.constexpr, t0, kv_empty, WAIT_KV: gl.constexpr, lse_desc, delta_desc, lse_smem,
                    delta_smem, stat_ready, STATS_TMA: gl.constexpr, q_base=0, k_base=0, EDGES=None, N_Q=0, N_K=0):
    """The load warp: the program's K and V tiles once, then the Q and dO
    tiles of every query tile of ``HEADS`` query heads from ``hq0`` into the
    ring.  With a tail (``TAIL_DIM`` > 0, the wide kernel) Q and K come as two
    pieces each, through ``qt_desc`` / ``kt_desc`` into ``qt_smem`` /
    ``kt_smem`` (without one those are unused).
    ``t0``: the ring's tiles before this key block's (a program's second
    block of a pair); ``WAIT_KV``: its K and V tiles replace the first
    block's once both compute warpgroups arrived on ``kv_empty``.  With
    ``STATS_TMA`` each query tile's lse₂ and Δ come by the copy engine too,
    into ``lse_smem``/``delta_smem`` (completing ``stat_ready``); without it
    those arguments are unused.  A packed sequence's rows start at
    ``q_base`` / ``k_base`` (``fwd_hopper_load._sequence``); ``EDGES`` (its
    (K, Q, dO) pointers and their head and row strides): where a tile ends
    past it, K, or Q and dO of every tile, come through descriptors that
    end with it (``_edge_descriptor``: zeros there, where the next
    sequence's rows would meet zero weights), made once a program."""
    if WAIT_KV:
        mbarrier.wait(kv_empty, 0)
    if TAIL_DIM > 0:
        mbarrier.expect(kv_bar, k_desc.block_type.nbytes + kt_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [off_b, off_hk, k_base + start_n, 0], kv_bar, k_smem)
        tma.async_copy_global_to_shared(kt_desc, [off_b, off_hk, k_base + start_n, 0], kv_bar, kt_smem)
    else:
        mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        k_src = k_desc
        if EDGES is not None:
            if start_n + k_desc.block_type.shape[2] > N_K:
                k_src = _edge_descriptor(k_desc, EDGES[0], EDGES[3], EDGES[4], off_hk, k_base + N_K)
        tma.async_copy_global_to_shared(k_src, [off_b, off_hk, k_base + start_n, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [off_b, off_hk, k_base + start_n, 0], kv_bar, v_smem)
    q_src = q_desc
    do_src = do_desc
    if EDGES is not None:
        # one descriptor each for Q and dO over this program's heads, made once: a descriptor in
        # global scratch is not rewritten while a copy through it may still be in flight
        if m_lo + n_m * BLOCK_M > N_Q:
            q_src = _edge_descriptor(q_desc, EDGES[1], EDGES[5], EDGES[6], hq0 + HEADS - 1, q_base + N_Q)
            do_src = _edge_descriptor(do_desc, EDGES[2], EDGES[7], EDGES[8], hq0 + HEADS - 1, q_base + N_Q)
    for t in range(HEADS * n_m):
        g = t // n_m
        m = q_base + m_lo + (t - g * n_m) * BLOCK_M
        hq = hq0 + g
        s = (t0 + t) % NUM_STAGES
        # a slot starts empty: the first wait on each passes (phase 1)
        phase = (((t0 + t) // NUM_STAGES) & 1) ^ 1
        mbarrier.wait(q_empty.index(s), phase)
        _load_rows(q_src, qt_desc, [off_b, hq, m, 0], q_ready.index(s), q_smem.index(s), qt_smem.index(s), TAIL_DIM)
        mbarrier.wait(do_empty.index(s), phase)
        mbarrier.expect(do_ready.index(s), do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(do_src, [off_b, hq, m, 0], do_ready.index(s), do_smem.index(s))
        if STATS_TMA:   # the slot's lse₂ and Δ are dead once both warpgroups released its Q and dO
            mbarrier.expect(stat_ready.index(s), 2 * lse_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(lse_desc, [off_b, hq, m], stat_ready.index(s), lse_smem.index(s))
            tma.async_copy_global_to_shared(delta_desc, [off_b, hq, m], stat_ready.index(s), delta_smem.index(s))


@gluon.jit
def _barriers(NUM_STAGES: gl.constexpr):
    """The backward's mbarriers, initialised: ``kv_bar`` (the program's K and
    V tiles landed), ``ds_bars`` (two: both compute warpgroups stored their
    half of dSᵀ), and per Q/dO slot ``q_ready``/``do_ready`` (the copy engine
    completes them) and ``q_empty``/``do_empty`` (both compute warpgroups
    arrive once their products have read the slot)."""
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ds_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    do_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(2):
        # each compute warpgroup arrives once its half of dSᵀ is stored
        mbarrier.init(ds_bars.index(i), count=2)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)
        mbarrier.init(do_empty.index(i), count=2)
    return kv_bar, ds_bars, q_ready, do_ready, q_empty, do_empty


@gluon.jit
def _invalidate(kv_bar, ds_bars, q_ready, do_ready, q_empty, do_empty, NUM_STAGES: gl.constexpr, stat_ready=None,
                STATS_TMA: gl.constexpr = False):
    mbarrier.invalidate(kv_bar)
    for i in gl.static_range(2):
        mbarrier.invalidate(ds_bars.index(i))
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(q_ready.index(i))
        mbarrier.invalidate(do_ready.index(i))
        mbarrier.invalidate(q_empty.index(i))
        mbarrier.invalidate(do_empty.index(i))
    if STATS_TMA:
        for i in gl.static_range(NUM_STAGES):
            mbarrier.invalidate(stat_ready.index(i))


@gluon.jit
def _ds_dq_buffers(dtype: gl.constexpr, dq_desc, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """The d <= 128 kernel's two dSᵀ buffers (both warpgroups' keys) and a
    float32 dQ staging tile a compute warpgroup, as wide as the dQ sum's box
    (D/2, or D with dq_turns)."""
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * BLOCK_N, BLOCK_M], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [2, 2 * BLOCK_N, BLOCK_M], ds_layout)
    DQ_W: gl.constexpr = dq_desc.block_type.shape[3]
    dq_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, DQ_W], gl.float32)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, DQ_W], dq_layout)
    return ds_smem, dq_smem


@gluon.jit
def _stat_buffers(LSE2, DELTA, NUM_STAGES: gl.constexpr, STATS_TMA: gl.constexpr, unused_smem, unused_bar):
    """With ``STATS_TMA`` each ring slot's lse₂ and Δ rows in shared memory
    and the barriers the copy engine completes with them; without it the
    placeholders given (the kernels read them from global memory)."""
    if STATS_TMA:
        lse_smem = gl.allocate_shared_memory(gl.float32, [NUM_STAGES] + LSE2.block_type.shape, LSE2.layout)
        delta_smem = gl.allocate_shared_memory(gl.float32, [NUM_STAGES] + DELTA.block_type.shape, DELTA.layout)
        stat_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(stat_ready.index(i), count=1)
    else:
        lse_smem = unused_smem
        delta_smem = unused_smem
        stat_ready = unused_bar
    return lse_smem, delta_smem, stat_ready


@gluon.jit
def _probs(st, lse2, offs_n, offs_m, diag, qk_scale, MASKED: gl.constexpr, WIN_LEFT=None, WIN_RIGHT=None):
    """Pᵀ from the raw scores Sᵀ (keys x queries): exp2(s c - lse₂), 0 where
    the causal mask hides the key (row i sees key j iff j <= i + diag), or
    with a sliding window (``WIN_LEFT`` not None) where j - i - diag is
    outside [-WIN_LEFT, WIN_RIGHT]."""
    pt = gl.exp2(st * qk_scale - lse2[None, :])
    if MASKED:
        if WIN_LEFT is None:
            pt = gl.where(offs_n[:, None] <= offs_m[None, :] + diag, pt, 0.0)
        else:
            rel = offs_n[:, None] - (offs_m[None, :] + diag)
            pt = gl.where((rel >= -WIN_LEFT) & (rel <= WIN_RIGHT), pt, 0.0)
    return pt


@gluon.jit
def _sequence_edge(x, offs_n, N_K):
    """Pᵀ or dSᵀ (keys x queries) with 0 for keys past a packed sequence's
    N_K: their K rows read as zeros (an edge descriptor), so their scores
    are 0, not -inf, and their dP may hold the next sequence's values."""
    return gl.where((offs_n < N_K)[:, None], x, 0.0)


@gluon.jit
def _add_row_sums(DS_SUM, sums, off_b, hq, m, N_HEADS, N_Q, BLOCK_M: gl.constexpr, rs_layout: gl.constexpr):
    """Add one query tile's row sums of dS into DS_SUM (rows past N_Q dropped;
    each query row gets one add per warpgroup of keys)."""
    offs_rs = m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, rs_layout))
    rs_row = (off_b * N_HEADS + hq).to(gl.int64) * N_Q + offs_rs
    gl.atomic_add(DS_SUM + rs_row, sums, mask=offs_rs < N_Q, sem="relaxed")


@gluon.jit
def _rows_inside(dq, m, N_Q, BLOCK_M: gl.constexpr, dq_layout: gl.constexpr):
    """A packed sequence's dQ tile with the rows past the sequence set to 0:
    the copy engine's add reaches the next sequence's rows, where a NaN of
    this sequence's K (times the zero dS there) would otherwise land."""
    rows = m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    return gl.where((rows < N_Q)[:, None], dq, 0.0)


@gluon.jit
def _dq_reduce(dq, dq_smem, dq_desc, off_b, hq, m, col0, WG: gl.constexpr, BLOCK_M: gl.constexpr,
               WIDTH: gl.constexpr):
    """Stage this warpgroup's dQ columns [col0, col0 + WIDTH) and let the copy
    engine add them into the float32 sum at rows [m, m + BLOCK_M) of head ``hq``."""
    # the warpgroup's previous reduce has read its staging buffer by now
    tma.store_wait(0)
    stage = dq_smem.index(WG)
    stage.store(dq)
    fence_async_shared()
    gl.thread_barrier()
    _tma_reduce_add(dq_desc, [off_b, hq, m, col0], stage.reshape([1, 1, BLOCK_M, WIDTH]))
