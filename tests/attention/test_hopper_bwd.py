"""The Hopper backward kernel (Gluon, kernels/bwd_hopper.py): the dK/dV
kernel with the float32 dQ sum, between the portable preprocess and convert
kernels.

On the CPU: every config compiles for sm_90a without a GPU, within the
shared memory of an H100/H200, with the copy engine's reduce for dQ, and
ptxas keeps its warpgroup MMAs asynchronous (no C7512 serialization).  On a
GPU of compute capability 9.0: dq, dk, dv against a float64 reference under
the accuracy rule, with each config forced, odd lengths, Nq != Nk, fully
masked rows, large logits, GQA, strided layouts and a gradient into lse;
and the dispatcher takes it for plain non-deterministic calls only.  The
same for the wide kernel (kernels/bwd_hopper_wide.py: QK 192 / V 128) and
the split kernel (kernels/bwd_hopper_split.py: d = 256), which the dispatch
skips for calls with sinks whose forward kept no output remainder.
"""
import dataclasses
import functools
import json
import os
import subprocess
import sys
from unittest import mock

import pytest
import torch

import tileattn
from tileattn import configs, dispatch, launch, ops
from tileattn.configs import HopperBwdConfig
from tileattn.launch import (bwd_memory, bwd_steps, grid_order, hopper as launch_hopper, hopper_calls,
                             hopper_persistent, runtime)
from tileattn.reference import standard_attention
from tileattn.testing import DEVICE, HOPPER_CASES, case_number, check_accuracy, counting_calls, hopper_inputs

from conftest import HAS_CUDA

ON_HOPPER = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not ON_HOPPER, reason="GPU-only case: needs a compute capability 9.0 GPU")

# ((QK, V head dims), config): the table's and the other configs worth forcing
FORCED = [(dims, c) for dims, c in configs.HOPPER_BWD.items()] + [
    ((128, 128), HopperBwdConfig(num_stages=3)), ((128, 128), HopperBwdConfig(dk_from_smem=True)),
    ((64, 64), HopperBwdConfig(dk_from_smem=False)), ((192, 128), HopperBwdConfig(block_m=32, num_stages=3)),
    # d = 256, 32-query tiles (the table's is 64 in one Q/dO slot): 2 and 3 ring slots
    ((256, 256), HopperBwdConfig(block_m=32, block_n=32, num_stages=2)),
    ((256, 256), HopperBwdConfig(block_m=32, block_n=32, num_stages=3)),
    # always a pair of mirror-image key blocks a program (non-causal calls too), never (the table's: causal, where
    # pairs_pay)
    ((128, 128), HopperBwdConfig(pair_blocks=True)), ((64, 64), HopperBwdConfig(dk_from_smem=True, pair_blocks=True)),
    ((128, 128), HopperBwdConfig(pair_blocks=False)), ((64, 64), HopperBwdConfig(dk_from_smem=True, pair_blocks=False)),
    # lse₂ and Δ by the copy engine into shared memory
    ((64, 64), HopperBwdConfig(dk_from_smem=True, stats_tma=True)), ((128, 128), HopperBwdConfig(stats_tma=True)),
    ((128, 128), HopperBwdConfig(stats_tma=True, pair_blocks=True)),
    # the warpgroups take turns forming a tile's whole dQ
    ((64, 64), HopperBwdConfig(dk_from_smem=True, stats_tma=True, dq_turns=True)),
    ((64, 64), HopperBwdConfig(dk_from_smem=True, stats_tma=True, dq_turns=True, pair_blocks=True)),
    ((128, 128), HopperBwdConfig(stats_tma=True, dq_turns=True)),
    # GQA: each kv head's group cut into slices (grid rows), float32 dK/dV sums
    ((128, 128), HopperBwdConfig(stats_tma=True, head_slices=2)),
    ((64, 64), HopperBwdConfig(dk_from_smem=True, stats_tma=True, dq_turns=True, head_slices=2, pair_blocks=True)),
    # causal: the key blocks of 4 or 2 (row, batch) pairs at a time (4 pairs in the test's grid, 8 in slices)
    ((128, 128), HopperBwdConfig(stats_tma=True, group_rows=4)),
    ((128, 128), HopperBwdConfig(stats_tma=True, head_slices=2, group_rows=4)),
    ((64, 64), HopperBwdConfig(dk_from_smem=True, stats_tma=True, dq_turns=True, group_rows=2)),
    ((192, 128), HopperBwdConfig(block_m=32, num_stages=2, group_rows=4)),
    ((256, 256), HopperBwdConfig(block_m=64, block_n=32, num_stages=1, group_rows=4)),
    # d = 64: one program an SM walks the key blocks (causal: mirror-image pairs), K and V in two buffers
    ((64, 64), dataclasses.replace(configs.HOPPER_BWD[(64, 64)], persistent=True)),
    ((64, 64), HopperBwdConfig(dk_from_smem=True, persistent=True)),
    # ... and the last round's blocks cut along their query tiles (non-causal)
    ((64, 64), dataclasses.replace(configs.HOPPER_BWD[(64, 64)], persistent=True, split_tail=True))]
# the table's configs of the kernel that sums dS for the sinks' gradient (Dv = D <= 128)
SUMMING = [(dims, c) for dims, c in configs.HOPPER_BWD.items() if dims[0] == dims[1] <= 128]
# (dims, config, causal, sinks): every forced config; with sinks, the table's configs adding each tile's
# row sums at once and under the next tile's products (defer_sums, the table's at d = 64)
COMPILED = ([(dims, c, causal, False) for dims, c in FORCED for causal in (False, True)]
            + [(dims, dataclasses.replace(c, defer_sums=False), True, True) for dims, c in SUMMING]
            + [(dims, dataclasses.replace(c, defer_sums=True), causal, True) for dims, c in SUMMING
               for causal in (False, True)]
            # dq_turns with dS row sums: the launcher gives the kernel half-width boxes (each half a tile)
            + [((64, 64), HopperBwdConfig(dk_from_smem=True, stats_tma=True, defer_sums=True, dq_turns=True), True,
                True)]
            # the sinks' per-head sums instead of dS's row sums (sink_sums), causal pairs too
            + [(dims, dataclasses.replace(c, sink_sums=True, pair_blocks=pairs), causal, True) for dims, c in SUMMING
               for causal, pairs in ((False, None), (True, False), (True, True))])


def _dims_id(dims):
    return f"d{dims[0]}" if dims[0] == dims[1] else f"d{dims[0]}-dv{dims[1]}"


def _expected_shared(dims, cfg, sinks=False):
    """The shared memory the kernel's buffers take (barriers aside): the
    program's K and V, the Q and dO slots, two dSᵀ buffers and the float32
    dQ staging (two column halves, or two whole tiles with ``dq_turns``
    unless the kernel sums dS; the wide kernel: two 64-row chunks a
    warpgroup at 32-query tiles, one at 64; the split kernel, d = 256: two
    chunks a warpgroup, and two Pᵀ buffers beside dSᵀ's); with ``stats_tma``
    each slot's lse₂ and Δ rows; the persistent walk two K/V buffers."""
    d, dv = dims
    split = d == dv and d > 128
    kv = (2 if cfg.persistent and not sinks else 1) * 2 * cfg.block_n * (d + dv) * 2   # persistent: two buffers
    ring = cfg.num_stages * cfg.block_m * (d + dv) * 2
    ds = (2 if split else 1) * 2 * (2 * cfg.block_n * cfg.block_m * 2)
    dq_width = d if cfg.dq_turns and not (sinks and not cfg.sink_sums) else d // 2
    chunks = 4 if cfg.block_m <= 32 or split else 2
    dq = chunks * 64 * cfg.block_m * 4 if dv != d or split else 2 * cfg.block_m * dq_width * 4
    stats = 2 * cfg.num_stages * cfg.block_m * 4 if cfg.stats_tma else 0
    return kv + ring + ds + dq + stats


