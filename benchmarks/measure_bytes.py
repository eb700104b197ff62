"""Measure the HBM bytes of standard and tiled attention with Nsight Compute.

One measured call per process: warm-up (compilation, autotuning) runs first,
then the single call is bracketed by cudaProfilerStart/Stop, so

    ncu --profile-from-start off --clock-control none \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum --csv \
        python benchmarks/measure_bytes.py --shape gpt2-medium --impl tiled --mode fwdbwd

profiles exactly the kernels of that call, including the backward kernels
autograd launches from its own thread.  The driver mode runs that for every
shape x impl x mode, sums the CSV over kernels, times each call with CUDA
events and writes a JSON results file (schema in tileattn.cost.validation):

    python benchmarks/measure_bytes.py --all --out results/
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import statistics
import subprocess
import sys
import time

SHAPES = {
    # name: (batch, heads, kv_heads, seqlen, head_dim, causal)
    "gpt2-medium": (64, 16, 16, 1024, 64, False),     # FlashAttention paper, Figure 2
    "n2048-d64": (16, 16, 16, 2048, 64, False),
    "n4096-d128": (4, 16, 16, 4096, 128, False),
    "n8192-d64": (2, 16, 16, 8192, 64, False),
    "n8192-d128-causal": (2, 16, 16, 8192, 128, True),
    "n16384-d128": (1, 16, 16, 16384, 128, False),
    "n16384-d64-causal": (1, 16, 16, 16384, 64, True),
    "gqa-n4096-d128": (4, 32, 8, 4096, 128, False),
}
IMPLS = ("standard", "tiled")
MODES = ("fwd", "fwdbwd")
METRICS = "dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum"


def _inputs(name, requires_grad):
    import torch
    b, h, hkv, n, d, causal = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda heads: torch.randn(b, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    q, k, v = mk(h), mk(hkv), mk(hkv)
    for t in (q, k, v):
        t.requires_grad_(requires_grad)
    do = torch.randn_like(q)
    return q, k, v, do, causal


def _call(impl, mode, q, k, v, do, causal):
    import tileattn
    from tileattn.reference import standard_attention
    fn = tileattn.attention if impl == "tiled" else standard_attention
    if mode == "fwd":
        import torch
        with torch.no_grad():
            return fn(q, k, v, causal=causal)
    out = fn(q, k, v, causal=causal)
    out.backward(do)
    q.grad = k.grad = v.grad = None
    return out


def _tuned_configs():
    """Configs the autotuner picked (best effort; private launcher API)."""
    try:
        from tileattn import launch
        out = {}
        for kind in ("fwd", "dkdv", "dq"):
            best = getattr(launch.attention._tuned(kind), "best_config", None)
            if best is not None:
                kw = best.kwargs
                out[kind] = f"M{kw['BLOCK_M']}-N{kw['BLOCK_N']}-w{best.num_warps}-s{best.num_stages}"
        return out
    except Exception:
        return {}


def run_one(shape, impl, mode, warmup=3, repeats=10):
    """Warm up, time (CUDA events, median), then one profiled call."""
    import torch
    q, k, v, do, causal = _inputs(shape, mode == "fwdbwd")
    for _ in range(warmup):
        _call(impl, mode, q, k, v, do, causal)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        _call(impl, mode, q, k, v, do, causal)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    cfg = _tuned_configs() if impl == "tiled" else {}
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    _call(impl, mode, q, k, v, do, causal)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return {"time_ms": statistics.median(times), "configs": cfg}


def parse_ncu_csv(text):
    """Sum the metrics over kernels of ncu --csv output. Returns (read, write, time_ns, kernel names)."""
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        raise RuntimeError("no ncu CSV table in output:\n" + text[-2000:])
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9,
             "nsecond": 1, "usecond": 1e3, "msecond": 1e6, "ns": 1, "us": 1e3, "ms": 1e6}
    tot = {"dram__bytes_read.sum": 0.0, "dram__bytes_write.sum": 0.0, "gpu__time_duration.sum": 0.0}
    kernels = {}
    for r in rows:
        m = r.get("Metric Name")
        if m in tot:
            val = float(r["Metric Value"].replace(",", ""))
            tot[m] += val * scale.get(r.get("Metric Unit", "byte"), 1)
            kernels[r["ID"]] = r.get("Kernel Name", "")
    return tot["dram__bytes_read.sum"], tot["dram__bytes_write.sum"], tot["gpu__time_duration.sum"], \
        list(kernels.values())


def drive(args):
    from tileattn.cost.validation import predict_row
    os.makedirs(args.out, exist_ok=True)
    import torch
    device = torch.cuda.get_device_name(0)
    shapes = args.shapes.split(",") if args.shapes else list(SHAPES)
    rows = []
    for name in shapes:
        b, h, hkv, n, d, causal = SHAPES[name]
        for impl in IMPLS:
            for mode in MODES:
                t0 = time.time()
                cmd = [args.ncu, "--profile-from-start", "off", "--clock-control", "none", "--metrics", METRICS,
                       "--csv", sys.executable, os.path.abspath(__file__), "--shape", name, "--impl", impl,
                       "--mode", mode, "--emit-json"]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    print(f"{name} {impl} {mode}: ncu failed\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}",
                          file=sys.stderr)
                    continue
                rd, wr, t_ns, kernels = parse_ncu_csv(proc.stdout)
                extra = next((json.loads(l[len("RESULT "):]) for l in proc.stdout.splitlines()
                              if l.startswith("RESULT ")), {})
                row = {"shape_name": name, "batch": b, "heads": h, "kv_heads": hkv, "seqlen_q": n, "seqlen_k": n,
                       "head_dim": d, "causal": causal, "dtype": "bf16", "impl": impl, "mode": mode,
                       "configs": extra.get("configs", {}), "measured_read_bytes": rd,
                       "measured_write_bytes": wr, "kernels": len(kernels), "kernel_names": kernels,
                       "gpu_time_ms": t_ns / 1e6, "time_ms": extra.get("time_ms")}
                row["predicted_bytes"] = predict_row(row, "nvidia-h200")
                row["ratio"] = (rd + wr) / row["predicted_bytes"]
                rows.append(row)
                print(f"{name:>20} {impl:>8} {mode:>6}: measured {(rd + wr) / 1e9:9.3f} GB, model "
                      f"{row['predicted_bytes'] / 1e9:9.3f} GB, ratio {row['ratio']:.3f}, "
                      f"{len(kernels)} kernels, {row['time_ms']:.3f} ms ({time.time() - t0:.0f} s)", flush=True)
    result = {"schema": 1, "hardware": "nvidia-h200", "device_name": device, "tool": "ncu " + METRICS,
              "torch": torch.__version__, "rows": rows}
    path = os.path.join(args.out, "measured_h200.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"wrote {path}")
    bad = [r for r in rows if abs(r["ratio"] - 1) > 0.2]
    print(f"{len(rows) - len(bad)}/{len(rows)} rows within 20% of the model")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES))
    p.add_argument("--impl", choices=IMPLS)
    p.add_argument("--mode", choices=MODES)
    p.add_argument("--emit-json", action="store_true", help="print a RESULT line (driver use)")
    p.add_argument("--all", action="store_true", help="driver: every shape x impl x mode under ncu")
    p.add_argument("--shapes", default=None, help="driver: comma-separated subset of shapes")
    p.add_argument("--out", default="results", help="driver: output folder")
    p.add_argument("--ncu", default="ncu", help="driver: ncu executable")
    args = p.parse_args(argv)
    if args.all:
        return drive(args)
    if not (args.shape and args.impl and args.mode):
        p.error("give --shape, --impl and --mode, or --all")
    res = run_one(args.shape, args.impl, args.mode)
    if args.emit_json:
        print("RESULT " + json.dumps(res), flush=True)
    else:
        print(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
