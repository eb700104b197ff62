"""The Hopper forward's products (Gluon; ``fwd_hopper.py``): S = Q Kᵀ and
O += P V issued as asynchronous warpgroup MMAs once their key / value tile
has landed, and with ``ROWSUM_MMA`` the row sums of P as a product with a
tile of ones (the tensor cores add the rounded P that multiplies V).

This module imports Gluon at load time: only the Hopper kernels import it.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)


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
def _issue_pv(p, acc, lacc, v_smem, v_ready, ones_t, j, o_layout: gl.constexpr, l_layout: gl.constexpr,
              BLOCK_N: gl.constexpr, HEAD_DIM_V: gl.constexpr, NUM_STAGES: gl.constexpr, ROWSUM_MMA: gl.constexpr):
    """Wait for value tile ``j`` and issue O += P V asynchronously (P from
    registers): (acc, lacc).  With ``ROWSUM_MMA`` first the row sums of P as a
    product P · ones (``ones_t``: BLOCK_N x 8 ones in shared memory) into
    ``lacc`` (every column a row's sum), so that a wait leaving one group
    outstanding still returns once Sᵀ's product and this one are done;
    without it ``lacc`` and ``ones_t`` are unused."""
    p16 = p.to(v_smem.dtype)
    if ROWSUM_MMA:
        lacc = warpgroup_mma(gl.convert_layout(p16, gl.DotOperandLayout(operand_index=0, parent=l_layout,
                                                                        k_width=2)), ones_t, lacc, is_async=True)
    s = j % NUM_STAGES
    p16 = gl.convert_layout(p16, gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    mbarrier.wait(v_ready.index(s), (j // NUM_STAGES) & 1)
    return warpgroup_mma(p16, v_smem.index(s).reshape([BLOCK_N, HEAD_DIM_V]), acc, is_async=True), lacc


@gluon.jit
def _wait_pv(acc, lacc, ROWSUM_MMA: gl.constexpr):
    """Wait for :func:`_issue_pv`'s products (both with ``ROWSUM_MMA``)."""
    if ROWSUM_MMA:
        acc, lacc = warpgroup_mma_wait(0, deps=[acc, lacc])
    else:
        acc = warpgroup_mma_wait(0, deps=[acc])
    return acc, lacc


@gluon.jit
def _fill_ones(ones_tile, BLOCK_N: gl.constexpr):
    """Ones into a softmax warpgroup's 8 x BLOCK_N tile (``ROWSUM_MMA``), visible to its MMAs."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    ones_tile.store(gl.full([8, BLOCK_N], 1.0, ones_tile.dtype, layout))
    fence_async_shared()
    gl.thread_barrier()
