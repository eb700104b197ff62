"""Forward kernel: one program per (query block, head, batch).

The Q tile stays in registers/SRAM; K and V tiles stream past it.  A running
row max ``m_i`` and row sum ``l_i`` (both in log2 units: the softmax scale is
folded into ``qk_scale = scale * log2(e)`` so every exponential is an exp2)
rescale the fp32 accumulator whenever the max grows.  S and P never leave the
chip.  Key tiles hidden by the causal mask are never visited; only the tiles
on the diagonal or at the N_K edge pay for masking (``MASKED`` stage).
The rescaling identity is derived in docs/design.md.
"""
import triton
import triton.language as tl

from .common import causal_key_bounds, head_base, load_rows, store_rows, tile_source

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_src, v_src, off_b, off_hk, offs_m, offs_n,
               lo, hi, N_Q, N_K, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
               IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr,
               USE_TMA: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        k = load_rows(k_src, off_b, off_hk, start_n, N_K, stride_kn, stride_kd, BLOCK_N, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s = qk * qk_scale
        if MASKED:
            n_idx = start_n + offs_n
            visible = (n_idx < N_K)[None, :]
            if IS_CAUSAL:
                visible = visible & (n_idx[None, :] <= offs_m[:, None] + (N_K - N_Q))
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if MASKED:
            # a row with nothing visible yet keeps m = -inf: subtract 0 instead
            # so exp2 gives 0, not NaN
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_ref = m_new
        p = tl.math.exp2(s - m_ref[:, None])
        alpha = tl.math.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_rows(v_src, off_b, off_hk, start_n, N_K, stride_vn, stride_vd, BLOCK_N, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
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
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
):
    # heaviest causal blocks (last rows) first: better tail balance
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    off_hk = off_h // GROUP_SIZE
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)

    q_src = tile_source(Q, off_b, off_h, stride_qb, stride_qh, USE_TMA)
    k_src = tile_source(K, off_b, off_hk, stride_kb, stride_kh, USE_TMA)
    v_src = tile_source(V, off_b, off_hk, stride_vb, stride_vh, USE_TMA)
    o_dst = tile_source(O, off_b, off_h, stride_ob, stride_oh, USE_TMA)

    q = load_rows(q_src, off_b, off_h, start_m, N_Q, stride_qn, stride_qd, BLOCK_M, HEAD_DIM, BLOCK_D, True, USE_TMA)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    full_end, hi = causal_key_bounds(start_m, N_Q, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, q, k_src, v_src, off_b, off_hk, offs_m, offs_n,
        0, full_end, N_Q, N_K, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
        HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
        IS_CAUSAL=IS_CAUSAL, MASKED=False, DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA)
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, q, k_src, v_src, off_b, off_hk, offs_m, offs_n,
        full_end, hi, N_Q, N_K, qk_scale, stride_kn, stride_kd, stride_vn, stride_vd,
        HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
        IS_CAUSAL=IS_CAUSAL, MASKED=True, DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA)

    # rows that saw no key: output 0, lse -inf (never 0/0)
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)
    store_rows(o_dst, off_b, off_h, start_m, out, N_Q, stride_on, stride_od,
               BLOCK_M, HEAD_DIM, BLOCK_D, USE_TMA)
    lse_ptrs = head_base(LSE, off_b, off_h, stride_lb, stride_lh) + offs_m
    tl.store(lse_ptrs, lse, mask=offs_m < N_Q)
