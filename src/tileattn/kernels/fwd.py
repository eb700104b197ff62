"""Forward kernel: one program per (query block, head, batch).

The Q tile stays in registers/SRAM; K and V tiles stream past it.  A running
row max ``m_i`` and row sum ``l_i`` (both in log2 units: the softmax scale is
folded into ``qk_scale = scale * log2(e)`` so every exponential is an exp2)
rescale the fp32 accumulator whenever the max grows.  S and P never leave the
chip.  Key tiles hidden by the causal mask are never visited; only the tiles
on the diagonal or at the N_K edge pay for masking (``MASKED`` stage).
The rescaling identity is derived in docs/design.md.

Variants are constexpr switches; with all of them off the kernel is the
plain one above (docs/variants.md):
  ``IS_VARLEN``    packed sequences: batch index = sequence, rows offset by
                   ``CU_SEQLENS_*``; programs past a sequence's end exit;
  ``HAS_WINDOW``   sliding window: key tiles outside every row's window are
                   skipped, the window's edge tiles are masked;
  ``HAS_SOFTCAP``  c * tanh(s / c) on the scaled scores;
  ``HAS_ALIBI``    -slope * |i + Nk - Nq - j| added to them;
  ``BLOCK_SPARSE`` walk the lists of visible BLOCK_Q x BLOCK_K blocks of the
                   query block's row (full blocks unmasked, partial ones
                   masked) instead of a range of key tiles.
"""
import triton
import triton.language as tl

