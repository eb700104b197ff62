"""Roofline: arithmetic intensity, ridge point, bound and predicted time.

A kernel that performs ``F`` FLOPs and moves ``Q`` bytes needs at least
``max(F / peak, Q / bandwidth)`` seconds.  Its arithmetic intensity
``I = F / Q`` decides which term wins: below the ridge point
``peak / bandwidth`` (FLOP per byte) it is memory-bound, above it
compute-bound.  The time of an implementation is the sum over its kernels
(each is bounded separately: an elementwise pass cannot borrow the matmul's
intensity), plus a fixed launch overhead per kernel, which dominates for
tiny problems ("latency-bound").
"""
from __future__ import annotations

import dataclasses
import io as _io
from typing import Iterable, Mapping

from .hardware import Hardware, get_hardware
from .io import (LAUNCH_OVERHEAD_S, AttentionShape, FlopBreakdown, ResidentMemory, TrafficEstimate,
                 cache_model, flop_breakdown, resident_memory, standard_traffic, tiled_traffic)
from .shape import KERNEL_LABELS, KernelFit, kernel_fits
from ..configs import KernelConfig

PHASES = ("fwd", "bwd", "fwd_bwd")


def peak_dtype(dtype: str) -> str:
    """The peak-rate key for an input dtype: half types use their tensor-core
    rate; fp32 inputs are multiplied in full fp32 (the kernels ask for IEEE
    products, and PyTorch does not enable TF32 by default)."""
    return {"fp16": "fp16", "bf16": "bf16", "fp32": "fp32"}[dtype]


@dataclasses.dataclass(frozen=True)
class PhasePrediction:
    impl: str
    phase: str
    flops: float
    bytes: float
    kernels: int
    peak_flops: float
    bandwidth: float
    compute_time_s: float
    memory_time_s: float
    time_s: float

    @property
    def intensity(self) -> float:
        """FLOP per DRAM byte."""
        return self.flops / self.bytes if self.bytes else float("inf")

    @property
    def ridge(self) -> float:
        return self.peak_flops / self.bandwidth

    @property
    def bound(self) -> str:
        """``memory``, ``compute`` or ``latency`` (launch overhead exceeds the
        longer of the compute and memory times)."""
        overhead = self.time_s - max(self.compute_time_s, self.memory_time_s)
        if overhead > max(self.compute_time_s, self.memory_time_s):
            return "latency"
        return "memory" if self.intensity < self.ridge else "compute"

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(intensity=self.intensity, ridge=self.ridge, bound=self.bound)
        return d


