"""The Hopper forward kernel (Gluon, kernels/fwd_hopper.py).

On the CPU: every config compiles for sm_90a without a GPU, without local
memory in the PTX or warpgroup MMAs that ptxas serializes, within the shared
memory of an H100/H200 (the compiler runs; the kernel cannot).  On a GPU of
compute capability 9.0: the kernel against a float64 reference under the
accuracy rule, with each config forced, odd lengths,
Nq != Nk, fully masked rows (causal with Nq > Nk), large logits, GQA and
strided layouts; and the dispatcher takes it for plain calls only.
"""
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

import tileattn
from tileattn import configs, dispatch, launch
from tileattn.launch import hopper as launch_hopper, hopper_calls, runtime
from tileattn.configs import HopperFwdConfig
from tileattn.reference import standard_attention
from tileattn.sinks import decode_remainder
from tileattn.testing import (HOPPER_CASES, case_number, check_accuracy, check_remainder, counting_calls,
                              hopper_inputs)

from conftest import HAS_CUDA

ON_HOPPER = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not ON_HOPPER, reason="GPU-only case: needs a compute capability 9.0 GPU")

# every table config ((QK head dim, V head dim) -> config), plus the variants
# of the softmax loop, forced once each
FORCED = list(configs.HOPPER_FWD.items()) + [
    ((64, 64), HopperFwdConfig(num_stages=2, overlap=False)),
    ((128, 128), HopperFwdConfig(num_stages=2, overlap=False, pingpong=False)),
    ((128, 128), HopperFwdConfig(num_stages=2, overlap=True, pingpong=False)),
    ((128, 128), HopperFwdConfig(num_stages=3)),
    ((128, 128), HopperFwdConfig(num_stages=2)),   # the d = 128 table's before v45 (no row_tree)
    ((192, 128), HopperFwdConfig(num_stages=2, overlap=False)),
    ((64, 64), HopperFwdConfig(num_stages=2, pingpong=True)),   # the d = 64 table's before v26
    ((64, 64), HopperFwdConfig(num_stages=2, pingpong=False)),   # the d = 64 table's before v45 (no row_tree)
    # one program an SM walking the query tiles
    ((64, 64), HopperFwdConfig(num_stages=2, persistent=True)),
    ((64, 64), HopperFwdConfig(num_stages=2, pingpong=False, persistent=True)),
    ((128, 128), HopperFwdConfig(num_stages=2, persistent=True)),
    ((128, 128), HopperFwdConfig(num_stages=2, overlap=False, persistent=True)),
    # persistent, O's copy waited on under the next item's first tile (both loop forms)
    ((64, 64), HopperFwdConfig(num_stages=2, pingpong=False, persistent=True, defer_o=True)),
    ((128, 128), HopperFwdConfig(num_stages=2, persistent=True, defer_o=True)),
    ((128, 128), HopperFwdConfig(num_stages=2, overlap=False, persistent=True, defer_o=True)),
    # each row's max and sum as trees of register blocks (persistent at d = 64 and 128, 128-key tiles; one
    # program a tile at d = 256, 64-key tiles)
    ((64, 64), HopperFwdConfig(num_stages=2, pingpong=False, persistent=True, row_tree=True)),
    ((128, 128), HopperFwdConfig(num_stages=2, persistent=True, row_tree=True)),
    ((256, 256), HopperFwdConfig(block_n=64, num_stages=2, row_tree=True)),
    # persistent, non-causal: the last wave's key tiles cut evenly over the programs (launch/stream_k.py; causal
    # calls run the plain walk)
    ((64, 64), HopperFwdConfig(num_stages=2, pingpong=False, persistent=True, row_tree=True, stream_k=True)),
    ((128, 128), HopperFwdConfig(num_stages=2, persistent=True, row_tree=True, stream_k=True)),
    ((128, 128), HopperFwdConfig(num_stages=2, overlap=False, persistent=True, defer_o=True, stream_k=True)),
    # causal: the query tiles of 2, 4 and all 8 of the test's (head, batch) pairs at a time
    ((128, 128), HopperFwdConfig(num_stages=2, group_rows=2)),
    ((192, 128), HopperFwdConfig(num_stages=2, group_rows=4)),
    ((256, 256), HopperFwdConfig(block_n=64, num_stages=2, group_rows=8)),
    # P made 16-bit once the previous P V completed (the overlapped loop's other order)
    ((64, 64), dataclasses.replace(configs.HOPPER_FWD[(64, 64)], early_p=True)),
    ((128, 128), dataclasses.replace(configs.HOPPER_FWD[(128, 128)], early_p=True)),
    # ... and persistent on two warpgroups (d = 64 causal to 4k: +1..+5 % over the table's, perf-notes v51, v54)
    ((64, 64), dataclasses.replace(configs.HOPPER_FWD[(64, 64)], early_p=True, persistent=True)),
    # three softmax warpgroups over 192 query rows (d = 64), turns round the three or none
    ((64, 64), HopperFwdConfig(pingpong=False, row_tree=True, warpgroups=3, maxnreg=128, early_p=True)),
    ((64, 64), HopperFwdConfig(pingpong=False, row_tree=True, warpgroups=3, maxnreg=128, early_p=True,
                               persistent=True)),
    ((64, 64), HopperFwdConfig(warpgroups=3, maxnreg=128, early_p=True, persistent=True, defer_o=True)),
]
PERSISTENT = [(dims, c) for dims, c in FORCED if c.persistent]
# the non-causal configs default calls take at d = 64 (three warpgroups) and 128, one program a tile and persistent
EVEN_K_CONFIGS = [(dims, dataclasses.replace(table[dims], persistent=persistent))
                  for dims, table in (((64, 64), configs.HOPPER_FWD_NONCAUSAL), ((128, 128), configs.HOPPER_FWD))
                  for persistent in (False, True)]
