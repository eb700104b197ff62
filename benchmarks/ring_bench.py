#!/usr/bin/env python3
"""Ring attention across GPUs: correctness against one GPU, then time and
scaling against one GPU, per-step compute vs transfer, and the cost model's
prediction next to each measurement.

On W GPUs of one host (NVLink multicast stays off; the script refuses other
values of these variables and sets them when unset):

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        torchrun --nproc-per-node=2 benchmarks/ring_bench.py --out docs/results/h200/ring

Plots from saved results (no GPU needed):

    python benchmarks/ring_bench.py --plot docs/results/h200/ring [--reanalyse]

Smoke run on CPU processes (gloo; tiny shapes):

    torchrun --nproc-per-node=2 benchmarks/ring_bench.py --device cpu --seqlens 256 512 \\
        --heads 2 --kv-heads 1 --head-dim 16 --check-max-local 32 --out /tmp/ring

What it does, with W = the number of processes:

1. Correctness: ring attention (forward and backward, both layouts, causal and
   not, GQA, 16- and 32-bit, odd local lengths with the contiguous layout)
   gathered from all ranks against ``tileattn.attention`` on one device and a
   float64 reference, under the accuracy rule of ``tileattn.testing``.
2. Sweep over global sequence lengths (default 32k-256k tokens; B=1, Hq=32,
   Hkv=8, D=128, bf16): forward and forward+backward time of the ring (the
   slowest rank's time per call), TFLOP/s per GPU, one GPU on the whole
   sequence where it fits (each GPU runs it; the fastest counts), speed-up and
   scaling efficiency = t_1 / (W t_W).  One extra profiled call records each
   step's compute and exposed wait on every rank; the transfer alone is timed
   with ``time_ring_exchange`` on buffers of the same size, so
   ``hidden_fraction = 1 - exposed wait / transfer time`` over the transfers
   that have compute to hide behind; the backward's final dK/dV hop home
   comes after the last compute step and is reported apart
   (``final_hop_ms``, ``final_wait_ms``; see ``overlap_columns``).
3. Model: ``tileattn.cost.interconnect.predict_ring`` with the catalogue's
   numbers (``model_*``) and calibrated with this run's single-GPU TFLOP/s
   and measured link bandwidth (``model_cal_*``).

Writes into ``--out``: ``ring_bench.csv`` / ``ring_bench.jsonl`` (one row per
point), ``ring_steps.csv`` (per rank and step), ``ring_check.json``
(correctness), ``ring_*.png`` (plots).  Exit status 1 if a correctness check
failed.
"""
from __future__ import annotations

import os
import sys

REQUIRED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _require_env() -> None:
    """Before torch or NCCL start: NVLink multicast (NVLS) stays off."""
    for key, want in REQUIRED_ENV.items():
        have = os.environ.get(key)
        if have is None:
            os.environ[key] = want
        elif have != want:
            sys.exit(f"ring_bench: {key}={have}; this benchmark runs with NVLink multicast off: set {key}={want}")


if __name__ == "__main__" and "--plot" not in sys.argv:
    _require_env()

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # ring_analysis.py beside it, also when this file is loaded by its path
    sys.path.insert(0, HERE)
# _read_csv is not used here: the tests read saved results through this module
from ring_analysis import (_read_csv, _write_csv, model_columns, model_hardware, overlap_columns,  # noqa: E402,F401
                           plot, point_line, reanalyse)

DTYPES = ("bf16", "fp16", "fp32")
MASKS = {"causal-zigzag": (True, "zigzag"), "causal-contiguous": (True, "contiguous"), "full": (False, "zigzag")}
MODES = ("fwd", "fwd_bwd")
# (name, layout, causal, dtype, batch, heads, kv_heads, n_local, head_dim)
CHECKS = [
    ("zigzag-causal-bf16-gqa", "zigzag", True, "bf16", 1, 8, 2, 1024, 128),
    ("zigzag-full-fp16", "zigzag", False, "fp16", 2, 4, 4, 512, 64),
    ("contiguous-causal-bf16-mqa-odd", "contiguous", True, "bf16", 1, 4, 1, 1001, 64),
    ("contiguous-full-fp32-odd", "contiguous", False, "fp32", 1, 4, 2, 777, 64),
    ("zigzag-causal-fp32-gqa", "zigzag", True, "fp32", 1, 8, 2, 512, 128),
]


