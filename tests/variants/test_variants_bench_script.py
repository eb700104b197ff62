"""benchmarks/variants_bench.py on the CPU: the smoke run writes its rows, and
--plot-from draws the window and block-density curves from them."""
import json
import os
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


def test_window_paths_section_restores_the_switches(tmp_path, monkeypatch):
    """The window_paths section (Hopper / portable / default dispatch,
    interleaved) runs on the CPU (all three the portable path there), writes
    one row per (N, window, mode) with each path's time, and leaves the
    dispatch switches and the width rule as it found them."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    monkeypatch.setenv("TILEATTN_AUTOTUNE", "0")   # what main() sets by default, undone after the test
    import variants_bench
    from tileattn import configs, dispatch
    before = dispatch.HOPPER_FWD, dispatch.HOPPER_BWD, configs.HOPPER_FWD_WINDOW_MIN_SPAN
    seen = []   # (Hopper switch, width rule) as each timed call ran
    timed = variants_bench._time_mode

    def spy(*args, **kw):
        seen.append((dispatch.HOPPER_FWD, configs.HOPPER_FWD_WINDOW_MIN_SPAN))
        return timed(*args, **kw)
    monkeypatch.setattr(variants_bench, "_time_mode", spy)
    assert variants_bench.main(["--device", "cpu", "--smoke", "--sections", "window_paths",
                                "--out", str(tmp_path)]) == 0
    assert (dispatch.HOPPER_FWD, dispatch.HOPPER_BWD, configs.HOPPER_FWD_WINDOW_MIN_SPAN) == before
    # the default path runs with the Hopper switches on and the table's width rule (not the every-width one)
    assert (True, before[2]) in seen and any(on and rule is not before[2] for on, rule in seen)
    rows = json.loads((tmp_path / "variants.json").read_text())["rows"]
    assert sorted((r["seqlen"], r["window"], r["mode"]) for r in rows) == [(256, 64, "fwd"), (256, 64, "fwd_bwd")]
    assert all(r["hopper_ms"] > 0 and r["portable_ms"] > 0 and r["ms"] > 0 for r in rows)


def test_varlen_paths_section_interleaves_the_switches(tmp_path, monkeypatch):
    """The varlen_paths section runs on the CPU (every path portable there):
    one row per (causal, mode) with the three paths' times, each timed call
    under its path's pair of switches (packed forward, packed backward), and
    the switches left as they were (here: one set, one unset)."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    monkeypatch.setenv("TILEATTN_AUTOTUNE", "0")
    monkeypatch.setenv("TILEATTN_HOPPER_VARLEN", "1")
    monkeypatch.delenv("TILEATTN_HOPPER_VARLEN_BWD", raising=False)
    import variants_bench
    seen = []
    timed = variants_bench._time_mode

    def spy(*args, **kw):
        seen.append((os.environ["TILEATTN_HOPPER_VARLEN"], os.environ["TILEATTN_HOPPER_VARLEN_BWD"]))
        return timed(*args, **kw)
    monkeypatch.setattr(variants_bench, "_time_mode", spy)
    assert variants_bench.main(["--device", "cpu", "--smoke", "--sections", "varlen_paths",
                                "--out", str(tmp_path)]) == 0
    assert os.environ["TILEATTN_HOPPER_VARLEN"] == "1" and "TILEATTN_HOPPER_VARLEN_BWD" not in os.environ
    # 2 causal x 2 modes x 2 rounds x 3 paths, odd rounds reversed
    assert seen[:6] == [("1", "1"), ("1", "0"), ("0", "0"), ("0", "0"), ("1", "0"), ("1", "1")] and len(seen) == 24
    rows = json.loads((tmp_path / "variants.json").read_text())["rows"]
    assert sorted((r["causal"], r["mode"]) for r in rows) == [(False, "fwd"), (False, "fwd_bwd"), (True, "fwd"),
                                                              (True, "fwd_bwd")]
    assert all(r["hopper_ms"] > 0 and r["portable_ms"] > 0 and r["ms"] > 0 for r in rows)
