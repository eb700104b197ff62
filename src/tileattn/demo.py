"""``tileattn demo``: standard (materialized) attention, tileattn and torch's
SDPA on one shape: do the outputs agree, how long does each take, how much
memory does each need on top of its inputs, and how many bytes the cost
model says each moves through a named GPU's memory.  Runs on the GPU when
there is one, else on the CPU (tileattn's CPU path).  The implementations
take turns within every repeat and the medians are reported, so a machine
whose load changes during the run slows all of them alike."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import tileattn
from tileattn.reference import standard_attention
from tileattn.validation import MAX_HEAD_DIM

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
IMPLS = ("standard", "tileattn", "sdpa")
_LABELS = {"standard": "standard", "tileattn": "tileattn", "sdpa": "torch SDPA"}
_DEFAULT_HW = "nvidia-h200"


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
    p.add_argument("--repeats", type=int, default=5, help="timed rounds; each runs every implementation once")
    p.add_argument("--hw", default=None, help="GPU of the cost model's byte counts: a name of `tileattn io --hw`; "
                   f"default: this GPU if the catalogue has it, else {_DEFAULT_HW}")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=run)


def _once(fn, device) -> float:
    """Seconds of one call of fn()."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def timed_interleaved(fns: dict, device, repeats: int) -> dict:
    """Median seconds of each fn over ``repeats`` rounds; each round calls every
    fn once, in turn, starting one further along each round (so none always
    runs after the same one), after one warm-up call each (compilation,
    autotuning)."""
    for fn in fns.values():
        fn()
    names = list(fns)
    times = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(_once(fns[name], device))
    return {name: statistics.median(t) for name, t in times.items()}


def _call(impl: str, q, k, v, causal):
    if impl == "sdpa":  # the demo's shapes are square: torch's top-left causal is tileattn's
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    fn = standard_attention if impl == "standard" else tileattn.attention
    return fn(q, k, v, causal=causal)


def tileattn_path(q, k, causal) -> str:
    """Which implementation a call of tileattn.attention on these tensors runs."""
    if tileattn.dispatch.uses_triton(q):
        return "Triton kernels"
    if tileattn.dispatch.cpu_fused_applies(q, k, causal):
        return "torch's fused CPU kernel"
    return "PyTorch tiled path"


def default_hw(device) -> str:
    """The cost model's name for this GPU if its catalogue has it, else the
    H200 (on a GPU the catalogue lacks, with a note on stderr)."""
    if device.type != "cuda":
        return _DEFAULT_HW
    from tileattn.cost.hardware import catalogue_name_for_device
    gpu = torch.cuda.get_device_name(device)
    name = catalogue_name_for_device(gpu)
    if name is None:
        print(f"tileattn: note: the cost model's catalogue has no {gpu}; its bytes and times are modelled for "
              f"{_DEFAULT_HW} (choose with --hw, or describe this GPU in a hardware file: tileattn io --help)",
              file=sys.stderr)
    return name or _DEFAULT_HW


