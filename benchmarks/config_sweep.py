"""Time every candidate config of each kernel at chosen shapes (GPU), the
evidence behind the tables in ``tileattn.configs``.

Forward configs are timed with ``triton.testing.do_bench``; the backward's
two kernels (dK/dV and dQ) are timed separately from a CUDA profiler trace
of ``launch.attn_bwd`` with one config forced per kernel.  Extra configs
not in the tables can be added as ``M128-N64-w8-s3``.

    python benchmarks/config_sweep.py --head-dim 128 --seqlen 2k 16k --causal both \
        --extra-fwd M128-N64-w8-s4 --extra-dkdv M64-N128-w8-s2
"""
from __future__ import annotations

import argparse
import json
import re
import sys

import torch
import triton

from tileattn import configs, launch
from tileattn.configs import KernelConfig
from tileattn.cost.io import attention_flops


def parse_config(name: str) -> KernelConfig:
    m = re.fullmatch(r"M(\d+)-N(\d+)-w(\d+)-s(\d+)", name)
    if not m:
        raise argparse.ArgumentTypeError(f"config must look like M128-N64-w8-s3, got {name!r}")
    return KernelConfig(*(int(x) for x in m.groups()), source="sweep")


def parse_n(s: str) -> int:
    return int(s[:-1]) * 1024 if s.lower().endswith("k") else int(s)


def kernel_times(fn, iters=10) -> dict:
    """Mean CUDA time per call (ms) of each kernel launched by ``fn``."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        if ev.device_type.name == "CUDA" or getattr(ev, "device_time_total", 0):
            t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            for kind in ("dkdv", "dq", "preprocess"):
                if kind in ev.key:
                    out[kind] = out.get(kind, 0.0) + t / 1000.0 / iters
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlen", type=parse_n, nargs="+", default=[2048, 16384])
    ap.add_argument("--causal", choices=["yes", "no", "both"], default="both")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--kinds", nargs="+", default=["fwd", "dkdv", "dq"])
    for kind in ("fwd", "dkdv", "dq"):
        ap.add_argument(f"--extra-{kind}", type=parse_config, nargs="*", default=[])
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    causals = {"yes": [True], "no": [False], "both": [False, True]}[args.causal]
    rows = []
    for d in args.head_dim:
        for n in args.seqlen:
            b, h = max(1, args.tokens // n), args.hidden // d
            q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            for causal in causals:
                scale = d ** -0.5
                fl = attention_flops(b, h, n, n, d, causal=causal, mode="fwd")
                o, lse = launch.attn_fwd(q, k, v, causal, scale)
                tag = f"d={d} N={n} causal={causal}"
                for kind in args.kinds:
                    cands = list(configs.candidates(kind, d)) + list(getattr(args, f"extra_{kind}"))
                    base = {c: configs.candidates(c, d)[0] for c in ("dkdv", "dq")}
                    for cfg in cands:
                        try:
                            if kind == "fwd":
                                ms = triton.testing.do_bench(lambda: launch.attn_fwd(q, k, v, causal, scale, config=cfg))
                                tf = fl / ms * 1e-9
                            else:
                                forced = dict(base, **{kind: cfg})
                                t = kernel_times(lambda: launch.attn_bwd(do, q, k, v, o, lse, causal, scale,
                                                                         config=forced))
                                ms = t.get(kind, float("nan"))
                                tf = float("nan")
                            rows.append(dict(d=d, n=n, causal=causal, kind=kind, config=cfg.name, ms=ms, tflops=tf))
                            print(f"{tag:28} {kind:5} {cfg.name:16} {ms:8.3f} ms {tf:7.1f} TFLOP/s", flush=True)
                        except Exception as e:  # report, go on
                            print(f"{tag:28} {kind:5} {cfg.name:16} FAILED {str(e)[:100]}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
