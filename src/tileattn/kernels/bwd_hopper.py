"""Hopper backward kernel (Gluon): warp-specialized, five tile matmuls, dQ
added into a float32 sum by the copy engine.

A program owns ``2 * BLOCK_N`` keys of one KV head and walks every query
tile (``BLOCK_M`` rows) of every query head of its group that can see them.
Three partitions share the CTA (the load partition, the mbarriers and Pᵀ's
helper are in ``bwd_hopper_common.py``, shared with the wide kernel):

* the **load partition** (one warp, 24 registers) copies the program's K and
  V tiles once, then Q and dO tiles into a ring of ``NUM_STAGES`` slots
  (``q_ready``/``do_ready`` completed by the copy engine, ``q_empty``/
  ``do_empty`` by both compute warpgroups once their products have read the
  slot); with ``STATS_TMA`` also each tile's lse₂ and Δ (BLOCK_M floats each),
  so the compute warpgroups read them from shared memory, not with global
  loads in the tile's critical path;
* two **compute partitions** (4 warps, 240 registers each; warpgroup ``WG``
  owns keys [start_n + BLOCK_N WG, +BLOCK_N)) keep dK and dV of their keys in
  registers and run, per query tile, as warpgroup MMAs:

  - Sᵀ = K Qᵀ and dPᵀ = V dOᵀ from shared memory (keys are the rows, so the
    softmax statistics of the queries broadcast along columns and Pᵀ, dSᵀ
    feed the next products straight from registers);
  - Pᵀ = exp2(Sᵀ · scale · log2 e − lse₂) with the saved log-sum-exp;
  - dV += Pᵀ dO, dSᵀ = Pᵀ ∘ (dPᵀ − Δ), dK += dSᵀ Q;
  - dSᵀ goes to shared memory, the two warpgroups meet at one mbarrier, and
    warpgroup ``WG`` forms columns [WG D/2, +D/2) of dQ = dS K from both
    halves, then the copy engine adds them into the float32 sum (a bulk
    tensor reduce; rows past N are clipped).  With ``dq_turns`` (the dQ
    sum's box D wide, not D/2) the warpgroups take turns instead: the one
    whose turn it is (tile count mod 2) waits for the other's half of dSᵀ
    and forms all D columns, the other goes on to its next tile.  The
    products are the same; the N = D/2 MMAs, which read shared memory at 1.5
    times the rate it delivers at d = 64, become N = D ones.

With ``SUM_DS`` each warpgroup also sums dS over its keys for every query
row and adds the sums into ``DS_SUM`` (float32, (B, Hq, N_Q)): the sinks'
gradient needs them.  The sum over keys runs across the warps, so it is an
MMA of dSᵀ (already in shared memory for dQ) against a ones column, not a
reduction in registers.  With ``SINK_SUMS`` instead (the sinks' gradient
without the forward's output remainder) each warpgroup sums Pᵀ ∘ dPᵀ
weighted by each query's sink probability p_sink = 2^(sink₂ − lse₂) over
the tile's queries (a thread's own columns and its lane quad: no shared
memory), a vector over its keys kept across the tiles; once a query head's
tiles are done it adds the vector's sum into ``DS_SUM[hq]`` (float32,
(Hq,)): Σ_i p_sink,i Σ_j P_ij dP_ij over the program's keys, what d sink
needs without rowsum(dO∘O) of a rounded O.

Rows past N_Q read as zeros with lse₂ = +inf, so their P is 0 (by TMA, lse₂
reads 0 there and P is 1, but their dO rows are zeros, so their dP, dS and
every product they feed are 0); keys past N_K
read as zeros, so their dS meets a zero K row in dQ, and their dK/dV rows are
not stored.  Only the causal diagonal needs a mask.  The preprocess and the
dQ convert kernels are the portable ones (``kernels/bwd.py``): Δ = rowsum(dO∘O)
(minus dlse), lse₂ = lse · log2 e (+inf for rows that saw no key), and
dq = scale · sum.

This module imports Gluon at load time: only the Hopper launcher imports it,
lazily, so a CPU install never does.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .bwd_hopper_common import (_add_row_sums, _barriers, _dq_reduce, _ds_dq_buffers, _invalidate, _load_partition,
                                 _probs, _query_tiles, _ring_buffers, _rows_inside, _sequence_edge, _stat_buffers)
from .fwd_hopper_load import _grid_coords, _sequence
from .fwd_hopper_softmax import LOG2E


@gluon.jit
def _compute_partition(WG: gl.constexpr, k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, ones_smem, kv_bar,
                       q_ready,
                       q_empty, do_ready, do_empty, ds_bars, dq_desc, DK, DV, LSE2, DELTA,
                       stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                       off_b, off_hk, hq0, start_n, m_lo, n_m, HEADS, N_HEADS, N_Q, N_K, qk_scale, sm_scale,
                       DS_SUM, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                       NUM_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, DK_FROM_SMEM: gl.constexpr,
                       SUM_DS: gl.constexpr, DEFER_SUMS: gl.constexpr, t0, kv_phase, kv_empty,
                       ARRIVE_KV: gl.constexpr, lse_smem, delta_smem, stat_ready, STATS_TMA: gl.constexpr,
                       ADD_DKDV: gl.constexpr, WIN_LEFT=None, WIN_RIGHT=None, IS_VARLEN: gl.constexpr = False,
                       q_base=0, k_base=0, ROWS_Q=None, SINK_SUMS: gl.constexpr = False, SINKS=None,
                       RELEASE_KV: gl.constexpr = False):
    """One key block of the program: ``t0`` ring tiles came before it and its
    K and V tiles complete ``kv_bar`` in phase ``kv_phase`` (a pair's second
    block: 1); with ``ARRIVE_KV`` the warpgroup arrives on ``kv_empty`` after
    a pair's first block, once its products are done with its K and V; with
    ``RELEASE_KV`` (the persistent walk) after every block, before its dK/dV
    stores, and the dQ reduces are waited on only where the caller ends.  With
    ``STATS_TMA`` lse₂ and Δ are read from the slot's shared-memory copies
    (rows past N_Q read as 0 there: harmless, their dO rows are 0, so are
    their dP and dS), else from global memory.  The block walks ``HEADS``
    query heads from ``hq0``; with ``ADD_DKDV`` (head slices) dK and dV are
    added into float32 sums, else stored.  A sliding window (``WIN_LEFT``
    not None, not causal): tiles whose every (query, key) pair lies inside
    it need no mask.  A packed sequence (``IS_VARLEN``; ``N_Q``/``N_K`` its
    lengths, its rows from ``q_base``/``k_base``, ``ROWS_Q`` the stats' rows
    a head): queries past it get lse₂ = +inf and Δ = 0 (their Q and dO rows
    read as zeros) and add zeros to dQ (:func:`_rows_inside`), keys past it
    Pᵀ = dSᵀ = 0 (:func:`_sequence_edge`).  ``SINK_SUMS``: the sinks' sums
    into ``DS_SUM`` (module docstring; ``SINKS`` the heads' sink logits)."""
    dtype: gl.constexpr = q_smem.dtype
    HALF_D: gl.constexpr = HEAD_DIM // 2
    # the dQ sum's box says who forms dQ: D/2 wide, each warpgroup half the
    # columns of every tile (meeting the other at ds_bars); D wide
    # (``dq_turns``), the warpgroups take turns, each all the columns of
    # every other tile, and only the one whose turn it is waits for the other
    DQ_W: gl.constexpr = dq_desc.block_type.shape[3]
    DQ_TURNS: gl.constexpr = DQ_W == HEAD_DIM
    # Sᵀ/dPᵀ: BLOCK_N keys x BLOCK_M queries; dK/dV: BLOCK_N keys x D; dQ: BLOCK_M x DQ_W
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DQ_W, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    # SUM_DS: queries x 8 (column 0 is the sum, the others multiply zeros)
    rs_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, 8, 16])
    key0 = start_n + WG * BLOCK_N
    offs_n = key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    diag = N_K - N_Q

    mbarrier.wait(kv_bar, kv_phase)
    k_all = k_smem.reshape([2 * BLOCK_N, HEAD_DIM])
    k_mine = k_all.slice(WG * BLOCK_N, BLOCK_N, dim=0)
    v_mine = v_smem.reshape([2 * BLOCK_N, HEAD_DIM]).slice(WG * BLOCK_N, BLOCK_N, dim=0)
    k_cols = k_all if DQ_TURNS else k_all.slice(WG * HALF_D, HALF_D, dim=1)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    if not ADD_DKDV:   # the whole group (HEADS of them): one value fewer live across the loop
        hq0 = off_hk * HEADS
    if SUM_DS and DEFER_SUMS:   # the row sums waiting to be added, and their tile
        rs_sum = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, rs_layout))
        m_sum = m_lo
        hq_sum = hq0
    if SINK_SUMS:   # this query head's sum so far, a partial sum a key
        sink_keys = gl.zeros([BLOCK_N], gl.float32, gl.SliceLayout(1, s_layout))
    for t in range(HEADS * n_m):
        g = t // n_m
        m = m_lo + (t - g * n_m) * BLOCK_M
        hq = hq0 + g
        tg = t0 + t   # the ring's and the dSᵀ buffers' count
        s = tg % NUM_STAGES
        phase = (tg // NUM_STAGES) & 1
        offs_m = m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
        if IS_VARLEN:
            row = hq.to(gl.int64) * ROWS_Q + q_base + offs_m
        else:
            row = (off_b * N_HEADS + hq).to(gl.int64) * N_Q + offs_m
        if not STATS_TMA:
            lse2 = gl.load(LSE2 + row, mask=offs_m < N_Q, other=float("inf"))

        mbarrier.wait(q_ready.index(s), phase)
        q2 = q_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
        zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
        st = warpgroup_mma(k_mine, q2.permute([1, 0]), zero_s, use_acc=False, is_async=True)
        mbarrier.wait(do_ready.index(s), phase)
        do2 = do_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
        dpt = warpgroup_mma(v_mine, do2.permute([1, 0]), zero_s, use_acc=False, is_async=True)
        if SUM_DS and DEFER_SUMS:
            if t > 0:   # the previous tile's row sums, while Sᵀ and dPᵀ run
                _add_row_sums(DS_SUM, rs_sum, off_b, hq_sum, m_sum, N_HEADS, N_Q, BLOCK_M, rs_layout)
        if STATS_TMA:
            mbarrier.wait(stat_ready.index(s), phase)
            lse2 = lse_smem.index(s).reshape([BLOCK_M]).load(gl.SliceLayout(0, s_layout))
        st = warpgroup_mma_wait(1, deps=[st])
        if IS_VARLEN:   # queries past the sequence (zero rows of Q and dO there) get P = 0
            lse2 = gl.where(offs_m < N_Q, lse2, float("inf"))
        if IS_CAUSAL:
            # only tiles whose first row misses this warpgroup's last key need the mask
            if m + diag < key0 + BLOCK_N - 1:
                pt = _probs(st, lse2, offs_n, offs_m, diag, qk_scale, True)
            else:
                pt = _probs(st, lse2, offs_n, offs_m, diag, qk_scale, False)
        elif WIN_LEFT is not None:
            # only tiles with a pair outside the window need its mask
            if ((key0 + BLOCK_N - 1 - (m + diag) <= WIN_RIGHT)
                    & (key0 - (m + BLOCK_M - 1 + diag) >= -WIN_LEFT)):
                pt = _probs(st, lse2, offs_n, offs_m, diag, qk_scale, False)
            else:
                pt = _probs(st, lse2, offs_n, offs_m, diag, qk_scale, True, WIN_LEFT, WIN_RIGHT)
        else:
            pt = _probs(st, lse2, offs_n, offs_m, diag, qk_scale, False)
        if IS_VARLEN:   # keys past the sequence (zero rows of K there): P and dS are 0
            if key0 + BLOCK_N > N_K:
                pt = _sequence_edge(pt, offs_n, N_K)
        # Δ is read once lse₂ is dead (a query-indexed vector costs 16 registers a thread here)
        if STATS_TMA:
            delta = delta_smem.index(s).reshape([BLOCK_M]).load(gl.SliceLayout(0, s_layout))
        else:
            delta = gl.load(DELTA + row, mask=offs_m < N_Q, other=0.0)
        dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), a_layout), do2, dv, is_async=True)
        dpt = warpgroup_mma_wait(1, deps=[dpt])
        if IS_VARLEN:   # the next sequence's Δ: queries past this one have P = 0 and dP = 0 (zero dO rows)
            delta = gl.where(offs_m < N_Q, delta, 0.0)
        if SINK_SUMS:
            # u = Pᵀ ∘ dPᵀ weighted by p_sink, summed over the queries; keys past N_K (zero V rows), queries
            # past N_Q (zero dO rows) and masked pairs add 0
            if STATS_TMA:
                lse2 = lse_smem.index(s).reshape([BLOCK_M]).load(gl.SliceLayout(0, s_layout))
            else:
                lse2 = gl.load(LSE2 + row, mask=offs_m < N_Q, other=float("inf"))
            u = pt * dpt
            ds = u - pt * delta[None, :]
            p_sink = gl.exp2(gl.load(SINKS + hq) * LOG2E - lse2)
            sink_keys += gl.sum(u * p_sink[None, :], axis=1)
            if t - g * n_m == n_m - 1:   # the head's last tile: one add a program and head
                gl.atomic_add(DS_SUM + hq, gl.sum(sink_keys, axis=0), sem="relaxed")
                sink_keys = gl.zeros([BLOCK_N], gl.float32, gl.SliceLayout(1, s_layout))
        else:
            ds = pt * (dpt - delta[None, :])
        if IS_VARLEN:   # 0 x a NaN of the next sequence's V in dP is not 0
            if key0 + BLOCK_N > N_K:
                ds = _sequence_edge(ds, offs_n, N_K)
        if SUM_DS:
            # keys past N_K read as zeros, so their P is not 0: harmless for dQ
            # (a zero K row) and dK/dV (not stored), not for the row sums of dS
            if key0 + BLOCK_N > N_K:
                ds = gl.where(offs_n[:, None] < N_K, ds, 0.0)
        ds16 = ds.to(dtype)
        # dSᵀ to shared memory for dQ (both halves); with DK_FROM_SMEM dK += dSᵀ Q
        # reads this warpgroup's half from there too, so no registers are held
        # while it runs, else it takes dSᵀ from registers and starts sooner
        ds_buf = ds_smem.index(tg % 2)
        ds_mine = ds_buf.slice(WG * BLOCK_N, BLOCK_N, dim=0)
        if not DK_FROM_SMEM:
            dk = warpgroup_mma(gl.convert_layout(ds16, a_layout), q2, dk, is_async=True)
        ds_mine.store(ds16)
        fence_async_shared()
        gl.thread_barrier()
        if DK_FROM_SMEM:
            dk = warpgroup_mma(ds_mine, q2, dk, is_async=True)
        mbarrier.arrive(ds_bars.index(tg % 2), count=1)
        if DQ_TURNS:   # (the launcher does not pair it with SUM_DS)
            dv, dk = warpgroup_mma_wait(0, deps=[dv, dk])
            mbarrier.arrive(q_empty.index(s), count=1)   # dQ reads dSᵀ and K only
            mbarrier.arrive(do_empty.index(s), count=1)
            if tg % 2 == WG:
                # ds_bars[WG] is waited on by this warpgroup alone, once a phase: the
                # other cannot arrive at its next phase before this one arrived at the
                # tile between, i.e. before this tile's dQ has read the buffer (tg runs
                # on across a pair's or a persistent walk's blocks: the same holds there)
                mbarrier.wait(ds_bars.index(tg % 2), (tg // 2) & 1)
                zero_q = gl.zeros([BLOCK_M, DQ_W], gl.float32, dq_layout)
                dq = warpgroup_mma(ds_buf.permute([1, 0]), k_cols, zero_q, use_acc=False, is_async=True)
                dq = warpgroup_mma_wait(0, deps=[dq])
                if IS_VARLEN:
                    if m + BLOCK_M > N_Q:
                        dq = _rows_inside(dq, m, N_Q, BLOCK_M, dq_layout)
                _dq_reduce(dq, dq_smem, dq_desc, off_b, hq, q_base + m, 0, WG, BLOCK_M, DQ_W)
        else:
            mbarrier.wait(ds_bars.index(tg % 2), (tg // 2) & 1)
            zero_q = gl.zeros([BLOCK_M, HALF_D], gl.float32, dq_layout)
            dq = warpgroup_mma(ds_buf.permute([1, 0]), k_cols, zero_q, use_acc=False, is_async=True)
            if SUM_DS:
                zero_rs = gl.zeros([BLOCK_M, 8], gl.float32, rs_layout)
                rs = warpgroup_mma(ds_mine.permute([1, 0]), ones_smem.permute([1, 0]), zero_rs, use_acc=False,
                                   is_async=True)
                dq, dv, dk, rs = warpgroup_mma_wait(0, deps=[dq, dv, dk, rs])
                if DEFER_SUMS:   # added in the next iteration, under its products (or after the loop)
                    rs_sum = gl.sum(rs, axis=1)
                    m_sum = m
                    hq_sum = hq
                else:
                    # rows past N_Q are dropped; each query row gets one add per warpgroup of keys
                    offs_rs = m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, rs_layout))
                    rs_row = (off_b * N_HEADS + hq).to(gl.int64) * N_Q + offs_rs
                    gl.atomic_add(DS_SUM + rs_row, gl.sum(rs, axis=1), mask=offs_rs < N_Q, sem="relaxed")
            else:
                dq, dv, dk = warpgroup_mma_wait(0, deps=[dq, dv, dk])
            mbarrier.arrive(q_empty.index(s), count=1)
            mbarrier.arrive(do_empty.index(s), count=1)
            if IS_VARLEN:
                if m + BLOCK_M > N_Q:
                    dq = _rows_inside(dq, m, N_Q, BLOCK_M, dq_layout)
            _dq_reduce(dq, dq_smem, dq_desc, off_b, hq, q_base + m, WG * HALF_D, WG, BLOCK_M, HALF_D)
    if SUM_DS and DEFER_SUMS:
        if HEADS * n_m > 0:
            _add_row_sums(DS_SUM, rs_sum, off_b, hq_sum, m_sum, N_HEADS, N_Q, BLOCK_M, rs_layout)
    if RELEASE_KV:   # every product that read this K and V has completed
        mbarrier.arrive(kv_empty, count=1)
    else:
        tma.store_wait(0)
        if ARRIVE_KV:   # after a pair's first block: the second block's K and V may land now
            if kv_phase == 0:
                mbarrier.arrive(kv_empty, count=1)

    # dK and dV of this warpgroup's keys (rows past N_K dropped)
    offs_kn = key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, kv_layout))
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, kv_layout))
    # (the column test is always true: it gives the mask the tile's full shape, as the atomic add takes it)
    ok = (offs_kn < N_K)[:, None] & (offs_d < HEAD_DIM)[None, :]
    n64 = (k_base + offs_kn).to(gl.int64)[:, None]
    dk_ptrs = DK + off_b.to(gl.int64) * stride_dkb + off_hk.to(gl.int64) * stride_dkh + n64 * stride_dkn
    dv_ptrs = DV + off_b.to(gl.int64) * stride_dvb + off_hk.to(gl.int64) * stride_dvh + n64 * stride_dvn
    if ADD_DKDV:   # this slice's share of the group's sums (float32; the launcher rounds them)
        gl.atomic_add(dk_ptrs + offs_d[None, :], dk * sm_scale, mask=ok, sem="relaxed")
        gl.atomic_add(dv_ptrs + offs_d[None, :], dv, mask=ok, sem="relaxed")
    else:
        gl.store(dk_ptrs + offs_d[None, :], (dk * sm_scale).to(DK.dtype.element_ty), mask=ok)
        gl.store(dv_ptrs + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=ok)


