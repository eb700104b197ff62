"""Forward kernel: one program per (query block, head, batch).

The Q tile stays in registers/SRAM; K and V tiles stream past it.  A running
row max ``m_i`` and row sum ``l_i`` (both in log2 units: the softmax scale is
folded into ``qk_scale = scale * log2(e)`` so every exponential is an exp2)
rescale the fp32 accumulator whenever the max grows.  S and P never leave the
chip.  Key tiles hidden by the causal mask are never visited; only the tiles
on the diagonal or at the N_K edge pay for masking (``MASKED`` stage).
The rescaling identity is derived in docs/design.md.  V and O have their
own head dim ``HEAD_DIM_V`` (tile width ``BLOCK_DV``), which may differ from
the Q/K head dim ``HEAD_DIM``.

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
``HAS_SINKS`` starts every row from its head's sink logit; ``HAS_O_LO`` also
stores the output's rounding remainder O - round(O) as its int8 code
(``tileattn.sinks``; the sinks' gradient takes rowsum(dO o O) from both).
"""
import triton
import triton.language as tl

from .common import (LN2, LOG2E, STAGE_MASKED, accumulate, alibi_slope_log2, head_base, key_stages, load_rows,
                     mask_keys, online_softmax_step, query_block_program, scores, stage_tile_start, stage_walk,
                     store_rows, tile_source)
from .remainder import encode_remainder