@pytest.fixture(scope="module")
def reports():
    """One fresh process compiles every config for sm_90a: under
    TRITON_INTERPRET, which this test process runs with, Gluon cannot compile."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    code = (
        "import json, sys; from tileattn.configs import HopperBwdConfig; from tileattn.launch import hopper_compile\n"
        "cases = json.loads(sys.argv[1])\n"
        "print(json.dumps([hopper_compile.compile_bwd_report(d, HopperBwdConfig(**c), causal, sinks=sinks,\n"
        "                                                     head_dim_v=dv)\n"
        "                  for (d, dv), c, causal, sinks in cases]))")
    arg = json.dumps([(dims, dataclasses.asdict(c), causal, sinks) for dims, c, causal, sinks in COMPILED])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {(dims, c.name, causal, sinks): r
            for (dims, c, causal, sinks), r in zip(COMPILED, json.loads(proc.stdout.splitlines()[-1]))}


@pytest.mark.parametrize("dims,cfg,causal,sinks", COMPILED,
                         ids=[f"{_dims_id(dims)}-{c.name}-{'causal' if causal else 'full'}{'-sinks' if sinks else ''}"
                              for dims, c, causal, sinks in COMPILED])
def test_compiles_for_sm90(reports, dims, cfg, causal, sinks):
    rep = reports[(dims, cfg.name, causal, sinks)]
    # per query tile: S^T, dP^T, dV, dK over D in steps of 16, dQ over the program's keys
    assert rep["wgmma"] > 0, "no warpgroup MMA in the PTX"
    assert rep["tma"] and rep["reduce"], "no TMA copy, or no bulk reduce for dQ, in the PTX"
    assert {"24", "240"} <= set(rep["setmaxnreg"]), f"register reallocation {rep['setmaxnreg']}"
    assert not rep["local"], "local memory in the PTX (a register array indexed at run time)"
    assert not rep["wgmma_serialized"], \
        "ptxas serialized the warpgroup MMAs (C7512: too few registers; C7514: accumulators read in flight)"
    expect = _expected_shared(dims, cfg, sinks)
    slack = 3072 if sinks else 1024   # barriers; with sinks also the scratch of the sum's reduction
    assert expect <= rep["shared"] <= expect + slack, f"shared memory {rep['shared']}, expected {expect} + barriers"
    assert rep["shared"] <= 227 * 1024, "more shared memory than a Hopper block may have"


@pytest.mark.parametrize("log,serialized,spills,regs", [
    ("ptxas info    : Used 168 registers\n    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
     False, 0, 168),
    ("ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
     "insufficient register resources\n    24 bytes stack frame, 28 bytes spill stores, 28 bytes spill loads",
     True, 28, None),
    ("ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
     "non wgmma instructions reading accumulator registers of  a wgmma between start and end of the pipeline "
     "stage in the function 'k'\nptxas info    : Used 168 registers", True, 0, 168)],
    ids=["clean", "serialized-spilling", "serialized-accumulator-read"])
def test_ptxas_report_reads_the_log(log, serialized, spills, regs, monkeypatch):
    """runtime.ptxas_report's reading of ``ptxas -v``: a warning that the
    warpgroup MMAs were serialized (C7512 for registers, C7514 for an
    accumulator read in flight), the spilled bytes and the registers."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    seen, real_run = [], subprocess.run

    def fake_run(cmd, *args, **kwargs):   # the assembling run only (triton asks ptxas its version too)
        if "-arch=sm_90a" not in cmd:
            return real_run(cmd, *args, **kwargs)
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout="", stderr=log)
    monkeypatch.setattr(subprocess, "run", fake_run)
    assert runtime.ptxas_report("// ptx") == {"wgmma_serialized": serialized, "spill_stores": spills,
                                              "registers": regs}
    assert "-arch=sm_90a" in seen[0] and "-v" in seen[0]


_inputs = hopper_inputs


def _hopper_calls():
    """A list that gets an entry per launch of the Hopper backward kernel."""
    return counting_calls(launch_hopper, "attn_bwd_dkdv")


def _reference_grads(q, k, v, do, causal, dlse=None, window=None):
    def grads(*ts):
        leaves = [t.detach().requires_grad_() for t in ts[:3]]
        out, lse = standard_attention(*leaves, causal=causal, return_lse=True, window=window)
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
    cfg = cfg or launch_hopper.bwd_config_for(q.shape[-1], v.shape[-1])
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
    _check(case, *_inputs(b, hq, hkv, n_q, n_k, d, dtype, seed=case_number(case) % 1000), causal)


@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dims,cfg", FORCED, ids=[f"{_dims_id(dims)}-{c.name}" for dims, c in FORCED])
def test_every_config(dims, cfg, causal):
    _check(cfg.name, *_inputs(2, 4, 2, 700, 900, dims[0], torch.bfloat16, seed=7, dv=dims[1]), causal, cfg)


