"""The Hopper forward's products (Gluon; ``fwd_hopper.py``): S = Q Kᵀ and
O += P V issued as asynchronous warpgroup MMAs once their key / value tile
has landed, P made a 16-bit MMA operand, and the softmax warpgroups' turns
at issuing them (``PINGPONG``), one step of the overlapped tile loop built
from these (``_overlap_step``), their hand-back of a Q buffer
(``DEFER_O``) and a persistent program's clock reads (``TRACE``).

This module imports Gluon at load time: only the Hopper kernels import it.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .fwd_hopper_softmax import _softmax_tile


@gluon.jit
def _issue_qk(q2, qt2, k_smem, kt_smem, k_ready, j, s_layout: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, TAIL_DIM: gl.constexpr, NUM_STAGES: gl.constexpr):
    """Wait for key tile ``j`` and issue S = Q Kᵀ asynchronously (with a
    tail: one more product of the last TAIL_DIM columns into the same S)."""
    s = j % NUM_STAGES
    mbarrier.wait(k_ready.index(s), (j // NUM_STAGES) & 1)
    k_t = k_smem.index(s).reshape([BLOCK_N, HEAD_DIM - TAIL_DIM]).permute([1, 0])
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    qk = warpgroup_mma(q2, k_t, zero, use_acc=False, is_async=True)
    if TAIL_DIM > 0:
        qk = warpgroup_mma(qt2, kt_smem.index(s).reshape([BLOCK_N, TAIL_DIM]).permute([1, 0]), qk, is_async=True)
    return qk


@gluon.jit
def _issue_pv(p, acc, v_smem, v_ready, j, o_layout: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM_V: gl.constexpr,
              NUM_STAGES: gl.constexpr):
    """Wait for value tile ``j`` and issue O += P V asynchronously (P from
    registers, in V's dtype: :func:`_p16`, unless it is already)."""
    s = j % NUM_STAGES
    p16 = _p16(p, v_smem.dtype, o_layout)
    mbarrier.wait(v_ready.index(s), (j // NUM_STAGES) & 1)
    return warpgroup_mma(p16, v_smem.index(s).reshape([BLOCK_N, HEAD_DIM_V]), acc, is_async=True)


@gluon.jit
def _wait_pv(acc):
    """Wait for :func:`_issue_pv`'s product."""
    return warpgroup_mma_wait(0, deps=[acc])


@gluon.jit
def _p16(p, dtype: gl.constexpr, o_layout: gl.constexpr):
    """P as the P V product's register operand: ``dtype`` (V's), the
    MMA's operand layout (a no-op on a P that already is)."""
    return gl.convert_layout(p.to(dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))


@gluon.jit
def _my_turn(turns, i, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Wait until the warpgroup before this one has issued its products of
    step i (warpgroup 0: the last warpgroup's of step i-1, its first wait
    passes): the turns go round the warpgroups in order."""
    if PINGPONG:
        if WG == 0:
            mbarrier.wait(turns.index(WG), (i & 1) ^ 1)
        else:
            mbarrier.wait(turns.index(WG), i & 1)


@gluon.jit
def _your_turn(turns, WG: gl.constexpr, PINGPONG: gl.constexpr, NUM_WG: gl.constexpr):
    """Hand the turn to the next warpgroup."""
    if PINGPONG:
        mbarrier.arrive(turns.index((WG + 1) % NUM_WG), count=1)


@gluon.jit
def _overlap_step(j, p, acc, m_i, l_i, q2, qt2, k_smem, kt_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turns,
                  kc, tc, j0, n_full, offs_m, N_Q, N_K, qk_scale, s_layout: gl.constexpr, o_layout: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, HEAD_DIM_V: gl.constexpr,
                  TAIL_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, ROW_TREE: gl.constexpr,
                  WG: gl.constexpr, PINGPONG: gl.constexpr, NUM_WG: gl.constexpr, EARLY_P: gl.constexpr, full_lo,
                  WIN_LEFT, WIN_RIGHT, tile_row0, EVEN_K: gl.constexpr):
    """Step j >= 1 of the overlapped tile loop (``fwd_hopper._softmax_rows``):
    S_j = Q K_jᵀ issued with O += P_{j-1} V_{j-1}, the softmax of tile j
    under the second product (the mask where it needs one), then O
    rescaled.  Returns (P_j, O, row max, row sums)."""
    _my_turn(turns, tc + j, WG, PINGPONG)
    qk = _issue_qk(q2, qt2, k_smem, kt_smem, k_ready, kc + j, s_layout, BLOCK_M, BLOCK_N, HEAD_DIM, TAIL_DIM,
                   NUM_STAGES)
    acc = _issue_pv(p, acc, v_smem, v_ready, kc + j - 1, o_layout, BLOCK_N, HEAD_DIM_V, NUM_STAGES)
    _your_turn(turns, WG, PINGPONG, NUM_WG)
    qk = warpgroup_mma_wait(1, deps=[qk])
    mbarrier.arrive(k_empty.index((kc + j) % NUM_STAGES), count=1)
    p, alpha, m_i, l_i = _softmax_tile(qk, m_i, l_i, j0 + j, n_full, offs_m, N_Q, N_K, qk_scale, s_layout, BLOCK_N,
                                       IS_CAUSAL, ROW_TREE, full_lo, WIN_LEFT, WIN_RIGHT, tile_row0, EVEN_K)
    acc = _wait_pv(acc)
    mbarrier.arrive(v_empty.index((kc + j - 1) % NUM_STAGES), count=1)
    if EARLY_P:
        p = _p16(p, v_smem.dtype, o_layout)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    return p, acc, m_i, l_i


@gluon.jit
def _release_q(q_empty, prev_qi, DEFER_O: gl.constexpr):
    """``DEFER_O``: once O's copy out of Q buffer ``prev_qi`` (the previous
    work item's, -1 for none) has read it, hand the buffer back to the loader."""
    if DEFER_O:
        if prev_qi >= 0:
            tma.store_wait(0)
            mbarrier.arrive(q_empty.index(prev_qi), count=1)


TRACE_SLOTS: gl.constexpr = gl.constexpr(128)


@gluon.jit
def _mark(TRACE, slot, WG: gl.constexpr, SM_ID: gl.constexpr = False):
    """``TRACE`` (``benchmarks/walk_trace.py``; None in every other call,
    so no code): warpgroup 0 of a persistent program writes the global timer
    (ns), or with ``SM_ID`` its multiprocessor's number, to entry ``slot``
    (< TRACE_SLOTS) of the program's row of the int64 ``TRACE``."""
    if TRACE is not None:
        if WG == 0:
            if SM_ID:
                x = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False,
                                              pack=1).to(gl.int64)
            else:
                x = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False,
                                              pack=1)
            if slot < TRACE_SLOTS:
                gl.store(TRACE + gl.program_id(0) * TRACE_SLOTS + slot, x)
