"""``tileattn bench``: the sweep runs end to end on the CPU, every provider is
reported (FlashAttention-4 as unavailable here), wrong providers are caught,
the interleaved timing rounds, the command's arguments.  Tables, the baseline
and the results files: ``test_bench_results.py``; the FlashAttention-4
provider itself: ``test_bench_fa4.py``."""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys

import pytest
import torch

import tileattn
from tileattn.bench import cli, providers, results, runner
from tileattn.cost.io import attention_flops
from tileattn.reference import standard_attention

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
    return out, json.loads(res.stdout), res.stderr


def _fa4_reason_here(status):
    """fa4's status on this CPU machine: not installed, or installed but no CUDA."""
    return status in ("unavailable: flash_attn.cute not installed", "unavailable: needs CUDA")


def test_quick_cli_writes_csv_and_jsonl_with_every_provider(quick_run):
    out, summary, _ = quick_run
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
        elif r["provider"] == "fa4":
            assert _fa4_reason_here(r["status"]), r["status"]
            assert r["ms"] is None and r["ms_rounds"] is None
        else:
            assert r["status"] == "ok", r
            assert r["ms"] > 0 and r["tflops"] > 0 and r["hbm_gbs"] > 0
            assert r["rounds"] == 3 and len(r["ms_rounds"]) == 3
            assert r["ms"] == pytest.approx(statistics.median(r["ms_rounds"]), rel=1e-12)
    # the first N of each configuration is checked, against the reference and tileattn
    checked = [r for r in rows if r["check"]]
    assert checked and all(r["check"] == "passed" and r["rel_err_ref"] < 1e-3 for r in checked)
    assert all(r["seqlen_q"] == min(x["seqlen_q"] for x in rows) for r in checked)
    assert {r["bytes_model"] for r in rows if r["provider"] == "standard" and r["status"] == "ok"} == \
        {"standard-eager"}


def test_quick_cli_prints_ratio_rows_and_baseline_note(quick_run):
    _, summary, stderr = quick_run
    assert "tileattn / standard" in stderr
    # no SDPA backend runs on the CPU: no baseline, and the run says why
    assert summary["baseline"] is None
    assert "no baseline" in summary["baseline_note"] and "needs CUDA" in summary["baseline_note"]
    assert "no baseline" in stderr


def test_quick_cli_metadata_fields_present(quick_run):
    out, summary, _ = quick_run
    for r in results.load_rows(out / "bench.csv"):
        for field in results.METADATA_FIELDS:
            assert r[field], field
        assert r["torch"] == torch.__version__
        assert r["gpu"].startswith("cpu")
    assert set(results.METADATA_FIELDS) <= set(summary["meta"])


def test_quick_cli_plots_written(quick_run):
    out, summary, _ = quick_run
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
        assert r.rounds == cfg.rounds and len(r.ms_rounds) == cfg.rounds and min(r.ms_rounds) > 0
        assert r.ms == statistics.median(r.ms_rounds)
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


@pytest.mark.parametrize("argv, flag", [
    (["--seqlens", "0"], "--seqlens"),
    (["--seqlens", "64", "--head-dims", "-8"], "--head-dims"),
    (["--providers", "tileattn", "no-such-kernel"], "--providers"),
    (["--modes", "sideways"], "--modes"),
    (["--kv-heads", "3"], "--kv-heads"),
    (["--hidden", "48"], "--hidden"),
    (["--rounds", "0"], "--rounds"),
    (["--baseline", "no-such-kernel"], "--baseline"),
    (["--providers", "tileattn", "standard", "--baseline", "sdpa-flash"], "--baseline"),
], ids=["seqlen-zero", "negative-head-dim", "unknown-provider", "unknown-mode", "kv-heads-not-divisor",
        "hidden-not-multiple", "rounds-zero", "baseline-unknown", "baseline-not-run"])
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


# ---------------------------------------------------------------------------
# interleaved timing rounds
# ---------------------------------------------------------------------------
@pytest.fixture
def logged_providers(monkeypatch):
    """Three correct providers that log every call, one that cannot run, and
    a time_ms whose clock drifts: the n-th timed call takes n ms."""
    log, timed = [], []

    def make(name):
        def fn(q, k, v, causal):
            log.append(name)
            return standard_attention(q, k, v, causal=causal)
        return fn

    names = ("fake-a", "fake-b", "fake-c")
    for name in names:
        providers.register(name, make(name))
    providers.register("fake-off", make("fake-off"), check=lambda device: "switched off")

    def drifting_time_ms(step, device, **kw):
        before = len(log)
        step()
        called = set(log[before:])
        assert len(called) == 1, called  # one provider per timed call
        timed.append(called.pop())
        return float(len(timed))

    monkeypatch.setattr(runner, "time_ms", drifting_time_ms)
    yield names, timed
    for name in names + ("fake-off",):
        providers.unregister(name)


def test_round_orders_rotate_and_reverse():
    """Rotated by one each round, odd rounds reversed: every provider moves
    through the positions and no provider follows the same neighbour in
    every round (rotation alone kept it there)."""
    assert runner.round_orders(["a", "b", "c", "d"], 4) == [["a", "b", "c", "d"], ["a", "d", "c", "b"],
                                                           ["c", "d", "a", "b"], ["c", "b", "a", "d"]]
    names = [f"p{i}" for i in range(8)]
    orders = runner.round_orders(names, 3)
    before = [{o[i]: o[i - 1] for i in range(1, len(o))} for o in orders]
    assert not any(len({b.get(n) for b in before}) == 1 for n in names)
    assert runner.round_orders(["a"], 2) == [["a"], ["a"]]
    assert runner.round_orders([], 2) == [[], []]


