"""The Hopper kernels' tensor descriptors (Gluon's host ``TensorDescriptor``,
imported on first use): Q/K/V/O tiles, lse₂ / Δ rows and the float32 dQ sum,
and the padded rows the copy engine can address (``stats_rows``); used by
``hopper.py``'s launchers.
"""
from __future__ import annotations

import torch

from . import runtime
from .runtime import output_f32, shared_layout, tma_strides


def _descriptor(t: torch.Tensor, rows: int):
    """A rank-4 (B, H, N, D) TMA descriptor with a (1, 1, rows, D) box.  Rows
    past N read as zeros and are clipped on stores, so a tile never reaches
    into the next head."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    runtime.register_descriptor_type(TensorDescriptor)   # direct launches key on it (launch/runtime.py)
    shape, strides = list(t.shape), tma_strides(t, 3)   # the row dim too: a 1-row tensor
    block = [1, 1, rows, shape[3]]
    dtype = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.int8: "int8"}[t.dtype]
    return TensorDescriptor(t, shape, strides, block, shared_layout(tuple(block), dtype))

def stats_rows(b: int, hq: int, n_q: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(delta, lse2) for the backward, float32 (B, Hq, N_Q) views of rows
    padded to a multiple of 4 (a copy-engine stride is 16-byte aligned), so
    that ``HopperBwdConfig.stats_tma`` can address them (NaN under
    POISON_OUTPUTS)."""
    pad = (n_q + 3) // 4 * 4
    store = output_f32((2, b, hq, pad), device)
    return store[0, ..., :n_q], store[1, ..., :n_q]

def _row_descriptor(x: torch.Tensor, rows: int):
    """A rank-3 (B, H, N) float32 descriptor with a (1, 1, rows) box, no
    swizzle (one row of a tile: lse₂ or Δ); rows past N read as zeros."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    return TensorDescriptor(x, list(x.shape), tma_strides(x, 2), [1, 1, rows], shared_layout((1, 1, rows), "rows"))

def _dq_descriptor(dq_acc: torch.Tensor, rows: int, cols: int):
    """The float32 dQ sum as a rank-4 descriptor with a (1, 1, rows, cols)
    box: the backward adds column halves of its dQ tiles into it."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    block = [1, 1, rows, cols]
    return TensorDescriptor(dq_acc, list(dq_acc.shape), tma_strides(dq_acc, 3), block,
                            shared_layout(tuple(block), "float32"))
