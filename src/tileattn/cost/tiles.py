"""Tile-shape solver: which (BLOCK_M, BLOCK_N) fit in shared memory, and what
HBM traffic each implies, for each of the three tiled kernels.

The kernels are the forward (``fwd``), the backward dK/dV kernel (``dkdv``,
one program per key block) and the backward dQ kernel (``dq``, one program
per query block).  Each has its own config table in :mod:`tileattn.configs`
(``FWD_CONFIGS``, ``DKDV_CONFIGS``, ``DQ_CONFIGS``) and its own
shared-memory estimator (``SMEM_ESTIMATORS``); feasibility here uses the
same estimators, so the solver and the launcher agree on what fits.

Why SMEM, not the IO bound, limits BLOCK_N: the forward reads K and V once
per query block, so its traffic falls with BLOCK_M (the rows kept on chip)
and does not depend on BLOCK_N at all.  BLOCK_N only sets how much of K/V
(times the pipeline depth) and of the S tile sits in SMEM.  The paper's
sizing ``B_c = ceil(M / 4d)`` counts one K and one V tile; with
``num_stages`` buffers and the S tile the largest BLOCK_N that fits is
smaller, and it is that bound, not the asymptotic analysis, that decides it.
The dQ kernel is the forward's mirror image (K/V streamed per query block);
the dK/dV kernel swaps the roles: K/V stay resident and Q/dO are streamed
once per key block, so its traffic falls with BLOCK_N instead.
"""
from __future__ import annotations

import dataclasses
import math

from ..configs import SMEM_ESTIMATORS, KernelConfig, candidates
from ..validation import MAX_HEAD_DIM
from .io import AttentionShape, default_configs, dtype_bytes, tiled_traffic

BLOCK_CHOICES = (16, 32, 64, 128, 256)
KERNELS = ("fwd", "dkdv", "dq")


@dataclasses.dataclass(frozen=True)
class TileOption:
    kind: str            # "fwd", "dkdv" or "dq"
    block_m: int
    block_n: int
    num_stages: int
    smem_bytes: int
    smem_limit: int
    hbm_bytes: float | None = None   # DRAM bytes of that kernel for the given shape (no L2 reuse)

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


def _kind(kind: str | None, backward: bool) -> str:
    """The kernel kind; ``backward=True`` without a kind means the dK/dV kernel."""
    kind = kind or ("dkdv" if backward else "fwd")
    if kind not in KERNELS:
        raise ValueError(f"kind={kind!r} must be one of {', '.join(KERNELS)}")
    return kind


def kernel_bytes(shape: AttentionShape, kind: str, config: KernelConfig) -> float:
    """DRAM bytes of one tiled kernel (``fwd``, ``dkdv``, ``dq``) at ``config``,
    every tile load counted (no L2 reuse)."""
    kw = {"fwd": "fwd_config", "dkdv": "bwd_config", "dq": "dq_config"}[_kind(kind, False)]
    t = tiled_traffic(shape, backward=kind != "fwd", **{kw: config})
    return float(sum(p.bytes for p in t.passes if p.kernel == kind))


def feasible_tiles(smem_bytes: int, head_dim: int, dtype: str = "bf16", *, backward: bool = False,
                   num_stages: int = 2, choices=BLOCK_CHOICES, shape: AttentionShape | None = None,
                   include_infeasible: bool = False, kind: str | None = None,
                   head_dim_v: int | None = None) -> list[TileOption]:
    """All (BLOCK_M, BLOCK_N) from ``choices`` whose shared-memory estimate fits
    ``smem_bytes`` (per block) for one kernel at ``num_stages`` pipeline
    stages: ``kind`` is ``"fwd"``, ``"dkdv"`` or ``"dq"`` (``backward=True``
    alone means ``"dkdv"``).  With ``shape`` each option carries the HBM
    bytes of that kernel without L2 reuse (the textbook count that the tile
    shape controls).  Sorted by bytes, then by larger tiles.  ``head_dim_v``:
    V's head dim where it differs from ``head_dim``."""
    _check("smem_bytes", smem_bytes)
    _check("head_dim", head_dim)
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim={head_dim} exceeds {MAX_HEAD_DIM}")
    if head_dim_v is not None:
        _check("head_dim_v", head_dim_v)
        if head_dim_v > MAX_HEAD_DIM:
            raise ValueError(f"head_dim_v={head_dim_v} exceeds {MAX_HEAD_DIM}")
    _check("num_stages", num_stages)
    e = dtype_bytes(dtype)
    kind = _kind(kind, backward)
    est = SMEM_ESTIMATORS[kind]
    out = []
    for bm in choices:
        for bn in choices:
            need = est(bm, bn, head_dim, e, num_stages, head_dim_v)
            if need > smem_bytes and not include_infeasible:
                continue
            hbm = None
            if shape is not None:
                hbm = kernel_bytes(shape, kind, KernelConfig(bm, bn, 4, num_stages, "solver"))
            out.append(TileOption(kind, bm, bn, num_stages, need, smem_bytes, hbm))
    out.sort(key=lambda o: (o.hbm_bytes if o.hbm_bytes is not None else 0.0, -o.block_m * o.block_n))
    return out


def max_block_n(smem_bytes: int, head_dim: int, dtype: str = "bf16", *, block_m: int = 128,
                num_stages: int = 2, backward: bool = False, choices=BLOCK_CHOICES,
                kind: str | None = None, head_dim_v: int | None = None) -> int | None:
    """Largest BLOCK_N from ``choices`` that fits next to a BLOCK_M-row tile (None if none)."""
    e = dtype_bytes(dtype)
    est = SMEM_ESTIMATORS[_kind(kind, backward)]
    ok = [bn for bn in choices if est(block_m, bn, head_dim, e, num_stages, head_dim_v) <= smem_bytes]
    return max(ok) if ok else None


def paper_block_sizes(smem_bytes: int, head_dim: int, dtype: str = "bf16") -> tuple[int, int]:
    """(B_r, B_c) of FlashAttention's Algorithm 1 for SRAM of ``smem_bytes``:
    ``B_c = ceil(M / 4d)``, ``B_r = min(B_c, d)`` with M counted in elements."""
    m_elems = smem_bytes // dtype_bytes(dtype)
    bc = math.ceil(m_elems / (4 * head_dim))
    return min(bc, head_dim), bc


def table_configs_check(smem_bytes: int, head_dim: int, dtype: str = "bf16",
                        head_dim_v: int | None = None) -> list[tuple[str, KernelConfig, bool]]:
    """Each config of the kernels' tables for ``head_dim`` (and V's
    ``head_dim_v``) -- forward, dK/dV, dQ, in table order -- with whether it
    fits ``smem_bytes`` under that kernel's estimator (the solver's test)."""
    e = dtype_bytes(dtype)
    out = []
    for kind in KERNELS:
        est = SMEM_ESTIMATORS[kind]
        for c in candidates(kind, head_dim, head_dim_v):
            out.append((kind, c, est(c.block_m, c.block_n, head_dim, e, c.num_stages, head_dim_v) <= smem_bytes))
    return out


def chosen_configs(smem_bytes: int, head_dim: int, dtype: str = "bf16",
                   head_dim_v: int | None = None) -> dict[str, KernelConfig]:
    """The config each kernel runs with autotuning off: the first of its table
    that fits ``smem_bytes`` (``{"fwd": ..., "dkdv": ..., "dq": ...}``)."""
    return default_configs(head_dim, dtype_bytes(dtype), smem_bytes, head_dim_v)._asdict()