@needs_hopper
@pytest.mark.parametrize("tail", [False, True], ids=["whole", "split-tail"])
@pytest.mark.parametrize("programs", [1, 3, 5, 13, 30], ids=["1-program", "3-programs", "5-programs", "13-programs",
                                                            "30-programs"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", ["B2-H4x2-N700x900", "B1-H4x2-N1500x700", "B3-H3x3-N129x257"])
def test_persistent_walk(case, causal, programs, tail, monkeypatch):
    """The persistent d = 64 backward with fewer programs than work items:
    each program walks several key blocks (causal: mirror-image pairs, the
    middle block alone where their count is odd), both K/V buffers and
    their phases wrap, the Q/dO ring's count runs on across blocks; against
    float64 (odd lengths, Nq != Nk both ways, GQA).  ``split_tail``
    (non-causal): the last round's items cut into pieces, or every item where
    they are at most half the programs (5 programs: 2 pieces of 2 items; 13:
    2 of 6 items, or 13 of 1 item, most of them without a query tile; 30: 15
    of 2 items, or 2 of all 12), their float32 sums rounded after: the fix-up
    kernel runs exactly where ``grid_order.tail_split`` cuts."""
    # work items (full / causal pairs): 32 / 16, 12 / 6, 27 / 18: more than 5 programs take in one round each
    b, hq, hkv, n_q, n_k = {"B2-H4x2-N700x900": (2, 4, 2, 700, 900), "B1-H4x2-N1500x700": (1, 4, 2, 1500, 700),
                            "B3-H3x3-N129x257": (3, 3, 3, 129, 257)}[case]
    for module in (launch_hopper, hopper_persistent):
        monkeypatch.setattr(module, "sm_count", lambda device: programs)
    cfg = dataclasses.replace(configs.HOPPER_BWD[(64, 64)], persistent=True, split_tail=tail)
    from tileattn.kernels.bwd_tail import _bwd_tail_kernel
    total = -(-n_k // 128) * hkv * b
    cut = tail and not causal and grid_order.tail_split(total, programs)[1] >= 2
    with counting_calls(hopper_persistent, "bwd_persistent") as walks, counting_calls(runtime, "run") as runs:
        _check(f"{case}-{programs}", *_inputs(b, hq, hkv, n_q, n_k, 64, torch.bfloat16,
                                              seed=case_number(case) % 1000), causal, cfg)
    assert walks, "the persistent kernel did not run"
    assert any(args[0] is _bwd_tail_kernel for args, _ in runs) is cut, "the tail was (not) cut"


@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sinks", [False, True], ids=["plain", "sinks"])
def test_default_call_walks_persistent(causal, sinks):
    """A default (config-less, atomic) d = 64 backward takes the persistent
    walk where ``bwd_call_config`` says (plain calls) and not with sinks;
    dq, dk, dv against float64 either way (the sinks' own gradient: test_sinks.py)."""
    q, k, v, do = _inputs(1, 2, 2, 2049, 2100, 64, torch.bfloat16, seed=11)   # in the rule's range (2k-4k keys)
    sink = torch.randn(2, device=q.device) if sinks else None

    def grads(dtype, run):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = run(*leaves, causal=causal, sinks=None if sink is None else sink.to(torch.float64 if dtype ==
                                                                                  torch.float64 else torch.float32))
        return torch.autograd.grad(out, leaves, do.to(dtype))
    with counting_calls(hopper_persistent, "bwd_persistent") as walks:
        got = grads(q.dtype, functools.partial(tileattn.attention, deterministic=False))
    assert bool(walks) is not sinks, "the persistent walk ran (or not) against the rule"
    ref, low = grads(torch.float64, standard_attention), grads(q.dtype, standard_attention)
    for part, g, r, lo in zip(("dq", "dk", "dv"), got, ref, low):
        check_accuracy(f"default-{causal}-{sinks} {part}", g, r, lo, q.dtype)


@pytest.mark.parametrize("total,programs,want", [
    (4096, 132, (4092, 33)), (2048, 132, (2048, 1)), (264, 132, (264, 1)), (32, 5, (30, 2)), (32, 3, (32, 1)),
    (4, 3, (3, 3)), (27, 13, (26, 13))],
                         ids=["d64-protocol", "d128-protocol-half-round", "whole-rounds", "2-pieces", "tail-too-wide",
                              "3-pieces", "13-pieces"])
def test_tail_split(total, programs, want):
    """grid_order.tail_split: whole rounds first, then each leftover item
    cut into as many pieces as the programs allow (at least 2, else none)."""
    assert grid_order.tail_split(total, programs) == want


def test_tail_fixup_kernel(kernels):
    """kernels/bwd_tail.py rounds each workspace slot into its item's dK and
    dV rows (keys past N_K dropped) and writes nothing else."""
    from tileattn.kernels.bwd_tail import _bwd_tail_kernel
    b, hkv, n_k, d, keys = 2, 3, 300, 64, 128
    n_blocks = -(-n_k // keys)
    total, main = n_blocks * hkv * b, 13
    ws = torch.randn(2, total - main, keys, d, device=DEVICE)
    # float16: the interpreter's bf16 rounding is not round-to-nearest (the kernel is the same for both)
    dk, dv = (torch.full((b, hkv, n_k, d), float("nan"), device=DEVICE, dtype=torch.float16) for _ in range(2))
    _bwd_tail_kernel[(total - main,)](ws, dk, dv, *dk.stride()[:3], *dv.stride()[:3], MAIN=main, TAIL=total - main,
                                      N_BLOCKS=n_blocks, N_ROWS=hkv, N_K=n_k, KEYS=keys, HEAD_DIM=d, BLOCK_D=d)
    written = torch.zeros(b, hkv, n_k, dtype=torch.bool, device=DEVICE)
    for t in range(total - main):
        item = main + t
        j, hk, bb = item % n_blocks, item // n_blocks % hkv, item // (n_blocks * hkv)
        rows = slice(j * keys, min((j + 1) * keys, n_k))
        n = rows.stop - rows.start
        for out, w in ((dk, ws[0, t]), (dv, ws[1, t])):
            assert torch.equal(out[bb, hk, rows], w[:n].to(torch.float16))
        written[bb, hk, rows] = True
    assert torch.isnan(dk[~written]).all() and torch.isnan(dv[~written]).all()


@pytest.mark.parametrize("dims,slices", [((128, 128), None), ((64, 32), None), ((64, 64), 2)],
                         ids=["d128", "d64-dv32", "d64-slices"])
def test_persistent_bwd_config_checks(dims, slices):
    """``persistent=True`` runs the d = 64 kernel only: other head dims get a
    ValueError naming the config before any launch (bwd_memory calls the
    check first); forced head slices take the one-program-a-block grid,
    which is what the rule gives a persistent config's GQA calls (one slice)."""
    with pytest.raises(ValueError, match="config: split_tail=True"):
        launch_hopper.check_slices(HopperBwdConfig(split_tail=True), 64, 64)
    cfg = HopperBwdConfig(persistent=True, head_slices=slices)
    if slices is None:
        with pytest.raises(ValueError, match="config: persistent=True"):
            launch_hopper.check_slices(cfg, *dims)
        return
    launch_hopper.check_slices(cfg, *dims)
    q, k = torch.empty(1, 8, 4096, 64), torch.empty(1, 2, 4096, 64)
    assert launch_hopper.head_slices(q, k, True, cfg) == 2
    assert launch_hopper.head_slices(q, k, True, dataclasses.replace(cfg, head_slices=None)) == 1


# (name, (batch, kv heads, keys), causal, config, float32 elements of the split tail's workspace on 132 SMs)
WORKSPACE_CASES = [("full-cut", (2, 4, 3072), False, "pers-tail", 60 * 2 * 128 * 64),   # 192 items: 60 cut
                   ("full-whole-rounds", (2, 4, 4224), False, "pers-tail", 0),   # 264 items: two whole rounds
                   ("full-tail-too-wide", (2, 4, 4096), False, "pers-tail", 0),   # 124 left: fewer than 2 pieces each
                   ("causal", (2, 4, 3072), True, "pers-tail", 0),   # causal walks are never cut
                   ("table", (2, 4, 3072), False, "table", 0)]


@pytest.mark.parametrize("shape,causal,kind,want", [c[1:] for c in WORKSPACE_CASES],
                         ids=[c[0] for c in WORKSPACE_CASES])
def test_persistent_workspace(shape, causal, kind, want, monkeypatch):
    """``hopper_persistent.bwd_workspace``: a zeroed float32 workspace of a
    slot (dK then dV, 128 keys x D each) a cut item where the persistent walk
    cuts its last round, else none; the launcher's arguments take a given
    one, and a workspace of the wrong size is a ValueError before any launch."""
    monkeypatch.setattr(hopper_persistent, "sm_count", lambda device: 132)
    b, hkv, n = shape
    k = torch.empty(b, hkv, n, 64)
    table = configs.HOPPER_BWD[(64, 64)]
    cfg = dataclasses.replace(table, persistent=True, split_tail=True) if kind == "pers-tail" else table
    ws = hopper_persistent.bwd_workspace(k, causal, cfg)
    if cfg.persistent:
        assert hopper_persistent.workspace_elements(k, causal, cfg, 132) == want
    if not want:
        assert ws == {}
        return
    assert ws["ws"].shape == (want,) and ws["ws"].dtype == torch.float32 and not ws["ws"].any()
    with pytest.raises(ValueError, match="workspace: the split tail needs"):
        hopper_persistent.persistent_bwd_args({}, k, causal, cfg, 132, torch.zeros(want - 1))


# (name, (batch, query heads, kv heads, keys, head dim), causal, plain, the config the rule gives)
RULE_CASES = [("full-2k", (8, 32, 32, 2048, 64), False, True, "pers-tail"),
              ("full-16k", (1, 32, 32, 16384, 64), False, True, "pers-tail"),
              ("full-32k", (1, 32, 32, 32768, 64), False, True, "table"),
              ("full-1k", (16, 32, 32, 1024, 64), False, True, "table"),
              ("causal-4k", (4, 32, 32, 4096, 64), True, True, "pers-tail"),
              ("causal-8k", (2, 32, 32, 8192, 64), True, True, "table"),
              ("sinks-or-window", (8, 32, 32, 2048, 64), False, False, "table"),
              ("gqa-causal", (4, 32, 4, 4096, 64), True, True, "table"),
              ("gqa-full", (4, 32, 4, 4096, 64), False, True, "table"),
              ("d128", (8, 16, 16, 2048, 128), False, True, "table")]


@pytest.mark.parametrize("shape,causal,plain,want", [c[1:] for c in RULE_CASES], ids=[c[0] for c in RULE_CASES])
def test_persistent_rule(shape, causal, plain, want):
    """The default backward config of a call (``bwd_call_config``): the
    table's, run persistent (its last round cut) for plain d = 64 calls
    without GQA whose keys are in ``HOPPER_BWD_PERSISTENT_KEYS``' range;
    anything else (sinks, a window, packed sequences, GQA, other head dims,
    shorter or longer calls) the table's config itself."""
    b, hq, hkv, n, d = shape
    q, k = torch.empty(b, hq, n, d, device="meta"), torch.empty(b, hkv, n, d, device="meta")
    table = configs.HOPPER_BWD[(d, d)]
    cfg = launch_hopper.bwd_call_config(q, k, k, causal, plain)
    assert cfg == (dataclasses.replace(table, persistent=True, split_tail=True) if want == "pers-tail" else table)


@pytest.mark.parametrize("sums", [False, True], ids=["plain", "ds-sums"])
def test_dq_turns_box(sums):
    """``dq_turns`` reaches the kernel as the dQ sum's box width: the whole
    head dim, or half of it when the kernel sums dS (which it pairs with the
    halves only)."""
    cfg = HopperBwdConfig(dk_from_smem=True, stats_tma=True, dq_turns=True)
    t, f, lse = torch.empty(1, 2, 256, 64, dtype=torch.bfloat16), torch.empty(1, 2, 256, 64), torch.empty(1, 2, 256)
    args = launch_hopper._bwd_args(t, t, t, t, f, t, t, lse, lse, False, 1.0, cfg,
                                   torch.empty(1, 2, 256) if sums else None)
    assert list(args["dq_desc"].block_shape) == [1, 1, cfg.block_m, 32 if sums else 64]


@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("direct", [False, True], ids=["padded-rows", "direct-contiguous"])
def test_stats_tma_odd_rows(causal, direct):
    """lse₂ and Δ by the copy engine at a query length that is not a multiple
    of 4: through the launcher (rows padded by ``stats_rows``), and a direct
    launch with contiguous rows (copied into padded ones first)."""
    cfg = HopperBwdConfig(dk_from_smem=True, stats_tma=True)
    q, k, v, do = _inputs(1, 4, 2, 333, 517, 64, torch.bfloat16, seed=13)
    if not direct:
        _check("stats-tma-333x517", q, k, v, do, causal, cfg)
        return
    scale = 64 ** -0.5
    out, lse = launch.attn_fwd(q, k, v, causal, scale)
    delta, lse2 = (torch.full((1, 4, 333), float("nan"), device="cuda") for _ in range(2))
    bwd_steps.preprocess(do, out, lse, None, delta, lse2)
    dq_acc = torch.zeros(q.shape, device="cuda", dtype=torch.float32)
    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    launch_hopper.attn_bwd_dkdv(do, q, k, v, dq_acc, dk, dv, lse2, delta, causal, scale, config=cfg)
    dq = torch.full_like(q, float("nan"))
    bwd_steps.dq_convert(dq_acc, dq, scale)
    ref, low = _reference_grads(q, k, v, do, causal)
    for part, g, r, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, low):
        check_accuracy(f"stats-tma-direct {part}", g, r, lo, q.dtype)


@pytest.mark.parametrize("n_q", [1, 33, 128], ids=["nq1", "nq33", "nq128"])
def test_preprocess_writes_padded_stat_rows(n_q):
    """``stats_rows`` gives (B, Hq, N_Q) views whose rows are 16-byte aligned
    (what ``stats_tma``'s copy engine needs), and the preprocess kernel
    writes Δ and lse₂ into them (here under the interpreter, or compiled on a
    GPU): the values of contiguous rows, the padding left alone."""
    import math
    device = "cuda" if HAS_CUDA else "cpu"
    gen = torch.Generator().manual_seed(n_q)
    o, do = (torch.randn(2, 3, n_q, 16, generator=gen).to(device) for _ in range(2))
    lse = torch.randn(2, 3, n_q, generator=gen).to(device)
    lse[0, 1, 0] = float("-inf")   # a row that saw no key: lse₂ = +inf
    delta, lse2 = launch_hopper.stats_rows(2, 3, n_q, device)
    assert delta.shape == lse2.shape == (2, 3, n_q) and delta.stride(1) % 4 == 0 and delta.stride(2) == 1
    pad = delta.stride(1)
    sentinel = torch.tensor(-7.0, device=device)
    for t in (delta, lse2):   # the padding after each row, seen through the row's storage
        t.as_strided((2, 3, pad), t.stride()).fill_(sentinel)
    bwd_steps.preprocess(do, o, lse, None, delta, lse2)
    torch.testing.assert_close(delta, (o * do).sum(-1), rtol=1e-5, atol=1e-5)
    want = torch.where(lse == float("-inf"), float("inf"), lse * math.log2(math.e))
    torch.testing.assert_close(lse2, want, rtol=1e-6, atol=1e-6)
    for t in (delta, lse2):
        assert (t.as_strided((2, 3, pad), t.stride())[..., n_q:] == sentinel).all(), "the padding was written"


@pytest.mark.parametrize("n_q", [1, 33, 130], ids=["nq1", "nq33", "nq130"])
def test_transposed_dq_sum_converts(n_q):
    """The wide kernel's float32 sum is stored (B, H, D, Nq padded to 4) and
    handed to the portable convert kernel as a (B, H, Nq, D) view: every row
    of dq is scale x the sum, read through the transposed strides (here under
    the interpreter, or compiled on a GPU)."""
    device = "cuda" if HAS_CUDA else "cpu"
    q = torch.empty(2, 3, n_q, 192, device=device, dtype=torch.float16)
    acc = launch_hopper.dq_sum_transposed(q)
    assert acc.shape == q.shape and acc.stride(2) == 1 and acc.stride(3) % 4 == 0 and not acc.any()
    acc.copy_(torch.randn(q.shape, generator=torch.Generator().manual_seed(n_q)).to(device))
    dq = torch.full_like(q, float("nan"))
    bwd_steps.dq_convert(acc, dq, 0.125)
    torch.testing.assert_close(dq.float(), (acc * 0.125).half().float(), rtol=0, atol=0)


# the kernels for wide head dims, on the shared shapes with each head dim pair: QK 192 / V 128 (the wide kernel)
# and 256 (the split kernel)
WIDE_DIMS = [(192, 128), (256, 256)]


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dims", WIDE_DIMS, ids=_dims_id)
def test_wide_against_float64(dims, case, causal, dtype):
    b, hq, hkv, n_q, n_k, _ = CASES[case]
    d, dv = dims
    _check(f"{_dims_id(dims)} {case}", *_inputs(b, hq, hkv, n_q, n_k, d, dtype, seed=case_number(case) % 1000, dv=dv),
           causal)


@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dims", WIDE_DIMS, ids=_dims_id)
def test_wide_large_logits_strided_and_dlse(dims, causal):
    """(B, N, H, D) storage (at 192/128 Q and K pieces are column views of
    it), logits scaled 30x, a gradient into lse, rows that see no key (Nq > Nk)."""
    d, dv = dims
    q, k, v, do = _inputs(2, 4, 2, 700, 300, d, torch.bfloat16, seed=19, layout="bnhd", logit_scale=30.0, dv=dv)
    assert not q.is_contiguous()
    _check(f"{_dims_id(dims)} large-logits-bnhd-dlse", q, k, v, do, causal,
           dlse=torch.randn(2, 4, 700, device="cuda"))


@needs_hopper
@pytest.mark.parametrize("dims", WIDE_DIMS, ids=_dims_id)
def test_wide_dispatch_default_and_sinks(dims):
    """The default call at QK 192 / V 128 and at 256 takes the wide or split
    kernel (and is then the non-deterministic backward), with sinks too: the
    forward keeps its output's rounding remainder, so the sinks' gradient
    needs no dS sums (which those kernels lack; without the remainder the
    default is the portable pair).  Gradients, the sinks' included, match
    float64."""
    d, dv = dims
    q, k, v, do = _inputs(1, 4, 2, 513, 513, d, torch.bfloat16, seed=23, dv=dv)
    sinks = torch.linspace(-2.0, 2.0, 4, device="cuda")
    assert dispatch.default_deterministic(q, k, v, True) is False
    assert dispatch.default_deterministic(q, k, v, True, sinks=True) is True
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with _hopper_calls() as calls:
        tileattn.attention(*leaves, causal=True).backward(do)
    assert calls, f"the default {_dims_id(dims)} backward did not take its Hopper kernel"

    def grads(impl, *ts):
        ls = [t.detach().requires_grad_() for t in ts]
        out = impl(*ls[:3], causal=True, sinks=ls[3])
        return torch.autograd.grad(out, ls, do.to(out.dtype))
    with _hopper_calls() as calls:
        got = grads(tileattn.attention, q, k, v, sinks)
    assert calls, "a differentiated call with sinks did not take the Hopper kernel"
    ref = grads(standard_attention, q.double(), k.double(), v.double(), sinks.double())
    low = grads(standard_attention, q, k, v, sinks)
    for part, g, r, lo in zip(("dq", "dk", "dv", "dsinks"), got, ref, low):
        check_accuracy(f"{_dims_id(dims)} sinks {part}", g, r, lo, q.dtype)


@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_large_logits_strided_and_dlse(causal):
    q, k, v, do = _inputs(2, 4, 4, 600, 600, 128, torch.bfloat16, seed=11, layout="bnhd", logit_scale=30.0)
    assert not q.is_contiguous()
    dlse = torch.randn(2, 4, 600, device="cuda")
    _check("large-logits-bnhd-dlse", q, k, v, do, causal, dlse=dlse)


# sliding windows on the d <= 128 Hopper backward: (b, hq, hkv, n_q, n_k, d, causal, window)
WINDOW_CASES = {
    "gpt-oss-128-causal-1024": (1, 4, 1, 1024, 1024, 64, True, (128, -1)),
    "causal-odd-gqa": (2, 4, 2, 777, 777, 128, True, (300, 0)),
    "both-sides-nq<nk": (1, 2, 2, 333, 1000, 128, False, (100, 37)),
    "right-only-nq>nk": (1, 2, 2, 1000, 129, 64, False, (-1, 5)),   # rows < 866 see no key
    "narrower-than-a-tile": (1, 2, 2, 517, 517, 128, True, (3, 0)),
}


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", list(WINDOW_CASES))
def test_window_against_float64(case, dtype):
    """A sliding window's gradients through ``tileattn.attention`` (the
    default, non-deterministic call on Hopper: both the forward and the
    dK/dV kernel take the window) against float64 standard attention with
    the same window, under the accuracy rule; then with sinks."""
    b, hq, hkv, n_q, n_k, d, causal, window = WINDOW_CASES[case]
    q, k, v, do = _inputs(b, hq, hkv, n_q, n_k, d, dtype, seed=case_number(case) % 1000)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with _hopper_calls() as calls:
        out = tileattn.attention(*leaves, causal=causal, window=window, deterministic=False)
        got = torch.autograd.grad(out, leaves, do)
    assert calls and calls[0][1]["window"] is not None, "the window's backward did not run on the Hopper kernel"
    ref, low = _reference_grads(q, k, v, do, causal, window=window)
    for part, g, r, lo in zip(("dq", "dk", "dv"), got, ref, low):
        check_accuracy(f"{case} {part}", g, r, lo, dtype)
    sinks = torch.linspace(-2.0, 2.0, hq, device="cuda", requires_grad=True)
    out = tileattn.attention(*leaves, causal=causal, window=window, sinks=sinks, deterministic=False)
    got = torch.autograd.grad(out, leaves + [sinks], do)
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)] + [sinks.detach().double().requires_grad_()]
    ref_out = standard_attention(*ref_leaves[:3], causal=causal, window=window, sinks=ref_leaves[3])
    ref = torch.autograd.grad(ref_out, ref_leaves, do.double())
    low_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)] + [sinks.detach().clone().requires_grad_()]
    low_out = standard_attention(*low_leaves[:3], causal=causal, window=window, sinks=low_leaves[3])
    low = torch.autograd.grad(low_out, low_leaves, do)
    for part, g, r, lo in zip(("dq", "dk", "dv", "dsinks"), got, ref, low):
        check_accuracy(f"{case} sinks {part}", g, r, lo, dtype)


