"""Superseded by ``tileattn bench``; kept because it produced
docs/results/h200/compare_sdpa_v2.json (the v1 numbers in docs/perf-notes.md).

tileattn beside PyTorch SDPA's backends and standard attention, one process,
FlashAttention-2 protocol (bf16, 16k tokens: batch = 16384 / N, heads = 2048 / d).

    python benchmarks/compare_sdpa.py [--head-dims 64 128] [--seqlens 512 ... 16384] [--out DIR]

Timing: triton.testing.do_bench medians (warm-up included).  TFLOP/s from the
cost model's one FLOP formula (causal counts the visible half).  Each
provider's output is checked against tileattn's on the first point of every
configuration (relative error printed; a wrong kernel cannot win silently).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import tileattn
from tileattn.cost.io import attention_flops
from tileattn.reference import standard_attention


def _sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
          "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

    def fn(q, k, v, causal):
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return fn


PROVIDERS = {
    "tileattn": lambda q, k, v, causal: tileattn.attention(q, k, v, causal=causal),
    "sdpa-flash": _sdpa("flash"),
    "sdpa-cudnn": _sdpa("cudnn"),
    "standard": lambda q, k, v, causal: standard_attention(q, k, v, causal=causal),
}


def bench_point(name, fn, b, h, n, d, causal, mode, ref=None):
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    try:
        if mode == "fwd":
            with torch.no_grad():
                out = fn(q, k, v, causal)
                ms = do_bench(lambda: fn(q, k, v, causal), warmup=50, rep=200, return_mode="median")
        else:
            for t in (q, k, v):
                t.requires_grad_(True)
            out = fn(q, k, v, causal)
            do = torch.randn_like(out)
            ms = do_bench(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True),
                          warmup=50, rep=200, return_mode="median")
    except Exception as e:  # report the provider as failed, do not drop it
        return {"status": f"failed: {type(e).__name__}: {str(e)[:80]}"}
    res = {"status": "ok", "ms": ms}
    flops = attention_flops(b, h, n, n, d, causal=causal, mode=mode)
    res["tflops"] = flops / ms / 1e9
    if ref is not None:
        res["rel_err_vs_tileattn"] = float((out.float() - ref.float()).norm() / ref.float().norm())
    return res, out.detach()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--modes", nargs="+", default=["fwd", "bwd"])
    ap.add_argument("--providers", nargs="+", default=list(PROVIDERS))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = []
    for d in args.head_dims:
        for causal in (False, True):
            for mode in args.modes:
                for i, n in enumerate(args.seqlens):
                    b, h = max(1, 16384 // n), 2048 // d
                    ref = None
                    for p in args.providers:
                        if p == "standard" and n > 8192:
                            rows.append(dict(provider=p, d=d, causal=causal, mode=mode, n=n, status="skipped: memory"))
                            continue
                        r = bench_point(p, PROVIDERS[p], b, h, n, d, causal, mode, ref if i == 0 else None)
                        if isinstance(r, tuple):
                            r, out = r
                            if p == "tileattn":
                                ref = out
                        rows.append(dict(provider=p, d=d, causal=causal, mode=mode, n=n, batch=b, heads=h, **r))
                        torch.cuda.empty_cache()
                    line = " ".join(f"{r['provider']}={r.get('tflops', float('nan')):6.1f}"
                                    for r in rows if r["d"] == d and r["causal"] == causal and r["mode"] == mode
                                    and r["n"] == n)
                    print(f"d{d} {'causal' if causal else 'full  '} {mode} N={n:5d}: {line}", flush=True)
    # ratios tileattn / sdpa-flash
    print("\nratio tileattn / sdpa-flash and / sdpa-cudnn (TFLOP/s, same run):")
    for d in args.head_dims:
        for causal in (False, True):
            for mode in args.modes:
                parts = []
                for n in args.seqlens:
                    sel = {r["provider"]: r for r in rows if r["d"] == d and r["causal"] == causal
                           and r["mode"] == mode and r["n"] == n}
                    t, f, c = (sel.get(p, {}).get("tflops") for p in ("tileattn", "sdpa-flash", "sdpa-cudnn"))
                    parts.append(f"{n}:{t / f if t and f else float('nan'):.2f}/{t / c if t and c else float('nan'):.2f}")
                print(f"  d{d} {'causal' if causal else 'full  '} {mode}: " + " ".join(parts))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                "triton": __import__("triton").__version__}
        with open(os.path.join(args.out, "compare_sdpa.json"), "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
