"""Ring attention on W CPU processes over gloo.

Outputs, lse and gradients of ``tileattn.distributed.ring_attention`` on W
local processes against single-process ``tileattn.attention`` on the gathered
sequence and a float64 reference (the accuracy rule of ``tileattn.testing``):
both layouts, causal and not, GQA/MQA, a (B, N, H, D) layout, sinks, a V head
dim of its own; the output's layout; each step's profile record (kind,
source, bytes sent, FLOPs); calls on which the ranks disagree failing on every
rank; and the failure path (a rank that dies or stops makes the others raise
within the process group's timeout instead of hanging).

Process start-up dominates on CPU, so the cases of one world size run in one
set of W processes (forked from a server that has torch imported), once per
test session even under pytest-xdist; each case is then checked by its own test.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import sys
import time
import zlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import tileattn
from tileattn.cost import attention_flops
from tileattn.distributed import RingProfile, ring_attention, ring_plan, shard_sequence, unshard_sequence
from tileattn.reference import standard_attention
from tileattn.testing import check_accuracy, max_error

DT = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16}
LAUNCH_DEADLINE_S = 120     # a whole batch of cases; only reached if something hangs
# process-group timeouts in the failure tests: a dead peer must be noticed long
# before a (long) timeout; a stopped one only after a (short) one
FAULT_TIMEOUT_S = {"dies": 30, "stops": 3}


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    world: int
    layout: str
    causal: bool
    dtype: str
    b: int
    hq: int
    hkv: int
    n_local: int
    d: int
    lse: str = "grad"       # "grad": lse in the loss; "value": returned, unused; "none": return_lse=False
    strided: bool = False   # (B, N, H, D) tensors transposed to (B, H, N, D)
    dv: int = 0             # V's head dim where it differs from D
    sinks: bool = False     # float32 attention sinks, one per query head

    @property
    def d_v(self) -> int:
        return self.dv or self.d

    @property
    def profiled(self) -> bool:
        return self.strided or bool(self.dv)

    @property
    def id(self) -> str:
        return (f"W{self.world}-{self.layout}-{'causal' if self.causal else 'full'}-{self.dtype}-B{self.b}-"
                f"H{self.hq}x{self.hkv}-Nl{self.n_local}-D{self.d}" + (f"-Dv{self.dv}" if self.dv else "")
                + f"-lse_{self.lse}" + ("-bnhd" if self.strided else "") + ("-sinks" if self.sinks else ""))


def _cases(w: int) -> list[Case]:
    return [
        Case(w, "zigzag", True, "fp32", 2, 4, 2, 16, 16),
        Case(w, "zigzag", True, "fp64", 1, 2, 2, 12, 8),
        Case(w, "zigzag", False, "fp32", 1, 4, 1, 10, 16, lse="value"),
        Case(w, "contiguous", True, "fp32", 1, 2, 2, 13, 16),
        Case(w, "contiguous", False, "fp64", 2, 4, 2, 7, 8, lse="none"),
        Case(w, "contiguous", True, "fp64", 1, 3, 1, 5, 8, lse="value"),
        Case(w, "zigzag", True, "bf16", 1, 4, 2, 16, 32),
        Case(w, "zigzag", True, "fp32", 1, 2, 1, 8, 16, strided=True),
        # V's head dim of its own: narrower (D 64, Dv 32) and wider odd (D 40, Dv 56)
        Case(w, "zigzag", True, "fp32", 1, 4, 2, 8, 64, dv=32, sinks=True),
        Case(w, "zigzag", False, "fp32", 2, 2, 2, 6, 64, dv=32, lse="value"),
        Case(w, "contiguous", True, "fp64", 1, 3, 1, 5, 40, dv=56),
        Case(w, "contiguous", False, "fp32", 1, 4, 2, 7, 40, dv=56, sinks=True, strided=True),
        Case(w, "zigzag", True, "fp64", 1, 4, 2, 6, 16, dv=8, lse="value", sinks=True),   # folded in float64
    ]


CASES = [c for w in (2, 4) for c in _cases(w)]


def _full_inputs(c: Case):
    """The whole sequence, (B, H, N, D) (views of (B, N, H, D) when strided)."""
    g = torch.Generator().manual_seed(zlib.crc32(c.id.encode()))
    n, dt = c.world * c.n_local, DT[c.dtype]

    def make(h, d):
        if c.strided:
            return torch.randn(c.b, n, h, d, generator=g).to(dt).transpose(1, 2)
        return torch.randn(c.b, h, n, d, generator=g).to(dt)

    q, k, v, do = make(c.hq, c.d), make(c.hkv, c.d), make(c.hkv, c.d_v), make(c.hq, c.d_v)
    dlse = torch.randn(c.b, c.hq, n, generator=g)
    sinks = torch.randn(c.hq, generator=g) if c.sinks else None
    return q, k, v, do, dlse, sinks


def _shard(c: Case, x, rank):
    if c.strided and x.dim() == 4:  # shard the (B, N, H, D) storage along N
        return shard_sequence(x.transpose(1, 2), rank, c.world, c.layout, dim=1).transpose(1, 2)
    return shard_sequence(x, rank, c.world, c.layout, dim=2)


def _loss(c: Case, out, lse, do, dlse):
    loss = (out.to(do.dtype) * do).sum()
    if c.lse == "grad":
        loss = loss + (lse * dlse.to(lse.dtype)).sum()
    return loss


# ---------------------------------------------------------------------------
# Process launching (workers must be module-level functions)
# ---------------------------------------------------------------------------
def _context():
    ctx = mp.get_context("forkserver")
    # each worker starts with torch, torch._dynamo (the custom ops' first call
    # imports it) and tileattn already imported: ~0.1 s instead of ~4 s
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "tileattn", "tileattn.distributed"])
    return ctx


def _init(rank: int, world: int, port: int, timeout_s: float) -> None:
    if os.path.exists("/sys/class/net/lo"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    # rendezvous waits long (slow CI starts); operations time out after timeout_s
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def _launch(target, world: int, args: tuple, deadline_s: float):
    """Run ``target(rank, world, port, *args)`` on ``world`` processes; return
    (exit codes, seconds, whether any had to be killed at the deadline)."""
    ctx = _context()
    # the rendezvous server lives here, on a port the OS picks (no race for a free port)
    server = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=60))
    port = server.port
    procs = [ctx.Process(target=target, args=(rank, world, port) + args, daemon=True) for rank in range(world)]
    start = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join(max(0.1, deadline_s - (time.monotonic() - start)))
    hung = [p for p in procs if p.is_alive()]
    for p in hung:  # only our own children, by handle
        p.kill()
        p.join()
    del server
    return [p.exitcode for p in procs], time.monotonic() - start, bool(hung)


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.rename(path)


def _case_worker(rank: int, world: int, port: int, outdir: str) -> None:
    out = Path(outdir)
    _init(rank, world, port, timeout_s=60)
    for c in _cases(world):
        *qkv, do, dlse, sinks = _full_inputs(c)
        q, k, v = (_shard(c, x, rank).detach().requires_grad_() for x in qkv)
        do, dlse = _shard(c, do, rank), _shard(c, dlse, rank)
        sinks = None if sinks is None else sinks.requires_grad_()
        prof = RingProfile() if c.profiled else None
        res = ring_attention(q, k, v, causal=c.causal, layout=c.layout, sinks=sinks, return_lse=c.lse != "none",
                             profile=prof)
        o, lse = res if c.lse != "none" else (res, None)
        _loss(c, o, lse, do, dlse).backward()
        torch.save({"out": o.detach(), "lse": None if lse is None else lse.detach(), "dq": q.grad, "dk": k.grad,
                    "dv": v.grad, "dsinks": None if sinks is None else sinks.grad,
                    "q_strides": q.stride(), "out_strides": o.stride(),
                    "records": None if prof is None else [r.as_dict() for r in prof.records()]},
                   out / f"{c.id}.rank{rank}.pt")
    # calls that must fail on every rank, none of them hanging
    errors = {}
    x = torch.randn(1, 2, 8, 8)
    bad = {
        # one rank holds a different number of tokens
        "length-mismatch": lambda: ring_attention(*(3 * (x[:, :, :6] if rank == 1 else x,)), causal=True),
        # the last rank names a layout that does not exist
        "one-rank-rejects": lambda: ring_attention(x, x, x, layout="zigzagg" if rank == world - 1 else "zigzag"),
        "causal-mismatch": lambda: ring_attention(x, x, x, causal=rank == 0),
        "scale-mismatch": lambda: ring_attention(x, x, x, scale=0.5 if rank == 0 else 0.25),
        "dv-mismatch": lambda: ring_attention(x, x, x[..., :6] if rank == 0 else x),
        # rank 0 passes sinks, the others none; then every rank sinks, rank 0's different
        "sinks-missing": lambda: ring_attention(x, x, x, sinks=torch.zeros(x.shape[1]) if rank == 0 else None),
        "sinks-values": lambda: ring_attention(x, x, x, sinks=torch.full((x.shape[1],), float(rank == 0))),
        # rank 0's sinks (0, 1), the others' (2, 0): the same position-weighted sum, other values
        "sinks-same-sum": lambda: ring_attention(x, x, x, sinks=torch.tensor([0.0, 1.0] if rank == 0 else [2.0, 0.0])),
    }
    for name, call in bad.items():
        try:
            call()
            errors[name] = None
        except Exception as exc:  # recorded for the parent to check
            errors[name] = [type(exc).__name__, str(exc)]
    _write_json(out / f"errors.rank{rank}.json", errors)
    dist.destroy_process_group()


def _shared_root(tmp_path_factory) -> Path:
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def ring_results(tmp_path_factory):
    """Directory with every rank's results for world size W, computed once per
    session (a file lock shares them between xdist workers)."""
    from filelock import FileLock

    root = _shared_root(tmp_path_factory)

    def get(world: int) -> Path:
        d = root / f"ring-results-w{world}"
        with FileLock(str(d) + ".lock"):
            if not (d / "status.json").exists():
                d.mkdir(exist_ok=True)
                codes, secs, hung = _launch(_case_worker, world, (str(d),), LAUNCH_DEADLINE_S)
                _write_json(d / "status.json", {"codes": codes, "seconds": secs, "hung": hung})
        status = json.loads((d / "status.json").read_text())
        assert not status["hung"] and status["codes"] == [0] * world, \
            f"ring workers for W={world} failed: {status} (their output is in the captured stderr)"
        return d

    return get


def _gather(d: Path, c: Case, name: str):
    parts = [torch.load(d / f"{c.id}.rank{r}.pt")[name] for r in range(c.world)]
    if parts[0] is None:
        return None
    if name == "dsinks":  # each rank's share of the replicated parameter's gradient
        return torch.stack(parts).sum(0)
    if c.strided and parts[0].dim() == 4:
        return unshard_sequence([p.transpose(1, 2) for p in parts], c.layout, dim=1).transpose(1, 2)
    return unshard_sequence(parts, c.layout, dim=2)


def _single_process(c: Case):
    """tileattn.attention, standard attention in the case's dtype and in
    float64, each on the whole sequence: (out, lse, dq, dk, dv, dsinks)."""
    q, k, v, do, dlse, sinks = _full_inputs(c)

    def run(fn, dtype=None):
        qq, kk, vv = (t.detach().to(dtype or t.dtype).requires_grad_() for t in (q, k, v))
        ss = None if sinks is None else sinks.to(dtype or sinks.dtype).requires_grad_()
        o, lse = fn(qq, kk, vv, causal=c.causal, return_lse=True, sinks=ss)
        wrt = (qq, kk, vv) + (() if ss is None else (ss,))
        grads = torch.autograd.grad(_loss(c, o, lse, do.to(dtype or do.dtype), dlse), wrt)
        return (o, lse) + grads + ((None,) if ss is None else ())

    return run(tileattn.attention), run(standard_attention), run(standard_attention, torch.float64)


# ---------------------------------------------------------------------------
# Exactness against single-process attention
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_ring_matches_single_process(case, ring_results):
    d = ring_results(case.world)
    single, lowp, ref64 = _single_process(case)
    dtype = DT[case.dtype]
    for i, name in enumerate(("out", "lse", "dq", "dk", "dv", "dsinks")):
        got = _gather(d, case, name)
        if (name == "lse" and case.lse == "none") or (name == "dsinks" and not case.sinks):
            assert got is None
            continue
        # the public lse is float32 for every input dtype (as tileattn.attention's), and so are the sinks
        want_dtype = torch.float32 if name in ("lse", "dsinks") else dtype
        assert got is not None, name
        assert got.shape == ref64[i].shape and got.dtype == want_dtype, name
        # float32 results of float64 inputs (dsinks: each rank's float32 share, summed here)
        floor = 1e-6 if name in ("lse", "dsinks") and dtype == torch.float64 else None
        _, allowed = check_accuracy(f"{case.id} {name}", got, ref64[i], lowp[i], dtype, floor=floor)
        err = max_error(got, single[i])
        assert err <= allowed, f"{case.id} {name}: {err:.3e} from single-process tileattn.attention (> {allowed:.3e})"


def test_output_keeps_query_layout(ring_results):
    c = next(c for c in CASES if c.strided and c.world == 2)
    rank0 = torch.load(ring_results(2) / f"{c.id}.rank0.pt")
    assert rank0["out_strides"] == rank0["q_strides"]


@pytest.mark.parametrize("case", [c for c in CASES if c.profiled], ids=lambda c: c.id)
def test_profile_records_every_step(case, ring_results):
    c, world = case, case.world
    flops = {"forward": 0.0, "backward": 0.0}
    for rank in range(world):
        recs = torch.load(ring_results(world) / f"{c.id}.rank{rank}.pt")["records"]
        plan = ring_plan(c.layout, c.causal, rank, world, c.n_local)
        fwd = [r for r in recs if r["phase"] == "forward"]
        bwd = [r for r in recs if r["phase"] == "backward"]
        assert [r["kind"] for r in fwd] == [p.kind for p in plan]
        assert [r["kind"] for r in bwd] == [p.kind for p in plan] + ["dkdv-return"]
        assert [r["source"] for r in fwd] == [p.source for p in plan]
        assert all(r["compute_ms"] >= 0 and r["wait_ms"] >= 0 for r in recs)
        # K/V blocks (V at its own head dim) leave on every step but the last; the
        # forward moves (W-1) blocks, the backward those and W dK/dV accumulators
        kv_elems = c.b * c.hkv * c.n_local * (c.d + c.d_v)
        kv_bytes = kv_elems * torch.finfo(DT[c.dtype]).bits // 8
        acc_bytes = kv_elems * (8 if c.dtype == "fp64" else 4)
        assert sum(r["bytes_sent"] for r in fwd) == (world - 1) * kv_bytes
        assert sum(r["bytes_sent"] for r in bwd) == (world - 1) * kv_bytes + world * acc_bytes
        for phase, rs in (("forward", fwd), ("backward", bwd)):
            flops[phase] += sum(r["flops"] for r in rs)
    # over all ranks and steps: the FLOPs of the whole attention, with Dv
    n = world * c.n_local
    for phase, mode in (("forward", "fwd"), ("backward", "bwd")):
        want = attention_flops(c.b, c.hq, n, n, c.d, causal=c.causal, mode=mode, head_dim_v=c.d_v)
        assert flops[phase] == pytest.approx(want), phase


@pytest.mark.parametrize("name,who,match", [
    ("length-mismatch", "all", "disagree on the local sequence length"),
    ("causal-mismatch", "all", "causal: the ranks' calls disagree on the causal flag"),
    ("scale-mismatch", "all", r"scale: .*softmax scale \(rank 0: 0\.5, rank 1: 0\.25"),
    ("dv-mismatch", "all", r"v: the ranks' calls disagree on the value head_dim \(rank 0: 6, rank 1: 8"),
    ("sinks-missing", "all", r"sinks: the ranks' calls disagree on the sinks \(rank 0: given .*rank 1: none"),
    ("sinks-values", "all", r"sinks: the ranks' calls disagree on the sinks \(rank 0: given \(hash (?!0{14})"),
    ("sinks-same-sum", "all", r"sinks: the ranks' calls disagree on the sinks \(rank 0: given \(hash [0-9a-f]{14}\), "
                              r"rank 1: given \(hash [0-9a-f]{14}\)"),
    ("one-rank-rejects", "last", "layout must be one of"),
    ("one-rank-rejects", "others", r"rank\(s\) \[\d\] rejected their arguments"),
], ids=["length-all", "causal-all", "scale-all", "dv-all", "sinks-none-all", "sinks-values-all", "sinks-same-sum-all",
        "rejects-last", "rejects-others"])
@pytest.mark.parametrize("world", [2, 4])
def test_disagreeing_calls_fail_on_every_rank(world, name, who, match, ring_results):
    d = ring_results(world)
    ranks = {"all": range(world), "last": [world - 1], "others": range(world - 1)}[who]
    for rank in ranks:
        err = json.loads((d / f"errors.rank{rank}.json").read_text())[name]
        assert err is not None, f"rank {rank}: {name} did not raise"
        assert err[0] == "ValueError", err
        assert re.search(match, err[1]), err[1]


# ---------------------------------------------------------------------------
# A rank that fails mid-run
# ---------------------------------------------------------------------------
def _fault_worker(rank: int, world: int, port: int, outdir: str, phase: str, mode: str) -> None:
    """Rank 1 raises in its second block computation of ``phase``; with
    ``mode="dies"`` its process exits, with ``"stops"`` it stays alive but
    never calls again.  The others record what they raised, and how soon."""
    import tileattn.distributed.ring as ring_mod

    _init(rank, world, port, timeout_s=FAULT_TIMEOUT_S[mode])
    name = "_block_forward" if phase == "forward" else "_block_backward"
    original, calls = getattr(ring_mod, name), [0]

    def faulty(*args, **kwargs):
        calls[0] += 1
        if rank == 1 and calls[0] == 2:
            raise RuntimeError(f"fault injected in the {phase} on rank 1")
        return original(*args, **kwargs)

    setattr(ring_mod, name, faulty)
    start = time.monotonic()
    try:
        for _ in range(3):  # later calls need rank 1 even if the first did not
            x = torch.randn(1, 2, 8, 8, requires_grad=True)
            ring_attention(x, x, x, causal=True).sum().backward()
    except Exception as exc:
        if rank == 1:
            if mode == "stops":  # alive but silent until the others have given up
                others = [Path(outdir) / f"rank{r}.json" for r in range(world) if r != 1]
                until = time.monotonic() + FAULT_TIMEOUT_S[mode] * world + 5
                while not all(f.exists() for f in others) and time.monotonic() < until:
                    time.sleep(0.1)
            raise
        _write_json(Path(outdir) / f"rank{rank}.json",
                    {"type": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start})
        sys.exit(3)
    _write_json(Path(outdir) / f"rank{rank}.json", {"type": None, "seconds": time.monotonic() - start})


@pytest.mark.parametrize("world,phase,mode", [(3, "forward", "dies"), (2, "backward", "stops"),
                                              (3, "forward", "stops")],
                         ids=lambda x: str(x))
def test_failing_rank_makes_the_others_fail(world, phase, mode, tmp_path):
    deadline = 50
    codes, secs, hung = _launch(_fault_worker, world, (str(tmp_path), phase, mode), deadline)
    assert not hung, f"processes still running after {deadline} s: the ring hung"
    assert codes[1] not in (0, None), f"the failing rank exited with {codes[1]}"
    # a dead peer is noticed at once; a stopped one after the timeout (per
    # hop: the error reaches the rank across the ring one timeout later)
    bound = 5.0 if mode == "dies" else FAULT_TIMEOUT_S[mode] * (world - 1) + 3
    for rank in range(world):
        if rank == 1:
            continue
        assert codes[rank] == 3, f"rank {rank} exited with {codes[rank]} instead of raising"
        info = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert info["type"] == "RingCommunicationError", info
        assert "a peer rank failed" in info["message"]
        assert info["seconds"] <= bound, f"rank {rank} took {info['seconds']:.1f} s to fail (bound {bound} s)"