def _tokens(text: str) -> int:
    t = text.strip().lower()
    mult = {"k": 1024, "m": 1024 * 1024}.get(t[-1:], 1)
    return int(t[:-1] if mult > 1 else t) * mult


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="directory for results (CSV, JSON lines, plots)")
    p.add_argument("--plot", metavar="DIR", help="only draw the plots from DIR/ring_bench.csv and exit")
    p.add_argument("--reanalyse", action="store_true",
                   help="with --plot: first recompute the overlap columns from DIR/ring_steps.csv")
    p.add_argument("--seqlens", nargs="+", type=_tokens, default=[_tokens(s) for s in ("32k", "64k", "128k", "256k")],
                   help="global sequence lengths (tokens over all GPUs; suffixes k, M)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--masks", nargs="+", choices=sorted(MASKS), default=["causal-zigzag", "full"])
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--single-max", type=_tokens, default=None,
                   help="skip the one-GPU baseline above this many tokens (default: try every length)")
    p.add_argument("--hw", default="auto", help="cost-model hardware name (default: from the device name)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu runs gloo (smoke test)")
    p.add_argument("--timeout", type=float, default=300.0, help="process-group timeout in seconds")
    p.add_argument("--skip-check", action="store_true", help="time only")
    p.add_argument("--check-only", action="store_true", help="run the correctness checks only")
    p.add_argument("--check-max-local", type=int, default=None, help="cap the local length of the checks")
    p.add_argument("--autotune", action="store_true",
                   help="autotune the kernels (default: the first fitting config of each table)")
    args = p.parse_args(argv)
    if not args.plot and not args.out:
        p.error("--out is required (or --plot DIR)")
    if args.check_only and args.skip_check:
        p.error("--check-only and --skip-check exclude each other")
    return args


# ---------------------------------------------------------------------------
# Set-up
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Ctx:
    rank: int
    world: int
    device: "torch.device"
    group: object
    meta: dict


def setup(args) -> Ctx:
    if not args.autotune:
        os.environ.setdefault("TILEATTN_AUTOTUNE", "0")
    import torch
    import torch.distributed as dist

    from tileattn.bench.results import collect_metadata

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    timeout = datetime.timedelta(seconds=args.timeout)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("ring_bench: no CUDA device (use --device cpu for a gloo smoke run)")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)  # batch_isend_irecv over NCCL needs it
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    meta = collect_metadata(device)
    meta.update(world_size=world, backend=dist.get_backend(), tileattn_autotune=os.environ.get("TILEATTN_AUTOTUNE"),
                env=" ".join(f"{k}={os.environ.get(k)}" for k in REQUIRED_ENV))
    # every rank writes the same run id
    box = [meta["run_id"]]
    dist.broadcast_object_list(box, src=0)
    meta["run_id"] = box[0]
    return Ctx(rank, world, device, dist.group.WORLD, meta)


def _dtype(name: str):
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _sync(ctx: Ctx) -> None:
    import torch
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def log(ctx: Ctx, *msg) -> None:
    if ctx.rank == 0:
        print(*msg, flush=True)


