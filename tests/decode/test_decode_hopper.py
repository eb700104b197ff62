"""The Hopper decoding kernel for the absorbed MLA cache
(``kernels/decode_hopper.py``): which calls take it, its sm_90a compile
(on any machine), and on a Hopper GPU its results against float64
``standard_attention`` under the accuracy rule -- contiguous caches whose
rows past each length hold NaN, shuffled pages, odd lengths, an empty
cache, forced and chosen split counts, a leading split, two query tokens
(32 packed rows), a left window, fp16 and bf16 -- and the portable kernel
beside it on the same inputs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tileattn import dispatch
from tileattn.launch import decode_hopper
from tileattn.testing import counting_calls
from tileattn.validation_kvcache import MLA_HEAD_DIM as D, MLA_HEAD_DIM_V as DV

from conftest import HAS_CUDA
from test_decode_head_dim_v import BF16, F16, Case, assert_case

ON_HOPPER = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not ON_HOPPER, reason="GPU-only case: needs a compute capability 9.0 GPU")

# (block_m, paged, dtype, causal) compiled for sm_90a
COMPILED = [(16, False, "bf16", True), (16, True, "bf16", True), (32, False, "fp16", True), (16, False, "bf16", False)]


@pytest.fixture(scope="module")
def reports():
    """One fresh process compiles each case for sm_90a (Gluon cannot compile
    under TRITON_INTERPRET, which the test process may run with)."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    code = ("import json, sys; from tileattn.launch import decode_hopper\n"
            "print(json.dumps([decode_hopper.compile_report(*c) for c in json.loads(sys.argv[1])]))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(COMPILED)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(zip(COMPILED, json.loads(proc.stdout.splitlines()[-1])))


@pytest.mark.parametrize("case", COMPILED, ids=lambda c: f"rows{c[0]}-{'paged' if c[1] else 'contig'}-{c[2]}"
                         f"-{'causal' if c[3] else 'full'}")
def test_compiles_for_sm90(reports, case):
    rep = reports[case]
    block_m = case[0]
    assert rep["wgmma"] > 0 and rep["tma"], rep
    assert not rep["local"], "local memory in the PTX (spills)"
    # two stages of a 64-key tile (576 channels) + the packed queries + Pᵀ, and the
    # scratch of one 128-channel float32 output piece turned to a coalescing layout
    expect = (decode_hopper.NUM_STAGES * decode_hopper.BLOCK_N * D + block_m * D
              + block_m * decode_hopper.BLOCK_N) * 2
    scratch = 128 * block_m * 4
    assert expect <= rep["shared"] <= expect + scratch + 1024, f"shared memory {rep['shared']} against {expect}"
    assert rep["shared"] <= 227 * 1024


def _hopper_calls(plans=False):
    return counting_calls(decode_hopper, "launch", plans=plans)


# (case, the Hopper kernel should run it)
CASES = [
    (Case(16, 1, 1, D, DV, BF16, (37,), n_new=1, shared=True), True),
    (Case(16, 1, 1, D, DV, F16, (300, 0, 129), n_new=1, shared=True, splits=3), True),   # an empty cache
    (Case(16, 1, 1, D, DV, BF16, (5000, 64), shared=True, splits=0), True),              # the split rule
    (Case(16, 1, 1, D, DV, BF16, (1000, 777), n_new=1, page=64, shared=True, splits=2), True),
    (Case(16, 1, 1, D, DV, F16, (700, 130), n_new=2, page=128, shared=True, v_new_view=True), True),
    (Case(16, 1, 2, D, DV, BF16, (190, 64), n_new=2, shared=True, splits=2), True),      # 32 packed rows
    (Case(8, 1, 1, D, DV, BF16, (77, 200), n_new=1, shared=True), True),                 # rows padded to 16
    (Case(16, 1, 1, D, DV, BF16, (400, 90), n_new=1, shared=True, window=(100, -1), splits=2), True),
    (Case(16, 1, 1, D, DV, F16, (3, 500), n_new=1, shared=True, causal=False, splits=5), True),
    (Case(16, 1, 1, D, DV, BF16, (50, 300), n_new=1, page=32, shared=True), False),      # pages below a tile
    (Case(128, 1, 1, D, DV, BF16, (300, 77), n_new=1, shared=True), True),              # 4 blocks of 32 rows
    (Case(40, 1, 2, D, DV, F16, (150, 64), n_new=2, shared=True, splits=2), True),      # 80 rows: a ragged block
    (Case(128, 1, 2, D, DV, BF16, (90,), n_new=2, shared=True), False),                 # 256 packed rows
    (Case(16, 1, 1, D, DV, BF16, (90, 60), shared=True, softcap=4.0), False),
]


