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

from .common import causal_key_bounds, load_tile, store_tile

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, offs_n, d_ok,
               lo, hi, N_Q, N_K, qk_scale, stride_kn, stride_vn,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
               IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    CHECK_D: tl.constexpr = HEAD_DIM != BLOCK_D
    for start_n in range(lo, hi, BLOCK_N):
        n_idx = start_n + offs_n
        n_ok = n_idx < N_K
        k = load_tile(k_ptrs, n_ok, d_ok, MASKED, CHECK_D)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s = qk * qk_scale
        if MASKED:
            visible = n_ok[None, :]
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
        v = load_tile(v_ptrs, n_ok, d_ok, MASKED, CHECK_D)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i, k_ptrs, v_ptrs


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
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # heaviest causal blocks (last rows) first: better tail balance
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    off_hk = off_h // GROUP_SIZE
    start_m = pid_m * BLOCK_M

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < N_Q
    d_ok = offs_d < HEAD_DIM
    CHECK_D: tl.constexpr = HEAD_DIM != BLOCK_D

    # 64-bit base offsets: B*H*N*D may exceed 2**31 elements
    q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh + start_m.to(tl.int64) * stride_qn
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hk.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hk.to(tl.int64) * stride_vh
    rows = tl.arange(0, BLOCK_M)
    q_ptrs = q_base + rows[:, None] * stride_qn + offs_d[None, :] * stride_qd
    k_ptrs = k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
    v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd

    q = load_tile(q_ptrs, m_ok, d_ok, True, CHECK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    full_end, hi = causal_key_bounds(start_m, N_Q, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
    acc, l_i, m_i, k_ptrs, v_ptrs = _fwd_inner(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, offs_n, d_ok,
        0, full_end, N_Q, N_K, qk_scale, stride_kn, stride_vn,
        HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
        IS_CAUSAL=IS_CAUSAL, MASKED=False, DOT_PRECISION=DOT_PRECISION)
    acc, l_i, m_i, k_ptrs, v_ptrs = _fwd_inner(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, offs_n, d_ok,
        full_end, hi, N_Q, N_K, qk_scale, stride_kn, stride_vn,
        HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D, BLOCK_N=BLOCK_N,
        IS_CAUSAL=IS_CAUSAL, MASKED=True, DOT_PRECISION=DOT_PRECISION)

    # rows that saw no key: output 0, lse -inf (never 0/0)
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2)

    o_base = O + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh + start_m.to(tl.int64) * stride_on
    o_ptrs = o_base + rows[:, None] * stride_on + offs_d[None, :] * stride_od
    store_tile(o_ptrs, out.to(O.dtype.element_ty), m_ok, d_ok, CHECK_D)
    lse_ptrs = LSE + off_b.to(tl.int64) * stride_lb + off_h.to(tl.int64) * stride_lh + offs_m
    tl.store(lse_ptrs, lse, mask=m_ok)