@gluon.jit
def _compute_paired(WG: gl.constexpr, k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, ones_smem, kv_bar, q_ready,
                    q_empty, do_ready, do_empty, ds_bars, dq_desc, DK, DV, LSE2, DELTA,
                    stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                    off_b, off_hk, hq0, start_n, m_lo, n_m, start_b, m_lo_b, n_m_b, kv_empty, HEADS, N_HEADS,
                    N_Q, N_K, qk_scale, sm_scale, DS_SUM, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                    DK_FROM_SMEM: gl.constexpr, SUM_DS: gl.constexpr, DEFER_SUMS: gl.constexpr, lse_smem,
                    delta_smem, stat_ready, STATS_TMA: gl.constexpr, ADD_DKDV: gl.constexpr,
                    SINK_SUMS: gl.constexpr, SINKS):
    """A compute warpgroup over a pair of key blocks (the second one only
    where ``n_m_b`` >= 0), one loop iteration each (one copy of the block's
    code, not two): the ring's and the dSᵀ buffers' counts run on across
    the two, and K/V's barrier completes a second time."""
    t0 = n_m * 0
    for blk in range(gl.where(n_m_b >= 0, 2, 1)):
        first = blk == 0
        _compute_partition(WG, k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, ones_smem, kv_bar, q_ready,
                           q_empty, do_ready, do_empty, ds_bars, dq_desc, DK, DV, LSE2, DELTA,
                           stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                           off_b, off_hk, hq0, gl.where(first, start_n, start_b), gl.where(first, m_lo, m_lo_b),
                           gl.where(first, n_m, n_m_b), HEADS, N_HEADS, N_Q, N_K, qk_scale, sm_scale,
                           DS_SUM, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES, IS_CAUSAL, DK_FROM_SMEM, SUM_DS,
                           DEFER_SUMS, t0, blk, kv_empty, True, lse_smem, delta_smem, stat_ready, STATS_TMA,
                           ADD_DKDV, SINK_SUMS=SINK_SUMS, SINKS=SINKS)
        t0 = t0 + HEADS * n_m


