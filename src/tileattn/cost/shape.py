"""The attention shape, the unit constants of the IO model, and the kernel
configs the model assumes for a shape (``cost/io.py`` holds the conventions)."""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from .. import configs as _configs
from ..configs import KernelConfig
from ..validation import MAX_HEAD_DIM

DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
FUSION_LEVELS = ("textbook", "eager")
FLOP_MODES = ("fwd", "bwd", "fwd_bwd")
LSE_BYTES = 4  # lse, delta and lse2 are float32 rows

# Share of L2 one streamed operand may occupy and still be served from L2 to
# later programs: the rest holds the other operands, outputs in flight and
# is lost to set conflicts.  A modelling constant, checked against Nsight
# Compute measurements (docs/io-model.md).
L2_USABLE_FRACTION = 0.5
# Launch overhead per kernel used by the roofline time (seconds).
LAUNCH_OVERHEAD_S = 4e-6


def _check_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            if float(value) != int(value):
                raise ValueError
            value = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}={value!r} must be an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (``fp16``, ``bf16``, ``fp32``)."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"dtype={dtype!r} is not one of {', '.join(DTYPE_BYTES)}") from None


@dataclasses.dataclass(frozen=True)
class AttentionShape:
    """The problem: ``q (B, Hq, Nq, D)``, ``k (B, Hkv, Nk, D)``, ``v (B, Hkv, Nk, Dv)``
    (``head_dim_v`` Dv defaults to ``head_dim``)."""

    batch: int
    heads: int
    seqlen_q: int
    head_dim: int
    seqlen_k: int | None = None
    kv_heads: int | None = None
    causal: bool = False
    dtype: str = "bf16"
    head_dim_v: int | None = None

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        set_("batch", _check_int("batch", self.batch))
        set_("heads", _check_int("heads", self.heads))
        set_("seqlen_q", _check_int("seqlen_q", self.seqlen_q))
        set_("head_dim", _check_int("head_dim", self.head_dim))
        if self.head_dim > MAX_HEAD_DIM:
            raise ValueError(f"head_dim={self.head_dim} exceeds {MAX_HEAD_DIM}, the largest the kernels support")
        set_("head_dim_v", self.head_dim if self.head_dim_v is None else _check_int("head_dim_v", self.head_dim_v))
        if self.head_dim_v > MAX_HEAD_DIM:
            raise ValueError(f"head_dim_v={self.head_dim_v} exceeds {MAX_HEAD_DIM}, the largest the kernels "
                             f"support")
        set_("seqlen_k", self.seqlen_q if self.seqlen_k is None else _check_int("seqlen_k", self.seqlen_k))
        set_("kv_heads", self.heads if self.kv_heads is None else _check_int("kv_heads", self.kv_heads))
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")
        dtype_bytes(self.dtype)
        set_("causal", bool(self.causal))

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.kv_heads

    @property
    def score_elements(self) -> int:
        """Entries of the full score matrix over all batches and heads."""
        return self.batch * self.heads * self.seqlen_q * self.seqlen_k

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def parse_config_name(name: str, source: str = "parsed") -> KernelConfig:
    """Inverse of :attr:`KernelConfig.name`: ``"M128-N64-w8-s3"`` -> KernelConfig."""
    try:
        m, n, w, st = name.split("-")
        assert m[0] == "M" and n[0] == "N" and w[0] == "w" and st[0] == "s"
        return KernelConfig(int(m[1:]), int(n[1:]), int(w[1:]), int(st[1:]), source)
    except (ValueError, AssertionError, IndexError):
        raise ValueError(f"config={name!r} is not of the form M<block_m>-N<block_n>-w<warps>-s<stages>") from None


class DefaultConfigs(NamedTuple):
    """One config per tiled kernel: forward, backward dK/dV, backward dQ."""

    fwd: KernelConfig
    dkdv: KernelConfig
    dq: KernelConfig


def default_configs(head_dim: int, elem_bytes: int = 2, smem_per_block: int | None = None,
                    head_dim_v: int | None = None) -> DefaultConfigs:
    """The (forward, dK/dV, dQ) configs the kernels would start from: the first
    entry of each kernel's table (``FWD_CONFIGS``, ``DKDV_CONFIGS``,
    ``DQ_CONFIGS``) for the head-dim bucket, or, given the device's shared
    memory per block, the first one whose estimate under that kernel's own
    estimator fits (the launcher drops the others before autotuning, and
    takes exactly this one when autotuning is off).  ``head_dim_v``: V's
    head dim where it differs."""
    out = []
    for kind in ("fwd", "dkdv", "dq"):
        cands = _configs.candidates(kind, head_dim, head_dim_v)
        if smem_per_block is not None:
            cands = _configs.fitting(cands, head_dim, elem_bytes, smem_per_block, kind=kind, head_dim_v=head_dim_v)
        out.append(cands[0])
    return DefaultConfigs(*out)


def _resolve_configs(shape, fwd_config=None, bwd_config=None, smem_per_block=None, dq_config=None
                     ) -> DefaultConfigs:
    """Given configs, with the defaults of :func:`default_configs` for those left out."""
    d = default_configs(shape.head_dim, shape.elem_bytes, smem_per_block, shape.head_dim_v)
    return DefaultConfigs(fwd_config or d.fwd, bwd_config or d.dkdv, dq_config or d.dq)
