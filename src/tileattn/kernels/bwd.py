"""Backward kernels.  P is never stored: every kernel recomputes its S tile
from Q, K and the saved log-sum-exp, P = exp(S - lse).

With dS = P * (dP - delta), delta_i = sum_d dO_id * O_id (minus dlse_i when
the caller differentiates through lse), the gradients are
    dV = P^T dO,   dK = scale * dS^T Q,   dQ = scale * dS K.

The deterministic backward is three launches, no atomics, so the result is
bitwise reproducible:
  1. ``_attn_bwd_preprocess_kernel``: delta, and lse in log2 units;
  2. ``_attn_bwd_dkdv_kernel``: one program per (key block, kv head, batch)
     keeps dK/dV in registers and loops over the query heads that share the
     kv head (GQA) and over the query blocks that see the key block;
  3. ``_attn_bwd_dq_kernel``: one program per (query block, head, batch)
     keeps dQ in registers and loops over the visible key blocks.
That is 7 tile matmuls per visible tile: S and dP are computed twice.

The atomic backward (``ATOMIC_DQ``) does 5: the dK/dV kernel also forms
dS K for each tile it visits and adds it into a zeroed float32 (B, Hq, N_Q,
D) accumulator (``tl.atomic_add`` with row masks, or on Hopper the copy
engine's bulk reduce through a tensor descriptor), and
``_attn_bwd_dq_convert_kernel`` scales the sum into dQ's dtype and layout.
Float32 adds in arrival order make dQ reproducible only to rounding; dK
and dV are computed as in the deterministic backward.

The variants are the forward's constexpr switches (see kernels/fwd.py):
both gradient kernels recompute the same scores, visit only the tiles the
window or the block layout leaves visible (the dK/dV kernel walks the
layout's columns, the dQ kernel its rows), and with a softcap multiply dS by
the derivative 1 - tanh^2 of c * tanh(s / c).  Packed sequences use the
(1, H, total, D) views with per-sequence row offsets; the preprocess kernel
runs on them unchanged.
"""
import triton
import triton.language as tl

