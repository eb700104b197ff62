"""``tileattn check``: the pass/fail table of every path, its JSON and exit codes."""
import json
import os
import re
import subprocess
import sys
from unittest import mock

import pytest
import torch

from tileattn import check, cli

from conftest import HAS_CUDA

NAMES = {c.name for c in check.CHECKS}
# the entries of a V head dim of its own, head dim 512 and the absorbed MLA decoding layout
HEAD_DIM_ENTRIES = ("attention head dim v", "attention head dim 512", "attention head dim 512 v",
                    "attention sinks head dim v", "varlen head dim v", "kvcache head dim v", "kvcache absorbed mla")


def _json(capsys, argv):
    rc = cli.main(argv)
    return rc, json.loads(capsys.readouterr().out)


def test_torch_path_passes(capsys):
    """Every function on the PyTorch path (plus transformers, on the default path) passes."""
    rc, d = _json(capsys, ["check", "--paths", "torch", "--json", "--seed", "11"])
    assert rc == 0, [c for c in d["checks"] if c["status"] == "fail"]
    transformers_checks = {n for n in NAMES if n.startswith("transformers ")}
    assert d["summary"]["failed"] == 0 and d["summary"]["passed"] >= len(NAMES) - len(transformers_checks)
    ran = {c["check"] for c in d["checks"] if c["status"] == "pass"}
    assert ran >= NAMES - transformers_checks
    assert "attention sinks" in ran and ran >= set(HEAD_DIM_ENTRIES)
    for c in d["checks"]:
        if c["status"] == "pass":
            assert 0 <= c["error"] <= c["allowed"]


def test_only_reproduces_a_full_runs_inputs(capsys):
    """A check's inputs depend on --seed and its name, not on where --only
    leaves it in the run: the same errors alone as in a longer run, and the
    JSON names each check's seed."""
    _, full = _json(capsys, ["check", "--paths", "torch", "--json", "--only", "attention softcap", "attention"])
    _, alone = _json(capsys, ["check", "--paths", "torch", "--json", "--only", "attention softcap"])
    rows = {(c["check"], c["dtype"]): c for c in full["checks"]}
    assert len(rows) > len(alone["checks"]) > 0
    for c in alone["checks"]:
        assert c["seed"] == rows[c["check"], c["dtype"]]["seed"] == check.check_seed(0, next(
            x for x in check.CHECKS if x.name == c["check"]))
        assert c["error"] == rows[c["check"], c["dtype"]]["error"], c