def test_window_compiles_for_sm90():
    """The d = 64 / 128 table configs' window builds (with and without the
    dS sums of sinks) compile for sm_90a without local memory or serialized
    warpgroup MMAs, in the plain build's shared memory."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    code = (
        "import json; from tileattn import configs; from tileattn.launch import hopper_compile\n"
        "print(json.dumps([[hopper_compile.compile_bwd_report(d, configs.HOPPER_BWD[(d, d)], False, sinks=s,\n"
        "                                                      window=w) for w in (False, True)]\n"
        "                  for d in (64, 128) for s in (False, True)]))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for plain, win in json.loads(proc.stdout.splitlines()[-1]):
        assert win["wgmma"] == plain["wgmma"] and win["shared"] == plain["shared"]
        assert not win["local"] and not win["wgmma_serialized"]


@needs_hopper
def test_dispatch_nondeterministic_plain_only():
    q, k, v, do = _inputs(1, 4, 2, 1024, 1024, 128, torch.bfloat16, seed=3)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    with _hopper_calls() as calls:
        tileattn.attention(*leaves, causal=True, deterministic=False).backward(do)
        assert calls, "a plain non-deterministic bf16 d=128 backward did not take the Hopper kernel"
        calls.clear()
        tileattn.attention(*leaves, causal=True, deterministic=False, window=(64, 0)).backward(do)
        assert calls and calls[0][1]["window"] == (64, 0), "a sliding window did not take the Hopper backward"
        calls.clear()
        for kw in (dict(deterministic=True), dict(deterministic=True, window=(64, 0)),
                   dict(deterministic=False, softcap=20.0), dict(deterministic=False, window=(64, 0), softcap=20.0)):
            tileattn.attention(*leaves, causal=True, **kw).backward(do)
        assert not calls, "a deterministic call or a variant other than a window took the Hopper backward"


@needs_hopper
@pytest.mark.parametrize("slices", [2, 4, 8])
@pytest.mark.parametrize("head_dim,causal", [(128, True), (128, False), (64, True)],
                         ids=["d128-causal", "d128-full", "d64-causal"])
def test_head_slices_against_float64(head_dim, causal, slices):
    """GQA 8 with each kv head's group cut into 2, 4 or 8 slices of query
    heads (the float32 dK/dV sums the slices add into), against float64."""
    q, k, v, do = _inputs(2, 16, 2, 777, 777, head_dim, torch.bfloat16, seed=slices)
    cfg = dataclasses.replace(launch_hopper.bwd_config_for(head_dim), head_slices=slices)
    assert launch_hopper.head_slices(q, k, causal, cfg) == slices
    _check(f"gqa8 {slices} slices", q, k, v, do, causal, cfg)


@needs_hopper
@pytest.mark.parametrize("mode", ["remainder", "sums-at-once", "defer-sums", "sums-head-slices", "sink-sums",
                                  "sink-sums-head-slices"])
@pytest.mark.parametrize("head_dim,causal,n", [(64, True, 700), (64, False, 700), (128, True, 700),
                                               (64, False, 2100), (128, True, 2100)],
                         ids=["d64-causal", "d64-full", "d128-causal", "d64-full-hopper-fwd",
                              "d128-causal-hopper-fwd"])
def test_sinks_gradient_on_the_hopper_kernel(head_dim, causal, n, mode, monkeypatch):
    """gpt-oss's shape family (GQA 8, d = 64) and d = 128: dq, dk, dv and the
    sinks' gradient against float64: from the forward's output remainder (the
    default), or, where the forward kept none, from the kernel's dS row sums,
    added at each tile or deferred to the next, or from its per-head sums
    (``sink_sums``).  From 2048 keys the forward is the Hopper kernel too
    (its remainder), below it the portable one."""
    if mode != "remainder":
        monkeypatch.setattr(ops, "keeps_remainder", lambda *args: False)
    defer = mode == "defer-sums"
    slices = 4 if mode.endswith("head-slices") else 1   # the sums of query heads split across grid rows
    q, k, v, do = _inputs(1, 16, 2, n, n, head_dim, torch.bfloat16, seed=21)
    sinks = torch.linspace(-3.0, 3.0, 16, device="cuda")
    dlse = torch.randn(1, 16, n, device="cuda")

    def grads(qq, kk, vv, ss, dd, impl):
        leaves = [t.detach().requires_grad_() for t in (qq, kk, vv, ss)]
        out, lse = impl(*leaves[:3], causal=causal, sinks=leaves[3], return_lse=True)
        loss = (out.to(dd.dtype) * dd).sum() + (lse.to(dlse.dtype) * dlse.to(lse.dtype)).sum()
        return torch.autograd.grad(loss, leaves)
    table = configs.HOPPER_BWD[(head_dim, head_dim)]
    with _hopper_calls() as calls, mock.patch.dict(configs.HOPPER_BWD,
                                                   {(head_dim, head_dim): dataclasses.replace(
                                                       table, defer_sums=defer, head_slices=slices,
                                                       sink_sums=mode.startswith("sink-sums"))}):
        got = grads(q, k, v, sinks, do, functools.partial(tileattn.attention, deterministic=False))
    assert calls, "the Hopper backward did not run"
    args, kwargs = calls[-1]   # attn_bwd_dkdv(..., config, ds_sum, ..., sink_sums=)
    assert (args[12] is None) == (mode == "remainder" or mode.startswith("sink-sums")), \
        "the kernel summed dS with a remainder kept, or not without"
    assert (kwargs.get("sink_sums") is not None) == mode.startswith("sink-sums")
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


# (name, group, n, causal, expected): causal groups of 4k keys or more in the fewest slices of at most 2
# heads (perf-notes v23); none without causal (equal programs walk in step), below 4k or for a group of one
SLICING = [("gqa8-causal-16k", 8, 16384, True, 4), ("gqa8-causal-4k", 8, 4096, True, 4),
           ("gqa8-causal-2k", 8, 2048, True, 1),
           ("gqa4-causal-16k", 4, 16384, True, 2), ("gqa2-causal", 2, 4096, True, 1),
           ("gqa3-causal", 3, 4096, True, 3), ("gqa6-causal", 6, 4096, True, 3),
           ("gqa8-full-16k", 8, 16384, False, 1), ("mha-causal-16k", 1, 16384, True, 1)]


@pytest.mark.parametrize("group,n,causal,expected", [c[1:] for c in SLICING], ids=[c[0] for c in SLICING])
def test_head_slices_rule(group, n, causal, expected):
    q = torch.empty(1, 2 * group, n, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(1, 2, n, 128, dtype=torch.bfloat16, device="meta")
    assert launch_hopper.head_slices(q, k, causal, HopperBwdConfig()) == expected


@pytest.mark.parametrize("forced,expected", [(1, 1), (2, 2), (3, 2), (8, 8), (16, 8)])
def test_head_slices_forced(forced, expected):
    """A forced count is the largest divisor of the group (8) not above it."""
    q = torch.empty(1, 16, 4096, 128, device="meta")
    k = torch.empty(1, 2, 4096, 128, device="meta")
    for causal in (False, True):
        assert launch_hopper.head_slices(q, k, causal, HopperBwdConfig(head_slices=forced)) == expected


@pytest.mark.parametrize("slices,dv", [(0, 64), (True, 64), (2.0, 64), (2, 32)],
                         ids=["zero", "bool", "float", "wide-kernel"])
def test_head_slices_config_refused(slices, dv):
    """A forced head_slices the launcher cannot run (not a positive int, or
    more than one slice for the wide kernel, which walks whole groups): a
    ValueError naming the config, before any launch (CPU tensors: nothing
    reaches a kernel)."""
    q = torch.zeros(1, 4, 256, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16)
    v = torch.zeros(1, 2, 256, dv, dtype=torch.bfloat16)
    rows = torch.zeros(1, 4, 256)
    with pytest.raises(ValueError, match="config: head_slices"):
        launch_hopper.attn_bwd_dkdv(q[..., :dv], q, k, v, torch.zeros(1, 4, 256, 64), torch.empty_like(k),
                                    torch.empty_like(v), rows, rows, True, 0.125, HopperBwdConfig(head_slices=slices))


@pytest.mark.parametrize("dims,transposed", [((64, 64), False), ((128, 128), False), ((192, 128), True),
                                              ((256, 256), True)], ids=["d64", "d128", "d192-dv128", "d256"])
def test_wide_kernels_walk_whole_groups(dims, transposed):
    """The wide (192/128) and split (256) kernels add dQ transposed and take
    no head slices: the rule gives one slice for a causal GQA 8 call of 16k
    keys (where d <= 128 takes slices), and a forced count above one is
    refused before any launch."""
    d, dv = dims
    assert launch_hopper.transposed_dq(d, dv) is transposed
    q = torch.zeros(1, 16, 16384, d, dtype=torch.bfloat16, device="meta")
    k = torch.zeros(1, 2, 16384, d, dtype=torch.bfloat16, device="meta")
    cfg = configs.HOPPER_BWD[dims]
    assert (launch_hopper.head_slices(q, k, True, cfg) == 1) is transposed
    if transposed:
        with pytest.raises(ValueError, match="config: head_slices"):
            launch_hopper.check_slices(HopperBwdConfig(head_slices=2), d, dv)


# (name, batch, query heads, kv heads, n, head dim, causal, chunks expected): the launches a call is cut into
# so that the float32 scratch stays within bwd_memory.SCRATCH_SHARE of the step's tensors (the FA2 protocol's
# 16k tokens: MHA holds 1.25x in one launch; GQA 8 at 16k, d = 128 read 1.45x / 1.56x in one, perf-notes v24)
CHUNKING = [("mha-16k", 1, 16, 16, 16384, 128, True, 1), ("gqa8-full-16k", 1, 16, 2, 16384, 128, False, 2),
            ("gqa8-causal-16k", 1, 16, 2, 16384, 128, True, 2), ("gqa4-causal-16k", 1, 16, 4, 16384, 128, True, 4),
            ("gqa4-full-16k", 1, 16, 4, 16384, 128, False, 2), ("gqa8-causal-4k-batch", 4, 16, 2, 4096, 128, True, 2),
            ("gqa4-odd-batch", 3, 8, 2, 4100, 64, False, 3), ("mla-gqa4", 1, 16, 4, 4096, 192, True, 2),
            # below CHUNK_MIN_KEYS one launch whatever the scratch (chunks' launches cost 30-57 % there)
            ("gqa8-causal-2k", 8, 16, 2, 2048, 128, True, 1), ("gqa8-causal-512", 32, 16, 2, 512, 128, True, 1)]


@pytest.mark.parametrize("b,hq,hkv,n,d,causal,expected", [c[1:] for c in CHUNKING], ids=[c[0] for c in CHUNKING])
def test_memory_chunks_rule(b, hq, hkv, n, d, causal, expected):
    """The fewest chunks within the scratch share; together they cover every
    (batch, kv head) once, each a run of whole batch elements or of kv heads
    of one element, with the query heads of its kv heads."""
    dv = 128 if d == 192 else d
    q = torch.empty(b, hq, n, d, dtype=torch.bfloat16, device="meta")
    k = torch.empty(b, hkv, n, d, dtype=torch.bfloat16, device="meta")
    v = torch.empty(b, hkv, n, dv, dtype=torch.bfloat16, device="meta")
    cfg = launch_hopper.bwd_config_for(d, dv)
    chunks = bwd_memory.memory_chunks(q, k, v, causal, cfg)
    assert len(chunks) == expected
    seen, g = [], hq // hkv
    for bs, hs, hks in chunks:
        assert (hs.start, hs.stop) == (hks.start * g, hks.stop * g)
        assert bs.stop - bs.start == 1 or (hks.start, hks.stop) == (0, hkv), "a chunk of kv heads spans batches"
        seen += [(i, h) for i in range(bs.start, bs.stop) for h in range(hks.start, hks.stop)]
        share = (bwd_memory.scratch_bytes(q[bs, hs], k[bs, hks], v[bs, hks], causal, cfg)
                 / bwd_memory.step_bytes(q, k, v))
        assert share <= bwd_memory.SCRATCH_SHARE or n < bwd_memory.CHUNK_MIN_KEYS
    assert sorted(seen) == [(i, h) for i in range(b) for h in range(hkv)]
    whole = bwd_memory.scratch_bytes(q, k, v, causal, cfg) / bwd_memory.step_bytes(q, k, v)
    assert (expected == 1) == (whole <= bwd_memory.SCRATCH_SHARE or n < bwd_memory.CHUNK_MIN_KEYS)


def test_memory_chunks_refuse_a_bad_config_first():
    """The plan checks head_slices before reading it: the launcher's ValueError."""
    q = torch.empty(1, 8, 256, 64, dtype=torch.bfloat16, device="meta")
    k = torch.empty(1, 2, 256, 64, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="config: head_slices"):
        bwd_memory.memory_chunks(q, k, k, True, HopperBwdConfig(head_slices=0))


