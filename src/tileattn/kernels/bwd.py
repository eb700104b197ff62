"""Backward kernels.  P is never stored: every kernel recomputes its S tile
from Q, K and the saved log-sum-exp, P = exp(S - lse).

With dS = P * (dP - delta), delta_i = sum_d dO_id * O_id (minus dlse_i when
the caller differentiates through lse), the gradients are
    dV = P^T dO,   dK = scale * dS^T Q,   dQ = scale * dS K.

The deterministic backward is three launches, no atomics, so the result is
bitwise reproducible:
  1. ``_attn_bwd_preprocess_kernel``: delta, and lse in log2 units (with
     sinks, delta from O plus its rounding remainder when the forward kept it);
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

V, dO and dV have their own head dim ``HEAD_DIM_V`` (tile width
``BLOCK_DV``), which may differ from that of Q, K, dQ and dK; delta sums
over it.
"""
import triton
import triton.language as tl

from .common import (LOG2E, STAGE_MASKED, add_rows, alibi_slope_log2, head_base, key_stages,
                     load_rows, load_tile, mask_keys, pair_visible, query_block_program, query_stages, scores,
                     sequence_span, sparse_stages, stage_tile_start, stage_walk, store_rows, tile_source)
from .remainder import decode_remainder


@triton.jit
def _attn_bwd_preprocess_kernel(
    O, DO, LSE, DLSE, DELTA, LSE2,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_dob, stride_doh, stride_don, stride_dod, stride_sh,
    N_HEADS, N_Q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    HAS_DLSE: tl.constexpr,
    O_LO=None, stride_lob=None, stride_loh=None, stride_lon=None, stride_lod=None, HAS_O_LO: tl.constexpr = False,
    SINKS=None, DSINK_PART=None, SINK_GRAD: tl.constexpr = False,
):
    # O and dO are (B, H, N_Q, Dv): HEAD_DIM / BLOCK_D here are V's head dim; with
    # HAS_O_LO, O_LO holds the int8 code of O's rounding remainder (the forward's float32 O is
    # the float32 with bits bits(O) + O_LO * 2^(15 - mantissa bits), tileattn.sinks).
    # SINK_GRAD (with HAS_O_LO: delta is then exact): the block's share of the sink's
    # gradient, -sum_i exp(sink_h - lse_i) delta_i, into DSINK_PART[b, h, block]
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
    if HAS_O_LO:
        lo_ptrs = (head_base(O_LO, off_b, off_h, stride_lob, stride_loh)
                   + offs_m[:, None].to(tl.int64) * stride_lon + offs_d[None, :] * stride_lod)
        code = load_tile(lo_ptrs, m_ok, d_ok, True, HEAD_DIM != BLOCK_D)
        o = decode_remainder(o, code, O.dtype.element_ty.fp_mantissa_width)
    delta = tl.sum(o * do, axis=1)
    # LSE, DLSE are contiguous (B, H, N_Q); DELTA, LSE2 (B, H, N_Q) with rows stride_sh apart
    # (N_Q, or padded for the Hopper backward's copy engine)
    row = (off_b.to(tl.int64) * N_HEADS + off_h) * N_Q + offs_m
    out_row = (off_b.to(tl.int64) * N_HEADS + off_h) * stride_sh + offs_m
    if HAS_DLSE:
        delta -= tl.load(DLSE + row, mask=m_ok, other=0.0)
    lse = tl.load(LSE + row, mask=m_ok, other=0.0)
    # rows that saw no key (lse = -inf) get +inf: P = exp2(s - inf) = 0, no NaN
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
    tl.store(DELTA + out_row, delta, mask=m_ok)
    tl.store(LSE2 + out_row, lse2, mask=m_ok)
    if SINK_GRAD:
        sink = tl.load(SINKS + off_h).to(tl.float32)
        p_sink = tl.where(m_ok & (lse != float("-inf")), tl.exp(sink - lse), 0.0)
        part = -tl.sum(p_sink * delta, axis=0)
        tl.store(DSINK_PART + (off_b.to(tl.int64) * N_HEADS + off_h) * tl.num_programs(0) + pid_m, part)


