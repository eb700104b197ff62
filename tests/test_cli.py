"""The top-level command: help, the demo (the README's main job) on this machine."""
import json
import os
import subprocess
import sys

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


def test_demo_json_runs_and_agrees():
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    res = subprocess.run([sys.executable, "-m", "tileattn", "demo", "--device", "cpu", "--seqlen", "1024",
                          "--heads", "2", "--repeats", "1", "--json"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["shape"]["seqlen"] == 1024
    assert d["tileattn_vs_fp64"] <= 2 * d["standard_vs_fp64"] + 1e-5
    assert d["standard"]["peak_extra_bytes"] > d["tileattn"]["peak_extra_bytes"]


def test_demo_bad_size_exit_2(capsys):
    assert cli.main(["demo", "--seqlen", "0"]) == 2