def test_table_to_a_pipe_does_not_wrap():
    """Redirected to a file or a pipe, the table's rows stay one line each
    (rich would render at 80 columns and wrap every cell)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("COLUMNS", None)
    res = subprocess.run([sys.executable, "-m", "tileattn", "check", "--paths", "torch", "--only", "attention sinks"],
                         capture_output=True, text=True, env=env, timeout=300)
    rows = [line for line in res.stdout.splitlines() if line.lstrip().startswith(("PASS", "FAIL"))]
    assert res.returncode == 0 and rows, res.stdout + res.stderr
    # each row holds its whole shape cell ("B1 H4:2 70x30 D32 causal"), not a first piece of it
    assert all(re.search(r"attention sinks.* torch .* B\d+ H\d+:\d+ \d+x\d+ D\d+", line) for line in rows), res.stdout
    assert "shape" in res.stdout and "\u2026" not in res.stdout, res.stdout


def test_kernels_json_and_exit_code(capsys):
    """The kernels (the interpreter here): the JSON parses, the exit code says whether
    any check failed, and plain attention, KV-cache decoding and the SDPA drop-in pass."""
    rc, d = _json(capsys, ["check", "--paths", "kernels", "--json"])
    s = d["summary"]
    assert rc == (1 if s["failed"] else 0)
    assert s["passed"] + s["failed"] + s["skipped"] == len(d["checks"])
    assert "kernels" in s["paths"]
    status = {(c["check"], c["path"]): c["status"] for c in d["checks"]}
    for name in ("attention", "kvcache", "sdpa drop-in"):
        assert status[name, "kernels"] == "pass", d["checks"]
    for name in HEAD_DIM_ENTRIES:   # small enough for the interpreter; on a GPU float32 at 512 may not fit
        rows = [c for c in d["checks"] if c["check"] == name and c["path"] == "kernels"]
        assert rows and all(c["status"] == "pass" or (HAS_CUDA and c["dtype"] == "fp32" and "does not fit"
                                                       in c["detail"]) for c in rows), rows
    if not HAS_CUDA:
        assert "interpreter" in s["paths"]["kernels"]


def test_fp32_at_512_skipped_where_it_does_not_fit(capsys):
    """On a GPU of 99 KB shared memory per block attention refuses float32 at
    512 with a gradient (ValueError, by design): the kernels' entry is skipped
    with that reason, not failed; the PyTorch path still runs it."""
    from tileattn.launch import attention as launch_attention
    with mock.patch.object(launch_attention, "_device_smem", return_value=99 * 1024):
        rc, d = _json(capsys, ["check", "--only", "head dim 512", "--json"])
    assert rc == 0, d["checks"]
    kernels = [c for c in d["checks"] if c["path"] == "kernels" and c["check"] == "attention head dim 512"]
    assert kernels and all(c["status"] == "skip" and "does not fit this GPU's shared memory" in c["detail"]
                           for c in kernels if c["dtype"] == "fp32")
    # Q/K 128 beside V 512 (the other entry --only selects): run, or skipped for the same reason
    assert all(c["status"] == "pass" or (c["status"] == "skip" and "does not fit" in c["detail"])
               for c in d["checks"] if c["check"] == "attention head dim 512 v")
    assert all(c["status"] == "pass" for c in d["checks"] if c["path"] == "torch")


@pytest.mark.parametrize("argv,seen", [([], "0"), (["--autotune"], None)], ids=["default", "autotune"])
def test_autotune_off_unless_asked(capsys, monkeypatch, argv, seen):
    """The checks run with TILEATTN_AUTOTUNE=0 (first fitting config) unless
    --autotune is given, and the caller's setting is back afterwards."""
    monkeypatch.setenv("TILEATTN_AUTOTUNE", "1")
    if seen is None:
        monkeypatch.delenv("TILEATTN_AUTOTUNE")
    during = []

    def probe(dtype, device, gen):
        during.append(os.environ.get("TILEATTN_AUTOTUNE"))
        x = torch.randn(4, 4, generator=gen, dtype=torch.float64)
        return "4x4", [("out", x, x, x.to(dtype))]

    monkeypatch.setattr(check, "CHECKS", (check.Check("probe", probe, paths=("auto",)),))
    rc, d = _json(capsys, ["check", "--json", *argv])
    assert rc == 0 and during and set(during) == {seen}
    assert d["summary"]["autotune"] is bool(argv)
    assert os.environ.get("TILEATTN_AUTOTUNE") == (None if seen is None else "1")


def test_table_output():
    res = subprocess.run([sys.executable, "-m", "tileattn", "check", "--paths", "torch", "--only", "sdpa", "kvcache"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "120"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASS" in res.stdout and "FAIL" not in res.stdout
    assert "pure-PyTorch tiled path" in res.stdout  # says which path ran
    assert "passed, 0 failed" in res.stdout
    # without a terminal each check writes one line to stderr as it ends (a log shows where a run is)
    progress = [line for line in res.stderr.splitlines() if line.startswith("[")]
    n = int(progress[-1].split("]")[0].split("/")[1]) if progress else 0
    assert progress and len(progress) == n and progress[-1].startswith(f"[{n}/{n}]"), res.stderr


def test_a_failing_check_exits_1(capsys, monkeypatch):
    def wrong(dtype, device, gen):
        x = torch.randn(4, 4, generator=gen, dtype=torch.float64)
        return "4x4", [("out", x + 1e-3, x, x.to(dtype))]

    monkeypatch.setattr(check, "CHECKS", (check.Check("deliberately wrong", wrong, paths=("auto",)),))
    rc, d = _json(capsys, ["check", "--json"])
    assert rc == 1 and d["summary"]["failed"] == 1
    assert d["checks"][0]["error"] > d["checks"][0]["allowed"]


def test_a_crashing_check_is_a_failure(capsys, monkeypatch):
    def crash(dtype, device, gen):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(check, "CHECKS", (check.Check("crash", crash, paths=("auto",)),))
    rc, d = _json(capsys, ["check", "--json"])
    assert rc == 1 and "kernel exploded" in d["checks"][0]["detail"]


def test_unknown_only_exit_2(capsys):
    assert cli.main(["check", "--only", "no-such-check"]) == 2
    assert "checks:" in capsys.readouterr().err


@pytest.mark.skipif(HAS_CUDA, reason="checks the message without a GPU")
def test_cuda_without_gpu_exit_3(capsys):
    assert cli.main(["check", "--device", "cuda"]) == 3
    err = capsys.readouterr().err
    assert "no CUDA device" in err and "--device cpu" in err


def test_help_has_examples(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["check", "--help"])
    assert exc.value.code == 0
    assert "examples:" in capsys.readouterr().out