@triton.jit
def _dkdv_stage(dk, dv, k, v, q_head, do_head, dq_head, lse2_ptrs, delta_ptrs, ds_sum_ptrs, offs_n, stage, span,
                var, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
                MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
                IS_CAUSAL: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_WINDOW: tl.constexpr,
                HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, BLOCK_SPARSE: tl.constexpr,
                MASK_BLOCK_Q: tl.constexpr, ATOMIC_DQ: tl.constexpr, DQ_TMA: tl.constexpr,
                SUM_DS: tl.constexpr):
    """One stage of the query walk of a key block: query tiles [lo, hi) in
    steps of BLOCK_M or, with BLOCK_SPARSE, the entries [lo, hi) of the
    stage's sub-tile list.  ``q_head``/``do_head``/``dq_head``: where the Q
    and dO tiles come from and dQ's share goes (``common.load_rows``);
    ``span``: (N_Q, N_K, first query row, end of the queries) of this
    sequence; ``var``: the scale and the variants' runtime parameters.
    With ``SUM_DS`` (atomic dQ only) each tile's sum over its keys of dS
    (before the softcap factor) is added into the query rows' float32 slots
    at ``ds_sum_ptrs``."""
    N_Q, N_K, q_row0, q_end = span
    qk_scale, win_left, win_right, softcap_scale, softcap_log2, alibi_log2 = var
    # packed: only the masked stages reach past the sequence's last row
    CHECK_ROWS: tl.constexpr = MASKED or not IS_VARLEN
    lo, hi, blocks = stage_walk(stage, MASK_BLOCK_Q // BLOCK_M, BLOCK_SPARSE)
    for it in range(lo, hi, 1 if BLOCK_SPARSE else BLOCK_M):
        start_m = stage_tile_start(it, blocks, BLOCK_M, MASK_BLOCK_Q, BLOCK_SPARSE)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_ok = offs_m < N_Q
        q = load_rows(q_head, q_row0 + start_m, q_end, BLOCK_M, HEAD_DIM, BLOCK_D, CHECK_ROWS, USE_TMA,
                      PACKED=IS_VARLEN)
        lse2 = tl.load(lse2_ptrs + offs_m, mask=m_ok, other=float("inf"))
        qk_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
        if HAS_SOFTCAP or HAS_ALIBI:
            s_t, t_t = scores(qk_t, offs_m[None, :], offs_n[:, None], N_K - N_Q, qk_scale, softcap_scale,
                              softcap_log2, alibi_log2, HAS_SOFTCAP, HAS_ALIBI)
            p_t = tl.math.exp2(s_t - lse2[None, :])
        else:
            p_t = tl.math.exp2(qk_t * qk_scale - lse2[None, :])
        if MASKED and (HAS_WINDOW or IS_CAUSAL):
            p_t = tl.where(pair_visible(offs_m[None, :], offs_n[:, None], N_K - N_Q, win_left, win_right,
                                        HAS_LEFT=HAS_WINDOW), p_t, 0.0)
        do = load_rows(do_head, q_row0 + start_m, q_end, BLOCK_M, HEAD_DIM_V, BLOCK_DV, CHECK_ROWS, USE_TMA,
                       PACKED=IS_VARLEN)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        delta = tl.load(delta_ptrs + offs_m, mask=m_ok, other=0.0)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        if SUM_DS:
            # keys past N_K load as zeros, so their P is not 0: kept out of the row sums
            ds_keys = tl.where((offs_n < N_K)[:, None], ds_t, 0.0)
            tl.atomic_add(ds_sum_ptrs + offs_m, tl.sum(ds_keys, axis=0), mask=m_ok, sem="relaxed")
        if HAS_SOFTCAP:
            ds_t = ds_t * (1.0 - t_t * t_t)
        ds_t = ds_t.to(q.dtype)
        dk = tl.dot(ds_t, q, dk, input_precision=DOT_PRECISION)
        if ATOMIC_DQ:
            # this key block's share of dQ (unscaled: the convert kernel applies
            # the softmax scale once); rows past the sequence / N_Q are never added
            dq = tl.dot(tl.trans(ds_t), k, input_precision=DOT_PRECISION)
            add_rows(dq_head, q_row0 + start_m, dq, q_end, BLOCK_M, HEAD_DIM, BLOCK_D, DQ_TMA)
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
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
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
    # SUM_DS (with ATOMIC_DQ): add each query row's sum over this block's keys
    # of dS into DS_SUM, zeroed float32 (B, Hq, N_Q) (the sinks' gradient)
    DS_SUM=None, SUM_DS: tl.constexpr = False,
):
    pid_n = tl.program_id(0)
    off_hk = tl.program_id(1)
    off_b = tl.program_id(2)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)

    # packed sequences: batch t_b of the (1, H, total, D) views, rows from
    # q_row0 / k_row0; dense: batch off_b, rows from 0
    t_b, q_row0, n_q, k_row0, n_k = sequence_span(CU_SEQLENS_Q, CU_SEQLENS_K, off_b, N_Q, N_K, IS_VARLEN)
    if IS_VARLEN and start_n >= n_k:
        return
    span = (n_q, n_k, q_row0, q_row0 + n_q)
    k_head = (tile_source(K, t_b, off_hk, stride_kb, stride_kh, USE_TMA), t_b, off_hk, stride_kn, stride_kd)
    v_head = (tile_source(V, t_b, off_hk, stride_vb, stride_vh, USE_TMA), t_b, off_hk, stride_vn, stride_vd)
    k = load_rows(k_head, k_row0 + start_n, k_row0 + n_k, BLOCK_N, HEAD_DIM, BLOCK_D, True, USE_TMA)
    v = load_rows(v_head, k_row0 + start_n, k_row0 + n_k, BLOCK_N, HEAD_DIM_V, BLOCK_DV, True, USE_TMA)
    if IS_VARLEN and ATOMIC_DQ and USE_TMA:
        # descriptors return the next sequence's keys past this one's end:
        # harmless for dK/dV (those rows are not stored), not for dS K
        kv_ok = (offs_n < n_k)[:, None]
        k = tl.where(kv_ok, k, tl.zeros_like(k))
        v = tl.where(kv_ok, v, tl.zeros_like(v))
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    if not BLOCK_SPARSE:
        stages = query_stages(start_n, n_q, n_k, win_left, win_right, BLOCK_M, BLOCK_N, IS_CAUSAL, HAS_WINDOW,
                              IS_VARLEN)
    # the masked head is the causal diagonal / the window's lower edge, the
    # masked tail the window's upper edge / a packed sequence's last tile
    HAS_STAGE: tl.constexpr = (not BLOCK_SPARSE and (IS_CAUSAL or HAS_WINDOW), True,
                               BLOCK_SPARSE or HAS_WINDOW or IS_VARLEN)
    for g in range(GROUP_SIZE):
        off_h = off_hk * GROUP_SIZE + g
        q_head = (tile_source(Q, t_b, off_h, stride_qb, stride_qh, USE_TMA), t_b, off_h, stride_qn, stride_qd)
        do_head = (tile_source(DO, t_b, off_h, stride_dob, stride_doh, USE_TMA), t_b, off_h, stride_don, stride_dod)
        # LSE2 and DELTA are contiguous (B, H, N_Q); packed, (1, H, total_q)
        row0 = (t_b.to(tl.int64) * N_HEADS + off_h) * N_Q + q_row0
        alibi_log2 = alibi_slope_log2(ALIBI, off_b, off_h, stride_ab, stride_ah, HAS_ALIBI)
        var = (qk_scale, win_left, win_right, softcap_scale, softcap_log2, alibi_log2)
        if ATOMIC_DQ:
            dq_head = (tile_source(DQ_ACC, t_b, off_h, stride_dqab, stride_dqah, DQ_TMA), t_b, off_h,
                       stride_dqan, stride_dqad)
        else:
            dq_head = DQ_ACC
        if BLOCK_SPARSE:
            # this key block's column of the layout: full blocks, then partial ones
            stages = sparse_stages(BS_FULL_NUM, BS_FULL_IDX, BS_PART_NUM, BS_PART_IDX,
                                   (stride_bs_nb, stride_bs_nh, stride_bs_ib, stride_bs_ih, stride_bs_ir),
                                   off_b, off_h, start_n // MASK_BLOCK_K, MASK_BLOCK_Q // BLOCK_M)
        ds_sum_ptrs = DS_SUM
        if SUM_DS:
            ds_sum_ptrs = DS_SUM + row0
        for i in tl.static_range(3):
            if HAS_STAGE[i]:
                dk, dv = _dkdv_stage(
                    dk, dv, k, v, q_head, do_head, dq_head, LSE2 + row0, DELTA + row0, ds_sum_ptrs, offs_n,
                    stages[i], span, var,
                    HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, HEAD_DIM_V=HEAD_DIM_V, BLOCK_DV=BLOCK_DV, BLOCK_M=BLOCK_M,
                    MASKED=STAGE_MASKED[i],
                    DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA, IS_CAUSAL=IS_CAUSAL, IS_VARLEN=IS_VARLEN,
                    HAS_WINDOW=HAS_WINDOW, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI,
                    BLOCK_SPARSE=BLOCK_SPARSE, MASK_BLOCK_Q=MASK_BLOCK_Q, ATOMIC_DQ=ATOMIC_DQ, DQ_TMA=DQ_TMA,
                    SUM_DS=SUM_DS)

    dk = dk * sm_scale
    # packed gradients are stored through pointers, clipped at the sequence's end
    DKV_TMA: tl.constexpr = USE_TMA and not IS_VARLEN
    dk_head = (tile_source(DK, t_b, off_hk, stride_dkb, stride_dkh, DKV_TMA), t_b, off_hk, stride_dkn, stride_dkd)
    dv_head = (tile_source(DV, t_b, off_hk, stride_dvb, stride_dvh, DKV_TMA), t_b, off_hk, stride_dvn, stride_dvd)
    store_rows(dk_head, k_row0 + start_n, dk, k_row0 + n_k, BLOCK_N, HEAD_DIM, BLOCK_D, DKV_TMA)
    store_rows(dv_head, k_row0 + start_n, dv, k_row0 + n_k, BLOCK_N, HEAD_DIM_V, BLOCK_DV, DKV_TMA)


@triton.jit
def _dq_stage(dq, ds_sum, q, do, lse2, delta, k_head, v_head, offs_m, offs_n, stage, span, var,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
              BLOCK_N: tl.constexpr,
              MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
              IS_CAUSAL: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_WINDOW: tl.constexpr,
              HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
              BLOCK_SPARSE: tl.constexpr, MASK_BLOCK_K: tl.constexpr, SUM_DS: tl.constexpr):
    """One stage of the key walk of a query block, as the forward's
    (``fwd._fwd_stage``): dQ += dS K over the stage's key tiles and, with
    ``SUM_DS``, ``ds_sum`` += each row's sum of dS (before the softcap factor)."""
    N_Q, N_K, k_row0, k_end = span
    qk_scale, win_left, win_right, softcap_scale, softcap_log2, alibi_log2 = var
    lo, hi, blocks = stage_walk(stage, MASK_BLOCK_K // BLOCK_N, BLOCK_SPARSE)
    for it in range(lo, hi, 1 if BLOCK_SPARSE else BLOCK_N):
        start_n = stage_tile_start(it, blocks, BLOCK_N, MASK_BLOCK_K, BLOCK_SPARSE)
        k = load_rows(k_head, k_row0 + start_n, k_end, BLOCK_N, HEAD_DIM, BLOCK_D, MASKED, USE_TMA,
                      PACKED=IS_VARLEN)
        v = load_rows(v_head, k_row0 + start_n, k_end, BLOCK_N, HEAD_DIM_V, BLOCK_DV, MASKED, USE_TMA,
                      PACKED=IS_VARLEN)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if HAS_SOFTCAP or HAS_ALIBI:
            s, t = scores(qk, offs_m[:, None], (start_n + offs_n)[None, :], N_K - N_Q, qk_scale, softcap_scale,
                          softcap_log2, alibi_log2, HAS_SOFTCAP, HAS_ALIBI)
            p = tl.math.exp2(s - lse2[:, None])
        else:
            p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASKED:
            p = mask_keys(p, 0.0, offs_m, start_n + offs_n, N_Q, N_K, win_left, win_right, IS_CAUSAL, HAS_WINDOW)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        if SUM_DS:
            ds_sum += tl.sum(ds, axis=1)
        if HAS_SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq, ds_sum


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
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
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
    # SUM_DS: DS_SUM (B, Hq, N_Q) float32 gets each query row's sum of dS over
    # every key (the sinks' gradient)
    DS_SUM=None, SUM_DS: tl.constexpr = False,
):
    # (as the forward's prologue)
    start_m, offs_m, offs_n, off_h, off_hk, off_b, t_b, q_row0, n_q, k_row0, n_k = query_block_program(
        CU_SEQLENS_Q, CU_SEQLENS_K, N_Q, N_K, GROUP_SIZE, BLOCK_M, BLOCK_N, IS_VARLEN)
    if IS_VARLEN and start_m >= n_q:
        return
    span = (n_q, n_k, k_row0, k_row0 + n_k)
    m_ok = offs_m < n_q
    q_head = (tile_source(Q, t_b, off_h, stride_qb, stride_qh, USE_TMA), t_b, off_h, stride_qn, stride_qd)
    do_head = (tile_source(DO, t_b, off_h, stride_dob, stride_doh, USE_TMA), t_b, off_h, stride_don, stride_dod)
    k_head = (tile_source(K, t_b, off_hk, stride_kb, stride_kh, USE_TMA), t_b, off_hk, stride_kn, stride_kd)
    v_head = (tile_source(V, t_b, off_hk, stride_vb, stride_vh, USE_TMA), t_b, off_hk, stride_vn, stride_vd)
    q = load_rows(q_head, q_row0 + start_m, q_row0 + n_q, BLOCK_M, HEAD_DIM, BLOCK_D, True, USE_TMA)
    do = load_rows(do_head, q_row0 + start_m, q_row0 + n_q, BLOCK_M, HEAD_DIM_V, BLOCK_DV, True, USE_TMA)
    # LSE2 and DELTA are contiguous (B, H, N_Q); packed, (1, H, total_q)
    row0 = (t_b.to(tl.int64) * N_HEADS + off_h) * N_Q + q_row0
    lse2 = tl.load(LSE2 + row0 + offs_m, mask=m_ok, other=float("inf"))
    delta = tl.load(DELTA + row0 + offs_m, mask=m_ok, other=0.0)
    alibi_log2 = alibi_slope_log2(ALIBI, off_b, off_h, stride_ab, stride_ah, HAS_ALIBI)
    var = (qk_scale, win_left, win_right, softcap_scale, softcap_log2, alibi_log2)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    ds_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    # with a block-sparse layout: this query block's row, full blocks then partial ones
    layout = (BS_FULL_NUM, BS_FULL_IDX, BS_PART_NUM, BS_PART_IDX,
              stride_bs_nb, stride_bs_nh, stride_bs_ib, stride_bs_ih, stride_bs_ir)
    stages = key_stages(start_m, n_q, n_k, win_left, win_right, layout, off_b, off_h, BLOCK_M, BLOCK_N, IS_CAUSAL,
                        HAS_WINDOW, BLOCK_SPARSE, MASK_BLOCK_Q, MASK_BLOCK_K)
    HAS_STAGE: tl.constexpr = (HAS_WINDOW and not BLOCK_SPARSE, True, True)
    for i in tl.static_range(3):
        if HAS_STAGE[i]:
            dq, ds_sum = _dq_stage(
                dq, ds_sum, q, do, lse2, delta, k_head, v_head, offs_m, offs_n, stages[i], span, var,
                HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, HEAD_DIM_V=HEAD_DIM_V, BLOCK_DV=BLOCK_DV, BLOCK_N=BLOCK_N,
                MASKED=STAGE_MASKED[i],
                DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA, IS_CAUSAL=IS_CAUSAL, IS_VARLEN=IS_VARLEN,
                HAS_WINDOW=HAS_WINDOW, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI,
                BLOCK_SPARSE=BLOCK_SPARSE, MASK_BLOCK_K=MASK_BLOCK_K, SUM_DS=SUM_DS)
    if SUM_DS:
        tl.store(DS_SUM + row0 + offs_m, ds_sum, mask=m_ok)
    dq = dq * sm_scale
    # packed: stored through pointers, clipped at the sequence's end
    DQ_STORE_TMA: tl.constexpr = USE_TMA and not IS_VARLEN
    dq_head = (tile_source(DQ, t_b, off_h, stride_dqb, stride_dqh, DQ_STORE_TMA), t_b, off_h, stride_dqn, stride_dqd)
    store_rows(dq_head, q_row0 + start_m, dq, q_row0 + n_q, BLOCK_M, HEAD_DIM, BLOCK_D, DQ_STORE_TMA)


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
    acc_head = (head_base(DQ_ACC, off_b, off_h, stride_dqab, stride_dqah), off_b, off_h, stride_dqan, stride_dqad)
    dq = load_rows(acc_head, start_m, N_Q, BLOCK_M, HEAD_DIM, BLOCK_D, True, False)
    dq_head = (head_base(DQ, off_b, off_h, stride_dqb, stride_dqh), off_b, off_h, stride_dqn, stride_dqd)
    store_rows(dq_head, start_m, dq * sm_scale, N_Q, BLOCK_M, HEAD_DIM, BLOCK_D, False)