def predicted_io(hw_name: str, b, h, n, d, dtype_name, causal) -> dict:
    """The cost model's HBM bytes and times (forward) of standard attention
    (as PyTorch eager runs it) and of the tiled kernels on ``hw_name``."""
    from tileattn.cost import hardware
    from tileattn.cost.io import AttentionShape
    from tileattn.cost.roofline import compare
    hw = hardware.get_hardware(hw_name)
    c = compare(AttentionShape(batch=b, heads=h, seqlen_q=n, head_dim=d, causal=causal, dtype=dtype_name), hw)
    return {"hw": hw.name, "hw_display_name": hw.display_name,
            "standard": {"hbm_bytes_fwd": c.standard_pred["fwd"].bytes, "time_s_fwd": c.standard_pred["fwd"].time_s},
            "tileattn": {"hbm_bytes_fwd": c.tiled_pred["fwd"].bytes, "time_s_fwd": c.tiled_pred["fwd"].time_s}}


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
              "run with --device cpu (the PyTorch tiled path)", file=sys.stderr)
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
            print(f"tileattn: error: --{name} must be >= 1, got {val}", file=sys.stderr)
            return 2
    if d > MAX_HEAD_DIM:
        print(f"tileattn: error: --head-dim must be at most {MAX_HEAD_DIM}, got {d}", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device=device, dtype=dtype) for _ in range(3))

    dt_name = args.dtype or ("bf16" if gpu else "fp32")
    try:
        io = predicted_io(args.hw or default_hw(device), b, h, n, d, dt_name, args.causal)
    except ValueError as e:  # an unknown --hw name
        print(f"tileattn: error: {e}", file=sys.stderr)
        return 2
    with torch.no_grad():
        times = timed_interleaved({impl: (lambda impl=impl: _call(impl, q, k, v, args.causal)) for impl in IMPLS},
                                  device, args.repeats)
        if gpu:
            mem = {impl: _gpu_peak_extra_bytes(impl, q, k, v, args.causal) for impl in IMPLS}
        else:
            mem = {impl: _cpu_peak_extra_bytes(impl, b, h, n, d, dt_name, args.causal) for impl in IMPLS}
        outs = {impl: _call(impl, q, k, v, args.causal) for impl in IMPLS}
        ref = standard_attention(q.double().cpu(), k.double().cpu(), v.double().cpu(), causal=args.causal) \
            if n <= 4096 and b * h <= 64 else None
    max_diff = float((outs["standard"].float() - outs["tileattn"].float()).abs().max())
    err = {}
    if ref is not None:
        err = {f"{impl}_vs_fp64": float((outs[impl].double().cpu() - ref).abs().max()) for impl in IMPLS}
    res = {
        "device": torch.cuda.get_device_name(device) if gpu else "cpu",
        "tileattn_path": tileattn_path(q, k, args.causal), "shape": {"batch": b, "heads": h, "seqlen": n, "head_dim": d},
        "dtype": str(dtype).replace("torch.", ""), "causal": args.causal, "repeats": args.repeats,
        "timing": "interleaved: every repeat runs " + ", ".join(IMPLS) + " in turn; medians",
        **{impl: {"ms": times[impl] * 1e3, "peak_extra_bytes": mem[impl]} for impl in IMPLS},
        "max_abs_diff_standard_vs_tileattn": max_diff, **err,
        "predicted_gpu_io": io,
    }
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    _print_table(res)
    return 0


def _mib(x):
    return "n/a" if x is None else f"{x / 2**20:,.1f} MiB"


def _bytes(x):
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= size:
            return f"{x / size:,.1f} {unit}"
    return f"{x:,.0f} B"


def _print_table(r) -> None:
    s, io = r["shape"], r["predicted_gpu_io"]
    gpu = io["hw_display_name"]
    title = (f"attention B={s['batch']} H={s['heads']} N={s['seqlen']} D={s['head_dim']} {r['dtype']}"
             f"{' causal' if r['causal'] else ''} on {r['device']} (tileattn: {r['tileattn_path']}); "
             f"medians of {r['repeats']} interleaved repeats")
    cols = ("implementation", "time here", "memory beyond inputs here", f"bytes on {io['hw']} (model)",
            f"time on {io['hw']} (model)")
    rows = []
    for impl in IMPLS:
        model = io.get(impl)
        rows.append((_LABELS[impl], f"{r[impl]['ms']:.2f} ms", _mib(r[impl]["peak_extra_bytes"]),
                     _bytes(model["hbm_bytes_fwd"]) if model else "-",
                     f"{model['time_s_fwd'] * 1e3:.3f} ms" if model else "-"))
    std, tile, sdpa = (r[i]["ms"] for i in IMPLS)
    notes = [f"tileattn: {std / max(tile, 1e-9):.2f}x the speed of standard, {sdpa / max(tile, 1e-9):.2f}x torch SDPA's",
             f"max |standard - tileattn| = {r['max_abs_diff_standard_vs_tileattn']:.2e}"]
    if "tileattn_vs_fp64" in r:
        notes.append("error vs float64: " + ", ".join(f"{_LABELS[i]} {r[i + '_vs_fp64']:.2e}" for i in IMPLS))
    ratio = io["standard"]["hbm_bytes_fwd"] / max(io["tileattn"]["hbm_bytes_fwd"], 1)
    notes.append(f"IO (forward, HBM bytes and time from tileattn's cost model for the {gpu}): standard attention "
                 f"writes and rereads the N x N scores and probabilities, {ratio:.1f}x the bytes of tileattn's "
                 f"kernels; here the same matrices are its extra memory. `tileattn io --hw {io['hw']}` has the "
                 f"whole model")
    try:
        from rich.console import Console
        from rich.table import Table
        t = Table(title=title)
        for col in cols:
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
            print(f"  {row[0]:12} {row[1]:>12} {row[2]:>14} {row[3]:>12} {row[4]:>12}")
        for line in notes:
            print(line)