@gluon.jit
def _load_paired(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready, q_empty,
                 do_ready, do_empty, off_b, off_hk, hq0, start_n, m_lo, n_m, start_b, m_lo_b, n_m_b, kv_empty,
                 HEADS, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr, lse_desc, delta_desc, lse_smem,
                 delta_smem, stat_ready, STATS_TMA: gl.constexpr):
    """The load warp over a pair of key blocks (see :func:`_compute_paired`)."""
    _load_partition(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready, q_empty,
                    do_ready, do_empty, off_b, off_hk, hq0, start_n, m_lo, n_m, HEADS, BLOCK_M, NUM_STAGES,
                    q_desc, k_desc, q_smem, k_smem, 0, 0, kv_empty, False, lse_desc, delta_desc, lse_smem, delta_smem,
                    stat_ready, STATS_TMA)
    if n_m_b >= 0:
        _load_partition(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready, q_empty,
                        do_ready, do_empty, off_b, off_hk, hq0, start_b, m_lo_b, n_m_b, HEADS, BLOCK_M,
                        NUM_STAGES, q_desc, k_desc, q_smem, k_smem, 0, HEADS * n_m, kv_empty, True, lse_desc,
                        delta_desc, lse_smem, delta_smem, stat_ready, STATS_TMA)


