"""The Hopper forward's products (Gluon; ``fwd_hopper.py``): S = Q Kᵀ and
O += P V issued as asynchronous warpgroup MMAs once their key / value tile
has landed.

This module imports Gluon at load time: only the Hopper kernels import it.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait


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
    registers, in V's dtype)."""
    s = j % NUM_STAGES
    p16 = gl.convert_layout(p.to(v_smem.dtype), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    mbarrier.wait(v_ready.index(s), (j // NUM_STAGES) & 1)
    return warpgroup_mma(p16, v_smem.index(s).reshape([BLOCK_N, HEAD_DIM_V]), acc, is_async=True)


@gluon.jit
def _wait_pv(acc):
    """Wait for :func:`_issue_pv`'s product."""
    return warpgroup_mma_wait(0, deps=[acc])
