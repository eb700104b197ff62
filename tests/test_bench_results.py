"""What ``tileattn bench`` reports: the ratio rows of its tables and the
baseline they divide by, the results files (CSV and JSON lines: the latest
run, rounds round-tripping, older files still loading) and the plots drawn
from them."""
import csv
import json
import os

import pytest
import torch

from tileattn.bench import cli, plots, providers, results


# ---------------------------------------------------------------------------
# results files and the plots drawn from them
# ---------------------------------------------------------------------------
def test_plots_from_results_file(tmp_path):
    meta = {"run_id": "r1", "gpu": "test gpu", "torch": "x", "triton": "y", "git_commit": "abc"}
    rows = []
    for prov, scale in (("tileattn", 1.0), ("sdpa-flash", 1.1), ("standard", 3.0)):
        for n in (512, 1024, 2048):
            oom = prov == "standard" and n == 2048
            rows.append(results.Row(provider=prov, status="oom" if oom else "ok", mode="fwd", causal=False,
                                    batch=1, heads=1, kv_heads=1, seqlen_q=n, seqlen_k=n, head_dim=64,
                                    dtype="bf16", device="cuda", ms=None if oom else scale * n / 512,
                                    tflops=None if oom else 100 / scale, peak_mem_bytes=None if oom else n * 2**20,
                                    **meta))
    files = results.write_results(rows, tmp_path / "res")
    for src in (files["jsonl"], files["csv"]):
        paths = plots.plot_results(src, tmp_path / os.path.basename(src).replace(".", "_"))
        assert [p.name for p in paths] == ["tflops.png", "speedup.png", "memory.png"]
        assert all(p.stat().st_size > 1000 for p in paths)


def test_load_rows_picks_latest_run(tmp_path):
    def row(run_id):
        return results.Row(provider="tileattn", status="ok", mode="fwd", causal=False, batch=1, heads=1,
                           kv_heads=1, seqlen_q=8, seqlen_k=8, head_dim=8, dtype="fp32", device="cpu", run_id=run_id)
    results.write_results([row("a"), row("a")], tmp_path)
    results.write_results([row("b")], tmp_path)
    for name in ("bench.jsonl", "bench.csv"):
        assert [r["run_id"] for r in results.load_rows(tmp_path / name)] == ["b"]
        assert len(results.load_rows(tmp_path / name, run_id=None)) == 3


def _vs_cudnn_payload():
    rows = []
    for mode, provs in (("fwd", ("sdpa-cudnn", "tileattn")), ("bwd", ("sdpa-cudnn", "tileattn-atomic"))):
        for n in (2048, 4096):
            for prov in provs:
                ms = 1.0 if prov == "sdpa-cudnn" else 0.8
                rows.append(dict(mode=mode, dtype="bf16", d=128, group=1, causal=True, n=n, provider=prov, ms=ms,
                                 tflops=400 / ms, vs_cudnn=1.0 / ms, max_diff_vs_cudnn=0.0, rounds=[ms]))
    return {"device": "test gpu", "torch": "x", "triton": "y", "rows": rows}


def test_speedup_baseline_without_standard_attention(tmp_path, monkeypatch):
    """A run without standard attention (the usual GPU run beside cuDNN)
    draws its speed-up figure over SDPA-cuDNN, not empty panels over a
    provider that never ran; standard attention first where it ran; a
    given baseline wins."""
    rows = [r for r in _ratio_rows() if r["provider"] != "standard"]
    for r in rows:
        r["ms"] = 1.0 / r["tflops"] if r["tflops"] else None
    assert plots.speedup_baseline(rows) == "sdpa-cudnn"
    assert plots.speedup_baseline(_ratio_rows()) == "standard"
    assert plots.speedup_baseline([r for r in rows if r["provider"] != "sdpa-cudnn"]) == "sdpa-flash"
    assert plots.speedup_baseline(rows, "flex") == "flex"
    drawn = {}
    real = plots.plot_speedup

    def spy(rows, path, baseline="standard"):
        drawn["baseline"] = baseline
        return real(rows, path, baseline=baseline)
    monkeypatch.setattr(plots, "plot_speedup", spy)
    plots.plot_results(rows, tmp_path)
    assert drawn["baseline"] == "sdpa-cudnn" and (tmp_path / "speedup.png").stat().st_size > 1000