STREAM_K = [(dims, c) for dims, c in FORCED if c.stream_k]


def _dims_id(dims):
    d, dv = dims
    return f"d{d}" if d == dv else f"d{d}-dv{dv}"


def _compile_reports():
    """One fresh process compiles every forced config (both causal modes) for
    sm_90a: under TRITON_INTERPRET, which this test process runs with, Gluon
    cannot compile."""
    cases = COMPILED
    code = (
        "import json, sys; from tileattn.configs import HopperFwdConfig; from tileattn.launch import hopper_compile\n"
        "cases = json.loads(sys.argv[1])\n"
        "print(json.dumps([hopper_compile.compile_report(d, HopperFwdConfig(**c), causal, sinks=sinks, head_dim_v=dv,\n"
        "                                                remainder=rem, window=win, even_k=even)\n"
        "                  for (d, dv), c, causal, sinks, rem, win, even in cases]))")
    arg = json.dumps([(dims, dataclasses.asdict(c), causal, "-sinks" in name, name.endswith("-remainder"),
                       "-window" in name, "-even" in name) for dims, c, causal, name in cases])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {(dims, name, causal): r
            for (dims, c, causal, name), r in zip(cases, json.loads(proc.stdout.splitlines()[-1]))}


@pytest.fixture(scope="module")
def reports():
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    return _compile_reports()


# ((QK, V head dims), config, causal, case name): every forced config, and the table's with sinks, also
# storing the output's rounding remainder (a sinks call that will be differentiated)
COMPILED = ([(dims, c, True, c.name) for dims, c in FORCED]
            + [(dims, c, False, c.name) for dims, c in configs.HOPPER_FWD.items()]
            + [(dims, c, False, c.name + extra) for dims, c in configs.HOPPER_FWD_NONCAUSAL.items()
               for extra in ("", "-sinks-remainder")]
            + [(dims, c, True, c.name + "-sinks") for dims, c in configs.HOPPER_FWD.items()]
            + [(dims, c, True, c.name + "-sinks-remainder") for dims, c in configs.HOPPER_FWD.items()]
            + [(dims, c, False, c.name) for dims, c in PERSISTENT]
            + [(dims, c, True, c.name + "-sinks-remainder") for dims, c in PERSISTENT]
            # a sliding window (causal folded into it), also with sinks and the remainder (gpt-oss's sliding layers)
            + [(dims, c, False, c.name + extra) for dims in ((64, 64), (128, 128))
               for c in (configs.HOPPER_FWD[dims], dataclasses.replace(configs.HOPPER_FWD[dims], persistent=True))
               for extra in ("-window", "-window-sinks-remainder")]
            # the builds without the mask step (non-causal, keys a multiple of the key tile: hopper.even_k), one
            # program a tile and persistent, also with sinks and the remainder
            + [(dims, c, False, c.name + extra) for dims, c in EVEN_K_CONFIGS
               for extra in ("-even", "-even-sinks-remainder")])


@pytest.mark.parametrize("dims,cfg,causal,name", COMPILED,
                         ids=[f"{_dims_id(dims)}-{n}-{'causal' if causal else 'full'}" for dims, c, causal, n in COMPILED])
def test_compiles_for_sm90(reports, dims, cfg, causal, name):
    head_dim, head_dim_v = dims
    rep = reports[(dims, name, causal)]
    assert rep["wgmma"] > 0, "no warpgroup MMA in the PTX"
    assert rep["tma"], "no TMA copy in the PTX"
    softmax_regs = "240" if cfg.warpgroups == 2 else "160"
    assert {"24", softmax_regs} <= set(rep["setmaxnreg"]), \
        f"register reallocation {rep['setmaxnreg']}: not 24 for the loader and {softmax_regs} for the softmax warps"
    assert not rep["local"], "local memory in the PTX (a register array indexed at run time)"
    assert not rep["wgmma_serialized"], \
        "ptxas serialized the warpgroup MMAs (C7512: too few registers; C7514: accumulators read in flight)"
    # a Q tile a softmax warpgroup; persistent: the next work item's Q lands in a second set
    q_tiles = cfg.warpgroups * (2 if cfg.persistent else 1)
    expect = q_tiles * cfg.block_m * head_dim * 2 + cfg.num_stages * cfg.block_n * (head_dim + head_dim_v) * 2
    if name.endswith("-remainder"):
        expect += cfg.warpgroups * cfg.block_m * head_dim_v   # the remainder code's int8 staging tiles
    assert expect <= rep["shared"] <= expect + 1024, \
        f"shared memory {rep['shared']} is not Q + K/V stages ({expect}) + barriers"
    assert rep["shared"] <= 227 * 1024, "more shared memory than a Hopper block may have"
    if name.endswith("-even"):   # the spills of these builds sat in the mask step (perf-notes v51, v57)
        assert rep["spill_stores"] == 0, f"the build without the mask step spilled {rep['spill_stores']} B"


@pytest.mark.parametrize("head_dim,causal,n_k,want", [
    (64, True, 1024, False), (64, True, 2048, True), (64, False, 1024, False), (64, False, 2048, True),
    (128, True, 1024, False), (128, False, 2048, True), (192, False, 512, False), (192, False, 1024, True),
    (192, True, 1024, False), (192, True, 2048, True), (256, False, 1024, False), (256, True, 2048, True)],
    ids=["d64-causal-1k", "d64-causal-2k", "d64-full-1k", "d64-full-2k", "d128-causal-1k", "d128-full-2k",
         "d192-full-512", "d192-full-1k", "d192-causal-1k", "d192-causal-2k", "d256-full-1k", "d256-causal-2k"])