@gluon.jit
def _attn_bwd_hopper_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, DK, DV, LSE2, DELTA,
                            stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                            GROUP_SIZE, N_HEADS, N_Q, N_K, qk_scale, sm_scale, DS_SUM,
                            HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                            IS_CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr, DK_FROM_SMEM: gl.constexpr,
                            SUM_DS: gl.constexpr, DEFER_SUMS: gl.constexpr = False, PAIRED: gl.constexpr = False,
                            STATS_TMA: gl.constexpr = False, HEADS=1, ADD_DKDV: gl.constexpr = False, N_ROWS=1,
                            GROUPED: gl.constexpr = False, WIN_LEFT=None, WIN_RIGHT=None,
                            IS_VARLEN: gl.constexpr = False, CU_SEQLENS_Q=None, CU_SEQLENS_K=None, K=None, Q=None,
                            DO=None, stride_kh=0, stride_kn=0, stride_qh=0, stride_qn=0, stride_doh=0, stride_don=0,
                            SINK_SUMS: gl.constexpr = False, SINKS=None):
    """A program owns 2 * BLOCK_N keys: BLOCK_N per compute warpgroup; with
    PAIRED (causal) two such key blocks, the grid's first half of them and
    their mirror images, so that every program has the same work.  With
    STATS_TMA, ``LSE2`` and ``DELTA`` are rank-3 (B, Hq, N_Q) descriptors with
    a (1, 1, BLOCK_M) box, else pointers to contiguous (B, Hq, N_Q) tensors.
    A program walks ``HEADS`` of its group's ``GROUP_SIZE`` query heads: with
    head slices (``HEADS`` < ``GROUP_SIZE``, ``ADD_DKDV``: ``DK``/``DV`` are
    zeroed float32 sums) grid row ``pid_h`` is slice ``pid_h % slices`` of kv
    head ``pid_h // slices``, so the programs running at once read the Q and
    dO of few query heads (a causal grid's programs drift apart in the walk).
    A sliding window (``WIN_LEFT`` / ``WIN_RIGHT``: ``kernels.common``'s
    bounds, causal folded in; not paired) walks only the query tiles that
    see the program's keys.  Packed sequences (``IS_VARLEN``; not paired,
    no head slices or dS sums): the tensors are (1, H, total, D), the grid's
    batch axis runs over the sequences (``fwd_hopper_load._sequence``), and
    tiles that end past a sequence read K, Q and dO (pointers and strides
    here) through descriptors that end with it.  ``SINK_SUMS`` (not with
    ``SUM_DS``): ``DS_SUM`` is a zeroed float32 (Hq,) that gets the sinks'
    sums (module docstring), ``SINKS`` the heads' float32 sink logits."""
    # causal: the first key blocks see the most query tiles, run them first
    pid_n, pid_h, off_b, _ = _grid_coords(N_ROWS, GROUPED)
    if ADD_DKDV:
        slices = GROUP_SIZE // HEADS
        off_hk = pid_h // slices
        hq0 = off_hk * GROUP_SIZE + (pid_h - off_hk * slices) * HEADS
    else:
        off_hk = pid_h
        hq0 = pid_h * GROUP_SIZE
    start_n = pid_n * (2 * BLOCK_N)
    gl.static_assert(WIN_LEFT is None or not (IS_CAUSAL or PAIRED), "a window: causal folded into it, not paired")
    gl.static_assert(not IS_VARLEN or not (PAIRED or ADD_DKDV or SUM_DS or GROUPED or SINK_SUMS),
                     "packed: a plain grid, no sinks")
    gl.static_assert(not (SUM_DS and SINK_SUMS), "the sinks' gradient one way: dS row sums or the sinks' sums")
    if IS_VARLEN:
        ROWS_Q = N_Q   # the stats' rows a head (all sequences')
        off_b, q_base, N_Q, k_base, N_K = _sequence(CU_SEQLENS_Q, CU_SEQLENS_K, off_b, N_Q, N_K, IS_VARLEN)
        if start_n >= N_K:   # past this sequence's keys
            return
        EDGES = (K, Q, DO, stride_kh, stride_kn, stride_qh, stride_qn, stride_doh, stride_don)
    else:
        EDGES: gl.constexpr = None
        ROWS_Q: gl.constexpr = 0
        q_base: gl.constexpr = 0
        k_base: gl.constexpr = 0
    m_lo, n_m = _query_tiles(start_n, N_Q, N_K, BLOCK_M, IS_CAUSAL, WIN_LEFT, WIN_RIGHT, 2 * BLOCK_N)

    dtype: gl.constexpr = q_desc.dtype
    k_smem, v_smem, q_smem, do_smem = _ring_buffers(q_desc, k_desc, v_desc, do_desc, NUM_STAGES)
    ds_smem, dq_smem = _ds_dq_buffers(dtype, dq_desc, BLOCK_M, BLOCK_N)
    ones_smem = dq_smem  # a placeholder without SUM_DS
    if SUM_DS:
        # a column of ones (row 0 of this K-major tile) for dS's sums over keys
        ones_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([8, BLOCK_N], dtype)
        fill: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
        rows = gl.arange(0, 8, layout=gl.SliceLayout(1, fill))[:, None] + gl.zeros([8, BLOCK_N], gl.int32, fill)
        ones_smem = gl.allocate_shared_memory(dtype, [8, BLOCK_N], ones_layout,
                                              gl.where(rows == 0, 1.0, 0.0).to(dtype))
        fence_async_shared()
    kv_bar, ds_bars, q_ready, do_ready, q_empty, do_empty = _barriers(NUM_STAGES)
    lse_smem, delta_smem, stat_ready = _stat_buffers(LSE2, DELTA, NUM_STAGES, STATS_TMA, dq_smem, q_ready)

    # the two compute partitions' argument tuples are written out: a tuple
    # built by concatenation in the kernel loses its constexpr entries (triton 3.6)
    if PAIRED:
        # key blocks pid_n and n_blocks - 1 - pid_n, one after the other: equal causal work a program
        kv_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_empty, count=2)
        start_b = (gl.cdiv(N_K, 2 * BLOCK_N) - 1 - pid_n) * (2 * BLOCK_N)
        m_lo_b, n_m_b = _query_tiles(start_b, N_Q, N_K, BLOCK_M, IS_CAUSAL)
        n_m_b = gl.where(start_b > start_n, n_m_b, -1)   # -1: no second block (the middle one of an odd count)
        gl.warp_specialize([
            (_compute_paired, (0, k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, ones_smem, kv_bar, q_ready,
                               q_empty, do_ready, do_empty, ds_bars, dq_desc, DK, DV, LSE2, DELTA,
                               stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                               off_b, off_hk, hq0, start_n, m_lo, n_m, start_b, m_lo_b, n_m_b, kv_empty, HEADS,
                               N_HEADS, N_Q, N_K, qk_scale, sm_scale, DS_SUM, BLOCK_M, BLOCK_N, HEAD_DIM,
                               NUM_STAGES, IS_CAUSAL, DK_FROM_SMEM, SUM_DS, DEFER_SUMS, lse_smem, delta_smem,
                               stat_ready, STATS_TMA, ADD_DKDV, SINK_SUMS, SINKS)),
            (_compute_paired, (1, k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, ones_smem, kv_bar, q_ready,
                               q_empty, do_ready, do_empty, ds_bars, dq_desc, DK, DV, LSE2, DELTA,
                               stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                               off_b, off_hk, hq0, start_n, m_lo, n_m, start_b, m_lo_b, n_m_b, kv_empty, HEADS,
                               N_HEADS, N_Q, N_K, qk_scale, sm_scale, DS_SUM, BLOCK_M, BLOCK_N, HEAD_DIM,
                               NUM_STAGES, IS_CAUSAL, DK_FROM_SMEM, SUM_DS, DEFER_SUMS, lse_smem, delta_smem,
                               stat_ready, STATS_TMA, ADD_DKDV, SINK_SUMS, SINKS)),
            (_load_paired, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready,
                            q_empty, do_ready, do_empty, off_b, off_hk, hq0, start_n, m_lo, n_m, start_b, m_lo_b,
                            n_m_b, kv_empty, HEADS, BLOCK_M, NUM_STAGES, LSE2, DELTA, lse_smem, delta_smem, stat_ready,
                            STATS_TMA)),
        ], [4, 1], [240, 24])
        mbarrier.invalidate(kv_empty)
    else:
        gl.warp_specialize([
            (_compute_partition, (0, k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, ones_smem, kv_bar, q_ready,
                                  q_empty,
                                  do_ready, do_empty, ds_bars, dq_desc, DK, DV, LSE2, DELTA,
                                  stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                                  off_b, off_hk, hq0, start_n, m_lo, n_m, HEADS, N_HEADS, N_Q, N_K, qk_scale,
                                  sm_scale, DS_SUM, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES, IS_CAUSAL, DK_FROM_SMEM,
                                  SUM_DS, DEFER_SUMS, 0, 0, kv_bar, False, lse_smem, delta_smem, stat_ready,
                                  STATS_TMA, ADD_DKDV, WIN_LEFT, WIN_RIGHT, IS_VARLEN, q_base, k_base, ROWS_Q,
                                  SINK_SUMS, SINKS)),
            (_compute_partition, (1, k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, ones_smem, kv_bar, q_ready,
                                  q_empty,
                                  do_ready, do_empty, ds_bars, dq_desc, DK, DV, LSE2, DELTA,
                                  stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                                  off_b, off_hk, hq0, start_n, m_lo, n_m, HEADS, N_HEADS, N_Q, N_K, qk_scale,
                                  sm_scale, DS_SUM, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES, IS_CAUSAL, DK_FROM_SMEM,
                                  SUM_DS, DEFER_SUMS, 0, 0, kv_bar, False, lse_smem, delta_smem, stat_ready,
                                  STATS_TMA, ADD_DKDV, WIN_LEFT, WIN_RIGHT, IS_VARLEN, q_base, k_base, ROWS_Q,
                                  SINK_SUMS, SINKS)),
            (_load_partition, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready,
                               q_empty, do_ready, do_empty, off_b, off_hk, hq0, start_n, m_lo, n_m, HEADS,
                               BLOCK_M, NUM_STAGES, q_desc, k_desc, q_smem, k_smem, 0, 0, kv_bar, False, LSE2, DELTA,
                               lse_smem, delta_smem, stat_ready, STATS_TMA, q_base, k_base, EDGES, N_Q, N_K)),
        ], [4, 1], [240, 24])

    _invalidate(kv_bar, ds_bars, q_ready, do_ready, q_empty, do_empty, NUM_STAGES, stat_ready, STATS_TMA)
