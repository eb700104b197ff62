"""The Hopper backward kernel (Gluon, kernels/bwd_hopper.py): the dK/dV
kernel with the float32 dQ sum, between the portable preprocess and convert
kernels.

On the CPU: every config compiles for sm_90a without a GPU, within the
shared memory of an H100/H200, with the copy engine's reduce for dQ.  On a
GPU of compute capability 9.0: dq, dk, dv against a float64 reference under
the accuracy rule, with each config forced, odd lengths, Nq != Nk, fully
masked rows, large logits, GQA, strided layouts and a gradient into lse;
and the dispatcher takes it for plain non-deterministic calls only.
"""
import dataclasses
import functools
import json
import os
import subprocess
import sys

import pytest
import torch

import tileattn
from tileattn import configs, dispatch, launch
from tileattn.configs import HopperBwdConfig
from tileattn.launch import hopper as launch_hopper
from tileattn.reference import standard_attention
from tileattn.testing import HOPPER_CASES, check_accuracy, counting_calls, hopper_inputs

from conftest import HAS_CUDA

ON_HOPPER = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not ON_HOPPER, reason="GPU-only case: needs a compute capability 9.0 GPU")

FORCED = [(d, c) for d, c in configs.HOPPER_BWD.items()] + [
    (128, HopperBwdConfig(num_stages=3)), (128, HopperBwdConfig(dk_from_smem=True)),
    (64, HopperBwdConfig(dk_from_smem=False))]
# (head dim, config, causal, sinks): every forced config, and the table's with sinks
COMPILED = ([(d, c, causal, False) for d, c in FORCED for causal in (False, True)]
            + [(d, c, True, True) for d, c in configs.HOPPER_BWD.items()])