def test_default_dispatch_by_size(head_dim, causal, n_k, want):
    """Where the portable kernel measured faster, the default dispatch keeps it."""
    assert dispatch.hopper_fwd_preferred(head_dim, causal, n_k) is want


@pytest.mark.parametrize("dims,causal,n_k,want", [
    ((64, 64), False, 2048, True), ((64, 64), True, 4096, True), ((64, 64), True, 4097, False),
    ((64, 64), False, 8192, True), ((64, 64), False, 8193, False), ((128, 128), False, 4096, True), ((128, 128), True, 4097, False), ((128, 128), False, 16384, False),
    ((192, 128), False, 2048, False), ((256, 256), True, 2048, False)],
    ids=["d64-full-2k", "d64-causal-4k", "d64-causal-4k+1", "d64-full-8k", "d64-full-8k+1", "d128-full-4k", "d128-causal-4k+1", "d128-full-16k",
         "d192-128-full-2k", "d256-causal-2k"])
def test_table_config_persistent_by_keys(dims, causal, n_k, want):
    """The table's forward runs persistent up to HOPPER_FWD_PERSISTENT_MAX_KEYS
    keys (where the per-tile prologue and epilogue were a measured cost), not
    beyond, and never at head dims the persistent kernel does not take."""
    cfg = launch_hopper.config_for(*dims, causal=causal, n_k=n_k)
    assert cfg.persistent is want
    table = configs.HOPPER_FWD if causal else {**configs.HOPPER_FWD, **configs.HOPPER_FWD_NONCAUSAL}
    early_p = want and (dims[0], causal) in configs.HOPPER_FWD_PERSISTENT_EARLY_P
    assert cfg.early_p is (table[dims].early_p or early_p)
    assert dataclasses.replace(cfg, persistent=False, early_p=table[dims].early_p) == table[dims]


@pytest.mark.parametrize("case,want_warpgroups", [
    ("d64-full", 3), ("d64-causal", 2), ("d64-full-window", 2), ("d64-full-packed", 2), ("d128-full", 2)])
def test_noncausal_config_by_call(case, want_warpgroups):
    """Plain non-causal d = 64 calls take HOPPER_FWD_NONCAUSAL's three
    softmax warpgroups; causal calls, sliding windows and packed sequences
    (not timed with them) keep the two-warpgroup table's config."""
    d = 128 if case.startswith("d128") else 64
    causal = case.endswith("causal")
    window = (63, 64) if case.endswith("window") else None
    varlen = (None, None, 4096, 4096) if case.endswith("packed") else None
    cfg = launch_hopper.call_config(d, d, 4096, causal, window, varlen)
    assert cfg.warpgroups == want_warpgroups
    assert not (varlen and cfg.persistent)


def _inputs(*args, **kwargs):
    return hopper_inputs(*args, **kwargs)[:3]   # (q, k, v): the forward takes no dO


def _references(q, k, v, causal, sinks=None, window=None):
    """(out, lse) of float64 and of low-precision standard attention, one
    batch element at a time: a many-items case's float64 scores alone take
    ~0.8 GB, and a test run's workers share one GPU."""
    kw = {} if sinks is None else dict(sinks=sinks)
    parts = []
    for i in range(q.shape[0]):
        qi, ki, vi = q[i:i + 1], k[i:i + 1], v[i:i + 1]
        ref = standard_attention(qi.double(), ki.double(), vi.double(), causal=causal, return_lse=True,
                                 window=window, **{n: t.double() for n, t in kw.items()})
        parts.append(ref + standard_attention(qi, ki, vi, causal=causal, return_lse=True, window=window, **kw))
    return tuple(torch.cat(ts) for ts in zip(*parts))


def _check(name, q, k, v, causal, cfg=None):
    runtime.POISON_OUTPUTS = True
    assert dispatch.hopper_fwd_eligible(q, k, v)
    # forced: the Hopper kernel at every size, the config the call's kind takes
    cfg = cfg or launch_hopper.config_for(q.shape[-1], v.shape[-1], causal=causal)
    out, lse = launch.attn_fwd(q, k, v, causal, q.shape[-1] ** -0.5, config=cfg)
    ref, ref_lse, low, low_lse = _references(q, k, v, causal)
    check_accuracy(f"{name} out", out, ref, low, q.dtype)
    check_accuracy(f"{name} lse", lse, ref_lse, low_lse.float(), q.dtype)
    assert out.shape == (*q.shape[:-1], v.shape[-1])
    assert out.stride() == q.stride() or q.is_contiguous() is False or v.shape[-1] != q.shape[-1]


def _check_sinks(name, q, k, v, causal, sinks, out, lse):
    """out and lse of a call with sinks against the float64 reference with an
    explicit sink column, under the accuracy rule."""
    ref, ref_lse, low, low_lse = _references(q, k, v, causal, sinks=sinks)
    check_accuracy(f"{name} out", out, ref, low, q.dtype)
    check_accuracy(f"{name} lse", lse, ref_lse, low_lse.float(), q.dtype)


CASES = HOPPER_CASES


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", list(CASES))
def test_against_float64(case, causal, dtype):
    b, hq, hkv, n_q, n_k, d = CASES[case]
    q, k, v = _inputs(b, hq, hkv, n_q, n_k, d, dtype, seed=case_number(case) % 1000)
    _check(case, q, k, v, causal)


