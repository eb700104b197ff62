"""The top-level command: help, the demo (the README's main job) on this machine."""
import json
import os
import subprocess
import sys

import pytest

from tileattn import cli


def test_help_lists_subcommands(capsys):
    try:
        cli.main(["--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    for name in ("demo", "bench", "io", "roofline", "report", "calibrate"):
        assert name in out


def test_no_subcommand_exit_2(capsys):
    assert cli.main([]) == 2


def _demo(*args):
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    return subprocess.run([sys.executable, "-m", "tileattn", "demo", "--device", "cpu", *args],
                          capture_output=True, text=True, env=env, timeout=300)


def test_demo_json_runs_and_agrees():
    res = _demo("--seqlen", "1024", "--heads", "2", "--repeats", "1", "--json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["shape"]["seqlen"] == 1024 and d["repeats"] == 1
    assert d["tileattn_path"] == "torch's fused CPU kernel"
    for impl in ("standard", "tileattn", "sdpa"):
        assert d[impl]["ms"] > 0
    assert d["tileattn_vs_fp64"] <= 2 * d["standard_vs_fp64"] + 1e-5
    assert d["sdpa_vs_fp64"] <= 2 * d["standard_vs_fp64"] + 1e-5
    assert d["standard"]["peak_extra_bytes"] > d["tileattn"]["peak_extra_bytes"]
    # the IO story: the cost model's bytes on a named GPU, standard above tileattn by the N x N traffic
    io = d["predicted_gpu_io"]
    assert io["hw"] == "nvidia-h200"
    assert io["standard"]["hbm_bytes_fwd"] > 4 * io["tileattn"]["hbm_bytes_fwd"] > 0


def test_demo_table_tells_the_io_story(capsys):
    code = cli.main(["demo", "--device", "cpu", "--seqlen", "256", "--heads", "1", "--repeats", "1", "--causal",
                     "--hw", "nvidia-a100-80gb-sxm4"])
    assert code == 0
    text = " ".join(capsys.readouterr().out.split())  # the table may wrap
    for word in ("standard", "tileattn", "torch SDPA", "A100", "interleaved", "error vs float64"):
        assert word in text, word


def test_demo_unknown_hw_exit_2(capsys):
    assert cli.main(["demo", "--device", "cpu", "--seqlen", "16", "--hw", "no-such-gpu"]) == 2
    out, err = capsys.readouterr()
    assert "unknown hardware" in err and not out   # errors to stderr: --json output stays parseable


@pytest.mark.parametrize("gpu,want,note", [("NVIDIA H100 80GB HBM3", "nvidia-h100-sxm", False),
                                            ("NVIDIA GH200 480GB", "nvidia-h200", True)], ids=["h100", "gh200"])
def test_demo_default_hw(capsys, monkeypatch, gpu, want, note):
    """On a GPU the demo models the catalogue's entry of that part; a GPU
    the catalogue lacks gets the H200 with a note on stderr saying so."""
    import torch
    from tileattn import demo
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: gpu)
    assert demo.default_hw(torch.device("cuda", 0)) == want
    err = capsys.readouterr().err
    assert ("catalogue has no " + gpu in err) == note, err


def test_timed_interleaved_rotates():
    """One warm-up call each, then every repeat calls each implementation
    once, starting one further along each round."""
    import torch
    from tileattn.demo import timed_interleaved
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in "abc"}
    med = timed_interleaved(fns, torch.device("cpu"), 4)
    assert order == list("abc") + list("abc") + list("bca") + list("cab") + list("abc")
    assert set(med) == {"a", "b", "c"}


@pytest.mark.parametrize("argv,flag", [(["--seqlen", "0"], "--seqlen"), (["--head-dim", "600"], "--head-dim")],
                         ids=["seqlen-0", "head-dim-600"])
def test_demo_bad_size_exit_2(capsys, argv, flag):
    assert cli.main(["demo", "--device", "cpu", "--json", *argv]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"tileattn: error: {flag} ") and not out
