"""The memory plan of the Hopper backward: how many launches of the dK/dV
kernel (and of dQ's convert) a call is cut into so that the float32 scratch
stays a bounded share of what a training step holds.  Pure functions of the
tensors' shapes; ``launch/attention.py`` runs the plan.
"""
from __future__ import annotations

import torch

from ..configs import HopperBwdConfig
from . import hopper

# The default backward's float32 dQ sum is twice q's bytes, held through the
# dK/dV launch and dQ's convert (slices add float32 dK/dV sums).  Without GQA
# that is 1.25x the tensors a training step holds; with GQA those shrink with
# k and v while the sum does not: at 16k, d = 128 the peak read 1.40-1.60x
# (H200, perf-notes v24; cuDNN 1.80-1.89x).  So the launcher runs the kernel
# and the convert over chunks of (batch, kv heads) with one sum, as few chunks
# as keep a chunk's scratch within SCRATCH_SHARE of the step's tensors.
# Each chunk is a launch of its own (descriptors, launch, convert): from 4k
# keys (v24, H200) that cost 0-2 %, at 2k up to 30 % (GQA 4, d = 128: 1.08 ->
# 0.72x cuDNN), at 1k and 512 40-57 %: shorter calls keep one launch.
SCRATCH_SHARE = 0.28   # the 1.3x bound of a forward+backward peak, less the allocator's rounding
CHUNK_MIN_KEYS = 4096   # the fewest keys at which chunks were timed and cost at most 2 %


def step_bytes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Bytes of what a training step holds: q, dQ, O, dO (O and dO as wide as
    v), k, dK, v, dV and the float32 lse."""
    rows = q.numel() // q.shape[-1]
    return (2 * q.numel() + 2 * rows * v.shape[-1] + 2 * k.numel() + 2 * v.numel()) * q.element_size() + 4 * rows


def scratch_bytes(q, k, v, causal: bool, cfg: HopperBwdConfig) -> int:
    """The float32 scratch of one dK/dV launch on these tensors: the dQ sum
    and, with head slices, the dK/dV sums."""
    sliced = v.shape[-1] == q.shape[-1] and hopper.head_slices(q, k, causal, cfg) > 1
    return 4 * q.numel() + (4 * (k.numel() + v.numel()) if sliced else 0)


def memory_chunks(q, k, v, causal: bool, cfg: HopperBwdConfig) -> list[tuple[slice, slice, slice]]:
    """(batch, query head, kv head) slices of the dK/dV launches: whole batch
    elements a chunk where that is enough, else kv heads of one element (so
    a chunk's rows of lse and delta stay contiguous), the fewest chunks whose
    :func:`scratch_bytes` is at most ``SCRATCH_SHARE`` of :func:`step_bytes`;
    one chunk below ``CHUNK_MIN_KEYS`` keys."""
    hopper.check_slices(cfg, q.shape[-1], v.shape[-1])
    b, hq = q.shape[:2]
    hkv = k.shape[1]
    if k.shape[2] < CHUNK_MIN_KEYS:
        return [(slice(0, b), slice(0, hq), slice(0, hkv))]
    g, budget = hq // hkv, SCRATCH_SHARE * step_bytes(q, k, v)
    scratch = scratch_bytes(q, k, v, causal, cfg)   # a chunk's: its share of (batch, kv heads); slices alike
    shapes = [(b // c, hkv) for c in range(1, b + 1) if b % c == 0] + [(1, hkv // e) for e in range(2, hkv + 1)
                                                                       if hkv % e == 0]
    nb, nh = next((s for s in shapes if scratch * s[0] * s[1] <= budget * b * hkv), shapes[-1])
    return [(slice(b0, b0 + nb), slice(h0 * g, (h0 + nh) * g), slice(h0, h0 + nh))
            for b0 in range(0, b, nb) for h0 in range(0, hkv, nh)]
