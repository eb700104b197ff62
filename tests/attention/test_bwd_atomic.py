"""The two backwards, ``deterministic=True`` (dK/dV kernel + dQ kernel) and
``deterministic=False`` (one kernel that also adds dQ into a float32
accumulator with atomics, then a convert kernel): gradients against the
float64 reference under the accuracy rule, through the case builders of
``tileattn.testing``; which backward the default picks; that
the deterministic one is the old launch sequence; bad values of the flag."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

import tileattn
from tileattn import configs, launch
from tileattn import testing as dense

from conftest import DEVICE, INTERPRETED

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
BACKWARDS = {"deterministic": True, "atomic": False}


@pytest.fixture(params=sorted(BACKWARDS))
def deterministic(request, kernels):
    return BACKWARDS[request.param]


# (name, case): small shapes, the interpreter is slow; 32 x 32 tiles there
DENSE = {
    "plain": dense.Case(1, 2, 2, 129, 129, 32, False, F16),
    "causal-bnhd": dense.Case(2, 2, 2, 100, 100, 32, True, BF16, "bnhd"),
    "gqa4": dense.Case(1, 8, 2, 70, 90, 32, True, F32),
    "len1": dense.Case(1, 2, 1, 1, 1, 16, False, F16),
    "len17": dense.Case(1, 2, 2, 17, 17, 40, True, BF16),
    "nq129-nk333": dense.Case(1, 1, 1, 129, 333, 16, True, F16),
    "nq333-nk129-masked-rows": dense.Case(1, 1, 1, 333, 129, 16, True, F32),   # rows 0..203 see no key
}

VARIANTS = {
    "window": dense.VariantCase(1, 4, 2, 100, 100, 32, F16, window=(16, 16)),
    "window-masked-rows": dense.VariantCase(1, 2, 2, 100, 40, 16, F32, causal=True, window=(0, 0)),
    "softcap": dense.VariantCase(1, 4, 2, 83, 96, 32, F16, softcap=5.0),
    "alibi": dense.VariantCase(2, 2, 1, 70, 70, 32, F32, alibi="bh", causal=True),
    "all-three": dense.VariantCase(2, 2, 2, 90, 60, 32, F16, alibi="h", causal=True, window=(30, -1), softcap=4.0),
    "blocks": dense.VariantCase(1, 2, 1, 200, 160, 16, F16, blocks="rand-1H", block_density=0.6),
    "blocks-causal": dense.VariantCase(1, 1, 1, 160, 200, 16, BF16, blocks="rand-BH", block_density=0.7, causal=True),
}

VARLEN = {
    "varlen": dense.VarlenCase((17, 1, 0, 40, 33), None, 2, 1, 32, F16),
    "varlen-nq-ne-nk": dense.VarlenCase((5, 40, 1, 50), (9, 31, 0, 70), 2, 1, 40, F32, causal=True),
    "varlen-empty": dense.VarlenCase((0, 0, 45), (3, 0, 20), 2, 2, 32, F16, causal=True),
}


@pytest.mark.parametrize("name", sorted(DENSE))
def test_dense(name, deterministic):
    dense.assert_case(DENSE[name], deterministic=deterministic)


def test_large_logits(deterministic):
    """Inputs x30: scores in the thousands."""
    dense.assert_case(dense.Case(1, 2, 2, 100, 130, 64, True, F16), input_scale=30.0, deterministic=deterministic)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variants(name, deterministic):
    dense.assert_variant_case(VARIANTS[name], deterministic=deterministic)


@pytest.mark.parametrize("name", sorted(VARLEN))
def test_varlen(name, deterministic):
    dense.assert_varlen_case(VARLEN[name], deterministic=deterministic)


def test_atomic_pointer_path(pointer_path):
    """Pointer loads (the atomics themselves go by pointer on the interpreter
    either way); a head dim below its tile (24 of 32) masks the adds' columns."""
    dense.assert_case(dense.Case(1, 4, 1, 40, 70, 24, True, F16), deterministic=False)


def test_atomic_pointer_path_varlen(pointer_path):
    dense.assert_varlen_case(VARLEN["varlen-empty"], deterministic=False)


# ---------------------------------------------------------------------------
# which backward runs
# ---------------------------------------------------------------------------
@pytest.fixture
def launched(monkeypatch):
    """The kinds of the configurable kernels each backward launches.  Launch
    plans are off: a replayed plan (GPU) launches without asking for kinds."""
    monkeypatch.setenv("TILEATTN_DIRECT_LAUNCH", "0")
    kinds = []
    real = launch.attention._launch

    def spy(kind, *args, **kwargs):
        kinds.append(kind)
        return real(kind, *args, **kwargs)

    monkeypatch.setattr(launch.attention, "_launch", spy)
    return kinds