@needs_hopper
@pytest.mark.parametrize("case", ["batch-chunks", "head-chunks", "head-chunks-sliced", "head-chunks-bnhd-dlse",
                                  "wide-head-chunks"])
def test_memory_chunks_against_float64(case, monkeypatch):
    """The backward in chunks of (batch, kv heads) sharing one float32 dQ
    sum, against float64: the rule's batch chunks, and kv heads of one batch
    element each (the share forced to 0) with head slices, a strided layout
    with a gradient into lse, and on the wide kernel (QK 192 / V 128)."""
    monkeypatch.setattr(bwd_memory, "CHUNK_MIN_KEYS", 0)   # short calls, chunked all the same
    if case != "batch-chunks":
        monkeypatch.setattr(bwd_memory, "SCRATCH_SHARE", 0.0)
    d, dv = (192, 128) if case.startswith("wide") else (64 if case == "batch-chunks" else 128,) * 2
    layout = "bnhd" if "bnhd" in case else "bhnd"
    q, k, v, do = _inputs(3 if case == "batch-chunks" else 2, 8, 2, 333, 517, d, torch.bfloat16, seed=31,
                          dv=dv, layout=layout)
    cfg = launch_hopper.bwd_config_for(d, dv)
    if case.endswith("sliced"):
        cfg = dataclasses.replace(cfg, head_slices=2)
    chunks = bwd_memory.memory_chunks(q, k, v, True, cfg)
    assert len(chunks) == (3 if case == "batch-chunks" else 4)
    with _hopper_calls() as calls:
        _check(case, q, k, v, do, True, cfg, dlse=torch.randn(2, 8, 333, device="cuda") if "dlse" in case else None)
    assert len(calls) == len(chunks), "one dK/dV launch a chunk"


