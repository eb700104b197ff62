"""tileattn's CPU path beside torch's CPU SDPA: forward and forward+backward,
float32, B = 1, d = 64, causal and not, timed in turn within every repeat
(medians), so a machine whose load changes slows both alike.  At N = 1k the
tiled PyTorch implementation (what runs the variants) is timed too.

    python benchmarks/cpu_path.py [--seqlens 1024 4096] [--heads 4 8] [--repeats 7] [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import tileattn
from tileattn import dispatch


def _tiled(q, k, v, causal):
    fused, dispatch.cpu_fused_applies = dispatch.cpu_fused_applies, (lambda *a, **kw: False)
    try:
        return tileattn.attention(q, k, v, causal=causal)
    finally:
        dispatch.cpu_fused_applies = fused


def _seconds(fn, inputs, dout) -> float:
    t0 = time.perf_counter()
    out = fn()
    if dout is not None:
        torch.autograd.grad(out, inputs, dout)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--heads", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tiled-up-to", type=int, default=1024, help="time the tiled path at N <= this")
    ap.add_argument("--out", default=None, help="JSON file for the rows")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.repeats} interleaved repeats, "
          f"medians; float32, B=1, d={args.head_dim}", flush=True)
    rows = []
    for n in args.seqlens:
        for h in args.heads:
            for causal in (False, True):
                for mode in ("fwd", "fwd+bwd"):
                    bwd = mode == "fwd+bwd"
                    q, k, v = (torch.randn(1, h, n, args.head_dim, requires_grad=bwd) for _ in range(3))
                    dout = torch.randn(1, h, n, args.head_dim) if bwd else None
                    impls = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                             "tileattn": lambda: tileattn.attention(q, k, v, causal=causal)}
                    if n <= args.tiled_up_to:
                        impls["tiled"] = lambda: _tiled(q, k, v, causal)
                    times = {name: [] for name in impls}
                    with torch.set_grad_enabled(bwd):
                        for fn in impls.values():
                            _seconds(fn, (q, k, v), dout)  # warm-up
                        for _ in range(args.repeats):
                            for name, fn in impls.items():
                                times[name].append(_seconds(fn, (q, k, v), dout))
                    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
                    row = {"seqlen": n, "heads": h, "head_dim": args.head_dim, "causal": causal, "mode": mode,
                           **{f"{name}_ms": round(m, 3) for name, m in ms.items()},
                           "tileattn_speed_vs_sdpa": round(ms["sdpa"] / ms["tileattn"], 3)}
                    rows.append(row)
                    tiled = f"   tiled path {ms['tiled']:9.2f} ms ({ms['sdpa'] / ms['tiled']:.2f}x)" if "tiled" in ms else ""
                    print(f"N={n:5} H={h} {'causal' if causal else 'full  '} {mode:7}  sdpa {ms['sdpa']:9.2f} ms  "
                          f"tileattn {ms['tileattn']:9.2f} ms  speed vs sdpa {row['tileattn_speed_vs_sdpa']:.3f}{tiled}",
                          flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "repeats": args.repeats,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
