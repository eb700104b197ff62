"""examples/train_gpt.py: the tiny CPU configuration end to end, tileattn
against SDPA with the same seed, and torch.compile(fullgraph=True) of the
example's GPT, forward and backward, without graph breaks."""
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_gpt.py"


@pytest.fixture(scope="module")
def train_gpt():
    spec = importlib.util.spec_from_file_location("train_gpt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_gpt"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_data_is_shipped_and_small(train_gpt):
    size = train_gpt.DATA.stat().st_size
    assert 50_000 < size < 400_000
    assert (train_gpt.DATA.parent / "README.md").exists()


def test_compare_same_seed_same_curve(train_gpt, tmp_path):
    """tileattn and SDPA from one seed: the same batches and weights, so the
    float32 losses differ only by rounding."""
    rc = train_gpt.main(["--compare", "--steps", "8", "--eval-every", "4", "--device", "cpu", "--seed", "3",
                         "--out", str(tmp_path)])
    assert rc == 0
    log = json.loads((tmp_path / "compare.json").read_text())
    a, b = (run["loss"] for run in log["runs"])
    assert [r["attn"] for r in log["runs"]] == ["tileattn", "sdpa"]
    assert len(a) == len(b) == 8 and all(math.isfinite(x) for x in a + b)
    assert a[-1] < a[0]  # it learns
    assert log["max_abs_loss_diff"] < 1e-4
    for run in log["runs"]:
        assert run["tokens_per_s"] > 0 and run["val"][-1]["step"] == 8
        assert run["peak_memory_bytes"] is None or run["peak_memory_bytes"] > 0
    assert log["runs"][0]["tileattn_path"] == "PyTorch tiled path"
    assert (tmp_path / "compare_loss.png").stat().st_size > 10_000


def test_command_line_tiny_run(tmp_path):
    """The script as a user runs it: standard attention, a few steps, JSON and plot written."""
    res = subprocess.run([sys.executable, str(SCRIPT), "--attn", "standard", "--steps", "4", "--eval-every", "2",
                          "--device", "cpu", "--out", str(tmp_path), "--sample", "20"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "TRITON_INTERPRET": "0"})
    assert res.returncode == 0, res.stderr
    log = json.loads((tmp_path / "standard.json").read_text())
    assert log["preset"] == "tiny" and len(log["runs"][0]["loss"]) == 4
    assert (tmp_path / "standard_loss.png").exists()
    assert "tokens/s" in res.stdout


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--n-head", "3"], ["--block-size", "999999"]],
                         ids=["steps-0", "heads-not-dividing", "context-longer-than-text"])
def test_bad_arguments_exit_2(train_gpt, tmp_path, argv):
    assert train_gpt.main(argv + ["--device", "cpu", "--out", str(tmp_path)]) == 2


def test_compile_fullgraph_no_graph_breaks(train_gpt):
    cfg = train_gpt.Config(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=20)
    torch.manual_seed(4)
    model = train_gpt.GPT(cfg, "tileattn")
    x = torch.randint(0, 20, (2, 16))
    y = torch.randint(0, 20, (2, 16))
    explained = torch._dynamo.explain(model)(x, y)
    assert explained.graph_break_count == 0
    assert "tileattn.attention_fwd" in "".join(g.code for g in explained.graphs)

    torch._dynamo.reset()
    # aot_eager: dynamo and AOT autograd trace forward and backward through the custom ops;
    # inductor code generation of the op is covered by test_custom_op (and is slow here)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    loss = compiled(x, y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    ref = model(x, y)
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)
