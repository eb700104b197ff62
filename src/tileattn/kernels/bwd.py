"""Backward kernels.  P is never stored: every kernel recomputes its S tile
from Q, K and the saved log-sum-exp, P = exp(S - lse).

With dS = P * (dP - delta), delta_i = sum_d dO_id * O_id (minus dlse_i when
the caller differentiates through lse), the gradients are
    dV = P^T dO,   dK = scale * dS^T Q,   dQ = scale * dS K.

Three launches, no atomics, so the result is bitwise reproducible:
  1. ``_attn_bwd_preprocess_kernel``: delta, and lse in log2 units;
  2. ``_attn_bwd_dkdv_kernel``: one program per (key block, kv head, batch)
     keeps dK/dV in registers and loops over the query heads that share the
     kv head (GQA) and over the query blocks that see the key block;
  3. ``_attn_bwd_dq_kernel``: one program per (query block, head, batch)
     keeps dQ in registers and loops over the visible key blocks.
"""
import triton
import triton.language as tl

from .common import (causal_key_bounds, causal_query_bounds, head_base, load_rows, load_tile, store_rows,
                     tile_source)

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _attn_bwd_preprocess_kernel(
    O, DO, LSE, DLSE, DELTA, LSE2,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_dob, stride_doh, stride_don, stride_dod,
    N_HEADS, N_Q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    HAS_DLSE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < N_Q
    d_ok = offs_d < HEAD_DIM
    o_ptrs = (head_base(O, off_b, off_h, stride_ob, stride_oh)
              + offs_m[:, None].to(tl.int64) * stride_on + offs_d[None, :] * stride_od)
    do_ptrs = (head_base(DO, off_b, off_h, stride_dob, stride_doh)
               + offs_m[:, None].to(tl.int64) * stride_don + offs_d[None, :] * stride_dod)
    o = load_tile(o_ptrs, m_ok, d_ok, True, HEAD_DIM != BLOCK_D).to(tl.float32)
    do = load_tile(do_ptrs, m_ok, d_ok, True, HEAD_DIM != BLOCK_D).to(tl.float32)
    delta = tl.sum(o * do, axis=1)
    # LSE, DLSE, DELTA, LSE2 are contiguous (B, H, N_Q)
    row = (off_b.to(tl.int64) * N_HEADS + off_h) * N_Q + offs_m
    if HAS_DLSE:
        delta -= tl.load(DLSE + row, mask=m_ok, other=0.0)
    lse = tl.load(LSE + row, mask=m_ok, other=0.0)
    # rows that saw no key (lse = -inf) get +inf: P = exp2(s - inf) = 0, no NaN
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
    tl.store(DELTA + row, delta, mask=m_ok)
    tl.store(LSE2 + row, lse2, mask=m_ok)


@triton.jit
def _dkdv_inner(dk, dv, k, v, q_src, do_src, off_b, off_h, lse2_ptrs, delta_ptrs, offs_n,
                lo, hi, N_Q, N_K, qk_scale, stride_qn, stride_qd, stride_don, stride_dod,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr):
    rows = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + rows
        m_ok = offs_m < N_Q
        q = load_rows(q_src, off_b, off_h, start_m, N_Q, stride_qn, stride_qd, BLOCK_M, HEAD_DIM, BLOCK_D, True,
                      USE_TMA)
        lse2 = tl.load(lse2_ptrs + offs_m, mask=m_ok, other=float("inf"))
        qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
        p_t = tl.math.exp2(qk_t * qk_scale - lse2[None, :])
        if MASKED:
            visible = offs_n[:, None] <= offs_m[None, :] + (N_K - N_Q)
            p_t = tl.where(visible, p_t, 0.0)
        do = load_rows(do_src, off_b, off_h, start_m, N_Q, stride_don, stride_dod, BLOCK_M, HEAD_DIM, BLOCK_D, True,
                       USE_TMA)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        delta = tl.load(delta_ptrs + offs_m, mask=m_ok, other=0.0)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(
    Q, K, V, DO, LSE2, DELTA, DK, DV,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    N_HEADS, GROUP_SIZE, N_Q, N_K, sm_scale, qk_scale,
    N_Q_BUCKET, N_K_BUCKET,  # autotune keys only
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
):
    pid_n = tl.program_id(0)
    off_hk = tl.program_id(1)
    off_b = tl.program_id(2)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)

    k_src = tile_source(K, off_b, off_hk, stride_kb, stride_kh, USE_TMA)
    v_src = tile_source(V, off_b, off_hk, stride_vb, stride_vh, USE_TMA)
    k = load_rows(k_src, off_b, off_hk, start_n, N_K, stride_kn, stride_kd, BLOCK_N, HEAD_DIM, BLOCK_D, True, USE_TMA)
    v = load_rows(v_src, off_b, off_hk, start_n, N_K, stride_vn, stride_vd, BLOCK_N, HEAD_DIM, BLOCK_D, True, USE_TMA)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    lo, full_start = causal_query_bounds(start_n, N_Q, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
    for g in range(GROUP_SIZE):
        off_h = off_hk * GROUP_SIZE + g
        q_src = tile_source(Q, off_b, off_h, stride_qb, stride_qh, USE_TMA)
        do_src = tile_source(DO, off_b, off_h, stride_dob, stride_doh, USE_TMA)
        row0 = (off_b.to(tl.int64) * N_HEADS + off_h) * N_Q
        if IS_CAUSAL:
            dk, dv = _dkdv_inner(
                dk, dv, k, v, q_src, do_src, off_b, off_h, LSE2 + row0, DELTA + row0, offs_n,
                lo, full_start, N_Q, N_K, qk_scale, stride_qn, stride_qd, stride_don, stride_dod,
                HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M,
                MASKED=True, DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA)
        dk, dv = _dkdv_inner(
            dk, dv, k, v, q_src, do_src, off_b, off_h, LSE2 + row0, DELTA + row0, offs_n,
            full_start, N_Q, N_Q, N_K, qk_scale, stride_qn, stride_qd, stride_don, stride_dod,
            HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M,
            MASKED=False, DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA)

    dk = dk * sm_scale
    dk_dst = tile_source(DK, off_b, off_hk, stride_dkb, stride_dkh, USE_TMA)
    dv_dst = tile_source(DV, off_b, off_hk, stride_dvb, stride_dvh, USE_TMA)
    store_rows(dk_dst, off_b, off_hk, start_n, dk, N_K, stride_dkn, stride_dkd,
               BLOCK_N, HEAD_DIM, BLOCK_D, USE_TMA)
    store_rows(dv_dst, off_b, off_hk, start_n, dv, N_K, stride_dvn, stride_dvd,
               BLOCK_N, HEAD_DIM, BLOCK_D, USE_TMA)


@triton.jit
def _dq_inner(dq, q, do, lse2, delta, k_src, v_src, off_b, off_hk, offs_m, offs_n,
              lo, hi, N_Q, N_K, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
              IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
              USE_TMA: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        k = load_rows(k_src, off_b, off_hk, start_n, N_K, stride_kn, stride_kd, BLOCK_N, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        v = load_rows(v_src, off_b, off_hk, start_n, N_K, stride_vn, stride_vd, BLOCK_N, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASKED:
            n_idx = start_n + offs_n
            visible = (n_idx < N_K)[None, :]
            if IS_CAUSAL:
                visible = visible & (n_idx[None, :] <= offs_m[:, None] + (N_K - N_Q))
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _attn_bwd_dq_kernel(
    Q, K, V, DO, LSE2, DELTA, DQ,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    N_HEADS, GROUP_SIZE, N_Q, N_K, sm_scale, qk_scale,
    N_Q_BUCKET, N_K_BUCKET,  # autotune keys only
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    off_hk = off_h // GROUP_SIZE
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    m_ok = offs_m < N_Q

    q_src = tile_source(Q, off_b, off_h, stride_qb, stride_qh, USE_TMA)
    do_src = tile_source(DO, off_b, off_h, stride_dob, stride_doh, USE_TMA)
    k_src = tile_source(K, off_b, off_hk, stride_kb, stride_kh, USE_TMA)
    v_src = tile_source(V, off_b, off_hk, stride_vb, stride_vh, USE_TMA)
    q = load_rows(q_src, off_b, off_h, start_m, N_Q, stride_qn, stride_qd, BLOCK_M, HEAD_DIM, BLOCK_D, True, USE_TMA)
    do = load_rows(do_src, off_b, off_h, start_m, N_Q, stride_don, stride_dod, BLOCK_M, HEAD_DIM, BLOCK_D, True,
                   USE_TMA)
    row0 = (off_b.to(tl.int64) * N_HEADS + off_h) * N_Q
    lse2 = tl.load(LSE2 + row0 + offs_m, mask=m_ok, other=float("inf"))
    delta = tl.load(DELTA + row0 + offs_m, mask=m_ok, other=0.0)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    full_end, hi = causal_key_bounds(start_m, N_Q, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
    dq = _dq_inner(
        dq, q, do, lse2, delta, k_src, v_src, off_b, off_hk, offs_m, offs_n,
        0, full_end, N_Q, N_K, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
        HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
        IS_CAUSAL=IS_CAUSAL, MASKED=False, DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA)
    dq = _dq_inner(
        dq, q, do, lse2, delta, k_src, v_src, off_b, off_hk, offs_m, offs_n,
        full_end, hi, N_Q, N_K, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
        HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
        IS_CAUSAL=IS_CAUSAL, MASKED=True, DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA)
    dq = dq * sm_scale
    dq_dst = tile_source(DQ, off_b, off_h, stride_dqb, stride_dqh, USE_TMA)
    store_rows(dq_dst, off_b, off_h, start_m, dq, N_Q, stride_dqn, stride_dqd,
               BLOCK_M, HEAD_DIM, BLOCK_D, USE_TMA)
