"""``tileattn demo``: standard (materialized) attention beside tileattn on one
shape: do the outputs agree, how long does each take, how much memory does
each need on top of its inputs.  Runs on the GPU when there is one, else on
the CPU (the pure-PyTorch tiled path)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

import tileattn
from tileattn.reference import standard_attention

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="standard vs tileattn side by side: agreement, time, peak memory",
                       description=__doc__ + "\n\nexamples:\n  tileattn demo\n"
                       "  tileattn demo --seqlen 8192 --head-dim 128 --causal\n  tileattn demo --device cpu --json",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--batch", type=int, default=None, help="default: 4 on GPU, 1 on CPU")
    p.add_argument("--heads", type=int, default=None, help="default: 16 on GPU, 4 on CPU")
    p.add_argument("--seqlen", type=int, default=None, help="default: 4096 on GPU, 1024 on CPU")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", choices=sorted(_DTYPES), default=None, help="default: bf16 on GPU, fp32 on CPU")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=run)


def _timed(fn, device, repeats):
    """Median wall time of fn() over ``repeats`` runs after one warm-up."""
    fn()  # warm-up: compilation, autotuning
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _call(impl: str, q, k, v, causal):
    fn = standard_attention if impl == "standard" else tileattn.attention
    return fn(q, k, v, causal=causal)


def _gpu_peak_extra_bytes(impl, q, k, v, causal) -> int:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    _call(impl, q, k, v, causal)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def _status_bytes(field: str) -> int:
    """VmRSS (resident now) or VmHWM (resident high-water mark of this process
    image; unlike ru_maxrss it does not carry over the parent's peak across exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{field} not in /proc/self/status")


def _child_peak(impl, b, h, n, d, dtype, causal) -> None:
    """Run once in a fresh process: the high-water mark of its resident memory
    minus the resident memory just before the call (the CPU has no allocator
    statistics to ask)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, dtype=_DTYPES[dtype]) for _ in range(3))
    with torch.no_grad():  # first-call set-up (lazy imports, dispatch caches) on one token
        _call(impl, q[:, :, :1], k[:, :, :1], v[:, :, :1], causal)
    base = _status_bytes("VmRSS")
    with torch.no_grad():
        _call(impl, q, k, v, causal)
    print(_status_bytes("VmHWM") - base)


def _cpu_peak_extra_bytes(impl, b, h, n, d, dtype, causal) -> int | None:
    code = (f"from tileattn.demo import _child_peak; "
            f"_child_peak({impl!r}, {b}, {h}, {n}, {d}, {dtype!r}, {causal})")
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                             env={**os.environ, "TRITON_INTERPRET": "0"})
        return max(0, int(res.stdout.strip().splitlines()[-1]))
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return None


def run(args) -> int:
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif args.device == "cuda" and not torch.cuda.is_available():
        print("tileattn: error: --device cuda asked for, but no CUDA device is visible; "
              "run with --device cpu (the PyTorch tiled path)")
        return 3
    else:
        device = torch.device(args.device)
    gpu = device.type == "cuda"
    def pick(value, on_gpu, on_cpu):
        return value if value is not None else (on_gpu if gpu else on_cpu)

    b, h, n = pick(args.batch, 4, 1), pick(args.heads, 16, 4), pick(args.seqlen, 4096, 1024)
    d = args.head_dim
    dtype = _DTYPES[args.dtype or ("bf16" if gpu else "fp32")]
    for name, val in (("batch", b), ("heads", h), ("seqlen", n), ("head-dim", d), ("repeats", args.repeats)):
        if val < 1:
            print(f"tileattn: error: --{name} must be >= 1, got {val}")
            return 2
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device=device, dtype=dtype) for _ in range(3))

    dt_name = args.dtype or ("bf16" if gpu else "fp32")
    with torch.no_grad():
        t_std = _timed(lambda: _call("standard", q, k, v, args.causal), device, args.repeats)
        t_tile = _timed(lambda: _call("tileattn", q, k, v, args.causal), device, args.repeats)
        if gpu:
            m_std, m_tile = (_gpu_peak_extra_bytes(i, q, k, v, args.causal) for i in ("standard", "tileattn"))
        else:
            m_std, m_tile = (_cpu_peak_extra_bytes(i, b, h, n, d, dt_name, args.causal)
                             for i in ("standard", "tileattn"))
        out_std = standard_attention(q, k, v, causal=args.causal)
        out_tile = tileattn.attention(q, k, v, causal=args.causal)
        ref = standard_attention(q.double().cpu(), k.double().cpu(), v.double().cpu(), causal=args.causal) \
            if n <= 4096 and b * h <= 64 else None
    max_diff = float((out_std.float() - out_tile.float()).abs().max())
    err = {}
    if ref is not None:
        err = {"standard_vs_fp64": float((out_std.double().cpu() - ref).abs().max()),
               "tileattn_vs_fp64": float((out_tile.double().cpu() - ref).abs().max())}
    path = "Triton kernels" if tileattn.ops.uses_triton(q) else "PyTorch tiled path"
    res = {
        "device": torch.cuda.get_device_name(device) if gpu else "cpu",
        "tileattn_path": path, "shape": {"batch": b, "heads": h, "seqlen": n, "head_dim": d},
        "dtype": str(dtype).replace("torch.", ""), "causal": args.causal,
        "standard": {"ms": t_std * 1e3, "peak_extra_bytes": m_std},
        "tileattn": {"ms": t_tile * 1e3, "peak_extra_bytes": m_tile},
        "max_abs_diff_standard_vs_tileattn": max_diff, **err,
    }
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    _print_table(res)
    return 0


def _mib(x):
    return "n/a" if x is None else f"{x / 2**20:,.1f} MiB"


def _print_table(r) -> None:
    s = r["shape"]
    title = (f"attention B={s['batch']} H={s['heads']} N={s['seqlen']} D={s['head_dim']} {r['dtype']}"
             f"{' causal' if r['causal'] else ''} on {r['device']} (tileattn: {r['tileattn_path']})")
    rows = [("standard (materialized)", f"{r['standard']['ms']:.2f} ms", _mib(r['standard']['peak_extra_bytes'])),
            ("tileattn", f"{r['tileattn']['ms']:.2f} ms", _mib(r['tileattn']['peak_extra_bytes']))]
    speed = r["standard"]["ms"] / max(r["tileattn"]["ms"], 1e-9)
    notes = [f"speed-up {speed:.2f}x", f"max |standard - tileattn| = {r['max_abs_diff_standard_vs_tileattn']:.2e}"]
    if "tileattn_vs_fp64" in r:
        notes.append(f"error vs float64: standard {r['standard_vs_fp64']:.2e}, tileattn {r['tileattn_vs_fp64']:.2e}")
    try:
        from rich.console import Console
        from rich.table import Table
        t = Table(title=title)
        for col in ("implementation", "time (median)", "peak memory beyond inputs"):
            t.add_column(col)
        for row in rows:
            t.add_row(*row)
        console = Console()
        console.print(t)
        for line in notes:
            console.print(line)
    except ImportError:
        print(title)
        for row in rows:
            print(f"  {row[0]:26} {row[1]:>12} {row[2]:>14}")
        for line in notes:
            print(line)