def test_vs_cudnn_replot_from_json_files(tmp_path, monkeypatch):
    """benchmarks/vs_cudnn.py --replot: its --json rows in the plots' schema, the
    backward's atomic-dQ provider drawn as tileattn, the ratio panel to cuDNN."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import vs_cudnn
    seen = {}
    real_speedup = plots.plot_speedup

    def spy(rows, path, baseline="standard"):
        seen["rows"], seen["baseline"] = rows, baseline
        return real_speedup(rows, path, baseline=baseline)
    monkeypatch.setattr(plots, "plot_speedup", spy)
    src = tmp_path / "a.json"
    src.write_text(json.dumps(_vs_cudnn_payload()))
    monkeypatch.setattr(sys, "argv", ["vs_cudnn.py", "--replot", str(src), "--plot", str(tmp_path / "fig"),
                                      "--tree", "abc1234"])
    vs_cudnn.main()
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == ["tflops.png", "vs_cudnn.png"]
    assert all(p.stat().st_size > 1000 for p in (tmp_path / "fig").iterdir())
    assert seen["baseline"] == "sdpa-cudnn"
    assert {(r["mode"], r["provider"]) for r in seen["rows"]} == {
        ("fwd", "sdpa-cudnn"), ("fwd", "tileattn"), ("bwd", "sdpa-cudnn"), ("bwd", "tileattn")}
    assert {r["git_commit"] for r in seen["rows"]} == {"abc1234"}
    assert {r["seqlen_q"] for r in seen["rows"]} == {2048, 4096}
    monkeypatch.setattr(sys, "argv", ["vs_cudnn.py", "--replot", str(src)])
    with pytest.raises(SystemExit):     # --replot without --plot: an argument error, nothing drawn
        vs_cudnn.main()


# ---------------------------------------------------------------------------
# ratio rows and the baseline
# ---------------------------------------------------------------------------
def _ratio_rows():
    tf = {"tileattn": 100.0, "sdpa-flash": 80.0, "sdpa-cudnn": 125.0, "flex": 100.0, "standard": 20.0}
    rows = []
    for n in (512, 1024):
        for prov in ("tileattn", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flex", "fa4", "standard"):
            status = {"fa4": "unavailable: flash_attn.cute not installed"}.get(prov, "ok")
            if prov == "sdpa-efficient":
                status = "oom" if n == 1024 else "ok"
            t = tf.get(prov, 50.0)
            rows.append(dict(provider=prov, status=status, mode="fwd", causal=False, batch=1, heads=8, kv_heads=8,
                             seqlen_q=n, seqlen_k=n, head_dim=64, dtype="bf16",
                             tflops=t if status == "ok" else None))
    return rows


def test_tables_ratio_rows_to_baseline_and_tileattn_peers():
    (title, header, body), = cli.tables(_ratio_rows(), "sdpa-cudnn")
    assert header == ["provider", "N=512", "N=1024"]
    ratios = {line[0]: line[1:] for line in body if " / " in line[0]}
    assert list(ratios) == ["tileattn / sdpa-flash", "tileattn / sdpa-cudnn", "tileattn / sdpa-efficient",
                            "tileattn / flex", "tileattn / standard", "sdpa-flash / sdpa-cudnn",
                            "sdpa-efficient / sdpa-cudnn", "flex / sdpa-cudnn", "standard / sdpa-cudnn"]
    assert ratios["tileattn / sdpa-cudnn"] == ["0.80x", "0.80x"]
    assert ratios["sdpa-flash / sdpa-cudnn"] == ["0.64x", "0.64x"]
    assert ratios["standard / sdpa-cudnn"] == ["0.16x", "0.16x"]
    assert ratios["sdpa-efficient / sdpa-cudnn"] == ["0.40x", "-"]  # out of memory at 1024
    assert not any(name.startswith("fa4") or name.endswith("fa4") for name in ratios)  # never ran
    cells = {line[0]: line[1:] for line in body if " / " not in line[0]}
    assert cells["fa4"] == ["UNAVAILABLE", "UNAVAILABLE"] and cells["sdpa-cudnn"] == ["125.0", "125.0"]


def test_tables_other_baseline_and_none():
    (_, _, body), = cli.tables(_ratio_rows(), "sdpa-flash")
    names = [line[0] for line in body if " / " in line[0]]
    assert "sdpa-cudnn / sdpa-flash" in names and "flex / sdpa-flash" in names
    assert names.count("tileattn / sdpa-flash") == 1
    (_, _, body), = cli.tables(_ratio_rows(), None)
    assert [line[0] for line in body if " / " in line[0]] == [
        "tileattn / sdpa-flash", "tileattn / sdpa-cudnn", "tileattn / sdpa-efficient", "tileattn / flex",
        "tileattn / standard"]


def test_baseline_falls_back_when_cudnn_cannot_run(monkeypatch):
    cuda = torch.device("cuda")  # only its type is read; no GPU needed
    monkeypatch.setattr(providers, "available_reason",
                        lambda name, device: "cuDNN is not available" if name == "sdpa-cudnn" else None)
    assert cli.resolve_baseline(None, providers.DEFAULT_PROVIDERS, cuda) == (
        "sdpa-flash", "baseline sdpa-flash: sdpa-cudnn cannot be the baseline here (cuDNN is not available)")
    assert cli.resolve_baseline("flex", providers.DEFAULT_PROVIDERS, cuda) == ("flex", "")
    base, note = cli.resolve_baseline(None, ("tileattn", "sdpa-efficient"), cuda)
    assert base == "sdpa-efficient" and "not among --providers" in note
    monkeypatch.setattr(providers, "available_reason", lambda name, device: None)
    assert cli.resolve_baseline(None, providers.DEFAULT_PROVIDERS, cuda) == ("sdpa-cudnn", "")


def test_baseline_none_on_cpu():
    base, note = cli.resolve_baseline(None, providers.DEFAULT_PROVIDERS, torch.device("cpu"))
    assert base is None and note.startswith("no baseline: sdpa-cudnn cannot run here (needs CUDA)")
    assert cli.resolve_baseline("standard", providers.DEFAULT_PROVIDERS, torch.device("cpu")) == ("standard", "")
    for bad in ("no-such-kernel", "sdpa-flash"):
        with pytest.raises(ValueError, match="--baseline"):
            cli.resolve_baseline(bad, ("tileattn", "standard"), torch.device("cpu"))

# ---------------------------------------------------------------------------
# the results schema: rounds round-trip, older files still load
# ---------------------------------------------------------------------------
def _row(run_id, **kw):
    return results.Row(provider="tileattn", status="ok", mode="fwd", causal=True, batch=1, heads=2, kv_heads=1,
                       seqlen_q=8, seqlen_k=8, head_dim=8, dtype="fp32", device="cpu", run_id=run_id, **kw)


def test_rounds_round_trip_csv_and_jsonl(tmp_path):
    rows = [_row("r", ms=0.25, rounds=3, ms_rounds=[0.3, 0.25, 0.125]), _row("r")]
    results.write_results(rows, tmp_path)
    for name in ("bench.jsonl", "bench.csv"):
        back = results.load_rows(tmp_path / name)
        assert back == [r.as_dict() for r in rows], name


OLD_FIELDS = [f for f in results.FIELDS if f not in ("rounds", "ms_rounds")]


def test_older_results_files_still_load_and_append(tmp_path):
    old = {**_row("old", ms=1.5).as_dict()}
    for key in ("rounds", "ms_rounds"):
        del old[key]
    with open(tmp_path / "bench.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=OLD_FIELDS)
        w.writeheader()
        w.writerow({k: "" if v is None else v for k, v in old.items()})
    with open(tmp_path / "bench.jsonl", "w") as fh:
        fh.write(json.dumps(old) + "\n")
    for name in ("bench.jsonl", "bench.csv"):
        (r,) = results.load_rows(tmp_path / name)
        assert r["rounds"] is None and r["ms_rounds"] is None and r["ms"] == 1.5 and r["causal"] is True
    # new rows appended to the old files: the CSV header grows, no column shifts
    results.write_results([_row("new", ms=0.5, rounds=2, ms_rounds=[0.5, 0.5])], tmp_path)
    for name in ("bench.jsonl", "bench.csv"):
        both = results.load_rows(tmp_path / name, run_id=None)
        assert [(r["run_id"], r["ms"], r["rounds"], r["ms_rounds"]) for r in both] == [
            ("old", 1.5, None, None), ("new", 0.5, 2, [0.5, 0.5])], name
        assert all(r["provider"] == "tileattn" and r["seqlen_q"] == 8 for r in both)
    with open(tmp_path / "bench.csv", newline="") as fh:
        assert next(csv.reader(fh)) == results.FIELDS