@triton.jit
def _fwd_stage(acc, l_i, m_i, q, k_head, v_head, offs_m, offs_n, stage, span, var,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
               BLOCK_N: tl.constexpr,
               MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
               IS_CAUSAL: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_WINDOW: tl.constexpr,
               HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
               BLOCK_SPARSE: tl.constexpr, MASK_BLOCK_K: tl.constexpr):
    """One stage of the key walk: the online softmax over the key tiles
    [lo, hi) in steps of BLOCK_N or, with BLOCK_SPARSE, over the entries
    [lo, hi) of the stage's sub-tile list.  ``k_head``/``v_head``: where the
    K and V tiles come from (see ``common.load_rows``); ``span``: (N_Q, N_K,
    first key row, end of the keys) of this sequence; ``var``: the scale and
    the variants' runtime parameters."""
    N_Q, N_K, k_row0, k_end = span
    qk_scale, win_left, win_right, softcap_scale, softcap_log2, alibi_log2 = var
    lo, hi, blocks = stage_walk(stage, MASK_BLOCK_K // BLOCK_N, BLOCK_SPARSE, COUNTS_FIRST=True)
    for it in range(lo, hi, 1 if BLOCK_SPARSE else BLOCK_N):
        start_n = stage_tile_start(it, blocks, BLOCK_N, MASK_BLOCK_K, BLOCK_SPARSE)
        # packed rows are absolute; past the sequence's end K's loads return
        # other sequences' rows (masked below, never stored)
        k = load_rows(k_head, k_row0 + start_n, k_end, BLOCK_N, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if HAS_SOFTCAP or HAS_ALIBI:
            s, _ = scores(qk, offs_m[:, None], (start_n + offs_n)[None, :], N_K - N_Q, qk_scale, softcap_scale,
                          softcap_log2, alibi_log2, HAS_SOFTCAP, HAS_ALIBI)
        else:
            s = qk * qk_scale
        if MASKED:
            s = mask_keys(s, float("-inf"), offs_m, start_n + offs_n, N_Q, N_K, win_left, win_right, IS_CAUSAL,
                          HAS_WINDOW)
        p, alpha, l_i, m_new = online_softmax_step(s, m_i, l_i, MASKED)
        v = load_rows(v_head, k_row0 + start_n, k_end, BLOCK_N, HEAD_DIM_V, BLOCK_DV, MASKED, USE_TMA,
                      PACKED=IS_VARLEN)
        acc = accumulate(acc, p, alpha, v, DOT_PRECISION)
        m_i = m_new
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
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
    # variants (None / unused unless their switch is on)
    CU_SEQLENS_Q=None, CU_SEQLENS_K=None,
    win_left=None, win_right=None,
    softcap_scale=None, softcap_log2=None,
    ALIBI=None, stride_ab=None, stride_ah=None,
    BS_FULL_NUM=None, BS_FULL_IDX=None, BS_PART_NUM=None, BS_PART_IDX=None,
    stride_bs_nb=None, stride_bs_nh=None, stride_bs_ib=None, stride_bs_ih=None, stride_bs_ir=None,
    SINKS=None,
    O_LO=None, stride_lob=None, stride_loh=None, stride_lon=None, stride_lod=None,
    IS_VARLEN: tl.constexpr = False, HAS_WINDOW: tl.constexpr = False, HAS_SOFTCAP: tl.constexpr = False,
    HAS_ALIBI: tl.constexpr = False, BLOCK_SPARSE: tl.constexpr = False,
    MASK_BLOCK_Q: tl.constexpr = 128, MASK_BLOCK_K: tl.constexpr = 128, HAS_SINKS: tl.constexpr = False,
    HAS_O_LO: tl.constexpr = False,
):
    # packed sequences: batch t_b of the (1, H, total, D) views, rows from
    # q_row0 / k_row0; dense: batch off_b, rows from 0
    start_m, offs_m, offs_n, off_h, off_hk, off_b, t_b, q_row0, n_q, k_row0, n_k = query_block_program(
        CU_SEQLENS_Q, CU_SEQLENS_K, N_Q, N_K, GROUP_SIZE, BLOCK_M, BLOCK_N, IS_VARLEN)
    if IS_VARLEN and start_m >= n_q:
        return
    # packed outputs are stored through pointers, clipped at the sequence's end
    O_TMA: tl.constexpr = USE_TMA and not IS_VARLEN
    q_head = (tile_source(Q, t_b, off_h, stride_qb, stride_qh, USE_TMA), t_b, off_h, stride_qn, stride_qd)
    k_head = (tile_source(K, t_b, off_hk, stride_kb, stride_kh, USE_TMA), t_b, off_hk, stride_kn, stride_kd)
    v_head = (tile_source(V, t_b, off_hk, stride_vb, stride_vh, USE_TMA), t_b, off_hk, stride_vn, stride_vd)
    o_head = (tile_source(O, t_b, off_h, stride_ob, stride_oh, O_TMA), t_b, off_h, stride_on, stride_od)
    q = load_rows(q_head, q_row0 + start_m, q_row0 + n_q, BLOCK_M, HEAD_DIM, BLOCK_D, True, USE_TMA)
    span = (n_q, n_k, k_row0, k_row0 + n_k)
    alibi_log2 = alibi_slope_log2(ALIBI, off_b, off_h, stride_ab, stride_ah, HAS_ALIBI)
    var = (qk_scale, win_left, win_right, softcap_scale, softcap_log2, alibi_log2)

    if HAS_SINKS:
        # the head's sink is one more score every row starts with: max = sink, sum = 1
        m_i = tl.full([BLOCK_M], 0.0, dtype=tl.float32) + tl.load(SINKS + off_h) * LOG2E
        l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # with a block-sparse layout: this query block's row, full blocks then partial ones
    layout = (BS_FULL_NUM, BS_FULL_IDX, BS_PART_NUM, BS_PART_IDX,
              stride_bs_nb, stride_bs_nh, stride_bs_ib, stride_bs_ih, stride_bs_ir)
    stages = key_stages(start_m, n_q, n_k, win_left, win_right, layout, off_b, off_h, BLOCK_M, BLOCK_N, IS_CAUSAL,
                        HAS_WINDOW, BLOCK_SPARSE, MASK_BLOCK_Q, MASK_BLOCK_K, COUNTS_FIRST=True)
    # the masked head is the window's left edge
    HAS_STAGE: tl.constexpr = (HAS_WINDOW and not BLOCK_SPARSE, True, True)
    for i in tl.static_range(3):
        if HAS_STAGE[i]:
            acc, l_i, m_i = _fwd_stage(
                acc, l_i, m_i, q, k_head, v_head, offs_m, offs_n, stages[i], span, var,
                HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, HEAD_DIM_V=HEAD_DIM_V, BLOCK_DV=BLOCK_DV, BLOCK_N=BLOCK_N,
                MASKED=STAGE_MASKED[i],
                DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA, IS_CAUSAL=IS_CAUSAL, IS_VARLEN=IS_VARLEN,
                HAS_WINDOW=HAS_WINDOW, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI,
                BLOCK_SPARSE=BLOCK_SPARSE, MASK_BLOCK_K=MASK_BLOCK_K)

    # rows that saw no key: output 0, lse -inf (never 0/0)
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)
    store_rows(o_head, q_row0 + start_m, out, q_row0 + n_q, BLOCK_M, HEAD_DIM_V, BLOCK_DV, O_TMA)
    if HAS_O_LO:   # the rounding remainder O - round(O) as its int8 code (through pointers)
        lo = encode_remainder(out, out.to(q.dtype))   # O is like Q
        lo_head = (head_base(O_LO, t_b, off_h, stride_lob, stride_loh), t_b, off_h, stride_lon, stride_lod)
        store_rows(lo_head, q_row0 + start_m, lo, q_row0 + n_q, BLOCK_M, HEAD_DIM_V, BLOCK_DV, False)
    lse_ptrs = head_base(LSE, t_b, off_h, stride_lb, stride_lh) + q_row0 + offs_m
    tl.store(lse_ptrs, lse, mask=offs_m < n_q)