# ---------------------------------------------------------------------------
# 1. Correctness
# ---------------------------------------------------------------------------
def run_checks(ctx: Ctx, args) -> list[dict]:
    import torch
    import torch.distributed as dist

    import tileattn
    from tileattn.distributed import ring_attention, shard_sequence, unshard_sequence
    from tileattn.reference import standard_attention
    from tileattn.testing import check_accuracy, max_error

    results = []
    for i, (name, layout, causal, dt, b, hq, hkv, n_local, d) in enumerate(CHECKS):
        if args.check_max_local:
            n_local = min(n_local, args.check_max_local)
        if layout == "zigzag":
            n_local += n_local % 2
        dtype, n = _dtype(dt), ctx.world * n_local
        g = torch.Generator(device=ctx.device).manual_seed(1000 + i)
        full = [torch.randn(b, h, n, d, generator=g, device=ctx.device).to(dtype) for h in (hq, hkv, hkv, hq)]
        full.append(torch.randn(b, hq, n, generator=g, device=ctx.device))
        for t in full:
            dist.broadcast(t, src=0)
        q, k, v, do, dlse = (shard_sequence(t, ctx.rank, ctx.world, layout).contiguous() for t in full)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out, lse = ring_attention(q, k, v, causal=causal, layout=layout, return_lse=True)
        ((out * do).sum() + (lse * dlse).sum()).backward()
        mine = {}
        for key, t in (("out", out.detach()), ("lse", lse.detach()), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
            parts = [torch.empty_like(t) for _ in range(ctx.world)]
            dist.all_gather(parts, t.contiguous())
            mine[key] = unshard_sequence(parts, layout)
        row = {"check": name, "layout": layout, "causal": causal, "dtype": dt, "batch": b, "heads": hq,
               "kv_heads": hkv, "n_local": n_local, "seqlen": n, "head_dim": d, "passed": True, "detail": ""}
        if ctx.rank == 0:
            qf, kf, vf, dof, dlsef = full

            def fwd_bwd(fn, cast):
                qq, kk, vv = (t.detach().to(cast).requires_grad_() for t in (qf, kf, vf))
                o, l = fn(qq, kk, vv, causal=causal, return_lse=True)
                grads = torch.autograd.grad((o * dof.to(cast)).sum() + (l * dlsef.to(l.dtype)).sum(), (qq, kk, vv))
                return dict(zip(("out", "lse", "dq", "dk", "dv"), (o, l) + grads))

            single = fwd_bwd(tileattn.attention, dtype)
            lowp = fwd_bwd(standard_attention, dtype)
            ref = fwd_bwd(standard_attention, torch.float64)
            for key in mine:
                try:
                    err, allowed = check_accuracy(f"{name} {key}", mine[key], ref[key], lowp[key], dtype)
                    row[f"err_{key}"], row[f"allowed_{key}"] = err, allowed
                    row[f"err_vs_single_{key}"] = max_error(mine[key], single[key])
                except AssertionError as exc:
                    row["passed"] = False
                    row["detail"] += str(exc) + "; "
            del single, lowp, ref
        box = [row]
        dist.broadcast_object_list(box, src=0)
        results.append(box[0])
        log(ctx, f"check {name}: {'passed' if box[0]['passed'] else 'FAILED ' + box[0]['detail']}")
    return results


# ---------------------------------------------------------------------------
# 2. Timing
# ---------------------------------------------------------------------------
def _time_call(ctx: Ctx, fn, warmup: int, reps: int, collective: bool) -> float:
    """Median ms of fn(); with ``collective`` the ranks start together and
    each call counts its slowest rank."""
    import torch
    import torch.distributed as dist

    times = []
    for i in range(warmup + reps):
        _sync(ctx)
        if collective:
            dist.barrier()
        if ctx.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            fn()
            ms = (time.perf_counter() - t0) * 1e3
        if collective:
            t = torch.tensor([ms], dtype=torch.float64, device=ctx.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            ms = float(t.item())
        if i >= warmup:
            times.append(ms)
    return statistics.median(times)


def _ring_call(q, k, v, do, causal, layout, mode, profile=None):
    from tileattn.distributed import ring_attention

    def call():
        for t in (q, k, v):
            t.grad = None
        out = ring_attention(q, k, v, causal=causal, layout=layout, check_shards=False, profile=profile)
        if mode == "fwd_bwd":
            out.backward(do)
    return call


def _single_call(q, k, v, do, causal, mode):
    import tileattn

    def call():
        for t in (q, k, v):
            t.grad = None
        out = tileattn.attention(q, k, v, causal=causal)
        if mode == "fwd_bwd":
            out.backward(do)
    return call


def run_point(ctx: Ctx, args, n: int, mask: str, hw) -> tuple[list[dict], list[dict]]:
    import torch
    import torch.distributed as dist

    from tileattn.cost import attention_flops
    from tileattn.cost.interconnect import RingShape, ring_step_bytes
    from tileattn.distributed import RingProfile, time_ring_exchange

    causal, layout = MASKS[mask]
    w, b, hq, hkv, d = ctx.world, args.batch, args.heads, args.kv_heads, args.head_dim
    dtype = _dtype(args.dtype)
    n_local = n // w
    make = lambda h, length: torch.randn(b, h, length, d, device=ctx.device, dtype=dtype)  # noqa: E731
    q, k, v = (make(h, n_local).requires_grad_() for h in (hq, hkv, hkv))
    do = make(hq, n_local)
    base = dict(mask=mask, layout=layout, causal=causal, world_size=w, batch=b, heads=hq, kv_heads=hkv, seqlen=n,
                n_local=n_local, head_dim=d, dtype=args.dtype)
    rows, steps = {}, []
    for mode in args.modes:
        ms = _time_call(ctx, _ring_call(q, k, v, do, causal, layout, mode), args.warmup, args.reps, True)
        flops = attention_flops(b, hq, n, n, d, causal=causal, mode=mode)
        rows[mode] = dict(base, mode=mode, flops=flops, ring_status="ok", ring_ms=ms,
                          ring_tflops_per_gpu=flops / w / (ms * 1e-3) / 1e12)
        # one profiled call: per-step compute and exposed wait on every rank
        prof = RingProfile()
        _sync(ctx)
        dist.barrier()
        _ring_call(q, k, v, do, causal, layout, mode, prof)()
        recs = [dict(r.as_dict(), rank=ctx.rank) for r in prof.records()]
        gathered = [None] * w
        dist.all_gather_object(gathered, recs)
        steps += [dict(base, mode=mode, **r) for rs in gathered for r in rs]
    # the transfers alone, same sizes
    shape = RingShape(b, hq, hkv, n, d, w, causal, layout, args.dtype)
    kv_bytes = ring_step_bytes(shape, "fwd")
    dkv_bytes = ring_step_bytes(shape, "bwd") - kv_bytes
    t_kv = time_ring_exchange(kv_bytes, device=ctx.device, repeats=max(3, args.reps)) if w > 1 else 0.0
    t_dkv = time_ring_exchange(dkv_bytes, device=ctx.device, repeats=max(3, args.reps)) if w > 1 else 0.0
    link_bw = kv_bytes / (t_kv * 1e-3) if t_kv else None
    for mode, row in rows.items():
        row.update(link_gbs_measured=(link_bw or 0) / 1e9, t_kv_ms=t_kv, t_dkv_ms=t_dkv)
        row.update(overlap_columns(mode, w, t_kv, t_dkv, [s for s in steps if s["mode"] == mode]))
    del q, k, v, do
    # one GPU on the whole sequence (each rank runs it; the fastest counts)
    if args.single_max is None or n <= args.single_max:
        try:
            qs, ks, vs = (make(h, n).requires_grad_() for h in (hq, hkv, hkv))
            dos = make(hq, n)
            local = {m: _time_call(ctx, _single_call(qs, ks, vs, dos, causal, m), args.warmup, args.reps, False)
                     for m in args.modes}
            status = "ok"
        except torch.cuda.OutOfMemoryError:
            local, status = {}, "oom"
        qs = ks = vs = dos = None
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
        everyone = [None] * w
        dist.all_gather_object(everyone, (status, local))
        ok = [loc for st, loc in everyone if st == "ok"]
        for mode, row in rows.items():
            if ok:
                sms = min(loc[mode] for loc in ok)
                row.update(single_status="ok", single_ms=sms, single_tflops=row["flops"] / (sms * 1e-3) / 1e12,
                           speedup=sms / row["ring_ms"], efficiency=sms / row["ring_ms"] / w)
            else:
                row.update(single_status="oom")
    else:
        for row in rows.values():
            row.update(single_status="skipped")
    if hw is not None:  # the model: catalogue numbers, and calibrated with this run's rates
        model_columns(rows, shape, hw, link_bw)
    return list(rows.values()), steps


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plot:
        if args.reanalyse:
            reanalyse(Path(args.plot))
        for p in plot(Path(args.plot)):
            print("wrote", p)
        return 0
    ctx = setup(args)
    import torch.distributed as dist

    out = Path(args.out)
    if ctx.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    log(ctx, f"ring_bench: {ctx.world} x {ctx.meta['gpu']}, torch {ctx.meta['torch']}, triton {ctx.meta['triton']}, "
             f"commit {ctx.meta['git_commit']}, {ctx.meta['env']}")
    failed = False
    if not args.skip_check:
        t0 = time.time()
        checks = run_checks(ctx, args)
        failed = not all(c["passed"] for c in checks)
        if ctx.rank == 0:
            (out / "ring_check.json").write_text(json.dumps({"meta": ctx.meta, "checks": checks}, indent=1))
        log(ctx, f"checks: {sum(c['passed'] for c in checks)}/{len(checks)} passed ({time.time() - t0:.0f} s)")
    hw = model_hardware(ctx, args)
    rows, steps = [], []
    for n in ([] if args.check_only else args.seqlens):
        chunks = ctx.world * 2
        if n % chunks:
            log(ctx, f"skip {n} tokens: not a multiple of {chunks}")
            continue
        for mask in args.masks:
            t0 = time.time()
            r, s = run_point(ctx, args, n, mask, hw)
            for row in r:
                row.update(ctx.meta)
                log(ctx, point_line(n, mask, row))
            rows += r
            steps += s
            log(ctx, f"  ({time.time() - t0:.0f} s)")
            if ctx.rank == 0:  # written as it goes: a timeout keeps what was measured
                _write_csv(out / "ring_bench.csv", rows)
                _write_csv(out / "ring_steps.csv", steps)
                with open(out / "ring_bench.jsonl", "w") as fh:
                    fh.writelines(json.dumps(r) + "\n" for r in rows)
    if ctx.rank == 0 and rows:
        try:
            for p in plot(out):
                log(ctx, "wrote", p)
        except ImportError:
            log(ctx, "matplotlib missing: no plots (python benchmarks/ring_bench.py --plot DIR later)")
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: once (2 gloo workers on a loaded 2-core CPU, after the process
    # group was destroyed) a worker aborted there ("terminate called without an active exception"), and torchrun
    # then failed a run whose results were all written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
