"""Forward TFLOP/s of the Hopper kernel's configs beside the portable Triton
kernel and torch SDPA (cuDNN and FlashAttention-2 backends), providers
interleaved at every point: each round times every provider once, in a
rotated order, and the median over rounds is reported (clock drift hits all
alike).  FlashAttention-2 paper protocol: 16k tokens, hidden 2048, bf16.

    python benchmarks/hopper_fwd.py [--head-dim 64 128] [--seqlen 2048 ...] [--rounds 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton

import tileattn
from tileattn import launch, launch_hopper
from tileattn.configs import HopperFwdConfig
from tileattn.cost.io import attention_flops


def providers(head_dim: int) -> dict:
    def sdpa(backend):
        def fn(q, k, v, causal):
            with torch.nn.attention.sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return fn

    def portable(q, k, v, causal):
        launch_hopper.ENABLED = False
        try:
            return tileattn.attention(q, k, v, causal=causal)
        finally:
            launch_hopper.ENABLED = True

    def hopper(cfg):
        return lambda q, k, v, causal: launch.attn_fwd(q, k, v, causal, head_dim ** -0.5, config=cfg)[0]

    out = {"sdpa-cudnn": sdpa(torch.nn.attention.SDPBackend.CUDNN_ATTENTION),
           "sdpa-flash": sdpa(torch.nn.attention.SDPBackend.FLASH_ATTENTION),
           "portable": portable}
    variants = {64: [dict(num_stages=3), dict(num_stages=2), dict(num_stages=3, pingpong=False)],
                128: [dict(num_stages=2), dict(num_stages=3), dict(num_stages=2, pingpong=False),
                      dict(num_stages=2, overlap=False)]}
    for kw in variants.get(head_dim, [{}]):
        cfg = HopperFwdConfig(**kw)
        out[cfg.name] = hopper(cfg)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlen", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    rows = []
    for d in args.head_dim:
        provs = providers(d)
        for causal in map(bool, args.causal):
            for n in args.seqlen:
                b, h = max(1, 16384 // n), 2048 // d
                q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(3))
                ref = provs["sdpa-cudnn"](q, k, v, causal).float()
                times = {name: [] for name in provs}
                errs = {}
                for name, fn in provs.items():
                    errs[name] = float((fn(q, k, v, causal).float() - ref).abs().max())
                names = list(provs)
                for r in range(args.rounds):
                    order = names[r % len(names):] + names[:r % len(names)]
                    for name in order:
                        times[name].append(triton.testing.do_bench(lambda: provs[name](q, k, v, causal),
                                                                   warmup=25, rep=100))
                flops = attention_flops(b, h, n, n, d, causal=causal)
                base = statistics.median(times["sdpa-cudnn"])
                for name in names:
                    ms = statistics.median(times[name])
                    rows.append(dict(d=d, causal=causal, n=n, provider=name, ms=ms, tflops=flops / ms * 1e-9,
                                     vs_cudnn=base / ms, max_diff_vs_cudnn=errs[name], rounds=times[name]))
                line = "  ".join(f"{r['provider']}={r['tflops']:.0f}({r['vs_cudnn']:.3f}x,e{r['max_diff_vs_cudnn']:.0e})"
                                 for r in rows[-len(names):])
                print(f"d={d} causal={int(causal)} N={n}: {line}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
