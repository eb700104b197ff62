"""Kernel launch configurations as data, with where the numbers came from.

A config fixes the tile shape (BLOCK_M query rows x BLOCK_N key rows), the
number of warps and the software-pipelining depth.  The shared-memory
footprint of a config is estimated by :func:`fwd_smem_bytes` /
:func:`bwd_smem_bytes`; the same functions back the tile-shape solver in
``tileattn.cost`` so that the cost model and the kernels agree on what fits.

On a GPU the launcher autotunes over the candidates of the matching head-dim
bucket, after dropping those whose estimate exceeds the device's shared
memory per block.  Under the Triton interpreter (``TRITON_INTERPRET=1``) a
single small config is used: autotuning needs a GPU timer.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Iterable


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    source: str = ""

    def as_meta(self) -> dict:
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n}

    @property
    def name(self) -> str:
        return f"M{self.block_m}-N{self.block_n}-w{self.num_warps}-s{self.num_stages}"


def block_d(head_dim: int) -> int:
    """Head dim padded to the power of two the kernels tile with (>= 16 for tl.dot)."""
    return max(16, 1 << (int(head_dim) - 1).bit_length())


def _buffers(num_stages: int) -> int:
    # Triton's software pipeliner keeps num_stages - 1 tiles in flight per
    # streamed operand (one when not pipelined)
    return max(1, num_stages - 1)


def fwd_smem_bytes(block_m: int, block_n: int, head_dim: int, elem_bytes: int, num_stages: int) -> int:
    """Shared memory of a forward program: the Q tile plus the multi-buffered K
    and V tiles.  P feeds the second matmul from registers.  Matches the
    compiler's report for sm_90 (docs/perf-notes.md, compile report)."""
    d = block_d(head_dim)
    return elem_bytes * d * (block_m + 2 * _buffers(num_stages) * block_n)


def bwd_smem_bytes(block_m: int, block_n: int, head_dim: int, elem_bytes: int, num_stages: int) -> int:
    """Shared memory of the larger backward program.  Each streams two tiles
    (dQ kernel: K and V of BLOCK_N rows; dK/dV kernel: Q and dO of BLOCK_M
    rows), holds two resident tiles, and stages P and dS (BLOCK_M x BLOCK_N)
    for the transposed matmuls.  Exact for the dQ kernel of most sm_90
    configs, an upper bound for the dK/dV kernel."""
    d = block_d(head_dim)
    stages = _buffers(num_stages)
    p_ds = 2 * block_m * block_n * elem_bytes
    dq = elem_bytes * d * (2 * stages * block_n + 2 * block_m) + p_ds
    dkdv = elem_bytes * d * (2 * stages * block_m + 2 * block_n) + p_ds
    return max(dq, dkdv)


def _head_dim_bucket(head_dim: int) -> int:
    for bucket in (64, 128, 256):
        if head_dim <= bucket:
            return bucket
    raise ValueError(f"head_dim={head_dim} exceeds 256")


_H = "H200 sweep, triton 3.6 (docs/perf-notes.md)"
_T = "Triton tutorial-like starting point, kept when not beaten on H200"

# Candidates for autotuning on a GPU, by head-dim bucket.
FWD_CONFIGS: dict[int, tuple[KernelConfig, ...]] = {
    64: (
        KernelConfig(128, 128, 8, 3, _H),
        KernelConfig(128, 64, 4, 3, _T),
        KernelConfig(128, 128, 4, 3, _T),
        KernelConfig(64, 64, 4, 3, _T),
    ),
    128: (
        KernelConfig(128, 128, 8, 3, _H),
        KernelConfig(128, 64, 8, 3, _T),
        KernelConfig(128, 64, 4, 3, _T),
        KernelConfig(64, 64, 4, 3, _T),
    ),
    256: (
        KernelConfig(128, 64, 8, 2, _H),
        KernelConfig(64, 64, 4, 2, _T),
        KernelConfig(64, 32, 4, 2, _T),
    ),
}

BWD_CONFIGS: dict[int, tuple[KernelConfig, ...]] = {
    64: (
        KernelConfig(64, 128, 8, 3, _H),
        KernelConfig(32, 128, 4, 3, _T),
        KernelConfig(64, 64, 4, 3, _T),
    ),
    128: (
        KernelConfig(64, 128, 8, 3, _H),
        KernelConfig(32, 128, 4, 3, _T),
        KernelConfig(64, 64, 4, 3, _T),
    ),
    256: (
        KernelConfig(32, 64, 4, 2, _T),
        KernelConfig(64, 64, 8, 2, _H),
        KernelConfig(32, 32, 4, 2, _T),
    ),
}

# One small config for the Triton interpreter (no GPU timer to autotune with).
# Small tiles keep the interpreter fast and still exercise multi-tile loops.
INTERPRETER_FWD = KernelConfig(32, 32, 4, 1, "interpreter: smallest tile that tl.dot accepts x2")
INTERPRETER_BWD = KernelConfig(32, 32, 4, 1, "interpreter: smallest tile that tl.dot accepts x2")


def interpreter_active() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def fwd_candidates(head_dim: int) -> tuple[KernelConfig, ...]:
    return FWD_CONFIGS[_head_dim_bucket(head_dim)]


def bwd_candidates(head_dim: int) -> tuple[KernelConfig, ...]:
    return BWD_CONFIGS[_head_dim_bucket(head_dim)]


def fitting(configs: Iterable[KernelConfig], head_dim: int, elem_bytes: int, smem_limit: int,
            backward: bool = False) -> list[KernelConfig]:
    """The configs whose shared-memory estimate fits ``smem_limit`` bytes; if none
    fits, the smallest one (the compiler then reports the real requirement)."""
    est = bwd_smem_bytes if backward else fwd_smem_bytes
    configs = list(configs)
    ok = [c for c in configs if est(c.block_m, c.block_n, head_dim, elem_bytes, c.num_stages) <= smem_limit]
    if ok:
        return ok
    return [min(configs, key=lambda c: est(c.block_m, c.block_n, head_dim, elem_bytes, c.num_stages))]


def all_configs() -> list[tuple[str, int, KernelConfig]]:
    """Every (kind, head-dim bucket, config) in the tables, for tests that force each once."""
    out = []
    for bucket, cfgs in FWD_CONFIGS.items():
        out += [("fwd", bucket, c) for c in cfgs]
    for bucket, cfgs in BWD_CONFIGS.items():
        out += [("bwd", bucket, c) for c in cfgs]
    return out