@needs_hopper
def test_memory_chunks_with_the_sinks_row_sums(monkeypatch):
    """Sinks whose gradient comes from the kernel's dS row sums (the forward
    kept no remainder), over kv-head chunks: dq, dk, dv, dsinks vs float64."""
    monkeypatch.setattr(bwd_memory, "CHUNK_MIN_KEYS", 0)
    monkeypatch.setattr(bwd_memory, "SCRATCH_SHARE", 0.0)
    monkeypatch.setattr(ops, "keeps_remainder", lambda *args: False)
    q, k, v, do = _inputs(2, 8, 2, 400, 400, 64, torch.bfloat16, seed=33)
    sinks = torch.linspace(-2.0, 2.0, 8, device="cuda")

    def grads(qq, kk, vv, ss, impl):
        leaves = [t.detach().requires_grad_() for t in (qq, kk, vv, ss)]
        out = impl(*leaves[:3], causal=True, sinks=leaves[3])
        return torch.autograd.grad(out, leaves, do.to(out.dtype))
    with _hopper_calls() as calls:
        got = grads(q, k, v, sinks, functools.partial(tileattn.attention, deterministic=False))
    assert len(calls) == 4 and all(args[12] is not None for args, _ in calls), "not 4 chunks summing dS"
    ref = grads(q.double(), k.double(), v.double(), sinks.double(), standard_attention)
    low = grads(q, k, v, sinks, standard_attention)
    for part, g, r, lo in zip(("dq", "dk", "dv", "dsinks"), got, ref, low):
        check_accuracy(f"chunked sinks {part}", g, r, lo, q.dtype)


