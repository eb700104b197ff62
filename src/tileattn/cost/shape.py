"""The attention shape, the unit constants of the IO model, and the kernel
configs the model assumes for a shape (``cost/io.py`` holds the conventions)."""
from __future__ import annotations

import dataclasses
import math
import numbers
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
    """``value`` as an int: an integer, or a float with an integral finite
    value (``1024.0``); TypeError for anything else that is not a number
    (strings, bools, None), ValueError for a fraction, inf, nan or a value
    below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={value!r} must be an integer, not {type(value).__name__}")
    if not isinstance(value, numbers.Integral):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{name}={value!r} must be an integer")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


def _check_bool(name: str, value) -> bool:
    """``value`` as a bool: True or False (numpy's bools too); TypeError for
    anything else (``causal="false"`` would otherwise read as True)."""
    if isinstance(value, bool):
        return value
    dtype = getattr(value, "dtype", None)
    if type(value).__module__ == "numpy" and getattr(dtype, "kind", "") == "b" and getattr(value, "ndim", 1) == 0:
        return bool(value)
    raise TypeError(f"{name}={value!r} must be a bool, not {type(value).__name__}")


def _check_head_dim(name: str, value) -> int:
    """A head dim: an integer in [1, MAX_HEAD_DIM] (the kernels' range)."""
    value = _check_int(name, value)
    if value > MAX_HEAD_DIM:
        raise ValueError(f"{name}={value} exceeds {MAX_HEAD_DIM}, the largest the kernels support")
    return value


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (``fp16``, ``bf16``, ``fp32``)."""
    try:
        return DTYPE_BYTES[dtype]
    except (KeyError, TypeError):
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
        set_("head_dim", _check_head_dim("head_dim", self.head_dim))
        set_("head_dim_v", self.head_dim if self.head_dim_v is None else _check_head_dim("head_dim_v",
                                                                                           self.head_dim_v))
        set_("seqlen_k", self.seqlen_q if self.seqlen_k is None else _check_int("seqlen_k", self.seqlen_k))
        set_("kv_heads", self.heads if self.kv_heads is None else _check_int("kv_heads", self.kv_heads))
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")
        dtype_bytes(self.dtype)
        set_("causal", _check_bool("causal", self.causal))

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
    takes exactly this one when autotuning is off).  If none fits, the
    smallest (what the launcher tries; :func:`kernel_fits` says whether the
    kernels run at all).  ``head_dim_v``: V's head dim where it differs."""
    head_dim = _check_head_dim("head_dim", head_dim)
    head_dim_v = None if head_dim_v is None else _check_head_dim("head_dim_v", head_dim_v)
    elem_bytes = _check_int("elem_bytes", elem_bytes)
    if elem_bytes not in set(DTYPE_BYTES.values()):
        raise ValueError(f"elem_bytes={elem_bytes} must be one of {sorted(set(DTYPE_BYTES.values()))}")
    if smem_per_block is not None:
        smem_per_block = _check_int("smem_per_block", smem_per_block)
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


KERNEL_LABELS = {"fwd": "forward", "dkdv": "backward dK/dV", "dq": "backward dQ"}


@dataclasses.dataclass(frozen=True)
class KernelFit:
    """Whether one tiled kernel's config fits the device's shared memory.

    ``fits``: the config's estimate is within ``smem_per_block``.
    ``runnable``: False where the kernels refuse the shape on this device
    (no config of the kernel's table fits and the head dim is above
    ``configs.SMEM_CHECKED_ABOVE``: ``configs.check_fits`` raises the
    ValueError that ``message`` quotes).  A config that does not fit at a
    smaller head dim still runs: the launcher tries the smallest of the table
    and the compiler, whose real requirement is below the estimate there,
    decides (``message`` says so)."""

    kind: str
    config: KernelConfig
    fits: bool
    runnable: bool = True
    message: str = ""

    def as_dict(self) -> dict:
        return {"kind": self.kind, "config": self.config.name, "fits": self.fits, "runnable": self.runnable,
                "message": self.message}


def kernel_fits(shape: AttentionShape, smem_per_block: int | None,
                configs: DefaultConfigs | None = None) -> dict[str, KernelFit]:
    """:class:`KernelFit` of the forward, dK/dV and dQ kernels for ``shape``
    on a device with ``smem_per_block`` bytes of shared memory per block
    (None: unknown, everything is taken to fit).  ``configs``: the configs
    the model uses (default: :func:`default_configs` for that device)."""
    s = shape
    if configs is None:
        configs = _resolve_configs(s, smem_per_block=smem_per_block)
    out = {}
    for kind, cfg in zip(("fwd", "dkdv", "dq"), configs):
        if smem_per_block is None:
            out[kind] = KernelFit(kind, cfg, True)
            continue
        est = _configs.SMEM_ESTIMATORS[kind]
        need = est(cfg.block_m, cfg.block_n, s.head_dim, s.elem_bytes, cfg.num_stages, s.head_dim_v)
        if need <= smem_per_block:
            out[kind] = KernelFit(kind, cfg, True)
            continue
        table = _configs.candidates(kind, s.head_dim, s.head_dim_v)
        if any(est(c.block_m, c.block_n, s.head_dim, s.elem_bytes, c.num_stages, s.head_dim_v) <= smem_per_block
               for c in table):
            out[kind] = KernelFit(kind, cfg, False, True, (
                f"the {KERNEL_LABELS[kind]} config {cfg.name} needs {need:,} bytes of shared memory per block "
                f"(estimated), more than the {smem_per_block:,} of this device; the model uses it as given"))
            continue
        try:
            _configs.check_fits((kind,), s.head_dim, s.elem_bytes, smem_per_block, s.head_dim_v, s.dtype)
        except ValueError as exc:
            out[kind] = KernelFit(kind, cfg, False, False, str(exc))
            continue
        out[kind] = KernelFit(kind, cfg, False, True, (
            f"no {KERNEL_LABELS[kind]} config's shared-memory estimate fits {smem_per_block:,} bytes per block; "
            f"{cfg.name} ({need:,} bytes estimated) is modelled: the launcher tries the smallest config and the "
            f"compiler decides whether it fits"))
    return out