def predict(traffic: TrafficEstimate, hw: Hardware, *, basis: str = "datasheet",
            launch_overhead_s: float = LAUNCH_OVERHEAD_S) -> dict[str, PhasePrediction]:
    """Roofline prediction of each phase (``fwd``, ``bwd`` if present, ``fwd_bwd``).

    Per kernel ``t = max(F/peak, Q/bw) + overhead``; a phase sums its kernels.
    ``compute_time_s``/``memory_time_s`` are the phase totals ``F/peak`` and
    ``Q/bw`` (for the intensity picture)."""
    hw = _hardware_arg(hw)
    peak = hw.peak(peak_dtype(traffic.shape.dtype), basis)
    bw = hw.bandwidth(basis)
    out = {}
    for phase in (*traffic.phases(), "fwd_bwd"):
        sel = None if phase == "fwd_bwd" else phase
        if phase == "fwd_bwd" and "bwd" not in traffic.phases():
            continue
        passes = [p for p in traffic.passes if sel is None or p.phase == sel]
        t = sum(max(p.flops / peak, p.bytes / bw) + launch_overhead_s for p in passes)
        f, q = traffic.flops(sel), traffic.bytes(sel)
        out[phase] = PhasePrediction(traffic.impl, phase, f, q, len(passes), peak, bw, f / peak, q / bw, t)
    return out


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Both implementations on one device and shape: the object the CLI and
    the report render."""

    shape: AttentionShape
    hardware: Hardware
    basis: str
    fusion: str
    standard: TrafficEstimate
    tiled: TrafficEstimate
    tiled_no_cache: TrafficEstimate
    flops: FlopBreakdown
    standard_pred: Mapping[str, PhasePrediction]
    tiled_pred: Mapping[str, PhasePrediction]
    standard_memory: ResidentMemory
    tiled_memory: ResidentMemory
    kernel_fit: Mapping[str, KernelFit] = dataclasses.field(default_factory=dict)

    @property
    def ridge(self) -> float:
        return self.hardware.ridge_point(peak_dtype(self.shape.dtype), self.basis)

    def not_runnable(self, phase: str | None = None) -> dict[str, str]:
        """{kernel: the kernels' ValueError message} for the tiled kernels that
        refuse this shape on this device (no config fits its shared memory),
        limited to those ``phase`` (``fwd``, ``bwd``, ``fwd_bwd``) runs."""
        kinds = {"fwd": ("fwd",), "bwd": ("dkdv", "dq")}.get(phase, ("fwd", "dkdv", "dq"))
        return {k: f.message for k, f in self.kernel_fit.items() if k in kinds and not f.runnable}

    def runnable(self, phase: str) -> bool:
        """Whether the tiled kernels of ``phase`` run for this shape on this device."""
        return not self.not_runnable(phase)

    def speedup(self, phase: str = "fwd") -> float:
        """Standard time over tiled time; nan where the tiled kernels do not run."""
        if not self.runnable(phase):
            return float("nan")
        return self.standard_pred[phase].time_s / self.tiled_pred[phase].time_s

    def as_dict(self) -> dict:
        return {
            "shape": self.shape.as_dict(),
            "hardware": self.hardware.name,
            "basis": self.basis,
            "fusion": self.fusion,
            "ridge_flop_per_byte": self.ridge,
            "flops": self.flops.as_dict(),
            "standard": {"traffic": self.standard.as_dict(),
                         "prediction": {k: v.as_dict() for k, v in self.standard_pred.items()},
                         "memory": self.standard_memory.as_dict()},
            "tiled": {"traffic": self.tiled.as_dict(),
                      "tile_loads_no_cache": {ph: self.tiled_no_cache.bytes(ph) for ph in ("fwd", "bwd")},
                      "prediction": {k: v.as_dict() for k, v in self.tiled_pred.items()},
                      "runnable": {ph: self.runnable(ph) for ph in self.tiled_pred},
                      "kernels": {k: f.as_dict() for k, f in self.kernel_fit.items()},
                      "memory": self.tiled_memory.as_dict()},
            "speedup": {ph: (self.speedup(ph) if self.runnable(ph) else None)
                        for ph in self.standard_pred if ph in self.tiled_pred},
        }


def _hardware_arg(hw) -> Hardware:
    """``hw`` as a :class:`Hardware`: one, or a name :func:`get_hardware` knows."""
    if isinstance(hw, Hardware):
        return hw
    if isinstance(hw, str):
        return get_hardware(hw)
    raise TypeError(f"hw={hw!r} must be a Hardware or a hardware name, not {type(hw).__name__}")


def fit_notes(comp: Comparison) -> list[str]:
    """One line per tiled kernel whose config does not fit the device's shared
    memory: refused by the kernels (the backward or the whole tiled column
    is then not runnable) or run with a config the estimate says is too big."""
    lines = []
    for kind, f in comp.kernel_fit.items():
        if not f.runnable:
            lines.append(f"note: the tiled {KERNEL_LABELS[kind]} kernel does not run here (the kernels raise "
                         f"ValueError): {f.message}")
        elif not f.fits:
            lines.append(f"note: {f.message}")
    return lines


def compare(shape: AttentionShape, hw: Hardware, *, fusion: str = "eager", basis: str = "datasheet",
            fwd_config: KernelConfig | None = None, bwd_config: KernelConfig | None = None,
            l2_reuse: bool = True, dq_config: KernelConfig | None = None) -> Comparison:
    """Model standard and tiled attention for ``shape`` on ``hw``.

    The tiled configs (``fwd_config``, ``bwd_config`` for the dK/dV kernel,
    ``dq_config`` for the dQ kernel) default to the first entry of each
    kernel's table that fits the device's shared memory per block;
    ``l2_reuse`` switches the L2 reuse model on (DRAM bytes) -- the no-reuse
    tile-load count is always included too.

    ``hw``: a :class:`Hardware` or a name :func:`get_hardware` knows.
    ``kernel_fit`` of the result says, kernel by kernel, whether the configs
    fit the device's shared memory and whether the kernels run at all
    (:func:`~tileattn.cost.shape.kernel_fits`); the traffic of a kernel that
    does not run is still computed (with its smallest config) but
    :meth:`Comparison.runnable` is False for its phases."""
    if not isinstance(shape, AttentionShape):
        raise TypeError(f"shape={shape!r} must be an AttentionShape, not {type(shape).__name__}")
    hw = _hardware_arg(hw)
    cache = cache_model(hw, basis) if l2_reuse else None
    smem = hw.get_int("smem_per_block", basis)
    l2 = cache.l2_bytes if cache else None
    from .io import _resolve_configs  # the same resolution tiled_traffic uses
    fc, bc, qc = _resolve_configs(shape, fwd_config, bwd_config, smem, dq_config)
    std = standard_traffic(shape, fusion=fusion, l2_bytes=l2)
    til = tiled_traffic(shape, fwd_config=fc, bwd_config=bc, dq_config=qc, cache=cache)
    raw = tiled_traffic(shape, fwd_config=fc, bwd_config=bc, dq_config=qc, cache=None)
    return Comparison(
        shape=shape, hardware=hw, basis=basis, fusion=fusion, standard=std, tiled=til, tiled_no_cache=raw,
        flops=flop_breakdown(shape, fc, bc, qc),
        standard_pred=predict(std, hw, basis=basis), tiled_pred=predict(til, hw, basis=basis),
        standard_memory=resident_memory(shape, "standard", fusion), tiled_memory=resident_memory(shape, "tiled"),
        kernel_fit=kernel_fits(shape, smem, (fc, bc, qc)),
    )


# ---------------------------------------------------------------------------
# Plot
# ---------------------------------------------------------------------------
def plot_roofline(comp: Comparison, path=None, *, measured: Iterable[Mapping] | None = None, ax=None):
    """Log-log roofline of ``comp.hardware`` with both implementations' forward
    and forward+backward points; ``measured`` rows (dicts with ``impl``,
    ``mode``, ``flops``, ``bytes``, ``time_s``) are overlaid as achieved
    FLOP/s.  Writes a PNG to ``path`` if given; returns the figure."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hw = comp.hardware
    peak = hw.peak(peak_dtype(comp.shape.dtype), comp.basis)
    bw = hw.bandwidth(comp.basis)
    ridge = peak / bw
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    else:
        fig = ax.figure
    pts = [p for preds in (comp.standard_pred, comp.tiled_pred) for p in preds.values()]
    lo = min([ridge / 100] + [p.intensity / 3 for p in pts])
    hi = max([ridge * 30] + [p.intensity * 3 for p in pts])
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.loglog(xs, [min(peak, x * bw) for x in xs], color="black", lw=1.6,
              label=f"{hw.display_name} roof ({comp.basis})")
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, peak), textcoords="offset points", xytext=(6, -14),
                fontsize=8, color="grey")
    style = {"standard": ("tab:red", "o"), "tiled": ("tab:blue", "s")}
    for preds in (comp.standard_pred, comp.tiled_pred):
        for ph, p in preds.items():
            if ph == "bwd":
                continue
            c, m = style[p.impl]
            achieved = p.flops / p.time_s
            ax.loglog([p.intensity], [achieved], m, color=c, ms=8 if ph == "fwd" else 6,
                      mfc=c if ph == "fwd" else "white",
                      label=f"{p.impl} {ph.replace('_', '+')} (model)")
    for row in measured or ():
        if not row.get("bytes") or not row.get("time_s"):
            continue
        c, m = style.get(row.get("impl"), ("tab:green", "^"))
        ax.loglog([row["flops"] / row["bytes"]], [row["flops"] / row["time_s"]], "x", color=c, ms=9, mew=2,
                  label=f"{row.get('impl')} {row.get('mode', '')} (measured)")
    ax.set_xlabel("arithmetic intensity (FLOP / HBM byte)")
    ax.set_ylabel("FLOP/s")
    s = comp.shape
    dv = f" dv={s.head_dim_v}" if s.head_dim_v != s.head_dim else ""
    ax.set_title(f"B={s.batch} H={s.heads} N={s.seqlen_q} d={s.head_dim}{dv} {s.dtype}"
                 f"{' causal' if s.causal else ''}", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=7, loc="lower right")
    if own:
        fig.tight_layout()
    if path is not None:
        fig.savefig(path)
    return fig


def figure_png_bytes(fig) -> bytes:
    buf = _io.BytesIO()
    fig.savefig(buf, format="png")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return buf.getvalue()