@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dims,cfg", FORCED, ids=[f"{_dims_id(dims)}-{c.name}" for dims, c in FORCED])
def test_every_config(dims, cfg, causal):
    q, k, v = _inputs(2, 4, 2, 700, 900, dims[0], torch.bfloat16, seed=7, dv=dims[1])
    _check(cfg.name, q, k, v, causal, cfg)


@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dims,cfg", PERSISTENT, ids=[f"{_dims_id(dims)}-{c.name}" for dims, c in PERSISTENT])
def test_persistent_programs_walk_many_tiles(dims, cfg, causal):
    """A persistent grid with several work items a program (4 x 16 heads x
    12 query tiles on at most one program an SM), GQA, Nq > Nk (causal: the
    first query tiles see no key, so some items have no key tile), and with
    sinks and the output remainder too."""
    q, k, v = _inputs(4, 16, 4, 1500, 1100, dims[0], torch.bfloat16, seed=23)
    _check(f"persistent {cfg.name}", q, k, v, causal, cfg)
    sinks = torch.linspace(-4.0, 4.0, 16, device="cuda")
    out, lse, out_lo = launch_hopper.attn_fwd(q, k, v, causal, dims[0] ** -0.5, cfg, poison=True, sinks=sinks,
                                              remainder=True)
    _check_sinks("persistent sinks", q, k, v, causal, sinks, out, lse)
    check_remainder(out, out_lo)


