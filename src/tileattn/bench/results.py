"""One row per (point, provider), appended to CSV and JSON lines files, with
the run's metadata (GPU, driver, versions, git commit, time) on every row so
that each file stays self-describing when several runs are appended.

The schema grows by adding fields with defaults, never by renaming: a file
written before a field existed loads with that field at its default, and
appending rows to an older CSV rewrites its header (old rows get empty cells)
so that columns never shift."""
from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import uuid
from pathlib import Path
from typing import Iterable, Optional

import torch

CSV_NAME = "bench.csv"
JSONL_NAME = "bench.jsonl"


@dataclasses.dataclass
class Row:
    # what was measured
    provider: str
    status: str                       # ok | oom | wrong: ... | failed: ... | unavailable: ...
    mode: str                         # fwd | bwd | fwd_bwd
    causal: bool
    batch: int
    heads: int
    kv_heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str
    device: str
    # results (None where not measured)
    ms: Optional[float] = None        # median of ms_rounds
    flops: Optional[float] = None     # tileattn.cost.io.attention_flops
    tflops: Optional[float] = None    # flops / time
    model_bytes: Optional[float] = None
    bytes_model: str = ""             # which IO model gave model_bytes
    hbm_gbs: Optional[float] = None   # model_bytes / time
    peak_mem_bytes: Optional[int] = None
    # correctness (first point of each configuration)
    check: str = ""                   # passed | wrong | skipped: ... | "" (not a check point)
    rel_err_ref: Optional[float] = None       # vs float32 standard attention, max over checked tensors
    rel_err_tileattn: Optional[float] = None  # vs tileattn's outputs, max over checked tensors
    check_detail: str = ""
    # timing rounds: the point's providers are timed in turn, ``rounds`` times,
    # in round_orders' order; ms_rounds holds this provider's time in each round
    # (in CSV: space-separated).  Absent (None) in files older than the rounds.
    rounds: Optional[int] = None
    ms_rounds: Optional[list] = None
    # metadata of the run
    run_id: str = ""
    timestamp: str = ""
    gpu: str = ""
    driver: str = ""
    torch: str = ""
    triton: str = ""
    python: str = ""
    git_commit: str = ""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELDS = [f.name for f in dataclasses.fields(Row)]
METADATA_FIELDS = ("run_id", "timestamp", "gpu", "driver", "torch", "triton", "python", "git_commit")
DEFAULTS = {f.name: f.default for f in dataclasses.fields(Row) if f.default is not dataclasses.MISSING}
_INT = {"batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim", "peak_mem_bytes", "rounds"}
_FLOAT = {"ms", "flops", "tflops", "model_bytes", "hbm_gbs", "rel_err_ref", "rel_err_tileattn"}
_FLOAT_LIST = {"ms_rounds"}


def _run(cmd, cwd=None) -> Optional[str]:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 and res.stdout.strip() else None


def git_commit(path: str | os.PathLike | None = None) -> str:
    """Short commit of the checkout holding ``path`` (default: this package),
    with ``-dirty`` when tracked files differ from it; ``"unknown"`` outside one."""
    cwd = str(path or Path(__file__).resolve().parent)
    commit = _run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd)
    if commit is None:
        return "unknown"
    try:
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=cwd, timeout=20).returncode == 1
    except (OSError, subprocess.SubprocessError):
        dirty = False
    return commit + ("-dirty" if dirty else "")


def driver_version() -> str:
    """NVIDIA driver version from nvidia-smi, else the CUDA runtime torch was built with."""
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if out:
        return out.splitlines()[0].strip()
    if torch.version.cuda:
        return f"cuda {torch.version.cuda}"
    if getattr(torch.version, "hip", None):
        return f"hip {torch.version.hip}"
    return "n/a"


def gpu_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def collect_metadata(device: torch.device | str = "cpu") -> dict:
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "run_id": now.strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6],
        "timestamp": now.isoformat(timespec="seconds"),
        "gpu": gpu_name(device),
        "driver": driver_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "git_commit": git_commit(),
    }


def _to_csv_value(value):
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return " ".join(repr(float(x)) for x in value)
    return value


def _upgrade_csv_header(path: Path) -> list[str]:
    """The columns to append with: FIELDS, after rewriting a file whose header
    differs (an older schema) so that its rows sit under the right columns.
    Columns the file has and FIELDS lacks are kept, at the end."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        header = list(reader.fieldnames or [])
        if header == FIELDS:
            return FIELDS
        old = list(reader)
    columns = FIELDS + [c for c in header if c not in FIELDS]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns, restval="")
        w.writeheader()
        w.writerows(old)
    os.replace(tmp, path)
    return columns


def append_csv(rows: Iterable[Row], path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    columns = FIELDS if new else _upgrade_csv_header(path)
    with open(path, "a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns, restval="")
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: _to_csv_value(v) for k, v in r.as_dict().items()})
    return path


def append_jsonl(rows: Iterable[Row], path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        for r in rows:
            fh.write(json.dumps(r.as_dict()) + "\n")
    return path


def write_results(rows: list[Row], out_dir: str | os.PathLike) -> dict[str, str]:
    """Append ``rows`` to ``out_dir/bench.csv`` and ``out_dir/bench.jsonl``."""
    out = Path(out_dir)
    return {"csv": str(append_csv(rows, out / CSV_NAME)), "jsonl": str(append_jsonl(rows, out / JSONL_NAME))}


def _from_csv_value(key: str, value: str):
    if value == "":
        return None if key in _INT | _FLOAT | _FLOAT_LIST else ""
    if key in _INT:
        return int(float(value))
    if key in _FLOAT:
        return float(value)
    if key in _FLOAT_LIST:
        return [float(x) for x in value.split()]
    if key == "causal":
        return value in ("True", "true", "1")
    return value


def load_rows(path: str | os.PathLike, run_id: str | None = "latest") -> list[dict]:
    """Rows of a results file (``.csv`` or ``.jsonl``) as dicts, every
    :class:`Row` field present (fields newer than the file at their defaults).
    ``run_id``: ``"latest"`` (the last run in the file), a run id, or ``None``
    for all."""
    path = Path(path)
    if path.suffix == ".csv":
        with open(path, newline="") as fh:
            rows = [{k: _from_csv_value(k, v) for k, v in r.items()} for r in csv.DictReader(fh)]
    else:
        with open(path) as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    rows = [{**DEFAULTS, **r} for r in rows]
    if run_id == "latest" and rows:
        run_id = rows[-1].get("run_id")
    if run_id is not None:
        rows = [r for r in rows if r.get("run_id") == run_id]
    return rows