@needs_hopper
@pytest.mark.parametrize("case,hopper", CASES, ids=[c.id for c, _ in CASES])
def test_absorbed_on_hopper(case, hopper, kernels):
    with _hopper_calls() as calls:
        assert_case(case)
    assert bool(calls) == hopper, f"the Hopper kernel {'did not run' if hopper else 'ran'}"


@needs_hopper
def test_leading_split(kernels, monkeypatch):
    """A leading split (split 0 takes 94 % of the tiles) on the Hopper kernel."""
    from tileattn.launch import decode as launch_decode
    real = launch_decode._kvcache_launch

    def with_lead(*args, **kw):
        kw.update(num_splits=4, lead_permille=940)
        return real(*args, **kw)
    monkeypatch.setattr(launch_decode, "_kvcache_launch", with_lead)
    with _hopper_calls() as calls:
        assert_case(Case(16, 1, 1, D, DV, BF16, (3000, 130), n_new=1, shared=True))
    assert calls


@needs_hopper
def test_portable_when_switched_off(kernels, monkeypatch):
    monkeypatch.setattr(dispatch, "HOPPER_DECODE", False)
    with _hopper_calls() as calls:
        assert_case(CASES[0][0])
    assert not calls


@needs_hopper
@pytest.mark.parametrize("splits", [1, 0], ids=["one-split", "split-rule"])
def test_second_call_replays_a_plan(kernels, splits):
    """A decoding loop's later calls of one shape replay the launch plan the
    first recorded (the Hopper kernel's Gluon descriptors rebuilt around this
    call's tensors), without the launcher, and stay right."""
    import tileattn
    from tileattn.reference import standard_attention
    from tileattn.testing import check_accuracy
    b, n = 3, 2000 + splits

    def call():
        q = torch.randn(b, 16, 1, D, device="cuda", dtype=BF16)
        k = torch.randn(b, 1, n + 9, D, device="cuda", dtype=BF16)
        k[:, :, n:] = float("nan")
        s = torch.full((b,), n, dtype=torch.int32, device="cuda")
        out = tileattn.attention_with_kvcache(q, k, k[..., :DV], s, num_splits=splits)
        want = standard_attention(q.double(), k[:, :, :n].double(), k[:, :, :n, :DV].double())
        low = standard_attention(q, k[:, :, :n], k[:, :, :n, :DV])
        return out, want, low
    with _hopper_calls(plans=True) as calls:
        first = call()
        second = call()
    assert len(calls) == 1, f"{len(calls)} launcher calls: the second call did not replay a plan"
    for name, (out, want, low) in (("first", first), ("second", second)):
        check_accuracy(f"{name} call", out, want, low, BF16)


@pytest.mark.parametrize("rows,expected", [(1, 16), (16, 16), (17, 32), (32, 32), (128, 32)])
def test_block_rows(rows, expected):
    """16 packed rows a program, else 32 (more rows: blocks of 32)."""
    assert decode_hopper.block_rows(rows) == expected


# (name, batch, cache capacity, splits) on 132 SMs, 16 heads (one 16-row block a batch element)
HOPPER_SPLITS = [("b4-4k", 4, 4096, 31), ("b4-32k", 4, 32768, 32), ("b32-8k", 32, 8192, 4),
                 ("b128-4k", 128, 4096, 1), ("b4-200", 4, 200, 1)]


@pytest.mark.parametrize("batch,capacity,expected", [c[1:] for c in HOPPER_SPLITS], ids=[c[0] for c in HOPPER_SPLITS])
def test_split_rule_on_the_hopper_path(batch, capacity, expected):
    """One program an SM and splits of at least two 64-key tiles, the fewest
    within 5 % of the best fill: the H200 runs of perf-notes v16 (B = 4 at
    32k: 32 splits of 1k keys)."""
    from tileattn.launch.decode import choose_num_splits
    got = choose_num_splits(batch, capacity, 132, programs_per_sm=decode_hopper.PROGRAMS_PER_SM,
                            min_keys=decode_hopper.MIN_KEYS)
    assert got == expected


def test_not_eligible_off_hopper():
    """CPU tensors (and so the interpreter's) never take the Hopper kernel."""
    k = torch.empty(1, 1, 64, D)
    assert not decode_hopper.eligible(torch.empty(1, 16, 1, D), k[..., DV:], k[..., :DV], None, None, None)
