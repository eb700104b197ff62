"""Host time of one KV-cache decoding step (GPU).

    python benchmarks/decode_host.py [--cache-lens 4096 16384] [--splits 0 1 2 4]

Shape of decode_bench.py (B=16, Hq=32, Hkv=8, d=128, bf16, contiguous cache,
check_indices=False).  For each cache length and split count it prints the
host time per call (200 calls issued without a sync), the time once the GPU
has drained them, and the do_bench median: where the first is above the
kernel's time, a step is host-bound.
"""
from __future__ import annotations

import argparse
import time

import torch
from triton.testing import do_bench

import tileattn


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache-lens", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--splits", type=int, nargs="+", default=[0, 1, 2, 4])
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args(argv)
    b, hq, hkv, d = 16, 32, 8, 128
    for n in a.cache_lens:
        q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        seqlens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        for s in a.splits:
            def fn():
                return tileattn.attention_with_kvcache(q, k, v, seqlens, num_splits=s, check_indices=False)
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.calls):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
            print(f"L={n} splits={s}: host {1e6 * (t1 - t0) / a.calls:.1f} us/call, "
                  f"host+drain {1e6 * (t2 - t0) / a.calls:.1f} us/call, do_bench {ms * 1e3:.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