from .common import (alibi_slope_log2, causal_key_bounds, head_base, load_rows, load_seq_rows, online_softmax_step,
                     pair_visible, scores, sequence_bounds, store_rows, tile_source, window_key_bounds)

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _fwd_tile(acc, l_i, m_i, q, k_src, v_src, off_b, off_hk, offs_m, offs_n, start_n,
              N_Q, N_K, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
              k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
              IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
              USE_TMA: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_WINDOW: tl.constexpr,
              HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    if IS_VARLEN:
        # rows are absolute in the packed tensor; past the sequence's end the
        # loads return other sequences' rows (masked below, never stored)
        k = load_rows(k_src, off_b, off_hk, k_row0 + start_n, k_end, stride_kn, stride_kd, BLOCK_N, HEAD_DIM,
                      BLOCK_D, MASKED, USE_TMA)
    else:
        k = load_rows(k_src, off_b, off_hk, start_n, N_K, stride_kn, stride_kd, BLOCK_N, HEAD_DIM, BLOCK_D,
                      MASKED, USE_TMA)
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if HAS_SOFTCAP or HAS_ALIBI:
        s, _ = scores(qk, offs_m[:, None], (start_n + offs_n)[None, :], N_K - N_Q, qk_scale, softcap_scale,
                      softcap_log2, alibi_log2, HAS_SOFTCAP, HAS_ALIBI)
    else:
        s = qk * qk_scale
    if MASKED:
        n_idx = start_n + offs_n
        visible = (n_idx < N_K)[None, :]
        if HAS_WINDOW or IS_CAUSAL:
            visible = visible & pair_visible(offs_m[:, None], n_idx[None, :], N_K - N_Q, win_left, win_right,
                                             HAS_WINDOW)
        s = tl.where(visible, s, float("-inf"))
    p, alpha, l_i, m_new = online_softmax_step(s, m_i, l_i, MASKED)
    if IS_VARLEN:
        v = load_seq_rows(v_src, off_b, off_hk, k_row0 + start_n, k_end, stride_vn, stride_vd, BLOCK_N, HEAD_DIM,
                          BLOCK_D, MASKED, USE_TMA)
    else:
        v = load_rows(v_src, off_b, off_hk, start_n, N_K, stride_vn, stride_vd, BLOCK_N, HEAD_DIM, BLOCK_D,
                      MASKED, USE_TMA)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_src, v_src, off_b, off_hk, offs_m, offs_n,
               lo, hi, N_Q, N_K, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
               k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, block_idx,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
               IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
               USE_TMA: tl.constexpr, IS_VARLEN: tl.constexpr = False, HAS_WINDOW: tl.constexpr = False,
               HAS_SOFTCAP: tl.constexpr = False, HAS_ALIBI: tl.constexpr = False,
               BLOCK_SPARSE: tl.constexpr = False, MASK_BLOCK_K: tl.constexpr = 128):
    """Key tiles [lo, hi) in steps of BLOCK_N or, with BLOCK_SPARSE, the
    entries [lo, hi) of the sub-tile list of ``block_idx`` (each listed block
    of MASK_BLOCK_K keys holds MASK_BLOCK_K // BLOCK_N tiles)."""
    if BLOCK_SPARSE:
        for it in range(lo, hi):
            sub = it % (MASK_BLOCK_K // BLOCK_N)
            start_n = tl.load(block_idx + it // (MASK_BLOCK_K // BLOCK_N)) * MASK_BLOCK_K + sub * BLOCK_N
            acc, l_i, m_i = _fwd_tile(
                acc, l_i, m_i, q, k_src, v_src, off_b, off_hk, offs_m, offs_n, start_n,
                N_Q, N_K, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
                k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2,
                HEAD_DIM, BLOCK_D, BLOCK_N, IS_CAUSAL, MASKED, DOT_PRECISION, USE_TMA,
                IS_VARLEN, HAS_WINDOW, HAS_SOFTCAP, HAS_ALIBI)
    else:
        for start_n in range(lo, hi, BLOCK_N):
            acc, l_i, m_i = _fwd_tile(
                acc, l_i, m_i, q, k_src, v_src, off_b, off_hk, offs_m, offs_n, start_n,
                N_Q, N_K, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
                k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2,
                HEAD_DIM, BLOCK_D, BLOCK_N, IS_CAUSAL, MASKED, DOT_PRECISION, USE_TMA,
                IS_VARLEN, HAS_WINDOW, HAS_SOFTCAP, HAS_ALIBI)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_lb, stride_lh,
    GROUP_SIZE, N_Q, N_K, qk_scale,
    N_Q_BUCKET, N_K_BUCKET,  # autotune keys only
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
    # variants (None / unused unless their switch is on)
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
    # heaviest causal blocks (last rows) first: better tail balance
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    off_hk = off_h // GROUP_SIZE
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)

    if IS_VARLEN:
        # the tensors are (1, H, total, D) views; off_b is the sequence
        q_row0, n_q, k_row0, n_k = sequence_bounds(CU_SEQLENS_Q, CU_SEQLENS_K, off_b)
        if start_m >= n_q:
            return
        t_b = 0
        q_src = tile_source(Q, t_b, off_h, stride_qb, stride_qh, USE_TMA)
        k_src = tile_source(K, t_b, off_hk, stride_kb, stride_kh, USE_TMA)
        v_src = tile_source(V, t_b, off_hk, stride_vb, stride_vh, USE_TMA)
        # stores go through pointers, clipped at the sequence's end
        o_dst = tile_source(O, t_b, off_h, stride_ob, stride_oh, False)
        q = load_rows(q_src, t_b, off_h, q_row0 + start_m, q_row0 + n_q, stride_qn, stride_qd, BLOCK_M, HEAD_DIM,
                      BLOCK_D, True, USE_TMA)
        k_end = k_row0 + n_k
    else:
        t_b = off_b
        n_q = N_Q
        n_k = N_K
        k_row0 = 0
        k_end = N_K
        q_src = tile_source(Q, off_b, off_h, stride_qb, stride_qh, USE_TMA)
        k_src = tile_source(K, off_b, off_hk, stride_kb, stride_kh, USE_TMA)
        v_src = tile_source(V, off_b, off_hk, stride_vb, stride_vh, USE_TMA)
        o_dst = tile_source(O, off_b, off_h, stride_ob, stride_oh, USE_TMA)
        q = load_rows(q_src, off_b, off_h, start_m, N_Q, stride_qn, stride_qd, BLOCK_M, HEAD_DIM, BLOCK_D, True,
                      USE_TMA)
    alibi_log2 = alibi_slope_log2(ALIBI, off_b, off_h, stride_ab, stride_ah, HAS_ALIBI)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    if BLOCK_SPARSE:
        # this query block's row of the layout: full blocks, then partial ones
        row = start_m // MASK_BLOCK_Q
        nb = off_b * stride_bs_nb + off_h * stride_bs_nh + row
        ib = off_b.to(tl.int64) * stride_bs_ib + off_h * stride_bs_ih + row * stride_bs_ir
        n_full = tl.load(BS_FULL_NUM + nb) * (MASK_BLOCK_K // BLOCK_N)
        n_part = tl.load(BS_PART_NUM + nb) * (MASK_BLOCK_K // BLOCK_N)
        acc, l_i, m_i = _fwd_inner(
            acc, l_i, m_i, q, k_src, v_src, t_b, off_hk, offs_m, offs_n,
            0, n_full, n_q, n_k, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
            k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, BS_FULL_IDX + ib,
            HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, IS_CAUSAL=IS_CAUSAL, MASKED=False,
            DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA, IS_VARLEN=IS_VARLEN, HAS_WINDOW=HAS_WINDOW,
            HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, BLOCK_SPARSE=True, MASK_BLOCK_K=MASK_BLOCK_K)
        acc, l_i, m_i = _fwd_inner(
            acc, l_i, m_i, q, k_src, v_src, t_b, off_hk, offs_m, offs_n,
            0, n_part, n_q, n_k, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
            k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, BS_PART_IDX + ib,
            HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, IS_CAUSAL=IS_CAUSAL, MASKED=True,
            DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA, IS_VARLEN=IS_VARLEN, HAS_WINDOW=HAS_WINDOW,
            HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI, BLOCK_SPARSE=True, MASK_BLOCK_K=MASK_BLOCK_K)
    else:
        if HAS_WINDOW:
            # masked left edge [lo, full_lo), then the two stages below
            lo, full_lo, full_end, hi = window_key_bounds(start_m, n_q, n_k, win_left, win_right, BLOCK_M, BLOCK_N)
            acc, l_i, m_i = _fwd_inner(
                acc, l_i, m_i, q, k_src, v_src, t_b, off_hk, offs_m, offs_n,
                lo, full_lo, n_q, n_k, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
                k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, None,
                HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N, IS_CAUSAL=IS_CAUSAL, MASKED=True,
                DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA, IS_VARLEN=IS_VARLEN, HAS_WINDOW=HAS_WINDOW,
                HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI)
        else:
            full_lo = 0
            full_end, hi = causal_key_bounds(start_m, n_q, n_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
        acc, l_i, m_i = _fwd_inner(
            acc, l_i, m_i, q, k_src, v_src, t_b, off_hk, offs_m, offs_n,
            full_lo, full_end, n_q, n_k, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
            k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, None,
            HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
            IS_CAUSAL=IS_CAUSAL, MASKED=False, DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA,
            IS_VARLEN=IS_VARLEN, HAS_WINDOW=HAS_WINDOW, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI)
        acc, l_i, m_i = _fwd_inner(
            acc, l_i, m_i, q, k_src, v_src, t_b, off_hk, offs_m, offs_n,
            full_end, hi, n_q, n_k, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
            k_row0, k_end, win_left, win_right, softcap_scale, softcap_log2, alibi_log2, None,
            HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
            IS_CAUSAL=IS_CAUSAL, MASKED=True, DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA,
            IS_VARLEN=IS_VARLEN, HAS_WINDOW=HAS_WINDOW, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI)

    # rows that saw no key: output 0, lse -inf (never 0/0)
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)
    if IS_VARLEN:
        store_rows(o_dst, t_b, off_h, q_row0 + start_m, out, q_row0 + n_q, stride_on, stride_od,
                   BLOCK_M, HEAD_DIM, BLOCK_D, False)
        lse_ptrs = head_base(LSE, t_b, off_h, stride_lb, stride_lh) + q_row0 + offs_m
        tl.store(lse_ptrs, lse, mask=offs_m < n_q)
    else:
        store_rows(o_dst, off_b, off_h, start_m, out, N_Q, stride_on, stride_od,
                   BLOCK_M, HEAD_DIM, BLOCK_D, USE_TMA)
        lse_ptrs = head_base(LSE, off_b, off_h, stride_lb, stride_lh) + offs_m
        tl.store(lse_ptrs, lse, mask=offs_m < N_Q)
