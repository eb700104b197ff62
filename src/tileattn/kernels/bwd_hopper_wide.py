"""Hopper backward kernel (Gluon) for a QK head dim that is V's plus a tail
(QK 192 / V 128, MLA): the dK/dV kernel of ``bwd_hopper.py`` with narrower
query tiles and dQ formed transposed.

At QK 192 / V 128 the accumulators that stay in registers for the whole
program (dK 64 x 192 and dV 64 x 128 per compute warpgroup: 160 float32
registers a thread) leave no room for 64 x 64 tiles of Sᵀ and dPᵀ beside
them, so a query tile is ``BLOCK_M`` = 32 rows (Sᵀ, dPᵀ: 16 registers each),
which is too few rows for a warpgroup MMA of dQ = dS K (its M is 64).  So
dQᵀ = Kᵀ dSᵀ: M is the head dim, in three 64-row chunks (two of the first
piece, one of the tail); warpgroup ``WG`` forms chunk ``WG`` and, on every
other query tile, the tail's chunk, so both do the same work over two tiles.
The float32 sum dQ is added into is itself transposed, (B, Hq, D, N_Q), and
the convert kernel reads it through a transposed view.

A copy box is a power of two wide, so Q and K come as two pieces (V's width,
``HEAD_DIM_V``, and ``TAIL_DIM``), each with its own descriptor and buffers;
Sᵀ = K Qᵀ is two products into one accumulator and dK two accumulators.

Partitions, barriers, masking and edges are those of ``bwd_hopper.py``
(the shared pieces are in ``bwd_hopper_common.py``): a
program owns ``2 * BLOCK_N`` keys (``BLOCK_N`` per compute warpgroup), a load
warp streams Q and dO tiles through ``NUM_STAGES`` slots, the two compute
warpgroups meet once per tile when both halves of dSᵀ are in shared memory,
and the copy engine adds the dQᵀ chunks into the sum.  The causal kernel
masks every tile (cheaper here than two copies of the softmax code).  It
does not sum dS (that would cost a third more dQ work here): calls with
sinks run it only where the forward kept its output's rounding remainder,
from which the sinks' gradient needs no dS sums; the others go to the
portable kernels.

This module imports Gluon at load time: only the Hopper launcher imports it,
lazily, so a CPU install never does.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .bwd_hopper_common import (_barriers, _invalidate, _load_partition, _probs, _query_tiles,
                                 _tile_at, _tma_reduce_add)
from .fwd_hopper_load import _grid_coords

CHUNK: gl.constexpr = gl.constexpr(64)   # rows of dQᵀ per MMA (a warpgroup MMA's M)


@gluon.jit
def _stage_dqt(dqt, dq_stage, dq_desc, off_b, hq, m, row0, BLOCK_M: gl.constexpr):
    """Stage rows [row0, row0 + 64) of dQᵀ and let the copy engine add them
    into the transposed sum at columns [m, m + BLOCK_M) of head ``hq``."""
    dq_stage.store(dqt)
    fence_async_shared()
    gl.thread_barrier()
    _tma_reduce_add(dq_desc, [off_b, hq, row0, m], dq_stage.reshape([1, 1, CHUNK, BLOCK_M]))


@gluon.jit
def _compute_partition(WG: gl.constexpr, k_smem, kt_smem, v_smem, q_smem, qt_smem, do_smem, ds_smem, dq_smem,
                       kv_bar, q_ready, q_empty, do_ready, do_empty, ds_bars, dq_desc, DK, DV, LSE2, DELTA,
                       stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                       off_b, off_hk, start_n, m_lo, n_m, GROUP_SIZE, N_HEADS, N_Q, N_K, qk_scale, sm_scale,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM_V: gl.constexpr,
                       TAIL_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                       DQ_BUFS: gl.constexpr):
    dtype: gl.constexpr = q_smem.dtype
    gl.static_assert(HEAD_DIM_V == 2 * CHUNK, "the first piece is two dQ chunks wide")
    gl.static_assert(TAIL_DIM == CHUNK, "the tail is one dQ chunk wide")
    # Sᵀ/dPᵀ and dQᵀ chunks: 64 rows x BLOCK_M queries; dK (two pieces) and dV: BLOCK_N keys x width
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM_V, 16])
    kt_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, TAIL_DIM, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    at_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kt_layout, k_width=2)
    key0 = start_n + WG * BLOCK_N
    keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))   # the warpgroup's keys from key0
    queries = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
    diag = N_K - N_Q

    mbarrier.wait(kv_bar, 0)
    k_all = k_smem.reshape([2 * BLOCK_N, HEAD_DIM_V])
    kt_all = kt_smem.reshape([2 * BLOCK_N, TAIL_DIM])
    k_mine = k_all.slice(WG * BLOCK_N, BLOCK_N, dim=0)
    kt_mine = kt_all.slice(WG * BLOCK_N, BLOCK_N, dim=0)
    v_mine = v_smem.reshape([2 * BLOCK_N, HEAD_DIM_V]).slice(WG * BLOCK_N, BLOCK_N, dim=0)
    k_cols = k_all.slice(WG * CHUNK, CHUNK, dim=1)   # this warpgroup's chunk of dQᵀ
    dk = gl.zeros([BLOCK_N, HEAD_DIM_V], gl.float32, kv_layout)
    dkt = gl.zeros([BLOCK_N, TAIL_DIM], gl.float32, kt_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM_V], gl.float32, kv_layout)
    for t in range(GROUP_SIZE * n_m):
        hq, m, s, phase = _tile_at(t, n_m, m_lo, off_hk * GROUP_SIZE, BLOCK_M, NUM_STAGES)
        offs_m = m + queries
        row = (off_b * N_HEADS + hq).to(gl.int64) * N_Q + offs_m
        lse2 = gl.load(LSE2 + row, mask=offs_m < N_Q, other=float("inf"))

        mbarrier.wait(q_ready.index(s), phase)
        q2 = q_smem.index(s).reshape([BLOCK_M, HEAD_DIM_V])
        qt2 = qt_smem.index(s).reshape([BLOCK_M, TAIL_DIM])
        zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
        st = warpgroup_mma(k_mine, q2.permute([1, 0]), zero_s, use_acc=False, is_async=True)
        st = warpgroup_mma(kt_mine, qt2.permute([1, 0]), st, is_async=True)
        mbarrier.wait(do_ready.index(s), phase)
        do2 = do_smem.index(s).reshape([BLOCK_M, HEAD_DIM_V])
        dpt = warpgroup_mma(v_mine, do2.permute([1, 0]), zero_s, use_acc=False, is_async=True)
        st = warpgroup_mma_wait(1, deps=[st])
        # causal: every tile is masked (one copy of the softmax code: a split into
        # masked and unmasked tiles spilled 392 B and ran 1-2 % slower, perf-notes v15)
        # the mask as key0 + i <= m + j + diag: positions in the tile against one scalar
        # (against the keys' and queries' own indices the causal build spilled 88 B, now 48; perf-notes v34)
        pt = _probs(st, lse2, keys, queries, m + diag - key0, qk_scale, IS_CAUSAL)
        delta = gl.load(DELTA + row, mask=offs_m < N_Q, other=0.0)
        dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), a_layout), do2, dv, is_async=True)
        dpt = warpgroup_mma_wait(1, deps=[dpt])
        ds16 = (pt * (dpt - delta[None, :])).to(dtype)
        dk = warpgroup_mma(gl.convert_layout(ds16, a_layout), q2, dk, is_async=True)
        dkt = warpgroup_mma(gl.convert_layout(ds16, at_layout), qt2, dkt, is_async=True)
        # both halves of dSᵀ in shared memory, then the dQᵀ chunks from all the program's keys
        ds_buf = ds_smem.index(t % 2)
        ds_buf.slice(WG * BLOCK_N, BLOCK_N, dim=0).store(ds16)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(ds_bars.index(t % 2), count=1)
        mbarrier.wait(ds_bars.index(t % 2), (t // 2) & 1)
        # dQᵀ = Kᵀ dSᵀ: this warpgroup's chunk and, every other tile, the tail's
        zero_q = gl.zeros([CHUNK, BLOCK_M], gl.float32, s_layout)
        dqt = warpgroup_mma(k_cols.permute([1, 0]), ds_buf, zero_q, use_acc=False, is_async=True)
        dv, dk, dkt, dqt = warpgroup_mma_wait(0, deps=[dv, dk, dkt, dqt])
        mbarrier.arrive(q_empty.index(s), count=1)
        mbarrier.arrive(do_empty.index(s), count=1)
        # the previous tiles' reduces have read the staging buffers by now
        tma.store_wait(0)
        if t % 2 == WG:
            # the tail's chunk runs on the tensor cores while this warpgroup's is staged
            dqt2 = warpgroup_mma(kt_all.permute([1, 0]), ds_buf, zero_q, use_acc=False, is_async=True)
            _stage_dqt(dqt, dq_smem.index(DQ_BUFS * WG), dq_desc, off_b, hq, m, WG * CHUNK, BLOCK_M)
            dqt2 = warpgroup_mma_wait(0, deps=[dqt2])
            if DQ_BUFS == 1:   # one staging buffer: the first chunk's reduce must have read it
                tma.store_wait(0)
            _stage_dqt(dqt2, dq_smem.index(DQ_BUFS * WG + DQ_BUFS - 1), dq_desc, off_b, hq, m, HEAD_DIM_V,
                       BLOCK_M)
        else:
            _stage_dqt(dqt, dq_smem.index(DQ_BUFS * WG), dq_desc, off_b, hq, m, WG * CHUNK, BLOCK_M)
    tma.store_wait(0)

    # dK (both pieces) and dV of this warpgroup's keys (rows past N_K dropped)
    offs_kn = key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, kv_layout))
    ok = (offs_kn < N_K)[:, None]
    n64 = offs_kn.to(gl.int64)[:, None]
    offs_d = gl.arange(0, HEAD_DIM_V, layout=gl.SliceLayout(0, kv_layout))
    dk_ptrs = DK + off_b.to(gl.int64) * stride_dkb + off_hk.to(gl.int64) * stride_dkh + n64 * stride_dkn
    gl.store(dk_ptrs + offs_d[None, :], (dk * sm_scale).to(dtype), mask=ok)
    dv_ptrs = DV + off_b.to(gl.int64) * stride_dvb + off_hk.to(gl.int64) * stride_dvh + n64 * stride_dvn
    gl.store(dv_ptrs + offs_d[None, :], dv.to(dtype), mask=ok)
    offs_tn = key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, kt_layout))
    offs_t = HEAD_DIM_V + gl.arange(0, TAIL_DIM, layout=gl.SliceLayout(0, kt_layout))
    dkt_ptrs = (DK + off_b.to(gl.int64) * stride_dkb + off_hk.to(gl.int64) * stride_dkh
                + offs_tn.to(gl.int64)[:, None] * stride_dkn)
    gl.store(dkt_ptrs + offs_t[None, :], (dkt * sm_scale).to(dtype), mask=(offs_tn < N_K)[:, None])


@gluon.jit
def _attn_bwd_hopper_wide_kernel(q_desc, qt_desc, k_desc, kt_desc, v_desc, do_desc, dq_desc, DK, DV, LSE2, DELTA,
                                 stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                                 GROUP_SIZE, N_HEADS, N_Q, N_K, qk_scale, sm_scale,
                                 HEAD_DIM_V: gl.constexpr, TAIL_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                                 BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr,
                                 DQ_BUFS: gl.constexpr, N_ROWS=1, GROUPED: gl.constexpr = False):
    """A program owns 2 * BLOCK_N keys: BLOCK_N per compute warpgroup."""
    pid_n, off_hk, off_b, _ = _grid_coords(N_ROWS, GROUPED)
    start_n = pid_n * (2 * BLOCK_N)
    m_lo, n_m = _query_tiles(start_n, N_Q, N_K, BLOCK_M, IS_CAUSAL)

    dtype: gl.constexpr = q_desc.dtype
    k_smem = gl.allocate_shared_memory(dtype, k_desc.block_type.shape, k_desc.layout)
    kt_smem = gl.allocate_shared_memory(dtype, kt_desc.block_type.shape, kt_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + q_desc.block_type.shape, q_desc.layout)
    qt_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + qt_desc.block_type.shape, qt_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES] + do_desc.block_type.shape, do_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * BLOCK_N, BLOCK_M], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [2, 2 * BLOCK_N, BLOCK_M], ds_layout)
    # DQ_BUFS staging buffers per warpgroup (its own chunk and, every other tile, the tail's)
    dq_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([CHUNK, BLOCK_M], gl.float32)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2 * DQ_BUFS, CHUNK, BLOCK_M], dq_layout)
    kv_bar, ds_bars, q_ready, do_ready, q_empty, do_empty = _barriers(NUM_STAGES)

    # written out per partition: a tuple built by concatenation in the kernel loses its constexprs (triton 3.6)
    gl.warp_specialize([
        (_compute_partition, (0, k_smem, kt_smem, v_smem, q_smem, qt_smem, do_smem, ds_smem, dq_smem, kv_bar,
                              q_ready, q_empty, do_ready, do_empty, ds_bars, dq_desc, DK, DV, LSE2, DELTA,
                              stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                              off_b, off_hk, start_n, m_lo, n_m, GROUP_SIZE, N_HEADS, N_Q, N_K, qk_scale, sm_scale,
                              BLOCK_M, BLOCK_N, HEAD_DIM_V, TAIL_DIM, NUM_STAGES, IS_CAUSAL, DQ_BUFS)),
        (_compute_partition, (1, k_smem, kt_smem, v_smem, q_smem, qt_smem, do_smem, ds_smem, dq_smem, kv_bar,
                              q_ready, q_empty, do_ready, do_empty, ds_bars, dq_desc, DK, DV, LSE2, DELTA,
                              stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                              off_b, off_hk, start_n, m_lo, n_m, GROUP_SIZE, N_HEADS, N_Q, N_K, qk_scale, sm_scale,
                              BLOCK_M, BLOCK_N, HEAD_DIM_V, TAIL_DIM, NUM_STAGES, IS_CAUSAL, DQ_BUFS)),
        (_load_partition, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready,
                           q_empty, do_ready, do_empty, off_b, off_hk, off_hk * GROUP_SIZE, start_n, m_lo, n_m,
                           GROUP_SIZE, BLOCK_M, NUM_STAGES, qt_desc, kt_desc, qt_smem, kt_smem, TAIL_DIM, 0, kv_bar,
                           False, LSE2, DELTA, q_smem, q_smem, q_ready, False)),
    ], [4, 1], [240, 24])

    _invalidate(kv_bar, ds_bars, q_ready, do_ready, q_empty, do_empty, NUM_STAGES)