@pytest.fixture(scope="module")
def reports():
    """One fresh process compiles every config for sm_90a: under
    TRITON_INTERPRET, which this test process runs with, Gluon cannot compile."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    code = (
        "import json, sys; from tileattn.configs import HopperBwdConfig; from tileattn.launch import hopper\n"
        "cases = json.loads(sys.argv[1])\n"
        "print(json.dumps([hopper.compile_bwd_report(d, HopperBwdConfig(**c), causal, sinks=sinks)\n"
        "                  for d, c, causal, sinks in cases]))")
    arg = json.dumps([(d, dataclasses.asdict(c), causal, sinks) for d, c, causal, sinks in COMPILED])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {(d, c.name, causal, sinks): r
            for (d, c, causal, sinks), r in zip(COMPILED, json.loads(proc.stdout.splitlines()[-1]))}


@pytest.mark.parametrize("head_dim,cfg,causal,sinks", COMPILED,
                         ids=[f"d{d}-{c.name}-{'causal' if causal else 'full'}{'-sinks' if sinks else ''}"
                              for d, c, causal, sinks in COMPILED])
def test_compiles_for_sm90(reports, head_dim, cfg, causal, sinks):
    rep = reports[(head_dim, cfg.name, causal, sinks)]
    # per query tile: S^T, dP^T, dV, dK over D in steps of 16, dQ over the program's keys
    assert rep["wgmma"] > 0, "no warpgroup MMA in the PTX"
    assert rep["tma"] and rep["reduce"], "no TMA copy, or no bulk reduce for dQ, in the PTX"
    assert {"24", "240"} <= set(rep["setmaxnreg"]), f"register reallocation {rep['setmaxnreg']}"
    assert not rep["local"], "local memory in the PTX (a register array indexed at run time)"
    tile = 2 * cfg.block_n * head_dim * 2            # the program's K (or V)
    ring = cfg.num_stages * cfg.block_m * head_dim * 2   # Q (or dO) slots
    expect = 2 * tile + 2 * ring + 2 * (2 * cfg.block_n * cfg.block_m * 2) + 2 * cfg.block_m * head_dim // 2 * 4
    slack = 3072 if sinks else 1024   # barriers; with sinks also the scratch of the sum's reduction
    assert expect <= rep["shared"] <= expect + slack, f"shared memory {rep['shared']}, expected {expect} + barriers"
    assert rep["shared"] <= 227 * 1024, "more shared memory than a Hopper block may have"


_inputs = hopper_inputs


def _hopper_calls():
    """A list that gets an entry per launch of the Hopper backward kernel."""
    return counting_calls(launch_hopper, "attn_bwd_dkdv")


def _reference_grads(q, k, v, do, causal, dlse=None):
    def grads(*ts):
        leaves = [t.detach().requires_grad_() for t in ts[:3]]
        out, lse = standard_attention(*leaves, causal=causal, return_lse=True)
        outs, gouts = [out], [ts[3]]
        if dlse is not None:
            outs.append(lse)
            gouts.append(ts[4])
        return torch.autograd.grad(outs, leaves, gouts)
    ref = grads(*(t.double() for t in (q, k, v, do) + ((dlse,) if dlse is not None else ())))
    low = grads(q, k, v, do, *((dlse.to(q.dtype),) if dlse is not None else ()))
    return ref, low


def _check(name, q, k, v, do, causal, cfg=None, dlse=None):
    assert dispatch.hopper_bwd_eligible(q, k, v, do)
    scale = q.shape[-1] ** -0.5
    cfg = cfg or launch_hopper.bwd_config_for(q.shape[-1])
    out, lse = launch.attn_fwd(q, k, v, causal, scale)
    with _hopper_calls() as calls:
        got = launch.attn_bwd(do, q, k, v, out, lse, causal, scale, dlse=dlse, config=cfg, deterministic=False)
    assert calls, "the Hopper backward did not run"
    ref, low = _reference_grads(q, k, v, do, causal, dlse)
    for part, g, r, lo in zip(("dq", "dk", "dv"), got, ref, low):
        assert g.shape == r.shape
        check_accuracy(f"{name} {part}", g, r, lo, q.dtype)


CASES = HOPPER_CASES


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", list(CASES))
def test_against_float64(case, causal, dtype):
    b, hq, hkv, n_q, n_k, d = CASES[case]
    _check(case, *_inputs(b, hq, hkv, n_q, n_k, d, dtype, seed=hash(case) % 1000), causal)


@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim,cfg", FORCED, ids=[f"d{d}-{c.name}" for d, c in FORCED])
def test_every_config(head_dim, cfg, causal):
    _check(cfg.name, *_inputs(2, 4, 2, 700, 900, head_dim, torch.bfloat16, seed=7), causal, cfg)


@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_large_logits_strided_and_dlse(causal):
    q, k, v, do = _inputs(2, 4, 4, 600, 600, 128, torch.bfloat16, seed=11, layout="bnhd", logit_scale=30.0)
    assert not q.is_contiguous()
    dlse = torch.randn(2, 4, 600, device="cuda")
    _check("large-logits-bnhd-dlse", q, k, v, do, causal, dlse=dlse)


@needs_hopper
def test_dispatch_nondeterministic_plain_only():
    q, k, v, do = _inputs(1, 4, 2, 1024, 1024, 128, torch.bfloat16, seed=3)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    with _hopper_calls() as calls:
        tileattn.attention(*leaves, causal=True, deterministic=False).backward(do)
        assert calls, "a plain non-deterministic bf16 d=128 backward did not take the Hopper kernel"
        calls.clear()
        for kw in (dict(deterministic=True), dict(deterministic=False, window=(64, 0)),
                   dict(deterministic=False, softcap=20.0)):
            tileattn.attention(*leaves, causal=True, **kw).backward(do)
        assert not calls, "a deterministic call or a variant took the Hopper backward"


@needs_hopper
@pytest.mark.parametrize("head_dim,causal", [(64, True), (64, False), (128, True)],
                         ids=["d64-causal", "d64-full", "d128-causal"])
def test_sinks_gradient_on_the_hopper_kernel(head_dim, causal):
    """gpt-oss's shape family (GQA 8, d = 64) and d = 128: dq, dk, dv and the
    sinks' gradient (gathered by the kernel from P and dP) against float64."""
    q, k, v, do = _inputs(1, 16, 2, 700, 700, head_dim, torch.bfloat16, seed=21)
    sinks = torch.linspace(-3.0, 3.0, 16, device="cuda")
    dlse = torch.randn(1, 16, 700, device="cuda")

    def grads(qq, kk, vv, ss, dd, impl):
        leaves = [t.detach().requires_grad_() for t in (qq, kk, vv, ss)]
        out, lse = impl(*leaves[:3], causal=causal, sinks=leaves[3], return_lse=True)
        loss = (out.to(dd.dtype) * dd).sum() + (lse.to(dlse.dtype) * dlse.to(lse.dtype)).sum()
        return torch.autograd.grad(loss, leaves)
    with _hopper_calls() as calls:
        got = grads(q, k, v, sinks, do, functools.partial(tileattn.attention, deterministic=False))
    assert calls, "the Hopper backward did not run"
    ref = grads(q.double(), k.double(), v.double(), sinks.double(), do.double(), standard_attention)
    low = grads(q, k, v, sinks, do, standard_attention)
    for part, g, r, lo in zip(("dq", "dk", "dv", "dsinks"), got, ref, low):
        check_accuracy(f"sinks d{head_dim} {part}", g, r, lo, q.dtype)


@pytest.fixture
def torch_deterministic():
    """Set torch.use_deterministic_algorithms inside a test; restored after."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield lambda on: torch.use_deterministic_algorithms(on)
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@pytest.mark.parametrize("case", ["cpu-plain", "cpu-variant", "fp32"])
def test_default_is_deterministic_off_the_hopper_path(case):
    """deterministic=None resolves to True where the Hopper backward cannot
    run (there the portable atomic kernel is the slower one)."""
    device = "cuda" if HAS_CUDA else "cpu"
    dtype = torch.float32 if case == "fp32" or device == "cpu" else torch.bfloat16
    q = torch.randn(1, 2, 64, 64, device="cpu" if case.startswith("cpu") else device, dtype=dtype)
    assert dispatch.default_deterministic(q, q, q, plain=case != "cpu-variant") is True


@needs_hopper
@pytest.mark.parametrize("switch", [False, True], ids=["torch-nondeterministic", "torch-deterministic"])
def test_default_takes_hopper_unless_torch_deterministic(switch, torch_deterministic):
    q, k, v, do = _inputs(1, 4, 2, 1024, 1024, 128, torch.bfloat16, seed=4)
    torch_deterministic(switch)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    with _hopper_calls() as calls:
        tileattn.attention(*leaves, causal=True).backward(do)
    assert bool(calls) is (not switch), \
        "deterministic=None: the Hopper backward unless torch.use_deterministic_algorithms is on"