@needs_hopper
@pytest.mark.parametrize("tail", ["short", "long"])
@pytest.mark.parametrize("dims,cfg", STREAM_K, ids=[f"{_dims_id(dims)}-{c.name}" for dims, c in STREAM_K])
def test_stream_k_tails(dims, cfg, tail):
    """Walks whose last wave is cut, on this GPU's SM count P: "short", a
    partial wave of 4 units of 8 key tiles (GQA 2, odd lengths, two query
    tiles a head); "long", one of P - 1 units of 2 key tiles (some ranges
    hold a whole unit, which the kernel ends itself); also with sinks and
    the output's remainder."""
    programs = runtime.sm_count(torch.device("cuda"))
    if tail == "short":
        hq, n_q, n_k = programs + 2, 200, 1000
    else:
        hq, n_q, n_k = 2 * programs - 1, 100, 200
    hkv = hq // 2 if hq % 2 == 0 else hq
    units = hq * -(-n_q // (2 * cfg.block_m))
    assert launch.stream_k.tail(cfg, False, units, programs, -(-n_k // cfg.block_n)) is not None
    q, k, v = _inputs(1, hq, hkv, n_q, n_k, dims[0], torch.bfloat16, seed=29)
    _check(f"stream-k {tail} {cfg.name}", q, k, v, False, cfg)
    sinks = torch.linspace(-4.0, 4.0, hq, device="cuda")
    out, lse, out_lo = launch_hopper.attn_fwd(q, k, v, False, dims[0] ** -0.5, cfg, poison=True, sinks=sinks,
                                              remainder=True)
    _check_sinks(f"stream-k {tail} sinks", q, k, v, False, sinks, out, lse)
    check_remainder(out, out_lo)


EVEN_K_RULE = {   # name: (switch, n_k, causal, window, packed, want)
    "full-2048": ("1", 2048, False, None, False, True),
    "switch-off": ("0", 2048, False, None, False, False),
    "full-2100": ("1", 2100, False, None, False, False),   # a partial last key tile
    "causal-2048": ("1", 2048, True, None, False, False),
    "window-2048": ("1", 2048, False, (255, 0), False, False),
    "packed-2048": ("1", 2048, False, None, True, False),
    "no-keys": ("1", 0, False, None, False, True),
}


@pytest.mark.parametrize("case", list(EVEN_K_RULE))
def test_even_k_rule(case, monkeypatch):
    """``hopper.even_k``: the build without the mask step only behind
    TILEATTN_HOPPER_EVEN_K=1, for non-causal calls without a window or
    packing whose keys fill every key tile."""
    switch, n_k, causal, window, packed, want = EVEN_K_RULE[case]
    monkeypatch.setenv("TILEATTN_HOPPER_EVEN_K", switch)
    cfg = configs.HOPPER_FWD[(128, 128)]
    assert launch_hopper.even_k(n_k, causal, window, ("cu",) if packed else None, cfg) is want


@needs_hopper
@pytest.mark.parametrize("extra", ["plain", "sinks-remainder"])
@pytest.mark.parametrize("case", ["B2-H4x2-N1000x1024", "B1-H4x4-N129x4096-logits8", "B2-H2x2-N1000x1100"])
@pytest.mark.parametrize("dims,cfg", EVEN_K_CONFIGS, ids=[f"{_dims_id(d)}-{c.name}" for d, c in EVEN_K_CONFIGS])
def test_even_k_against_float64(dims, cfg, case, extra, monkeypatch):
    """The build without the mask step (TILEATTN_HOPPER_EVEN_K=1; non-causal,
    keys a multiple of the key tile) against float64: odd query counts,
    GQA, large logits, with sinks and the output's remainder; it runs exactly
    where the keys fill their tiles (1100 keys: the masked build)."""
    monkeypatch.setenv("TILEATTN_HOPPER_EVEN_K", "1")
    b, hq, hkv, n_q, n_k = {"B2-H4x2-N1000x1024": (2, 4, 2, 1000, 1024), "B1-H4x4-N129x4096-logits8": (
        1, 4, 4, 129, 4096), "B2-H2x2-N1000x1100": (2, 2, 2, 1000, 1100)}[case]
    d = dims[0]
    q, k, v = _inputs(b, hq, hkv, n_q, n_k, d, torch.bfloat16, seed=case_number(case) % 1000,
                      logit_scale=8.0 if case.endswith("logits8") else 1.0)
    sinks = torch.linspace(-3.0, 3.0, hq, device="cuda") if extra != "plain" else None
    with counting_calls(runtime, "run") as runs:
        got = launch_hopper.attn_fwd(q, k, v, False, d ** -0.5, cfg, poison=True, sinks=sinks,
                                     remainder=sinks is not None)
    from tileattn.kernels.fwd_hopper import _attn_fwd_hopper_kernel
    even = [args[3].get("EVEN_K", False) for args, _ in runs if args[0] is _attn_fwd_hopper_kernel]
    assert even == [n_k % cfg.block_n == 0], f"EVEN_K of the forward's launches: {even}"
    if sinks is None:
        ref, ref_lse, low, low_lse = _references(q, k, v, False)
        check_accuracy(f"{case} out", got[0], ref, low, q.dtype)
        check_accuracy(f"{case} lse", got[1], ref_lse, low_lse.float(), q.dtype)
    else:
        _check_sinks(case, q, k, v, False, sinks, got[0], got[1])
        check_remainder(got[0], got[2])


def test_persistent_config_refuses_wide_head_dims():
    """A forced persistent config at QK 192 / V 128 (Q in two pieces: no
    room for a second pair of Q buffers): a ValueError naming the config,
    before any launch."""
    q, k = torch.empty(1, 2, 256, 192, dtype=torch.bfloat16), torch.empty(1, 2, 256, 192, dtype=torch.bfloat16)
    v = torch.empty(1, 2, 256, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="config: a persistent"):
        launch_hopper.attn_fwd(q, k, v, False, 0.1, HopperFwdConfig(persistent=True))


WARPGROUP_ERRORS = {   # case -> (forced config, (QK, V head dims), what the error says)
    "three-at-d128": (HopperFwdConfig(warpgroups=3, maxnreg=128), (128, 128), "three softmax warpgroups"),
    "three-at-168-registers": (HopperFwdConfig(warpgroups=3), (64, 64), "maxnreg <= 128"),
    "three-with-stream-k": (HopperFwdConfig(warpgroups=3, maxnreg=128, persistent=True, stream_k=True), (64, 64),
                            "without the stream-K cut"),
    "four": (HopperFwdConfig(warpgroups=4, maxnreg=96), (64, 64), "warpgroups is 2 or 3"),
}


@pytest.mark.parametrize("case", list(WARPGROUP_ERRORS))
def test_warpgroups_config_checked_before_launch(case):
    """A forced config the kernel cannot run with its softmax warpgroups:
    a ValueError naming the field, before any launch (CPU: no GPU needed)."""
    cfg, dims, match = WARPGROUP_ERRORS[case]
    q, k = (torch.empty(1, 2, 256, dims[0], dtype=torch.bfloat16) for _ in range(2))
    v = torch.empty(1, 2, 256, dims[1], dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=f"config: .*{match}"):
        launch_hopper.attn_fwd(q, k, v, False, 0.1, cfg)


@pytest.mark.parametrize("case", ["one-program-a-tile", "row-too-narrow", "int32", "too-few-rows"])
def test_trace_buffer_checked_before_launch(case):
    """``trace`` (benchmarks/walk_trace.py's clock reads) must be a
    contiguous int64 (programs, TRACE_SLOTS) tensor and the config
    persistent: a ValueError naming it, before any launch (CPU: one program)."""
    from tileattn.kernels.fwd_hopper import TRACE_SLOTS
    q, k, v = (torch.empty(1, 2, 256, 64, dtype=torch.bfloat16) for _ in range(3))
    cfg = HopperFwdConfig(pingpong=False, persistent=case != "one-program-a-tile")
    rows, width, dtype = 1, TRACE_SLOTS.value, torch.int64
    if case == "row-too-narrow":
        width -= 1
    elif case == "int32":
        dtype = torch.int32
    elif case == "too-few-rows":
        rows = 0
    with pytest.raises(ValueError, match="trace: a persistent config's contiguous int64"):
        launch_hopper.attn_fwd(q, k, v, False, 0.125, cfg, trace=torch.zeros(rows, width, dtype=dtype))


@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_large_logits_and_strided_layout(causal):
    q, k, v = _inputs(2, 4, 4, 600, 600, 128, torch.bfloat16, seed=11, layout="bnhd", logit_scale=30.0)
    assert not q.is_contiguous()
    _check("large-logits-bnhd", q, k, v, causal)


# sliding windows on the one-program-a-tile Hopper forward: (b, hq, hkv, n_q, n_k, d, causal, window)
WINDOW_CASES = {
    "gpt-oss-128-causal-2048": (1, 4, 1, 2048, 2048, 64, True, (128, -1)),
    "mistral-4096-causal-odd": (2, 4, 2, 1500, 1500, 128, True, (600, 0)),
    "both-sides-nq<nk": (1, 2, 2, 333, 1000, 128, False, (100, 37)),
    "left-only-unbounded-right": (1, 2, 2, 700, 700, 64, False, (50, -1)),
    "right-only-nq>nk": (1, 2, 2, 1000, 129, 128, False, (-1, 5)),   # rows < 866 see no key: out 0, lse -inf
    "narrower-than-a-tile": (2, 2, 2, 517, 517, 64, True, (3, 0)),
    "causal-window-past-the-keys": (1, 2, 2, 640, 640, 128, True, (5000, 7)),   # causal folds right to 0
}


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("walk", ["per-tile", "persistent"])
@pytest.mark.parametrize("case", list(WINDOW_CASES))
def test_window_against_float64(case, walk, dtype):
    """A sliding window through the default dispatch (forced onto the Hopper
    kernel at every size, one program a tile or persistent, poisoned
    outputs): out and lse against float64 standard attention with the same
    window, under the accuracy rule; and with sinks and the output's
    remainder (gpt-oss's sliding layers)."""
    b, hq, hkv, n_q, n_k, d, causal, window = WINDOW_CASES[case]
    q, k, v = _inputs(b, hq, hkv, n_q, n_k, d, dtype, seed=case_number(case) % 1000)
    runtime.POISON_OUTPUTS = True
    cfg = dataclasses.replace(configs.HOPPER_FWD[(d, d)], persistent=walk == "persistent")   # windows' table
    with counting_calls(launch_hopper, "attn_fwd") as calls:
        out, lse = launch.attn_fwd(q, k, v, causal, d ** -0.5, config=cfg, window=window)
    assert calls and calls[0][1]["window"] is not None, "the window did not run on the Hopper kernel"
    ref, ref_lse, low, low_lse = _references(q, k, v, causal, window=window)
    check_accuracy(f"{case} out", out, ref, low, dtype)
    check_accuracy(f"{case} lse", lse, ref_lse, low_lse.float(), dtype)
    sinks = torch.linspace(-3.0, 3.0, hq, device="cuda")
    out, lse, out_lo = launch.attn_fwd(q, k, v, causal, d ** -0.5, config=cfg, window=window, sinks=sinks,
                                       remainder=True)
    ref, ref_lse, low, low_lse = _references(q, k, v, causal, sinks=sinks, window=window)
    check_accuracy(f"{case} sinks out", out, ref, low, dtype)
    check_accuracy(f"{case} sinks lse", lse, ref_lse, low_lse.float(), dtype)
    check_remainder(out, out_lo)


def test_window_switch(monkeypatch):
    """``TILEATTN_HOPPER_WINDOW=0`` / ``dispatch.HOPPER_WINDOW = False`` keep
    the default dispatch of windowed calls off the Hopper kernels; a forced
    Hopper config still takes them; the backward's rule also wants QK = V
    head dim <= 128."""
    q64, q192, v128 = torch.empty(1, 1, 1, 64), torch.empty(1, 1, 1, 192), torch.empty(1, 1, 1, 128)
    assert dispatch.hopper_window() and dispatch.hopper_window_bwd(q64, q64)
    assert not dispatch.hopper_window_bwd(q192, v128) and not dispatch.hopper_window_bwd(v128, q64)
    monkeypatch.setenv("TILEATTN_HOPPER_WINDOW", "0")
    assert not dispatch.hopper_window() and not dispatch.hopper_window_bwd(q64, q64)
    assert dispatch.hopper_window(forced=True) and dispatch.hopper_window_bwd(q64, q64, forced=True)
    monkeypatch.delenv("TILEATTN_HOPPER_WINDOW")
    monkeypatch.setattr(dispatch, "HOPPER_WINDOW", False)
    assert not dispatch.hopper_window() and dispatch.hopper_window(forced=True)
    monkeypatch.setattr(dispatch, "HOPPER_WINDOW", True)
    # the forward's width rule: configs.HOPPER_FWD_WINDOW_MIN_SPAN keys (left + right + 1), QK = V head dim
    least = configs.HOPPER_FWD_WINDOW_MIN_SPAN[64]
    assert dispatch.hopper_window_fwd(q64, q64, (least - 1, 0))
    assert not dispatch.hopper_window_fwd(q64, q64, (least - 2, 0))
    assert dispatch.hopper_window_fwd(q64, q64, (3, 0), forced=True)
    assert not dispatch.hopper_window_fwd(q192, v128, (100_000, 0))


class _Chosen(Exception):
    """Raised by a stand-in for ``config_for``: the launch stops there."""


def test_window_walk_rule(monkeypatch):
    """The default config of a windowed Hopper forward: persistent up to
    ``configs.HOPPER_FWD_WINDOW_PERSISTENT_SPAN`` keys (left + right + 1 of
    the kernel's bounds), one program a tile above, in the launcher and in
    the call path's plan (CPU: the launch stops at the choice); packed
    sequences take the table's one-program config
    (:func:`test_noncausal_config_by_call`)."""
    for d, widest in configs.HOPPER_FWD_WINDOW_PERSISTENT_SPAN.items():
        assert launch_hopper.config_for(d, d, window_span=widest).persistent
        assert not launch_hopper.config_for(d, d, window_span=widest + 1).persistent
    assert not launch_hopper.config_for(192, 128, window_span=3).persistent
    spans = []

    def chosen(*args):
        spans.append(args[4])
        raise _Chosen
    monkeypatch.setattr(launch_hopper, "config_for", chosen)
    q = torch.empty(1, 2, 300, 64, dtype=torch.bfloat16)
    with pytest.raises(_Chosen):
        launch_hopper.attn_fwd(q, q, q, False, 0.125, window=(100, 27))
    with pytest.raises(_Chosen):   # the call path's plan key and workspace take the same config
        hopper_calls.fwd(q, q, q, False, 0.125, window=(100, 27))
    assert spans == [128, 128]


def test_window_refuses_stream_k_and_causal():
    """A forced stream-K config with a window, or causal not folded into
    it: a ValueError naming the window, before any launch (CPU tensors:
    nothing runs)."""
    q, k, v = (torch.empty(1, 2, 256, 64, dtype=torch.bfloat16) for _ in range(3))
    with pytest.raises(ValueError, match="window: the Hopper forward runs a window without the stream-K cut"):
        launch_hopper.attn_fwd(q, k, v, False, 0.125,
                               HopperFwdConfig(pingpong=False, persistent=True, stream_k=True), window=(16, 0))
    with pytest.raises(ValueError, match="window: .* causal folded into it"):
        launch_hopper.attn_fwd(q, k, v, True, 0.125, HopperFwdConfig(pingpong=False), window=(16, 0))


@needs_hopper
def test_dispatch_plain_only():
    q, k, v = _inputs(1, 2, 2, 2048, 2048, 128, torch.bfloat16, seed=3)
    with counting_calls(launch_hopper, "attn_fwd") as calls:
        tileattn.attention(q, k, v, causal=True)
        assert calls, "a plain bf16 d=128 call did not take the Hopper kernel"
        calls.clear()
        tileattn.attention(q, k, v, causal=True, window=(1500, 0))
        assert calls, "a 1,501-key sliding window (bf16, d = 128, 2k keys) did not take the Hopper kernel"
        calls.clear()
        narrow = [t[..., :64].contiguous() for t in (q, k, v)]   # d = 64: narrower than HOPPER_FWD_WINDOW_MIN_SPAN
        tileattn.attention(*narrow, causal=True, window=(64, 0))
        tileattn.attention(q, k, v, window=(1500, 0), softcap=30.0)
        tileattn.attention(q.float(), k.float(), v.float())
        tileattn.attention(q[..., :96].contiguous(), k[..., :96].contiguous(), v[..., :96].contiguous())
        short = [t[:, :, :1024].contiguous() for t in (q, k, v)]
        tileattn.attention(*short, causal=True)
        tileattn.attention(*(torch.cat([t, t], -1) for t in short), causal=True)   # 256 below its bound
        assert not calls, ("a narrow window, softcap, fp32, an unsupported head dim or a short sequence took the "
                           "Hopper kernel")


@needs_hopper
@pytest.mark.parametrize("d,dv", [(128, 128), (192, 128), (256, 256)], ids=["d128", "d192-dv128", "d256"])
def test_backward_after_hopper_forward(d, dv):
    """The default call's gradients after the Hopper forward (QK 192 / V 128:
    the wide Hopper backward; 256: the portable one) on its out and lse."""
    q, k, v, do = hopper_inputs(1, 4, 2, 2049, 2049, d, torch.bfloat16, seed=5, dv=dv)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = tileattn.attention(q, k, v, causal=True)
    got = torch.autograd.grad(out, (q, k, v), do)
    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(standard_attention(*leaves64, causal=True), leaves64, do.double())
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    low = torch.autograd.grad(standard_attention(*leaves, causal=True), leaves, do)
    for name, g, r, lo in zip(("dq", "dk", "dv"), got, ref, low):
        check_accuracy(name, g, r, lo, q.dtype)


@needs_hopper
@pytest.mark.parametrize("persistent", [False, True], ids=["per-tile", "persistent"])
@pytest.mark.parametrize("case", ["causal-rows-see-nothing", "gqa-full", "gqa-full-a-sink-of-minus-inf"])
def test_sinks_in_the_kernel(case, persistent):
    """Each row's denominator takes its head's sink, folded in after the key
    tiles, on one program a query tile and on the persistent kernel: out and
    lse against the float64 reference with an explicit sink column (rows that
    see no key: 0, lse = sink; a sink of -inf is no sink)."""
    b, hq, hkv, n_q, n_k, causal = {"causal-rows-see-nothing": (1, 4, 4, 700, 300, True),
                                    "gqa-full": (2, 8, 2, 777, 1000, False),
                                    "gqa-full-a-sink-of-minus-inf": (2, 8, 2, 777, 1000, False)}[case]
    q, k, v = _inputs(b, hq, hkv, n_q, n_k, 128, torch.bfloat16, seed=13)
    sinks = torch.linspace(-4.0, 4.0, hq, device="cuda")
    if case.endswith("minus-inf"):
        sinks[1] = float("-inf")
    runtime.POISON_OUTPUTS = True
    cfg = dataclasses.replace(launch_hopper.config_for(128), persistent=persistent)
    out, lse = launch_hopper.attn_fwd(q, k, v, causal, 128 ** -0.5, cfg, poison=True, sinks=sinks)
    _check_sinks(case, q, k, v, causal, sinks, out, lse)


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("dims,layout,causal", [((64, 64), "bhnd", True), ((128, 128), "bnhd", False),
                                                ((192, 128), "bnhd", True), ((256, 256), "bhnd", True)],
                         ids=["d64-causal", "d128-bnhd-full", "d192-dv128-bnhd-causal", "d256-causal"])
def test_sinks_remainder_in_the_kernel(dims, layout, causal, dtype):
    """remainder=True (a sinks call that will be differentiated): the same out
    and lse bit for bit, and out_lo what rounding the float32 result to out
    dropped (poisoned outputs; odd lengths, rows that see no key); out and lse
    against the float64 reference with the sink column."""
    d, dv = dims
    q, k, v = _inputs(2, 4, 2, 701, 333, d, dtype, seed=19, layout=layout, dv=dv)
    sinks = torch.linspace(-4.0, 4.0, 4, device="cuda")
    cfg = launch_hopper.config_for(d, dv, causal=causal)
    out, lse = launch_hopper.attn_fwd(q, k, v, causal, d ** -0.5, cfg, poison=True, sinks=sinks)
    out2, lse2, out_lo = launch_hopper.attn_fwd(q, k, v, causal, d ** -0.5, cfg, poison=True, sinks=sinks,
                                                remainder=True)
    _check_sinks(f"{_dims_id(dims)} sinks", q, k, v, causal, sinks, out, lse)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    check_remainder(out, out_lo)
    ref = standard_attention(q.double(), k.double(), v.double(), causal=causal, sinks=sinks.double())
    assert (decode_remainder(out, out_lo).double() - ref).abs().mean() <= (out.double() - ref).abs().mean()


@needs_hopper
@pytest.mark.parametrize("case", ["d64-causal-2048-sinks", "d64-causal-2048-remainder", "d128-full-2048-remainder",
                                  "d64-full-4096-remainder"])
def test_sinks_forward_plans_replay(case, monkeypatch):
    """A forward with sinks, and one that also keeps the output's remainder,
    replays its launch plan on a key seen before (``hopper_calls.fwd``):
    out, lse and out_lo bit for bit those of the same call without plans,
    with new sinks values each time (the plan reads the call's tensor, not
    the recorded one) and another key in between."""
    dim, mode, n, kind = case.split("-")[:4]
    d, n, causal, remainder = int(dim[1:]), int(n), mode == "causal", kind == "remainder"
    monkeypatch.setattr(runtime, "POISON_OUTPUTS", False)   # a poisoned forward plans nothing
    runtime.PLANS.clear()
    q, k, v = _inputs(2, 4, 2, n, n, d, torch.bfloat16, seed=29)
    other = _inputs(1, 4, 2, n + 17, n + 17, d, torch.bfloat16, seed=30)

    def call(q, k, v, sinks):
        return hopper_calls.fwd(q, k, v, causal, d ** -0.5, sinks=sinks, remainder=remainder)
    for i in range(3):
        sinks = torch.linspace(-2.0, 2.0, 4, device="cuda") + i
        call(*other, sinks)
        got = call(q, k, v, sinks)
        monkeypatch.setattr(runtime, "PLANS_ON", False)
        want = call(q, k, v, sinks)
        monkeypatch.setattr(runtime, "PLANS_ON", True)
        assert len(got) == len(want) == (3 if remainder else 2)
        for name, g, w in zip(("out", "lse", "out_lo"), got, want):
            assert torch.equal(g, w), f"{case} {name}, call {i}"
    keys = [key for key in runtime.PLANS if key[0] == "hopper_fwd"]
    assert len(keys) == 2, f"{len(keys)} forward plans (one a key expected)"


# The wide head dims: QK 192 / V 128 (MLA training and prefill: Q and K in
# two pieces, V's width and a 64-column tail) and 256 (64-key tiles);
# name: (b, hq, hkv, n_q, n_k)
WIDE_DIMS = [(192, 128), (256, 256)]
WIDE_CASES = {
    "square-1000": (2, 4, 4, 1000, 1000),
    "odd-1": (1, 2, 2, 1, 1),
    "odd-17x129": (1, 2, 2, 17, 129),
    "nq<nk-129x1000": (1, 4, 4, 129, 1000),
    "nq>nk-1000x129": (1, 4, 4, 1000, 129),   # causal: the first rows see no key
    "gqa4-777": (2, 8, 2, 777, 777),
    "tiles-even-2048": (1, 2, 2, 2048, 2048),
}


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", list(WIDE_CASES))
@pytest.mark.parametrize("dims", WIDE_DIMS, ids=[_dims_id(x) for x in WIDE_DIMS])
def test_wide_head_dims_against_float64(dims, case, causal, dtype):
    b, hq, hkv, n_q, n_k = WIDE_CASES[case]
    q, k, v = _inputs(b, hq, hkv, n_q, n_k, dims[0], dtype, seed=case_number(case) % 1000, dv=dims[1])
    _check(f"{_dims_id(dims)} {case}", q, k, v, causal)


@needs_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_separate_v_head_dim_strided_large_logits_sinks(causal):
    """(B, N, H, D) storage (the pieces are column views of it), logits
    scaled 30x, and a sink per head, rows that see no key included."""
    q, k, v = _inputs(2, 4, 2, 700, 300, 192, torch.bfloat16, seed=17, layout="bnhd", logit_scale=30.0, dv=128)
    assert not q.is_contiguous()
    sinks = torch.linspace(-4.0, 4.0, 4, device="cuda")
    runtime.POISON_OUTPUTS = True
    out, lse = launch_hopper.attn_fwd(q, k, v, causal, 192 ** -0.5, launch_hopper.config_for(192, 128), poison=True,
                                      sinks=sinks)
    _check_sinks("192/128 bnhd sinks", q, k, v, causal, sinks, out, lse)


@needs_hopper
def test_dispatch_takes_separate_v_head_dim():
    """A plain 192/128 call takes the Hopper forward from its size bound
    (``configs.HOPPER_FWD_MIN_KEYS``: 2k keys causal); 128/64 (no config)
    does not."""
    with counting_calls(launch_hopper, "attn_fwd") as calls:
        n = configs.HOPPER_FWD_MIN_KEYS[(192, True)]
        q, k, v = _inputs(1, 2, 2, n, n, 192, torch.bfloat16, seed=3, dv=128)
        tileattn.attention(q, k, v, causal=True)
        assert calls, "a plain bf16 192/128 call did not take the Hopper kernel"
        calls.clear()
        q, k, v = _inputs(1, 2, 2, 2048, 2048, 128, torch.bfloat16, seed=3, dv=64)
        tileattn.attention(q, k, v, causal=True)
        assert not calls, "a 128/64 call (no Hopper config) took the Hopper kernel"