@pytest.mark.parametrize("module", ["attention", "bwd_memory", "hopper_calls"])
def test_launcher_names_exist(module):
    """Every ``hopper.X`` / ``bwd_memory.X`` / ``bwd_steps.X`` / ``hopper_calls.X`` the launchers read exists (the
    Hopper path runs only on a GPU, so a CPU run would not reach a missing one)."""
    import ast
    import importlib
    path = importlib.import_module(f"tileattn.launch.{module}").__file__
    mods = {"hopper": launch_hopper, "bwd_memory": bwd_memory, "bwd_steps": bwd_steps, "hopper_calls": hopper_calls}
    used = {(n.value.id, n.attr) for n in ast.walk(ast.parse(open(path).read()))
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in mods}
    assert used, "no name read"
    missing = sorted(f"{m}.{a}" for m, a in used if not hasattr(mods[m], a))
    assert not missing, f"read but not defined: {missing}"


@pytest.mark.parametrize("block, dtype", [((1, 1, 128, 128), "bfloat16"), ((1, 1, 64, 64), "float16"),
                                          ((1, 1, 128, 64), "float32"), ((1, 1, 128), "rows")])
def test_shared_layout_cached(block, dtype):
    """The descriptors' cached shared layout equals a freshly built one and is
    built once (the launchers read it at every launch)."""
    from triton.experimental.gluon import language as gl
    got = runtime.shared_layout(block, dtype)
    fresh = (gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=len(block)) if dtype == "rows"
             else gl.NVMMASharedLayout.get_default_for(list(block), getattr(gl, dtype)))
    assert got == fresh
    assert runtime.shared_layout(block, dtype) is got


