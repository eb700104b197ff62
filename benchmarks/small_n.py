"""Small N (GPU): is a call host-bound or GPU-bound?  For the FA2 protocol's
short sequences (16k tokens, hidden 2048, bf16) it times each call eagerly
(``triton.testing.do_bench``: host and GPU) and replayed from a CUDA graph
(``do_bench_cudagraph``: GPU only), for tileattn and SDPA's flash backend.
When the eager time is well above the graph time, the host sets the pace.

    python benchmarks/small_n.py [--seqlens 512 1024] [--head-dims 64 128]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench, do_bench_cudagraph

import tileattn
from tileattn import launch
from tileattn.cost import attention_flops


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    args = ap.parse_args()
    print(f"{'d':>4} {'N':>5} {'causal':>6} {'what':<28} {'eager ms':>9} {'graph ms':>9} {'TFLOP/s eager/graph':>20}")
    for d in args.head_dims:
        for n in args.seqlens:
            b, h = 16384 // n, 2048 // d
            q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            scale = d ** -0.5
            for causal in (False, True):
                o, lse = launch.attn_fwd(q, k, v, causal, scale)

                def flash():
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                calls = {
                    "tileattn.attention fwd": (lambda: tileattn.attention(q, k, v, causal=causal), "fwd"),
                    "sdpa-flash fwd": (flash, "fwd"),
                    "tileattn launchers fwd+bwd": (lambda: launch.attn_bwd(do, q, k, v, *launch.attn_fwd(
                        q, k, v, causal, scale), causal, scale), "fwd_bwd"),
                    "tileattn launcher bwd": (lambda: launch.attn_bwd(do, q, k, v, o, lse, causal, scale), "bwd"),
                }
                for name, (fn, mode) in calls.items():
                    fn()
                    torch.cuda.synchronize()
                    eager = do_bench(fn, warmup=25, rep=100)
                    try:
                        graph = do_bench_cudagraph(fn, rep=100)
                    except Exception as e:  # a call that cannot be captured
                        graph = float("nan")
                        print("   (no graph:", type(e).__name__, str(e)[:80], ")")
                    fl = attention_flops(b, h, n, n, d, causal=causal, mode=mode)
                    print(f"{d:>4} {n:>5} {str(causal):>6} {name:<28} {eager:9.4f} {graph:9.4f} "
                          f"{fl / eager / 1e9:9.0f} / {fl / graph / 1e9:.0f}", flush=True)


if __name__ == "__main__":
    main()