def test_providers_alternate_per_round_at_each_point(logged_providers):
    names, timed = logged_providers
    cfg = _tiny(providers=names + ("fake-off",), rounds=3, seqlens=(17, 32), causal=(False, True))
    rows = runner.run_sweep(cfg)
    a, b, c = names
    per_point = [a, b, c, a, c, b, c, a, b]  # round 1, 2, 3: rotated by one each, the second reversed
    assert timed == per_point * 4  # 2 lengths x 2 causal, the off provider never timed
    by = {(r.provider, r.causal, r.seqlen_q): r for r in rows}
    # first point: a took 1, 4, 8 ms; b 2, 6, 9; c 3, 5, 7 (the clock drifts up by 1 per call)
    expect = {a: [1.0, 4.0, 8.0], b: [2.0, 6.0, 9.0], c: [3.0, 5.0, 7.0]}
    for name, ms_rounds in expect.items():
        r = by[(name, False, 17)]
        assert r.status == "ok" and r.rounds == 3 and r.ms_rounds == ms_rounds
        assert r.ms == statistics.median(ms_rounds)
    # the drift favours no one by more than a round: medians 4, 6, 5 (run in a fixed
    # order a, b, c the medians would be 4, 5, 6: always the first provider ahead)
    assert sorted(by[(n, False, 17)].ms for n in names) == [4.0, 5.0, 6.0]
    off = [r for r in rows if r.provider == "fake-off"]
    assert len(off) == 4 and all(r.status == "unavailable: switched off" and r.ms is None for r in off)


def test_provider_failing_in_a_round_leaves_the_rounds(logged_providers, monkeypatch):
    names, timed = logged_providers
    calls = {"n": 0}

    def flaky(q, k, v, causal):
        calls["n"] += 1
        if calls["n"] > 3:  # check and two set-up calls pass; the first timed call fails
            raise RuntimeError("lost the device")
        return standard_attention(q, k, v, causal=causal)

    providers.register("flaky", flaky)
    try:
        rows = runner.run_sweep(_tiny(providers=names[:2] + ("flaky",), rounds=2, seqlens=(32,)))
    finally:
        providers.unregister("flaky")
    st = {r.provider: r for r in rows}
    assert st["flaky"].status == "failed: RuntimeError: lost the device" and st["flaky"].ms is None
    # round 2's order is round 1's rotated (b, flaky, a) and reversed, flaky left out
    assert timed == [names[0], names[1], names[0], names[1]]
    assert all(st[n].status == "ok" and st[n].rounds == 2 for n in names[:2])


def test_rounds_is_a_cli_option():
    args = _parser().parse_args(["bench", "--quick", "--device", "cpu", "--rounds", "5"])
    assert cli.build_config(args, torch.device("cpu")).rounds == 5
    args = _parser().parse_args(["bench", "--quick", "--device", "cpu"])
    assert cli.build_config(args, torch.device("cpu")).rounds == 3


# ---------------------------------------------------------------------------
# the optional FlashAttention-4 provider: registered, unavailable on this machine
# ---------------------------------------------------------------------------
def test_fa4_registered_and_unavailable_here():
    assert "fa4" in providers.PROVIDERS and "fa4" in providers.DEFAULT_PROVIDERS
    reason = providers.available_reason("fa4", "cpu")
    assert _fa4_reason_here(f"unavailable: {reason}"), reason
    import importlib.util
    try:
        installed = importlib.util.find_spec("flash_attn.cute") is not None
    except (ImportError, ValueError):
        installed = False
    if not installed:
        assert reason == "flash_attn.cute not installed"


def test_fa4_rows_unavailable_in_a_sweep(torch_path):
    rows = runner.run_sweep(_tiny(providers=("tileattn", "fa4"), seqlens=(32,)))
    fa4 = [r for r in rows if r.provider == "fa4"]
    assert len(fa4) == 1 and _fa4_reason_here(fa4[0].status) and fa4[0].ms is None
    assert [r.status for r in rows if r.provider == "tileattn"] == ["ok"]


def test_a_run_cut_short_keeps_the_points_it_timed(torch_path, tmp_path, monkeypatch):
    """``tileattn bench`` appends each point's rows to bench.csv / bench.jsonl
    as the point finishes: a run stopped part-way (here at its second sequence
    length, as a ``timeout`` would) keeps the first point's rows, whole."""
    real = runner.run_sweep

    def stopped_at_64(cfg, on_row=None, **kw):
        def row(r):
            if r.seqlen_q == 64:
                raise KeyboardInterrupt
            on_row(r)
        return real(cfg, on_row=row, **kw)

    monkeypatch.setattr(runner, "run_sweep", stopped_at_64)
    args = _parser().parse_args(["bench", "--device", "cpu", "--head-dims", "16", "--seqlens", "32", "64",
                                 "--modes", "fwd", "--causal", "no", "--providers", "tileattn", "standard",
                                 "--tokens", "64", "--hidden", "32", "--repeats", "1", "--out", str(tmp_path)])
    with pytest.raises(KeyboardInterrupt):
        args.func(args)
    for name in ("bench.csv", "bench.jsonl"):
        rows = results.load_rows(tmp_path / name)
        assert sorted((r["provider"], r["seqlen_q"], r["status"]) for r in rows) == [
            ("standard", 32, "ok"), ("tileattn", 32, "ok")], name