from .common import (LOG2E, add_rows, alibi_slope_log2, causal_key_bounds, causal_query_bounds, head_base, load_rows,
                     load_seq_rows, load_tile, pair_visible, scores, sequence_bounds, store_rows, tile_source,
                     window_key_bounds, window_query_bounds)



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
def _dkdv_tile(dk, dv, k, v, q_src, do_src, off_b, off_h, lse2_ptrs, delta_ptrs, offs_n, start_m,
               N_Q, N_K, qk_scale, stride_qn, stride_qd, stride_don, stride_dod,
               q_row0, q_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2,
               dq_dst, stride_dqan, stride_dqad,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
               IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
               IS_VARLEN: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
               HAS_ALIBI: tl.constexpr, ATOMIC_DQ: tl.constexpr, DQ_TMA: tl.constexpr):
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m_ok = offs_m < N_Q
    if IS_VARLEN:
        # only the masked stages reach past the sequence's last row
        q = load_seq_rows(q_src, off_b, off_h, q_row0 + start_m, q_end, stride_qn, stride_qd, BLOCK_M, HEAD_DIM,
                          BLOCK_D, MASKED, USE_TMA)
    else:
        q = load_rows(q_src, off_b, off_h, start_m, N_Q, stride_qn, stride_qd, BLOCK_M, HEAD_DIM, BLOCK_D, True,
                      USE_TMA)
    lse2 = tl.load(lse2_ptrs + offs_m, mask=m_ok, other=float("inf"))
    qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
    if HAS_SOFTCAP or HAS_ALIBI:
        s_t, t_t = scores(qk_t, offs_m[None, :], offs_n[:, None], N_K - N_Q, qk_scale, softcap_scale,
                          softcap_log2, alibi_log2, HAS_SOFTCAP, HAS_ALIBI)
        p_t = tl.math.exp2(s_t - lse2[None, :])
    else:
        p_t = tl.math.exp2(qk_t * qk_scale - lse2[None, :])
    if MASKED and (HAS_WINDOW or IS_CAUSAL):
        p_t = tl.where(pair_visible(offs_m[None, :], offs_n[:, None], N_K - N_Q, win_left, win_right, HAS_WINDOW),
                       p_t, 0.0)
    if IS_VARLEN:
        do = load_seq_rows(do_src, off_b, off_h, q_row0 + start_m, q_end, stride_don, stride_dod, BLOCK_M,
                           HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
    else:
        do = load_rows(do_src, off_b, off_h, start_m, N_Q, stride_don, stride_dod, BLOCK_M, HEAD_DIM, BLOCK_D,
                       True, USE_TMA)
    dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
    delta = tl.load(delta_ptrs + offs_m, mask=m_ok, other=0.0)
    dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
    ds_t = p_t * (dp_t - delta[None, :])
    if HAS_SOFTCAP:
        ds_t = ds_t * (1.0 - t_t * t_t)
    ds_t = ds_t.to(q.dtype)
    dk = tl.dot(ds_t, q, dk, input_precision=DOT_PRECISION)
    if ATOMIC_DQ:
        # this key block's share of dQ (unscaled: the convert kernel applies
        # the softmax scale once); rows past the sequence / N_Q are never added
        dq = tl.dot(tl.trans(ds_t), k, input_precision=DOT_PRECISION)
        add_rows(dq_dst, off_b, off_h, q_row0 + start_m, dq, q_end, stride_dqan, stride_dqad, BLOCK_M, HEAD_DIM,
                 BLOCK_D, DQ_TMA)
    return dk, dv


@triton.jit
def _dkdv_inner(dk, dv, k, v, q_src, do_src, off_b, off_h, lse2_ptrs, delta_ptrs, offs_n,
                lo, hi, N_Q, N_K, qk_scale, stride_qn, stride_qd, stride_don, stride_dod,
                q_row0, q_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, block_idx,
                dq_dst, stride_dqan, stride_dqad,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
                IS_CAUSAL: tl.constexpr = False, IS_VARLEN: tl.constexpr = False,
                HAS_WINDOW: tl.constexpr = False, HAS_SOFTCAP: tl.constexpr = False,
                HAS_ALIBI: tl.constexpr = False, BLOCK_SPARSE: tl.constexpr = False,
                MASK_BLOCK_Q: tl.constexpr = 128, ATOMIC_DQ: tl.constexpr = False, DQ_TMA: tl.constexpr = False):
    """Query tiles [lo, hi) in steps of BLOCK_M or, with BLOCK_SPARSE, the
    entries [lo, hi) of the sub-tile list of ``block_idx``."""
    if BLOCK_SPARSE:
        for it in range(lo, hi):
            sub = it % (MASK_BLOCK_Q // BLOCK_M)
            start_m = tl.load(block_idx + it // (MASK_BLOCK_Q // BLOCK_M)) * MASK_BLOCK_Q + sub * BLOCK_M
            dk, dv = _dkdv_tile(dk, dv, k, v, q_src, do_src, off_b, off_h, lse2_ptrs, delta_ptrs, offs_n, start_m,
                                N_Q, N_K, qk_scale, stride_qn, stride_qd, stride_don, stride_dod,
                                q_row0, q_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2,
                                dq_dst, stride_dqan, stride_dqad,
                                HEAD_DIM, BLOCK_D, BLOCK_M, IS_CAUSAL, MASKED, DOT_PRECISION, USE_TMA,
                                IS_VARLEN, HAS_WINDOW, HAS_SOFTCAP, HAS_ALIBI, ATOMIC_DQ, DQ_TMA)
    else:
        for start_m in range(lo, hi, BLOCK_M):
            dk, dv = _dkdv_tile(dk, dv, k, v, q_src, do_src, off_b, off_h, lse2_ptrs, delta_ptrs, offs_n, start_m,
                                N_Q, N_K, qk_scale, stride_qn, stride_qd, stride_don, stride_dod,
                                q_row0, q_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2,
                                dq_dst, stride_dqan, stride_dqad,
                                HEAD_DIM, BLOCK_D, BLOCK_M, IS_CAUSAL, MASKED, DOT_PRECISION, USE_TMA,
                                IS_VARLEN, HAS_WINDOW, HAS_SOFTCAP, HAS_ALIBI, ATOMIC_DQ, DQ_TMA)
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
    # variants (None / unused unless their switch is on); the block lists are
    # the layout's columns: per key block, the visible query blocks
    CU_SEQLENS_Q=None, CU_SEQLENS_K=None,
    win_left=None, win_right=None,
    softcap_scale=None, softcap_log2=None,
    ALIBI=None, stride_ab=None, stride_ah=None,
    BS_FULL_NUM=None, BS_FULL_IDX=None, BS_PART_NUM=None, BS_PART_IDX=None,
    stride_bs_nb=None, stride_bs_nh=None, stride_bs_ib=None, stride_bs_ih=None, stride_bs_ir=None,
    IS_VARLEN: tl.constexpr = False, HAS_WINDOW: tl.constexpr = False, HAS_SOFTCAP: tl.constexpr = False,
    HAS_ALIBI: tl.constexpr = False, BLOCK_SPARSE: tl.constexpr = False,
    MASK_BLOCK_Q: tl.constexpr = 128, MASK_BLOCK_K: tl.constexpr = 128,
    # ATOMIC_DQ: also add each tile's dS K into DQ_ACC, a zeroed float32
    # (B, Hq, N_Q, D) accumulator (a tensor descriptor with DQ_TMA)
    DQ_ACC=None, stride_dqab=None, stride_dqah=None, stride_dqan=None, stride_dqad=None,
    ATOMIC_DQ: tl.constexpr = False, DQ_TMA: tl.constexpr = False,
):
    pid_n = tl.program_id(0)
    off_hk = tl.program_id(1)
    off_b = tl.program_id(2)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)

    if IS_VARLEN:
        q_row0, n_q, k_row0, n_k = sequence_bounds(CU_SEQLENS_Q, CU_SEQLENS_K, off_b)
        if start_n >= n_k:
            return
        t_b = 0
        q_end = q_row0 + n_q
        k_src = tile_source(K, t_b, off_hk, stride_kb, stride_kh, USE_TMA)
        v_src = tile_source(V, t_b, off_hk, stride_vb, stride_vh, USE_TMA)
        k = load_rows(k_src, t_b, off_hk, k_row0 + start_n, k_row0 + n_k, stride_kn, stride_kd, BLOCK_N, HEAD_DIM,
                      BLOCK_D, True, USE_TMA)
        v = load_rows(v_src, t_b, off_hk, k_row0 + start_n, k_row0 + n_k, stride_vn, stride_vd, BLOCK_N, HEAD_DIM,
                      BLOCK_D, True, USE_TMA)
        if ATOMIC_DQ and USE_TMA:
            # descriptors return the next sequence's keys past this one's end:
            # harmless for dK/dV (those rows are not stored), not for dS K
            kv_ok = (offs_n < n_k)[:, None]
            k = tl.where(kv_ok, k, tl.zeros_like(k))
            v = tl.where(kv_ok, v, tl.zeros_like(v))
    else:
        t_b = off_b
        n_q = N_Q
        n_k = N_K
        q_row0 = 0
        q_end = N_Q
        k_src = tile_source(K, off_b, off_hk, stride_kb, stride_kh, USE_TMA)
        v_src = tile_source(V, off_b, off_hk, stride_vb, stride_vh, USE_TMA)
        k = load_rows(k_src, off_b, off_hk, start_n, N_K, stride_kn, stride_kd, BLOCK_N, HEAD_DIM, BLOCK_D, True,
                      USE_TMA)
        v = load_rows(v_src, off_b, off_hk, start_n, N_K, stride_vn, stride_vd, BLOCK_N, HEAD_DIM, BLOCK_D, True,
                      USE_TMA)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    # query tiles [lo, full_start) masked, [full_start, full_end) unmasked,
    # [full_end, hi) masked (the window's upper edge)
    if HAS_WINDOW:
        lo, full_start, full_end, hi = window_query_bounds(start_n, n_q, n_k, win_left, win_right, BLOCK_M, BLOCK_N)
    else:
        lo, full_start = causal_query_bounds(start_n, n_q, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
        full_end = n_q
        hi = n_q
    if IS_VARLEN:
        # a sequence's last, partial query tile runs in the masked stage, whose
        # loads zero the rows past the sequence
        full_end = tl.maximum(tl.minimum(full_end, (n_q // BLOCK_M) * BLOCK_M), full_start)
    for g in range(GROUP_SIZE):
        off_h = off_hk * GROUP_SIZE + g
        q_src = tile_source(Q, t_b, off_h, stride_qb, stride_qh, USE_TMA)
        do_src = tile_source(DO, t_b, off_h, stride_dob, stride_doh, USE_TMA)
        if IS_VARLEN:
            # LSE2 and DELTA are (1, H, total_q)
            row0 = off_h.to(tl.int64) * N_Q + q_row0
        else:
            row0 = (off_b.to(tl.int64) * N_HEADS + off_h) * N_Q
        alibi_log2 = alibi_slope_log2(ALIBI, off_b, off_h, stride_ab, stride_ah, HAS_ALIBI)
        if ATOMIC_DQ:
            dq_dst = tile_source(DQ_ACC, t_b, off_h, stride_dqab, stride_dqah, DQ_TMA)
        else:
            dq_dst = DQ_ACC
        if BLOCK_SPARSE:
            col = start_n // MASK_BLOCK_K
            nb = off_b * stride_bs_nb + off_h * stride_bs_nh + col
            ib = off_b.to(tl.int64) * stride_bs_ib + off_h * stride_bs_ih + col * stride_bs_ir
            dk, dv = _dkdv_inner(
                dk, dv, k, v, q_src, do_src, t_b, off_h, LSE2 + row0, DELTA + row0, offs_n,
                0, tl.load(BS_FULL_NUM + nb) * (MASK_BLOCK_Q // BLOCK_M), n_q, n_k, qk_scale,
                stride_qn, stride_qd, stride_don, stride_dod,
                q_row0, q_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, BS_FULL_IDX + ib,
                dq_dst, stride_dqan, stride_dqad,
                HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, MASKED=False, DOT_PRECISION=DOT_PRECISION,
                USE_TMA=USE_TMA, IS_CAUSAL=IS_CAUSAL, IS_VARLEN=IS_VARLEN, HAS_WINDOW=HAS_WINDOW,
                HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, BLOCK_SPARSE=True, MASK_BLOCK_Q=MASK_BLOCK_Q,
                ATOMIC_DQ=ATOMIC_DQ, DQ_TMA=DQ_TMA)
            dk, dv = _dkdv_inner(
                dk, dv, k, v, q_src, do_src, t_b, off_h, LSE2 + row0, DELTA + row0, offs_n,
                0, tl.load(BS_PART_NUM + nb) * (MASK_BLOCK_Q // BLOCK_M), n_q, n_k, qk_scale,
                stride_qn, stride_qd, stride_don, stride_dod,
                q_row0, q_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, BS_PART_IDX + ib,
                dq_dst, stride_dqan, stride_dqad,
                HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M, MASKED=True, DOT_PRECISION=DOT_PRECISION,
                USE_TMA=USE_TMA, IS_CAUSAL=IS_CAUSAL, IS_VARLEN=IS_VARLEN, HAS_WINDOW=HAS_WINDOW,
                HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, BLOCK_SPARSE=True, MASK_BLOCK_Q=MASK_BLOCK_Q,
                ATOMIC_DQ=ATOMIC_DQ, DQ_TMA=DQ_TMA)
        else:
            if IS_CAUSAL or HAS_WINDOW:
                # the causal diagonal / the window's lower edge
                dk, dv = _dkdv_inner(
                    dk, dv, k, v, q_src, do_src, t_b, off_h, LSE2 + row0, DELTA + row0, offs_n,
                    lo, full_start, n_q, n_k, qk_scale, stride_qn, stride_qd, stride_don, stride_dod,
                    q_row0, q_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, None,
                    dq_dst, stride_dqan, stride_dqad,
                    HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M,
                    MASKED=True, DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA, IS_CAUSAL=IS_CAUSAL,
                    IS_VARLEN=IS_VARLEN, HAS_WINDOW=HAS_WINDOW, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI,
                    ATOMIC_DQ=ATOMIC_DQ, DQ_TMA=DQ_TMA)
            dk, dv = _dkdv_inner(
                dk, dv, k, v, q_src, do_src, t_b, off_h, LSE2 + row0, DELTA + row0, offs_n,
                full_start, full_end, n_q, n_k, qk_scale, stride_qn, stride_qd, stride_don, stride_dod,
                q_row0, q_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, None,
                dq_dst, stride_dqan, stride_dqad,
                HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M,
                MASKED=False, DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA, IS_CAUSAL=IS_CAUSAL,
                IS_VARLEN=IS_VARLEN, HAS_WINDOW=HAS_WINDOW, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI,
                ATOMIC_DQ=ATOMIC_DQ, DQ_TMA=DQ_TMA)
            if HAS_WINDOW or IS_VARLEN:
                # the window's upper edge / the sequence's last tile
                dk, dv = _dkdv_inner(
                    dk, dv, k, v, q_src, do_src, t_b, off_h, LSE2 + row0, DELTA + row0, offs_n,
                    full_end, hi, n_q, n_k, qk_scale, stride_qn, stride_qd, stride_don, stride_dod,
                    q_row0, q_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, None,
                    dq_dst, stride_dqan, stride_dqad,
                    HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_M=BLOCK_M,
                    MASKED=True, DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA, IS_CAUSAL=IS_CAUSAL,
                    IS_VARLEN=IS_VARLEN, HAS_WINDOW=HAS_WINDOW, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI,
                    ATOMIC_DQ=ATOMIC_DQ, DQ_TMA=DQ_TMA)

    dk = dk * sm_scale
    if IS_VARLEN:
        dk_dst = tile_source(DK, t_b, off_hk, stride_dkb, stride_dkh, False)
        dv_dst = tile_source(DV, t_b, off_hk, stride_dvb, stride_dvh, False)
        store_rows(dk_dst, t_b, off_hk, k_row0 + start_n, dk, k_row0 + n_k, stride_dkn, stride_dkd,
                   BLOCK_N, HEAD_DIM, BLOCK_D, False)
        store_rows(dv_dst, t_b, off_hk, k_row0 + start_n, dv, k_row0 + n_k, stride_dvn, stride_dvd,
                   BLOCK_N, HEAD_DIM, BLOCK_D, False)
    else:
        dk_dst = tile_source(DK, off_b, off_hk, stride_dkb, stride_dkh, USE_TMA)
        dv_dst = tile_source(DV, off_b, off_hk, stride_dvb, stride_dvh, USE_TMA)
        store_rows(dk_dst, off_b, off_hk, start_n, dk, N_K, stride_dkn, stride_dkd,
                   BLOCK_N, HEAD_DIM, BLOCK_D, USE_TMA)
        store_rows(dv_dst, off_b, off_hk, start_n, dv, N_K, stride_dvn, stride_dvd,
                   BLOCK_N, HEAD_DIM, BLOCK_D, USE_TMA)


@triton.jit
def _dq_tile(dq, q, do, lse2, delta, k_src, v_src, off_b, off_hk, offs_m, offs_n, start_n,
             N_Q, N_K, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
             k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2,
             HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
             IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
             USE_TMA: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_WINDOW: tl.constexpr,
             HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    if IS_VARLEN:
        k = load_seq_rows(k_src, off_b, off_hk, k_row0 + start_n, k_end, stride_kn, stride_kd, BLOCK_N, HEAD_DIM,
                      BLOCK_D, MASKED, USE_TMA)
        v = load_seq_rows(v_src, off_b, off_hk, k_row0 + start_n, k_end, stride_vn, stride_vd, BLOCK_N, HEAD_DIM,
                      BLOCK_D, MASKED, USE_TMA)
    else:
        k = load_rows(k_src, off_b, off_hk, start_n, N_K, stride_kn, stride_kd, BLOCK_N, HEAD_DIM, BLOCK_D, MASKED,
                      USE_TMA)
        v = load_rows(v_src, off_b, off_hk, start_n, N_K, stride_vn, stride_vd, BLOCK_N, HEAD_DIM, BLOCK_D, MASKED,
                      USE_TMA)
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if HAS_SOFTCAP or HAS_ALIBI:
        s, t = scores(qk, offs_m[:, None], (start_n + offs_n)[None, :], N_K - N_Q, qk_scale, softcap_scale,
                      softcap_log2, alibi_log2, HAS_SOFTCAP, HAS_ALIBI)
        p = tl.math.exp2(s - lse2[:, None])
    else:
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
    if MASKED:
        n_idx = start_n + offs_n
        visible = (n_idx < N_K)[None, :]
        if HAS_WINDOW or IS_CAUSAL:
            visible = visible & pair_visible(offs_m[:, None], n_idx[None, :], N_K - N_Q, win_left, win_right,
                                             HAS_WINDOW)
        p = tl.where(visible, p, 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    ds = p * (dp - delta[:, None])
    if HAS_SOFTCAP:
        ds = ds * (1.0 - t * t)
    dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _dq_inner(dq, q, do, lse2, delta, k_src, v_src, off_b, off_hk, offs_m, offs_n,
              lo, hi, N_Q, N_K, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
              k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, block_idx,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
              IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
              USE_TMA: tl.constexpr, IS_VARLEN: tl.constexpr = False, HAS_WINDOW: tl.constexpr = False,
              HAS_SOFTCAP: tl.constexpr = False, HAS_ALIBI: tl.constexpr = False,
              BLOCK_SPARSE: tl.constexpr = False, MASK_BLOCK_K: tl.constexpr = 128):
    if BLOCK_SPARSE:
        for it in range(lo, hi):
            sub = it % (MASK_BLOCK_K // BLOCK_N)
            start_n = tl.load(block_idx + it // (MASK_BLOCK_K // BLOCK_N)) * MASK_BLOCK_K + sub * BLOCK_N
            dq = _dq_tile(dq, q, do, lse2, delta, k_src, v_src, off_b, off_hk, offs_m, offs_n, start_n,
                          N_Q, N_K, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
                          k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2,
                          HEAD_DIM, BLOCK_D, BLOCK_N, IS_CAUSAL, MASKED, DOT_PRECISION, USE_TMA,
                          IS_VARLEN, HAS_WINDOW, HAS_SOFTCAP, HAS_ALIBI)
    else:
        for start_n in range(lo, hi, BLOCK_N):
            dq = _dq_tile(dq, q, do, lse2, delta, k_src, v_src, off_b, off_hk, offs_m, offs_n, start_n,
                          N_Q, N_K, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
                          k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2,
                          HEAD_DIM, BLOCK_D, BLOCK_N, IS_CAUSAL, MASKED, DOT_PRECISION, USE_TMA,
                          IS_VARLEN, HAS_WINDOW, HAS_SOFTCAP, HAS_ALIBI)
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
    # variants (None / unused unless their switch is on); the block lists are
    # the layout's rows, as in the forward
    CU_SEQLENS_Q=None, CU_SEQLENS_K=None,
    win_left=None, win_right=None,
    softcap_scale=None, softcap_log2=None,
    ALIBI=None, stride_ab=None, stride_ah=None,
    BS_FULL_NUM=None, BS_FULL_IDX=None, BS_PART_NUM=None, BS_PART_IDX=None,
    stride_bs_nb=None, stride_bs_nh=None, stride_bs_ib=None, stride_bs_ih=None, stride_bs_ir=None,
    IS_VARLEN: tl.constexpr = False, HAS_WINDOW: tl.constexpr = False, HAS_SOFTCAP: tl.constexpr = False,
    HAS_ALIBI: tl.constexpr = False, BLOCK_SPARSE: tl.constexpr = False,
    MASK_BLOCK_Q: tl.constexpr = 128, MASK_BLOCK_K: tl.constexpr = 128,
):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    off_hk = off_h // GROUP_SIZE
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)

    if IS_VARLEN:
        q_row0, n_q, k_row0, n_k = sequence_bounds(CU_SEQLENS_Q, CU_SEQLENS_K, off_b)
        if start_m >= n_q:
            return
        t_b = 0
        k_end = k_row0 + n_k
        m_ok = offs_m < n_q
        q_src = tile_source(Q, t_b, off_h, stride_qb, stride_qh, USE_TMA)
        do_src = tile_source(DO, t_b, off_h, stride_dob, stride_doh, USE_TMA)
        k_src = tile_source(K, t_b, off_hk, stride_kb, stride_kh, USE_TMA)
        v_src = tile_source(V, t_b, off_hk, stride_vb, stride_vh, USE_TMA)
        q = load_rows(q_src, t_b, off_h, q_row0 + start_m, q_row0 + n_q, stride_qn, stride_qd, BLOCK_M, HEAD_DIM,
                      BLOCK_D, True, USE_TMA)
        do = load_rows(do_src, t_b, off_h, q_row0 + start_m, q_row0 + n_q, stride_don, stride_dod, BLOCK_M,
                       HEAD_DIM, BLOCK_D, True, USE_TMA)
        row0 = off_h.to(tl.int64) * N_Q + q_row0
    else:
        t_b = off_b
        n_q = N_Q
        n_k = N_K
        k_row0 = 0
        k_end = N_K
        m_ok = offs_m < N_Q
        q_src = tile_source(Q, off_b, off_h, stride_qb, stride_qh, USE_TMA)
        do_src = tile_source(DO, off_b, off_h, stride_dob, stride_doh, USE_TMA)
        k_src = tile_source(K, off_b, off_hk, stride_kb, stride_kh, USE_TMA)
        v_src = tile_source(V, off_b, off_hk, stride_vb, stride_vh, USE_TMA)
        q = load_rows(q_src, off_b, off_h, start_m, N_Q, stride_qn, stride_qd, BLOCK_M, HEAD_DIM, BLOCK_D, True,
                      USE_TMA)
        do = load_rows(do_src, off_b, off_h, start_m, N_Q, stride_don, stride_dod, BLOCK_M, HEAD_DIM, BLOCK_D,
                       True, USE_TMA)
        row0 = (off_b.to(tl.int64) * N_HEADS + off_h) * N_Q
    lse2 = tl.load(LSE2 + row0 + offs_m, mask=m_ok, other=float("inf"))
    delta = tl.load(DELTA + row0 + offs_m, mask=m_ok, other=0.0)
    alibi_log2 = alibi_slope_log2(ALIBI, off_b, off_h, stride_ab, stride_ah, HAS_ALIBI)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if BLOCK_SPARSE:
        row = start_m // MASK_BLOCK_Q
        nb = off_b * stride_bs_nb + off_h * stride_bs_nh + row
        ib = off_b.to(tl.int64) * stride_bs_ib + off_h * stride_bs_ih + row * stride_bs_ir
        dq = _dq_inner(
            dq, q, do, lse2, delta, k_src, v_src, t_b, off_hk, offs_m, offs_n,
            0, tl.load(BS_FULL_NUM + nb) * (MASK_BLOCK_K // BLOCK_N), n_q, n_k, qk_scale,
            stride_kn, stride_kd, stride_vn, stride_vd,
            k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, BS_FULL_IDX + ib,
            HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, IS_CAUSAL=IS_CAUSAL, MASKED=False,
            DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA, IS_VARLEN=IS_VARLEN, HAS_WINDOW=HAS_WINDOW,
            HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, BLOCK_SPARSE=True, MASK_BLOCK_K=MASK_BLOCK_K)
        dq = _dq_inner(
            dq, q, do, lse2, delta, k_src, v_src, t_b, off_hk, offs_m, offs_n,
            0, tl.load(BS_PART_NUM + nb) * (MASK_BLOCK_K // BLOCK_N), n_q, n_k, qk_scale,
            stride_kn, stride_kd, stride_vn, stride_vd,
            k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, BS_PART_IDX + ib,
            HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, IS_CAUSAL=IS_CAUSAL, MASKED=True,
            DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA, IS_VARLEN=IS_VARLEN, HAS_WINDOW=HAS_WINDOW,
            HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, BLOCK_SPARSE=True, MASK_BLOCK_K=MASK_BLOCK_K)
    else:
        if HAS_WINDOW:
            lo, full_lo, full_end, hi = window_key_bounds(start_m, n_q, n_k, win_left, win_right, BLOCK_M, BLOCK_N)
            dq = _dq_inner(
                dq, q, do, lse2, delta, k_src, v_src, t_b, off_hk, offs_m, offs_n,
                lo, full_lo, n_q, n_k, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
                k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, None,
                HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, IS_CAUSAL=IS_CAUSAL, MASKED=True,
                DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA, IS_VARLEN=IS_VARLEN, HAS_WINDOW=HAS_WINDOW,
                HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI)
        else:
            full_lo = 0
            full_end, hi = causal_key_bounds(start_m, n_q, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
        dq = _dq_inner(
            dq, q, do, lse2, delta, k_src, v_src, t_b, off_hk, offs_m, offs_n,
            full_lo, full_end, n_q, n_k, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
            k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, None,
            HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
            IS_CAUSAL=IS_CAUSAL, MASKED=False, DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA,
            IS_VARLEN=IS_VARLEN, HAS_WINDOW=HAS_WINDOW, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI)
        dq = _dq_inner(
            dq, q, do, lse2, delta, k_src, v_src, t_b, off_hk, offs_m, offs_n,
            full_end, hi, n_q, n_k, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
            k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, None,
            HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
            IS_CAUSAL=IS_CAUSAL, MASKED=True, DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA,
            IS_VARLEN=IS_VARLEN, HAS_WINDOW=HAS_WINDOW, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI)
    dq = dq * sm_scale
    if IS_VARLEN:
        dq_dst = tile_source(DQ, t_b, off_h, stride_dqb, stride_dqh, False)
        store_rows(dq_dst, t_b, off_h, q_row0 + start_m, dq, q_row0 + n_q, stride_dqn, stride_dqd,
                   BLOCK_M, HEAD_DIM, BLOCK_D, False)
    else:
        dq_dst = tile_source(DQ, off_b, off_h, stride_dqb, stride_dqh, USE_TMA)
        store_rows(dq_dst, off_b, off_h, start_m, dq, N_Q, stride_dqn, stride_dqd,
                   BLOCK_M, HEAD_DIM, BLOCK_D, USE_TMA)


@triton.jit
def _attn_bwd_dq_convert_kernel(
    DQ_ACC, DQ,
    stride_dqab, stride_dqah, stride_dqan, stride_dqad,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    N_Q, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """dQ = scale * the float32 accumulator the atomic dK/dV kernel added
    into, in dQ's dtype and strides: every row of dQ is written."""
    pid_m = tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    start_m = pid_m * BLOCK_M
    acc_src = head_base(DQ_ACC, off_b, off_h, stride_dqab, stride_dqah)
    dq = load_rows(acc_src, off_b, off_h, start_m, N_Q, stride_dqan, stride_dqad, BLOCK_M, HEAD_DIM, BLOCK_D, True,
                   False)
    dq_dst = head_base(DQ, off_b, off_h, stride_dqb, stride_dqh)
    store_rows(dq_dst, off_b, off_h, start_m, dq * sm_scale, N_Q, stride_dqn, stride_dqd, BLOCK_M, HEAD_DIM,
               BLOCK_D, False)