@needs_hopper
@pytest.mark.parametrize("case", ["mha-causal-d128-2048", "gqa4-full-d64-2100", "bnhd-causal-d128-2048",
                                  "dlse-full-d64-300", "short-causal-d128-512", "tail-full-d64-3072"])
def test_hopper_plans_replay_the_first_call(case, monkeypatch):
    """A plain call of a key seen before replays its launch plan
    (``launch.hopper_calls``; the forward from the Hopper kernel's size
    bound, below it the portable plans): the forward bitwise the first call's, dk/dv
    bitwise (no atomics without slices) and dq to the float32 sum's rounding;
    other keys (another length, fp16, a strided layout) in between share the
    caches.  Poisoned outputs take no plan; later calls must fully write the
    replayed outputs (they are fresh allocations, checked finite).  "tail":
    the default d = 64 call walks persistent with a cut tail (192 items on
    132 programs: 60 cut in two), whose plan names its zeroed workspace and
    launches the fix-up (dk/dv from the pieces' float32 sums: to rounding)."""
    if case.startswith("tail"):
        monkeypatch.setattr(hopper_persistent, "sm_count", lambda device: 132)
    kind, mode, dim, n = case.split("-")
    d, n, group = int(dim[1:]), int(n), 4 if kind == "gqa4" else 1
    layout = "bnhd" if kind == "bnhd" else "bhnd"
    q, k, v, do = _inputs(2, 4, 4 // group, n, n, d, torch.bfloat16, seed=11, layout=layout)
    other = _inputs(1, 4, 4 // group, n + 17, n + 17, d, torch.float16, seed=12)
    causal, scale = mode == "causal", d ** -0.5
    dlse = torch.randn(q.shape[:3], device="cuda") if kind == "dlse" else None
    monkeypatch.setattr(runtime, "POISON_OUTPUTS", False)   # the suite poisons outputs: a poisoned forward plans nothing
    runtime.PLANS.clear()

    def step(q, k, v, do):
        out, lse = launch.attn_fwd(q, k, v, causal, scale)
        return (out, lse) + launch.attn_bwd(do, q, k, v, out, lse, causal, scale, dlse=dlse if q.shape[0] == 2
                                            else None, deterministic=False)
    first = step(q, k, v, do)
    for _ in range(3):
        step(*other)
        got = step(q, k, v, do)
        summed = ("dq", "dk", "dv") if kind == "tail" else ("dq",)   # float32 sums in a varying order
        for name, g, f in zip(("out", "lse", "dq", "dk", "dv"), got, first):
            if name in summed:
                assert (g.float() - f.float()).abs().max() <= 1e-2 * f.float().abs().max() + 1e-6, f"{case} {name}"
            else:
                assert torch.equal(g, f), f"{case} {name}"
        assert all(torch.isfinite(t).all() for t in got)
    kinds = {key[0] for key in runtime.PLANS}
    want = {"hopper_bwd"} | ({"hopper_fwd"} if dispatch.hopper_fwd_preferred(d, causal, n) else set())
    assert want <= kinds, f"plans made: {kinds}"
    if kind == "tail":   # the plan of the cut call (the other key's 100 items are not cut) launches the fix-up
        names = [launch_.compiled.name for key, plan in runtime.PLANS.items() if key[0] == "hopper_bwd"
                 for launch_ in plan]
        assert any("bwd_tail" in name for name in names), f"no plan launches the split tail's fix-up: {names}"
    monkeypatch.setattr(runtime, "POISON_OUTPUTS", True)
    runtime.PLANS.clear()
    for _ in range(2):
        got = step(q, k, v, do)
        assert all(torch.isfinite(t).all() for t in got), "a poisoned output was not fully written"
    assert not any(key[0] == "hopper_fwd" for key in runtime.PLANS), "a poisoned forward made a plan"


@pytest.mark.parametrize("chunked", [False, True], ids=["one-launch", "chunks"])
def test_hopper_call_plumbing(chunked, monkeypatch):
    """``launch.hopper_calls.bwd`` with the dK/dV kernel replaced by
    a float64 reference of its contract (dk, dv written; dQ / scale added
    into the float32 sum): the portable preprocess and convert around it and,
    with memory chunks forced, each chunk's views and the reused dQ sum give
    the reference gradients (the Hopper kernel itself is the GPU tests')."""
    q, k, v, do = (torch.randn(2, h, 40, 64, dtype=torch.float32, device=DEVICE) for h in (4, 2, 2, 4))
    scale = 0.25
    out, lse = standard_attention(q.double(), k.double(), v.double(), causal=True, scale=scale, return_lse=True)
    chunks = []

    def fake_dkdv(do, q, k, v, dq_acc, dk, dv, lse2, delta, causal, scale, cfg, ds_sum, window=None, varlen=None,
                  sink_sums=None, sinks=None, workspace=None):
        assert window is None and varlen is None and sink_sums is None   # a plain call
        assert workspace is None   # 40 keys: the table's grid, no persistent walk to cut
        chunks.append((q.shape, dq_acc.shape))
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        ref = standard_attention(*leaves, causal=causal, scale=scale)
        gq, gk, gv = torch.autograd.grad(ref, leaves, do.double())
        dk.copy_(gk)
        dv.copy_(gv)
        dq_acc.add_(gq.float() / scale)
    monkeypatch.setattr(launch_hopper, "attn_bwd_dkdv", fake_dkdv)
    monkeypatch.setattr(runtime, "PLANS_ON", False)   # a plan would record the convert without the fake between
    if chunked:
        monkeypatch.setattr(bwd_memory, "CHUNK_MIN_KEYS", 1)
        monkeypatch.setattr(bwd_memory, "SCRATCH_SHARE", 1e-9)   # the most chunks: a kv head of one element
    got = hopper_calls.bwd(do, q, k, v, out.float(), lse.float(), None, True, scale)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(standard_attention(*leaves, causal=True, scale=scale), leaves, do.double())
    assert len(chunks) == (4 if chunked else 1)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.allclose(g.double(), w, atol=1e-4, rtol=1e-4), name
