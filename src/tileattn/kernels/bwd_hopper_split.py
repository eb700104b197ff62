"""Hopper backward kernel (Gluon) for head dim 256: the two compute
warpgroups share the program's 64 keys and split dK, dV and dQ by columns.

At d = 256 the dK and dV of 64 keys are 256 float32 registers a thread of
one warpgroup, more than it has, so neither ``bwd_hopper.py`` (64 keys a
warpgroup) nor ``bwd_hopper_wide.py`` (the same, narrower query tiles) fits.
Here a program owns ``2 * BLOCK_N`` = 64 keys and both compute warpgroups
work on all of them: warpgroup ``WG`` keeps columns [128 WG, 128 WG + 128)
of dK and dV (64 + 64 registers).  Per query tile of ``BLOCK_M`` rows (64
in the table's config, with one Q/dO slot; 32 with a ring of two or three)
the two full-width products are split by role: warpgroup 0 forms
Sᵀ = K Qᵀ and Pᵀ, warpgroup 1 dPᵀ = V dOᵀ and, from Pᵀ (bf16/fp16, as
the standard backward in the same precision rounds it) in shared memory,
dSᵀ = Pᵀ ∘ (dPᵀ - Δ).  Pᵀ and dSᵀ go through shared memory (two buffers
each, alternating by tile); then each warpgroup adds its columns of
dV += Pᵀ dO and dK += dSᵀ Q, and forms two 64-row chunks of
dQᵀ = Kᵀ dSᵀ (a 32-row tile is too few rows for dQ = dS K, whose M is 64)
which the copy engine adds into the transposed float32 sum, as in the wide
kernel.  dV and dK are the Q/dO slot's last readers: it is released once
they retire, so the next tile's rows load under the dQᵀ products.

Barriers per tile (double-buffered with Pᵀ/dSᵀ): ``p_bars`` (warpgroup 0
stored Pᵀ) and ``ds_bars`` (both arrived: warpgroup 0 with Pᵀ, warpgroup 1
with dSᵀ).  A warpgroup reaches tile t + 2's buffers only after waiting on
tile t + 1's barriers, by which time the other has retired tile t's
products, so two buffers suffice.  The load warp, the ring, masking and
edges are those of the other Hopper backward kernels
(``bwd_hopper_common.py``); the causal kernel masks every tile.  It does not
sum dS: calls with sinks run it only where the forward kept its output's
rounding remainder.

This module imports Gluon at load time: only the Hopper launcher imports it,
lazily, so a CPU install never does.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .bwd_hopper_common import (_barriers, _invalidate, _load_partition, _probs, _query_tiles,
                                 _ring_buffers, _tile_at)
from .fwd_hopper_load import _grid_coords
from .bwd_hopper_wide import CHUNK, _stage_dqt


@gluon.jit
def _role_product(WG: gl.constexpr, k_all, v_all, q_smem, do_smem, q_ready, do_ready, s, phase, zero_s,
                  BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Issue the full-width product of this warpgroup's role on ring slot
    ``s`` once it has landed (``phase``): Sᵀ = K Qᵀ (warpgroup 0) or
    dPᵀ = V dOᵀ (1)."""
    if WG == 0:
        mbarrier.wait(q_ready.index(s), phase)
        rows = q_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
        got = warpgroup_mma(k_all, rows.permute([1, 0]), zero_s, use_acc=False, is_async=True)
    else:
        mbarrier.wait(do_ready.index(s), phase)
        rows = do_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
        got = warpgroup_mma(v_all, rows.permute([1, 0]), zero_s, use_acc=False, is_async=True)
    return got


