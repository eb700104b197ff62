"""``tileattn bench``: the sweep runs end to end on the CPU, every provider is
reported, wrong providers are caught, results and plots are written."""
import argparse
import csv
import json
import os
import subprocess
import sys

import pytest
import torch

import tileattn
from tileattn.bench import cli, plots, providers, results, runner
from tileattn.cost.io import attention_flops

CUDA_ONLY = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flex")


def _parser():
    p = argparse.ArgumentParser(prog="tileattn")
    cli.add_parser(p.add_subparsers())
    return p


def _tiny(**kw):
    base = dict(head_dims=(16,), seqlens=(32, 64), modes=("fwd",), causal=(False,), tokens=64, hidden=32,
                dtype="fp32", device="cpu", cpu_repeats=1)
    base.update(kw)
    return runner.BenchConfig(**base)


@pytest.fixture
def torch_path():
    """The tileattn provider on its PyTorch path (the test set-up turns the interpreter on)."""
    with tileattn.use_backend("torch"):
        yield


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """``tileattn bench --quick --plot --json`` in a fresh process on the CPU."""
    out = tmp_path_factory.mktemp("bench")
    code = ("import argparse, sys; from tileattn.bench import cli; p = argparse.ArgumentParser(); "
            "cli.add_parser(p.add_subparsers()); a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))")
    env = {**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run([sys.executable, "-c", code, "bench", "--quick", "--device", "cpu", "--plot", "--json",
                          "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return out, json.loads(res.stdout)


def test_quick_cli_writes_csv_and_jsonl_with_every_provider(quick_run):
    out, summary = quick_run
    rows = results.load_rows(out / "bench.jsonl")
    with open(out / "bench.csv", newline="") as fh:
        csv_rows = list(csv.DictReader(fh))
    assert len(csv_rows) == len(rows) == len(summary["rows"]) > 0
    assert {r["provider"] for r in rows} == set(providers.DEFAULT_PROVIDERS)
    assert {r["mode"] for r in rows} == set(runner.MODES)
    assert {r["causal"] for r in rows} == {False, True}
    for r in rows:
        assert r["status"], r
        if r["provider"] in CUDA_ONLY:
            assert r["status"] == "unavailable: needs CUDA"
        else:
            assert r["status"] == "ok", r
            assert r["ms"] > 0 and r["tflops"] > 0 and r["hbm_gbs"] > 0
    # the first N of each configuration is checked, against the reference and tileattn
    checked = [r for r in rows if r["check"]]
    assert checked and all(r["check"] == "passed" and r["rel_err_ref"] < 1e-3 for r in checked)
    assert all(r["seqlen_q"] == min(x["seqlen_q"] for x in rows) for r in checked)
    assert {r["bytes_model"] for r in rows if r["provider"] == "standard" and r["status"] == "ok"} == \
        {"standard-eager"}


def test_quick_cli_metadata_fields_present(quick_run):
    out, summary = quick_run
    for r in results.load_rows(out / "bench.csv"):
        for field in results.METADATA_FIELDS:
            assert r[field], field
        assert r["torch"] == torch.__version__
        assert r["gpu"].startswith("cpu")
    assert set(results.METADATA_FIELDS) <= set(summary["meta"])


def test_quick_cli_plots_written(quick_run):
    out, summary = quick_run
    for name in ("tflops.png", "speedup.png", "memory.png"):
        assert (out / name).stat().st_size > 1000
    assert len(summary["plots"]) == 3


def test_tflops_is_attention_flops_over_time(torch_path):
    cfg = _tiny(modes=("fwd", "bwd", "fwd_bwd"), causal=(False, True), providers=("tileattn", "standard"))
    rows = runner.run_sweep(cfg)
    assert rows and all(r.status == "ok" for r in rows)
    for r in rows:
        flops = attention_flops(r.batch, r.heads, r.seqlen_q, r.seqlen_k, r.head_dim, causal=r.causal, mode=r.mode)
        assert r.flops == flops
        assert r.tflops == pytest.approx(flops / (r.ms * 1e-3) / 1e12, rel=1e-12)
        assert r.hbm_gbs == pytest.approx(r.model_bytes / (r.ms * 1e-3) / 1e9, rel=1e-12)


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_wrong_provider_is_flagged(torch_path, mode):
    def garbage(q, k, v, causal):  # differentiable, fast and wrong
        return q * 0.5 + k * 0.25 + v
    providers.register("garbage", garbage)
    try:
        rows = runner.run_sweep(_tiny(modes=(mode,), providers=("tileattn", "garbage", "standard")))
    finally:
        providers.unregister("garbage")
    by = {(r.provider, r.seqlen_q): r for r in rows}
    first, later = by[("garbage", 32)], by[("garbage", 64)]
    assert first.check == "wrong" and first.status.startswith("wrong"), first.status
    assert first.rel_err_ref > 2e-2 and first.rel_err_tileattn > 2e-2
    assert later.status.startswith("wrong") and "N=32" in later.status  # stays out of the race at every N
    for name in ("tileattn", "standard"):
        assert by[(name, 32)].check == "passed" and by[(name, 64)].status == "ok"
    if mode == "fwd_bwd":
        assert "dq" in first.check_detail and "dv" in by[("tileattn", 32)].check_detail


def test_failing_provider_is_reported_not_dropped(torch_path):
    def broken(q, k, v, causal):
        raise RuntimeError("kernel exploded")
    providers.register("broken", broken)
    try:
        rows = runner.run_sweep(_tiny(providers=("tileattn", "broken")))
    finally:
        providers.unregister("broken")
    broken_rows = [r for r in rows if r.provider == "broken"]
    assert len(broken_rows) == 2
    assert all(r.status == "failed: RuntimeError: kernel exploded" for r in broken_rows)


def test_cuda_only_providers_unavailable_on_cpu(torch_path):
    rows = runner.run_sweep(_tiny(providers=("tileattn",) + CUDA_ONLY, seqlens=(32,)))
    assert {r.provider: r.status for r in rows if r.provider != "tileattn"} == \
        {p: "unavailable: needs CUDA" for p in CUDA_ONLY}


def test_gqa_shapes(torch_path):
    rows = runner.run_sweep(_tiny(hidden=64, kv_heads=2, modes=("fwd_bwd",), providers=("tileattn", "standard")))
    assert all(r.status == "ok" and r.heads == 4 and r.kv_heads == 2 for r in rows)
    assert all(r.check == "passed" for r in rows if r.seqlen_q == 32)


def test_fa2_protocol_shapes():
    cfg = runner.BenchConfig()
    assert cfg.dtype == "bf16" and cfg.seqlens == (512, 1024, 2048, 4096, 8192, 16384)
    assert cfg.head_dims == (64, 128) and set(cfg.modes) == {"fwd", "bwd", "fwd_bwd"}
    for n in cfg.seqlens:
        for d in cfg.head_dims:
            b, h, hkv = cfg.shape(n, d)
            assert b * n == 16384 and h * d == 2048 and hkv == h


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


@pytest.mark.parametrize("argv, flag", [
    (["--seqlens", "0"], "--seqlens"),
    (["--seqlens", "64", "--head-dims", "-8"], "--head-dims"),
    (["--providers", "tileattn", "no-such-kernel"], "--providers"),
    (["--modes", "sideways"], "--modes"),
    (["--kv-heads", "3"], "--kv-heads"),
    (["--hidden", "48"], "--hidden"),
], ids=["seqlen-zero", "negative-head-dim", "unknown-provider", "unknown-mode", "kv-heads-not-divisor",
        "hidden-not-multiple"])
def test_bad_arguments_exit_2(capsys, argv, flag):
    args = _parser().parse_args(["bench", "--quick", "--device", "cpu", *argv])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert flag in err and "error" in err


def test_seqlen_k_suffix_and_help():
    p = _parser()
    assert p.parse_args(["bench", "--seqlens", "1k", "16k", "512"]).seqlens == [1024, 16384, 512]
    with pytest.raises(SystemExit) as e:
        p.parse_args(["bench", "--seqlens", "lots"])
    assert e.value.code == 2
    text = [a for a in p._subparsers._group_actions[0].choices.values()][0].format_help()
    assert "examples:" in text and "--kv-heads" in text and "--quick" in text


def test_cuda_requested_without_gpu_exit_3(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = _parser().parse_args(["bench", "--device", "cuda"])
    assert args.func(args) == 3
    args = _parser().parse_args(["bench"])  # the full protocol on a machine without a GPU
    assert args.func(args) == 3
    assert "GPU" in capsys.readouterr().err


def test_flex_recompile_limit_raised():
    import torch._dynamo.config as cfg
    providers.raise_recompile_limit(5000)
    limit = getattr(cfg, "recompile_limit", None) or getattr(cfg, "cache_size_limit")
    assert limit >= 5000


def test_host_time_helpers():
    import cProfile

    from tileattn.bench.host import per_call_us, profile_text

    calls = []
    us = per_call_us(lambda: calls.append(sum(range(100))), iters=50, warmup=5)
    assert len(calls) == 55 and 0 < us < 1e5
    pr = cProfile.Profile()
    pr.enable()
    sorted(range(1000), key=lambda x: -x)
    pr.disable()
    text = profile_text(pr, top=5)
    assert "sorted" in text and "tottime" in text
