"""benchmarks/variants_bench.py on the CPU: the smoke run writes its rows, and
--plot-from draws the window and block-density curves from them."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "variants_bench.py"


def test_smoke_run_then_plots(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--smoke", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads((tmp_path / "variants.json").read_text())
    sections = {r["section"] for r in data["rows"]}
    assert sections == {"varlen", "window", "block_sparse"}
    assert all(r["ms"] > 0 for r in data["rows"])
    plots = subprocess.run([sys.executable, str(SCRIPT), "--plot-from", str(tmp_path / "variants.json"),
                            "--out", str(tmp_path / "fig")], capture_output=True, text=True, timeout=300)
    assert plots.returncode == 0, plots.stderr[-2000:]
    for name in ("window.png", "block_sparse.png"):
        png = tmp_path / "fig" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