@pytest.fixture
def global_switch():
    """Set torch.use_deterministic_algorithms inside a test; restored after."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield lambda on: torch.use_deterministic_algorithms(on)
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def _dense_grads(**kw):
    torch.manual_seed(7)
    q, k, v = (torch.randn(1, 2, 40, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    out = tileattn.attention(q, k, v, causal=True, **kw)
    return torch.autograd.grad(out, (q, k, v), torch.ones_like(out))


def _varlen_grads(**kw):
    torch.manual_seed(8)
    q, k, v = (torch.randn(30, 2, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 12, 30], dtype=torch.int32, device=DEVICE)
    out = tileattn.attention_varlen(q, k, v, cu, cu, 18, 18, causal=True, **kw)
    return torch.autograd.grad(out, (q, k, v), torch.ones_like(out))


RUNS = {"dense": _dense_grads, "varlen": _varlen_grads}
BACKWARD_KINDS = {True: ["fwd", "dkdv", "dq"], False: ["fwd", "dkdv_atomic"]}


@pytest.mark.parametrize("run", sorted(RUNS))
@pytest.mark.parametrize("switch", [False, True], ids=["torch-nondeterministic", "torch-deterministic"])
def test_default_is_deterministic(run, switch, kernels, launched, global_switch):
    global_switch(switch)
    RUNS[run]()
    assert launched == BACKWARD_KINDS[True]


@pytest.mark.parametrize("run", sorted(RUNS))
@pytest.mark.parametrize("flag", [True, False], ids=["deterministic", "atomic"])
def test_explicit_flag_beats_torch_switch(run, flag, kernels, launched, global_switch):
    global_switch(not flag)
    RUNS[run](deterministic=flag)
    assert launched == BACKWARD_KINDS[flag]


def test_compiled_graph_passes_the_flag(kernels, launched):
    """torch.compile(fullgraph=True): the flag travels through the custom ops
    to the backward."""
    torch.manual_seed(10)
    q, k, v = (torch.randn(1, 2, 40, 16, device=DEVICE, requires_grad=True) for _ in range(3))
    torch._dynamo.reset()
    # (the atomic backward goes through opcheck in test_custom_op)
    compiled = torch.compile(lambda q, k, v: tileattn.attention(q, k, v, deterministic=True).sum(), fullgraph=True)
    loss = compiled(q, k, v)
    launched.clear()
    torch.autograd.grad(loss, (q, k, v))
    assert launched == BACKWARD_KINDS[True][1:]


def test_opcheck_atomic_backward_ops(kernels, launched):
    """The backward custom ops with deterministic=False, dense and packed."""
    torch.manual_seed(11)
    q, k, v = (torch.randn(1, 2, 40, 16, device=DEVICE) for _ in range(3))
    out, lse, _ = torch.ops.tileattn.attention_fwd(q, k, v, True, 0.25)
    torch.library.opcheck(torch.ops.tileattn.attention_bwd.default,
                          (torch.randn_like(out), q, k, v, out, lse, None, True, 0.25, -1, -1, 0.0, None, None, False))
    qp, kp, vp = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))
    cu = torch.tensor([0, 15, 40], dtype=torch.int32, device=DEVICE)
    out, lse = torch.ops.tileattn.attention_varlen_fwd(qp, kp, vp, cu, cu, 25, 25, True, 0.25)
    torch.library.opcheck(torch.ops.tileattn.attention_varlen_bwd.default,
                          (torch.randn_like(out), qp, kp, vp, out, lse, None, cu, cu, 25, 25, True, 0.25, -1, -1, 0.0,
                           None, False))
    assert "dkdv_atomic" in launched and "dq" not in launched


# ---------------------------------------------------------------------------
# deterministic=True is the old launch sequence
# ---------------------------------------------------------------------------
def _launcher_inputs(dtype=F16):
    torch.manual_seed(9)
    q = torch.randn(1, 4, 75, 40, device=DEVICE).to(dtype)
    k, v = (torch.randn(1, 2, 70, 40, device=DEVICE).to(dtype) for _ in range(2))
    do = torch.randn_like(q)
    scale = 40 ** -0.5
    out, lse = launch.attn_fwd(q, k, v, True, scale)
    return do, q, k, v, out, lse, True, scale


def test_deterministic_is_the_default_of_the_launcher(kernels, launched):
    """``attn_bwd`` called as before the flag existed runs the dK/dV and dQ
    kernels, bitwise as ``deterministic=True``."""
    args = _launcher_inputs()
    dlse = torch.randn_like(args[5])
    old = launch.attn_bwd(*args, dlse=dlse)
    assert launched == ["fwd", "dkdv", "dq"]
    new = launch.attn_bwd(*args, dlse=dlse, deterministic=True)
    for name, a, b in zip(("dq", "dk", "dv"), old, new):
        assert torch.equal(a, b), name


@pytest.mark.skipif(not INTERPRETED, reason="bitwise across two compiled kernels holds only where both run the "
                                            "same arithmetic (the interpreter); the GPU checks the accuracy rule")
def test_atomic_dk_dv_bitwise_as_deterministic(kernels):
    """The fused kernel computes dK and dV exactly as the dK/dV kernel does:
    only dQ changes its order of additions."""
    args = _launcher_inputs(F32)
    cfg = configs.INTERPRETER_BWD
    det = launch.attn_bwd(*args, config=cfg, deterministic=True)
    fast = launch.attn_bwd(*args, config=cfg, deterministic=False)
    assert torch.equal(det[1], fast[1]) and torch.equal(det[2], fast[2])
    assert (det[0] - fast[0]).abs().max() <= 1e-5


def test_accumulator_starts_at_zero_and_dq_is_fully_written(kernels, monkeypatch):
    """Outputs are poisoned (NaN) before the launch; the accumulator must not
    be, and the convert kernel writes every element of dq (also the rows
    that see no key)."""
    seen = []
    real = launch.bwd_steps.dq_accumulator
    monkeypatch.setattr(launch.bwd_steps, "dq_accumulator", lambda q: seen.append(real(q)) or seen[-1])
    do, q, k, v, out, lse, _, scale = _launcher_inputs(F32)
    out, lse = launch.attn_fwd(q, k[:, :, :30], v[:, :, :30], True, scale)   # Nq > Nk: rows 0..44 see no key
    dq, dk, dv = launch.attn_bwd(do, q, k[:, :, :30], v[:, :, :30], out, lse, True, scale, deterministic=False)
    assert len(seen) == 1 and seen[0].dtype == torch.float32 and seen[0].shape == q.shape
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()
    assert torch.equal(dq[:, :, :45], torch.zeros_like(dq[:, :, :45]))


# ---------------------------------------------------------------------------
# bad values
# ---------------------------------------------------------------------------
BAD = {"int": 1, "str": "yes", "tensor": torch.tensor(True), "float": 0.0}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_flag(name, path, monkeypatch):
    for fn in ("attn_fwd", "attn_bwd"):
        monkeypatch.setattr(launch, fn, dense.forbidden())
    q = torch.randn(1, 2, 8, 16, device=DEVICE)
    cu = torch.tensor([0, 8], dtype=torch.int32, device=DEVICE)
    with pytest.raises(TypeError, match="deterministic must be a bool or None, got"):
        tileattn.attention(q, q, q, deterministic=BAD[name])
    with pytest.raises(TypeError, match="deterministic must be a bool or None, got"):
        tileattn.attention_varlen(q[0].transpose(0, 1), q[0].transpose(0, 1), q[0].transpose(0, 1), cu, cu, 8, 8,
                                  deterministic=BAD[name])


# ---------------------------------------------------------------------------
# the shared-memory estimate of the fused kernel
# ---------------------------------------------------------------------------
_SMEM_SCRIPT = """
import json, sys
sys.path.insert(0, {bench!r})
from compile_report import compile_one
from tileattn import configs
from tileattn.kernels.bwd import _attn_bwd_dkdv_kernel
cfg = configs.candidates("dkdv_atomic", 128)[0]
regs, smem, spills, wgmma, _ = compile_one(_attn_bwd_dkdv_kernel, cfg, 128, "bf16", True, 90, atomic_dq=True)
print(json.dumps([cfg.block_m, cfg.block_n, cfg.num_stages, smem, "cp.reduce.async.bulk.tensor" in _.asm["ptx"]]))
"""


@pytest.mark.skipif(not triton.__version__.startswith("3.6"),
                    reason="the estimate describes triton 3.6's pipeliner; re-measure it on another version")
def test_atomic_smem_estimate_matches_compiler():
    """The fused kernel compiled for sm_90 (no GPU needed; in a subprocess
    without TRITON_INTERPRET): its shared memory is what
    ``dkdv_atomic_smem_bytes`` says, to the overhead term, and its dQ adds
    are the copy engine's bulk reduce."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    bench = str(Path(__file__).resolve().parents[2] / "benchmarks")
    res = subprocess.run([sys.executable, "-c", _SMEM_SCRIPT.format(bench=bench)], capture_output=True, text=True,
                         env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    bm, bn, stages, actual, bulk_reduce = json.loads(res.stdout.strip().splitlines()[-1])
    est = configs.dkdv_atomic_smem_bytes(bm, bn, 128, 2, stages)
    assert actual <= est <= actual + 2048, (actual, est)
    assert bulk_reduce
