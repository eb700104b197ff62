"""Check the byte model against Nsight Compute measurements.

A results file (written by ``benchmarks/measure_bytes.py``) is JSON::

    {"schema": 1, "hardware": "nvidia-h200", "device_name": "...", "tool": "...",
     "rows": [{"shape_name": "gpt2-medium", "batch": 64, "heads": 16, "kv_heads": 16,
               "seqlen_q": 1024, "seqlen_k": 1024, "head_dim": 64, "causal": false,
               "dtype": "bf16", "impl": "standard" | "tiled", "mode": "fwd" | "fwdbwd",
               "configs": {"fwd": "M128-N64-w8-s3", "dkdv": "...", "dq": "..."},   # tiled, optional
               "measured_read_bytes": ..., "measured_write_bytes": ..., "kernels": ...,
               "kernel_names": [...], "gpu_time_ms": ..., "time_ms": ...,
               "predicted_bytes": ..., "ratio": ...}, ...]}

A row may carry ``measured_total_bytes`` (read + write) instead of the two
separate counts, e.g. when it was transcribed from a printed log; ``source``
then says where it came from.  Rows with empty ``configs`` ran with
autotuning off, i.e. with the first config of each kernel's table that fits
the device (:func:`tileattn.cost.io.default_configs`), which is what the
prediction assumes for them.

The prediction is always recomputed from the shape (``predicted_bytes`` in
the file is informational), so a change to the model is checked against the
measurements, not against its own earlier output.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .hardware import get_hardware
from .io import AttentionShape, attention_flops, cache_model, parse_config_name, standard_traffic, tiled_traffic

MEASURED_H200 = Path(__file__).with_name("data") / "measured_h200.json"
MODES = ("fwd", "fwdbwd")
IMPLS = ("standard", "tiled")
DEFAULT_TOLERANCE = 0.20


def row_shape(row: dict) -> AttentionShape:
    return AttentionShape(batch=row["batch"], heads=row["heads"], seqlen_q=row["seqlen_q"],
                          head_dim=row["head_dim"], seqlen_k=row.get("seqlen_k"), kv_heads=row.get("kv_heads"),
                          causal=bool(row.get("causal", False)), dtype=row.get("dtype", "bf16"),
                          head_dim_v=row.get("head_dim_v"))


def _mode(row: dict) -> str:
    mode = row.get("mode")
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} must be one of {', '.join(MODES)}")
    return mode


def model_flops(row: dict) -> float:
    """Useful FLOPs of the row's call (the numerator of achieved FLOP/s)."""
    s = row_shape(row)
    return attention_flops(s.batch, s.heads, s.seqlen_q, s.seqlen_k, s.head_dim, causal=s.causal,
                           mode="fwd" if _mode(row) == "fwd" else "fwd_bwd", head_dim_v=s.head_dim_v)


def predict_row(row: dict, hardware: str | None = None, *, fusion: str = "eager") -> float:
    """Model DRAM bytes (read + write) for one measured row."""
    s = row_shape(row)
    hw = get_hardware(hardware or row.get("hardware") or "nvidia-h200")
    backward = _mode(row) == "fwdbwd"
    impl = row.get("impl")
    cache = cache_model(hw)
    if impl == "standard":
        t = standard_traffic(s, fusion=fusion, backward=backward, l2_bytes=cache.l2_bytes if cache else None)
    elif impl == "tiled":
        cfg = row.get("configs") or {}
        kw = {}
        for key, arg in (("fwd", "fwd_config"), ("dkdv", "bwd_config"), ("dq", "dq_config")):
            if cfg.get(key):
                kw[arg] = parse_config_name(cfg[key], "measured run")
        t = tiled_traffic(s, cache=cache, backward=backward, smem_per_block=hw.get_int("smem_per_block"), **kw)
    else:
        raise ValueError(f"impl={impl!r} must be one of {', '.join(IMPLS)}")
    return t.bytes()


@dataclasses.dataclass(frozen=True)
class RowCheck:
    label: str
    measured: float
    predicted: float
    tolerance: float

    @property
    def ratio(self) -> float:
        """measured / predicted."""
        return self.measured / self.predicted if self.predicted else float("inf")

    @property
    def ok(self) -> bool:
        return abs(self.ratio - 1.0) <= self.tolerance


def row_label(row: dict) -> str:
    name = row.get("shape_name") or (f"B{row.get('batch')}-H{row.get('heads')}-N{row.get('seqlen_q')}"
                                     f"-d{row.get('head_dim')}{'-causal' if row.get('causal') else ''}")
    return f"{name}-{row.get('impl')}-{row.get('mode')}"


def measured_bytes(row: dict) -> float:
    """Measured DRAM bytes of a row: read + write, or ``measured_total_bytes``."""
    if row.get("measured_read_bytes") is not None and row.get("measured_write_bytes") is not None:
        return float(row["measured_read_bytes"]) + float(row["measured_write_bytes"])
    if row.get("measured_total_bytes") is not None:
        return float(row["measured_total_bytes"])
    raise KeyError(f"{row_label(row)}: no measured_read_bytes/measured_write_bytes or measured_total_bytes")


def check_row(row: dict, hardware: str | None = None, tolerance: float = DEFAULT_TOLERANCE) -> RowCheck:
    measured = measured_bytes(row)
    if measured <= 0:
        raise ValueError(f"{row_label(row)}: measured bytes must be positive")
    return RowCheck(row_label(row), measured, predict_row(row, hardware), tolerance)


def load_rows(path=MEASURED_H200) -> tuple[str | None, list[dict]]:
    """(hardware name, rows) of a results file; ``(None, [])`` if it does not exist."""
    p = Path(path)
    if not p.is_file():
        return None, []
    data = json.loads(p.read_text())
    if isinstance(data, list):
        return None, data
    return data.get("hardware"), list(data.get("rows", []))


def _shape_text(row: dict) -> str:
    kv = f", {row['kv_heads']} kv" if row.get("kv_heads") not in (None, row.get("heads")) else ""
    return (f"{row.get('shape_name', '')} (B={row['batch']}, H={row['heads']}{kv}, N={row['seqlen_q']}, "
            f"d={row['head_dim']}{', causal' if row.get('causal') else ''})")


def markdown_table(path=MEASURED_H200, hardware: str | None = None) -> str:
    """Measured against model bytes for every row of a results file, as a
    Markdown table (the one in ``docs/io-model.md``)."""
    hw, rows = load_rows(path)
    lines = ["| shape | impl | mode | measured GB | model GB | measured / model |",
             "| --- | --- | --- | ---: | ---: | ---: |"]
    for row in rows:
        chk = check_row(row, hardware or hw)
        mode = "fwd+bwd" if row.get("mode") == "fwdbwd" else row.get("mode")
        lines.append(f"| {_shape_text(row)} | {row.get('impl')} | {mode} | {chk.measured / 1e9:.3f} | "
                     f"{chk.predicted / 1e9:.3f} | {chk.ratio:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m tileattn.cost.validation [results.json]
    import sys

    print(markdown_table(sys.argv[1] if len(sys.argv) > 1 else MEASURED_H200), end="")
