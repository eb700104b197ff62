"""Where the time of a sliding-window or block-sparse call goes (GPU): host
time per call, do_bench, and torch.profiler's table of the ops and kernels.

    python benchmarks/floor_profile.py

B=1, H=16, d=128, bf16, autotuning off (the tables' first fitting config).
A call whose host time is close to its do_bench time is host-bound; the
profiler's table then shows what the host spends it on.
"""
from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TILEATTN_AUTOTUNE", "0")

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import tileattn  # noqa: E402
from tileattn.block_mask import BLOCK_K, BLOCK_Q  # noqa: E402

H, D = 16, 128


def case(name, n, density=None, **kw):
    q, k, v = (torch.randn(1, H, n, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    if density is not None:
        gen = torch.Generator().manual_seed(0)
        kw["block_mask"] = (torch.rand(1, H, -(-n // BLOCK_Q), -(-n // BLOCK_K), generator=gen) < density).cuda()

    def fn():
        return tileattn.attention(q, k, v, **kw)
    with torch.no_grad():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        ms = do_bench(fn, warmup=10, rep=50, return_mode="median")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
    print(f"==== {name} N={n}: host {1e3 * (t1 - t0) / 50:.3f} ms/call, host+drain {1e3 * (t2 - t0) / 50:.3f} "
          f"ms/call, do_bench {ms:.3f} ms")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
    sys.stdout.flush()


def main() -> int:
    case("plain causal", 16384, causal=True)
    case("window 256", 16384, causal=True, window=(256, 0))
    case("window 256", 4096, causal=True, window=(256, 0))
    case("window 1024", 16384, causal=True, window=(1024, 0))
    case("dense", 16384)
    case("block-sparse 0.2", 16384, density=0.2)
    case("block-sparse 1.0", 16384, density=1.01)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