@gluon.jit
def _compute_partition(WG: gl.constexpr, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem,
                       kv_bar, q_ready, q_empty, do_ready, do_empty, p_bars, ds_bars, dq_desc, DK, DV, LSE2, DELTA,
                       stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                       off_b, off_hk, start_n, m_lo, n_m, GROUP_SIZE, N_HEADS, N_Q, N_K, qk_scale, sm_scale,
                       BLOCK_M: gl.constexpr, KEYS: gl.constexpr, HEAD_DIM: gl.constexpr,
                       NUM_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr):
    dtype: gl.constexpr = q_smem.dtype
    HALF: gl.constexpr = HEAD_DIM // 2
    gl.static_assert(HALF == 2 * CHUNK, "each warpgroup's columns are two dQ chunks")
    gl.static_assert(KEYS == 64, "a program's keys are one warpgroup MMA's M")
    # Sᵀ/dPᵀ and dQᵀ chunks: 64 rows x BLOCK_M queries; dK and dV: the program's keys x this warpgroup's columns
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HALF, 16])
    offs_n = start_n + gl.arange(0, KEYS, layout=gl.SliceLayout(1, s_layout))
    diag = N_K - N_Q
    COL0: gl.constexpr = WG * HALF

    mbarrier.wait(kv_bar, 0)
    k_all = k_smem.reshape([KEYS, HEAD_DIM])
    v_all = v_smem.reshape([KEYS, HEAD_DIM])
    dk = gl.zeros([KEYS, HALF], gl.float32, kv_layout)
    dv = gl.zeros([KEYS, HALF], gl.float32, kv_layout)
    zero_s = gl.zeros([KEYS, BLOCK_M], gl.float32, s_layout)
    for t in range(GROUP_SIZE * n_m):
        hq, m, s, phase = _tile_at(t, n_m, m_lo, off_hk * GROUP_SIZE, BLOCK_M, NUM_STAGES)
        buf = t % 2
        bar_phase = (t // 2) & 1
        offs_m = m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
        row = (off_b * N_HEADS + hq).to(gl.int64) * N_Q + offs_m
        q2 = q_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
        do2 = do_smem.index(s).reshape([BLOCK_M, HEAD_DIM])
        p_buf = p_smem.index(buf)
        ds_buf = ds_smem.index(buf)
        if WG == 0:
            stat = gl.load(LSE2 + row, mask=offs_m < N_Q, other=float("inf"))
        else:
            stat = gl.load(DELTA + row, mask=offs_m < N_Q, other=0.0)
        # the next tile's product issued under this tile's (early_s, v28) lost 12-18 %
        sdp = _role_product(WG, k_all, v_all, q_smem, do_smem, q_ready, do_ready, s, phase, zero_s, BLOCK_M,
                            HEAD_DIM)
        cur = warpgroup_mma_wait(0, deps=[sdp])
        if WG == 0:   # Pᵀ from Sᵀ into shared memory
            pt = _probs(cur, stat, offs_n, offs_m, diag, qk_scale, IS_CAUSAL)
            p_buf.store(pt.to(dtype))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(p_bars.index(buf), count=1)
            mbarrier.arrive(ds_bars.index(buf), count=1)
            mbarrier.wait(do_ready.index(s), phase)
        else:   # dSᵀ from dPᵀ and warpgroup 0's Pᵀ
            mbarrier.wait(p_bars.index(buf), bar_phase)
            pt = p_buf.load(s_layout).to(gl.float32)
            ds_buf.store((pt * (cur - stat[None, :])).to(dtype))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(ds_bars.index(buf), count=1)
            mbarrier.wait(q_ready.index(s), phase)
        # this warpgroup's columns of dV and dK, and its two chunks of dQᵀ
        dv = warpgroup_mma(p_buf, do2.slice(COL0, HALF, dim=1), dv, is_async=True)
        mbarrier.wait(ds_bars.index(buf), bar_phase)
        dk = warpgroup_mma(ds_buf, q2.slice(COL0, HALF, dim=1), dk, is_async=True)
        zero_q = gl.zeros([CHUNK, BLOCK_M], gl.float32, s_layout)
        dqt0 = warpgroup_mma(k_all.slice(COL0, CHUNK, dim=1).permute([1, 0]), ds_buf, zero_q, use_acc=False,
                             is_async=True)
        dqt1 = warpgroup_mma(k_all.slice(COL0 + CHUNK, CHUNK, dim=1).permute([1, 0]), ds_buf, zero_q,
                             use_acc=False, is_async=True)
        # dV and dK were the slot's last readers (groups retire in order): release it to the load warp
        # while the dQᵀ chunks are still on the tensor cores, so the next Q and dO load under them
        dv, dk = warpgroup_mma_wait(2, deps=[dv, dk])
        mbarrier.arrive(q_empty.index(s), count=1)
        mbarrier.arrive(do_empty.index(s), count=1)
        # the previous tile's reduces have read the staging buffers by now
        tma.store_wait(0)
        dqt0, dqt1 = warpgroup_mma_wait(0, deps=[dqt0, dqt1])
        _stage_dqt(dqt0, dq_smem.index(2 * WG), dq_desc, off_b, hq, m, COL0, BLOCK_M)
        _stage_dqt(dqt1, dq_smem.index(2 * WG + 1), dq_desc, off_b, hq, m, COL0 + CHUNK, BLOCK_M)
    tma.store_wait(0)

    # this warpgroup's columns of dK and dV (rows past N_K dropped)
    offs_kn = start_n + gl.arange(0, KEYS, layout=gl.SliceLayout(1, kv_layout))
    ok = (offs_kn < N_K)[:, None]
    n64 = offs_kn.to(gl.int64)[:, None]
    offs_d = COL0 + gl.arange(0, HALF, layout=gl.SliceLayout(0, kv_layout))
    dk_ptrs = DK + off_b.to(gl.int64) * stride_dkb + off_hk.to(gl.int64) * stride_dkh + n64 * stride_dkn
    gl.store(dk_ptrs + offs_d[None, :], (dk * sm_scale).to(dtype), mask=ok)
    dv_ptrs = DV + off_b.to(gl.int64) * stride_dvb + off_hk.to(gl.int64) * stride_dvh + n64 * stride_dvn
    gl.store(dv_ptrs + offs_d[None, :], dv.to(dtype), mask=ok)


@gluon.jit
def _attn_bwd_hopper_split_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, DK, DV, LSE2, DELTA,
                                  stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                                  GROUP_SIZE, N_HEADS, N_Q, N_K, qk_scale, sm_scale,
                                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                                  IS_CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr, N_ROWS=1,
                                  GROUPED: gl.constexpr = False):
    """A program owns 2 * BLOCK_N keys, shared by both compute warpgroups."""
    KEYS: gl.constexpr = 2 * BLOCK_N
    pid_n, off_hk, off_b, _ = _grid_coords(N_ROWS, GROUPED)
    start_n = pid_n * KEYS
    m_lo, n_m = _query_tiles(start_n, N_Q, N_K, BLOCK_M, IS_CAUSAL)

    dtype: gl.constexpr = q_desc.dtype
    k_smem, v_smem, q_smem, do_smem = _ring_buffers(q_desc, k_desc, v_desc, do_desc, NUM_STAGES)
    pds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([KEYS, BLOCK_M], dtype)
    p_smem = gl.allocate_shared_memory(dtype, [2, KEYS, BLOCK_M], pds_layout)
    ds_smem = gl.allocate_shared_memory(dtype, [2, KEYS, BLOCK_M], pds_layout)
    # two staging buffers per warpgroup: its two dQᵀ chunks of a tile
    dq_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([CHUNK, BLOCK_M], gl.float32)
    dq_smem = gl.allocate_shared_memory(gl.float32, [4, CHUNK, BLOCK_M], dq_layout)
    # ds_bars (count 2): both warpgroups' halves of the exchange; p_bars: warpgroup 0's Pᵀ alone
    kv_bar, ds_bars, q_ready, do_ready, q_empty, do_empty = _barriers(NUM_STAGES)
    p_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(p_bars.index(i), count=1)

    # written out per partition: a tuple built by concatenation in the kernel loses its constexprs (triton 3.6)
    gl.warp_specialize([
        (_compute_partition, (0, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, kv_bar,
                              q_ready, q_empty, do_ready, do_empty, p_bars, ds_bars, dq_desc, DK, DV, LSE2, DELTA,
                              stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                              off_b, off_hk, start_n, m_lo, n_m, GROUP_SIZE, N_HEADS, N_Q, N_K, qk_scale, sm_scale,
                              BLOCK_M, KEYS, HEAD_DIM, NUM_STAGES, IS_CAUSAL)),
        (_compute_partition, (1, k_smem, v_smem, q_smem, do_smem, p_smem, ds_smem, dq_smem, kv_bar,
                              q_ready, q_empty, do_ready, do_empty, p_bars, ds_bars, dq_desc, DK, DV, LSE2, DELTA,
                              stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                              off_b, off_hk, start_n, m_lo, n_m, GROUP_SIZE, N_HEADS, N_Q, N_K, qk_scale, sm_scale,
                              BLOCK_M, KEYS, HEAD_DIM, NUM_STAGES, IS_CAUSAL)),
        (_load_partition, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_ready,
                           q_empty, do_ready, do_empty, off_b, off_hk, off_hk * GROUP_SIZE, start_n, m_lo, n_m,
                           GROUP_SIZE, BLOCK_M, NUM_STAGES, q_desc, k_desc, q_smem, k_smem, 0, 0, kv_bar,
                           False, LSE2, DELTA, q_smem, q_smem, q_ready, False)),
    ], [4, 1], [240, 24])

    _invalidate(kv_bar, ds_bars, q_ready, do_ready, q_empty, do_empty, NUM_STAGES)
    for i in gl.static_range(2):
        mbarrier.invalidate(p_bars.index(i))
