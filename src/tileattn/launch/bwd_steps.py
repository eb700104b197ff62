"""The backward's steps around the dK/dV kernels that the portable
(``launch/attention.py``) and the Hopper (``launch/hopper_calls.py``) paths
share: the float32 dQ sum, the preprocess (Δ = rowsum(dO ∘ O), lse₂) and the
convert of the dQ sum into dq (portable Triton kernels, ``kernels/bwd.py``).
"""
from __future__ import annotations

import torch
import triton

from .. import configs
from .._env import interpreter_active
from ..kernels.bwd import _attn_bwd_dq_convert_kernel, _attn_bwd_preprocess_kernel
from . import runtime
from .runtime import output_f32, strides4


def dq_accumulator(q: torch.Tensor) -> torch.Tensor:
    """The float32 (B, Hq, Nq, D) sum the atomic backward adds dQ into: it
    must start at zero (never poisoned; dq itself is)."""
    return torch.zeros(q.shape, device=q.device, dtype=torch.float32)


def preprocess(do, o, lse, dlse, delta, lse2, o_lo=None, sinks=None):
    """delta = rowsum(dO o O) (minus dlse) and lse2 = lse log2 e (+inf where
    -inf); the rows of O and dO are V's head dim wide; with ``o_lo`` (O's
    rounding remainder) O is o + o_lo.  ``delta`` and ``lse2`` share one
    layout, contiguous or with padded rows (:func:`hopper.stats_rows`).
    With ``o_lo`` and ``sinks`` the kernel also forms the sinks' gradient,
    -sum_i exp(sink_h - lse_i) delta_i, one partial sum per row block
    summed here in a fixed order (reproducible); returned, else None."""
    b, hq, n_q, d = o.shape
    assert delta.stride() == lse2.stride() and delta.stride(2) == 1 and delta.stride(0) == delta.stride(1) * hq
    pre_block = configs.INTERPRETER_BWD.block_m if interpreter_active() else 64
    has_dlse = dlse is not None
    lse = lse.contiguous()
    grid = (triton.cdiv(n_q, pre_block), hq, b)
    extra = {} if o_lo is None else dict(O_LO=o_lo, **strides4(o_lo, "lo"), HAS_O_LO=True)
    part = None if o_lo is None or sinks is None else output_f32((b, hq, grid[0]), o.device)
    if part is not None:
        extra.update(SINKS=sinks, DSINK_PART=part, SINK_GRAD=True)
    runtime.run(_attn_bwd_preprocess_kernel, grid, {}, dict(
        O=o, DO=do, LSE=lse, DLSE=dlse.contiguous() if has_dlse else lse, DELTA=delta, LSE2=lse2,
        **strides4(o, "o"), **strides4(do, "do"), stride_sh=delta.stride(1),
        N_HEADS=hq, N_Q=n_q, HEAD_DIM=d, BLOCK_D=configs.block_d(d), BLOCK_M=pre_block,
        HAS_DLSE=has_dlse, **extra))
    return None if part is None else part.sum(dim=(0, 2)).to(sinks.dtype)


def dq_convert(dq_acc, dq, scale):
    """dq = scale x the float32 dQ sum, in dq's dtype and layout."""
    b, hq, n_q, d = dq.shape
    pre_block = configs.INTERPRETER_BWD.block_m if interpreter_active() else 64
    runtime.run(_attn_bwd_dq_convert_kernel, (triton.cdiv(n_q, pre_block), hq, b), {}, dict(
        DQ_ACC=dq_acc, DQ=dq, **strides4(dq_acc, "dqa"), **strides4(dq, "dq"), N_Q=n_q, sm_scale=scale,
        HEAD_DIM=d, BLOCK_D=configs.block_d(d), BLOCK_M=pre_block))
