"""Tile-shape solver: which (BLOCK_M, BLOCK_N) fit in shared memory, and what
HBM traffic each implies.

Feasibility uses the kernels' own shared-memory estimators
(:func:`tileattn.configs.fwd_smem_bytes` / :func:`~tileattn.configs.bwd_smem_bytes`),
so the solver and the launcher agree on what fits.

Why SMEM, not the IO bound, limits BLOCK_N: the forward reads K and V once
per query block, so its traffic falls with BLOCK_M (the rows kept on chip)
and does not depend on BLOCK_N at all.  BLOCK_N only sets how much of K/V
(times the pipeline depth) and of the S tile sits in SMEM.  The paper's
sizing ``B_c = ceil(M / 4d)`` counts one K and one V tile; with
``num_stages`` buffers and the S tile the largest BLOCK_N that fits is
smaller, and it is that bound, not the asymptotic analysis, that decides it.
"""
from __future__ import annotations

import dataclasses
import math

from ..configs import KernelConfig, bwd_smem_bytes, fwd_candidates, bwd_candidates, fwd_smem_bytes
from .io import AttentionShape, dtype_bytes, tiled_traffic

BLOCK_CHOICES = (16, 32, 64, 128, 256)


@dataclasses.dataclass(frozen=True)
class TileOption:
    kind: str            # "fwd" or "bwd"
    block_m: int
    block_n: int
    num_stages: int
    smem_bytes: int
    smem_limit: int
    hbm_bytes: float | None = None   # DRAM bytes of that kernel phase for the given shape (no L2 reuse)

    @property
    def fits(self) -> bool:
        return self.smem_bytes <= self.smem_limit

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["fits"] = self.fits
        return d


def _check(name, v, lo=1):
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name}={v!r} must be an integer >= {lo}")
    return v


def feasible_tiles(smem_bytes: int, head_dim: int, dtype: str = "bf16", *, backward: bool = False,
                   num_stages: int = 2, choices=BLOCK_CHOICES, shape: AttentionShape | None = None,
                   include_infeasible: bool = False) -> list[TileOption]:
    """All (BLOCK_M, BLOCK_N) from ``choices`` whose shared-memory estimate fits
    ``smem_bytes`` (per block), for the forward or the backward (dK/dV)
    program at ``num_stages`` pipeline stages.  With ``shape`` each option
    carries the HBM bytes of that phase without L2 reuse (the textbook count
    that the tile shape controls).  Sorted by bytes, then by larger tiles."""
    _check("smem_bytes", smem_bytes)
    _check("head_dim", head_dim)
    if head_dim > 256:
        raise ValueError(f"head_dim={head_dim} exceeds 256")
    _check("num_stages", num_stages)
    e = dtype_bytes(dtype)
    est = bwd_smem_bytes if backward else fwd_smem_bytes
    kind = "bwd" if backward else "fwd"
    out = []
    for bm in choices:
        for bn in choices:
            need = est(bm, bn, head_dim, e, num_stages)
            if need > smem_bytes and not include_infeasible:
                continue
            hbm = None
            if shape is not None:
                cfg = KernelConfig(bm, bn, 4, num_stages, "solver")
                kw = {"bwd_config": cfg} if backward else {"fwd_config": cfg}
                t = tiled_traffic(shape, backward=backward, **kw)
                hbm = t.bytes(kind)
            out.append(TileOption(kind, bm, bn, num_stages, need, smem_bytes, hbm))
    out.sort(key=lambda o: (o.hbm_bytes if o.hbm_bytes is not None else 0.0, -o.block_m * o.block_n))
    return out


def max_block_n(smem_bytes: int, head_dim: int, dtype: str = "bf16", *, block_m: int = 128,
                num_stages: int = 2, backward: bool = False, choices=BLOCK_CHOICES) -> int | None:
    """Largest BLOCK_N from ``choices`` that fits next to a BLOCK_M-row tile (None if none)."""
    e = dtype_bytes(dtype)
    est = bwd_smem_bytes if backward else fwd_smem_bytes
    ok = [bn for bn in choices if est(block_m, bn, head_dim, e, num_stages) <= smem_bytes]
    return max(ok) if ok else None


def paper_block_sizes(smem_bytes: int, head_dim: int, dtype: str = "bf16") -> tuple[int, int]:
    """(B_r, B_c) of FlashAttention's Algorithm 1 for SRAM of ``smem_bytes``:
    ``B_c = ceil(M / 4d)``, ``B_r = min(B_c, d)`` with M counted in elements."""
    m_elems = smem_bytes // dtype_bytes(dtype)
    bc = math.ceil(m_elems / (4 * head_dim))
    return min(bc, head_dim), bc


def table_configs_check(smem_bytes: int, head_dim: int, dtype: str = "bf16") -> list[tuple[str, KernelConfig, bool]]:
    """Each config of the kernels' table for ``head_dim`` with whether the
    solver (same estimator) finds it feasible at ``smem_bytes``."""
    e = dtype_bytes(dtype)
    out = []
    for c in fwd_candidates(head_dim):
        out.append(("fwd", c, fwd_smem_bytes(c.block_m, c.block_n, head_dim, e, c.num_stages) <= smem_bytes))
    for c in bwd_candidates(head_dim):
        out.append(("bwd", c, bwd_smem_bytes(c.block_m, c.block_n, head_dim, e, c.num_stages) <= smem_bytes))
    return out
