"""The hardware model: :class:`Value` (a number with its unit, source and
basis) and :class:`Hardware` (one device's peak rates, bandwidth and on-chip
memory).  ``hardware.py`` holds the catalogue of real GPUs, the user files
and the look-up, and explains the bases and units."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

BASES = ("datasheet", "measured", "derived")
PEAK_DTYPES = ("fp16", "bf16", "tf32", "fp32", "fp8")
KB = 1024
MB = 1024 ** 2
TERA = 1e12
GIGA = 1e9


@dataclasses.dataclass(frozen=True)
class Value:
    """One number with its unit, its source and how it was obtained."""

    value: float
    unit: str
    source: str
    basis: str = "datasheet"
    note: str = ""

    def __post_init__(self) -> None:
        if self.basis not in BASES:
            raise ValueError(f"basis={self.basis!r} is not one of {', '.join(BASES)}")
        if (isinstance(self.value, bool) or not isinstance(self.value, (int, float)) or not math.isfinite(self.value)
                or self.value < 0):
            raise ValueError(f"value={self.value!r} must be a finite non-negative number")

    def as_dict(self) -> dict:
        d = {"value": self.value, "unit": self.unit, "source": self.source, "basis": self.basis}
        if self.note:
            d["note"] = self.note
        return d


class UnknownHardwareError(ValueError):
    """Raised for a hardware name that is neither in the catalogue nor in a user file."""


# Fields of Hardware that hold a single Value, with their unit (for file loading).
SCALAR_FIELDS = {
    "hbm_bandwidth": "B/s",
    "memory_capacity": "B",
    "smem_per_sm": "B",
    "smem_per_block": "B",
    "sm_count": "count",
    "tensor_cores": "count",
    "l2_bytes": "B",
    "llc_bytes": "B",
    "interconnect_bandwidth": "B/s",
    "interconnect_gpus": "count",
    "pcie_bandwidth": "B/s",
}


@dataclasses.dataclass(frozen=True)
class Hardware:
    """A GPU (or AMD accelerator) as the cost model sees it.

    ``peak_flops`` maps a dtype name (``fp16``, ``bf16``, ``tf32``, ``fp32``,
    ``fp8``) to the dense matrix (tensor-core) peak.  ``measured`` holds
    measured alternatives for any field, keyed by the field name
    (``"hbm_bandwidth"``, ``"l2_bytes"``) or ``"peak_flops.<dtype>"``; the
    datasheet value stays the primary one so the two can be compared.
    ``sm_count`` counts SMs on NVIDIA and compute units (CUs) on AMD;
    ``smem_per_sm`` / ``smem_per_block`` are shared memory / LDS.
    ``llc_bytes`` is a last-level cache beyond L2 where one exists (AMD
    Infinity Cache).

    Links are per GPU and *per direction* (vendors quote both directions
    added): ``interconnect_bandwidth`` is what one GPU can send to one peer
    over the GPU-to-GPU fabric (NVLink through NVSwitch, a bridge, AMD
    Infinity Fabric), ``interconnect_gpus`` how many GPUs that fabric joins,
    ``pcie_bandwidth`` the host link (x16).  ``cost.interconnect`` uses them.
    """

    name: str
    display_name: str
    vendor: str
    peak_flops: Mapping[str, Value]
    hbm_bandwidth: Value
    memory_capacity: Value | None = None
    smem_per_sm: Value | None = None
    smem_per_block: Value | None = None
    sm_count: Value | None = None
    tensor_cores: Value | None = None
    l2_bytes: Value | None = None
    llc_bytes: Value | None = None
    interconnect_bandwidth: Value | None = None
    interconnect_gpus: Value | None = None
    pcie_bandwidth: Value | None = None
    measured: Mapping[str, Value] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()
    origin: str = "catalogue"

    # -- lookups -----------------------------------------------------------
    def value(self, field: str, basis: str = "datasheet") -> Value | None:
        """The :class:`Value` of ``field`` (``"hbm_bandwidth"``,
        ``"peak_flops.bf16"``, ...).  ``basis="measured"`` prefers a measured
        value and falls back to the primary one; ``"datasheet"`` returns the
        primary value."""
        if basis not in ("datasheet", "measured"):
            raise ValueError(f"basis={basis!r} must be 'datasheet' or 'measured'")
        if basis == "measured" and field in self.measured:
            return self.measured[field]
        if field.startswith("peak_flops."):
            return self.peak_flops.get(field.split(".", 1)[1])
        if field not in SCALAR_FIELDS:
            raise ValueError(f"field={field!r} is not a hardware field")
        return getattr(self, field)

    def peak(self, dtype: str, basis: str = "datasheet") -> float:
        """Dense matrix peak in FLOP/s for ``dtype``; ``fp32`` falls back to ``tf32``
        only if no fp32 figure exists."""
        if dtype not in PEAK_DTYPES:
            raise ValueError(f"dtype={dtype!r} is not one of {', '.join(PEAK_DTYPES)}")
        v = self.value(f"peak_flops.{dtype}", basis)
        if v is None:
            have = ", ".join(sorted(self.peak_flops)) or "none"
            raise ValueError(f"hardware {self.name!r} has no {dtype} peak (it has: {have})")
        if v.value <= 0:
            raise ValueError(f"hardware {self.name!r}: the {dtype} peak is {v.value!r}; it must be > 0")
        return float(v.value)

    def bandwidth(self, basis: str = "datasheet") -> float:
        """HBM (DRAM) bandwidth in bytes/s (ValueError unless > 0)."""
        v = self.value("hbm_bandwidth", basis)
        if v is None or v.value <= 0:
            raise ValueError(f"hardware {self.name!r}: hbm_bandwidth is {None if v is None else v.value!r}; "
                             f"it must be > 0")
        return float(v.value)

    def ridge_point(self, dtype: str = "bf16", basis: str = "datasheet") -> float:
        """FLOP per byte above which a kernel is compute-bound: peak / bandwidth."""
        return self.peak(dtype, basis) / self.bandwidth(basis)

    def get_int(self, field: str, basis: str = "datasheet") -> int | None:
        v = self.value(field, basis)
        return None if v is None else int(v.value)

    def has_measured(self) -> bool:
        return bool(self.measured)

    def as_dict(self) -> dict:
        """JSON-ready dict in the same schema :func:`load_hardware_file` reads."""
        out: dict[str, Any] = {"name": self.name, "display_name": self.display_name,
                               "vendor": self.vendor,
                               "peak_flops": {k: v.as_dict() for k, v in self.peak_flops.items()}}
        for f in SCALAR_FIELDS:
            v = getattr(self, f)
            if v is not None:
                out[f] = v.as_dict()
        if self.measured:
            out["measured"] = {k: v.as_dict() for k, v in self.measured.items()}
        if self.notes:
            out["notes"] = list(self.notes)
        return out
