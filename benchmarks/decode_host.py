"""Host time of one KV-cache decoding step (GPU).

    python benchmarks/decode_host.py [--cache-lens 4096 16384] [--splits 0 1 2 4] [--append] [--stages]

Shape of decode_bench.py (B=16, Hq=32, Hkv=8, d=128, bf16, contiguous cache,
check_indices=False).  For each cache length and split count it prints the
host time per call (200 calls issued without a sync), the time once the GPU
has drained them, and the do_bench median: where the first is above the
kernel's time, a step is host-bound.  ``--stages`` then also times the
parts of a step's host path on its own (the call key, the validation a
first call runs, the launcher with its plan replay, the output
allocations) and prints a cProfile of 200 steps, sorted by own time.
``--append``: each step also appends one token (k_new/v_new), as a
decoding loop does.
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
    ap.add_argument("--stages", action="store_true", help="also time the host path's parts and profile it")
    ap.add_argument("--append", action="store_true",
                    help="steps append one new token (k_new/v_new) as a decoding loop does")
    a = ap.parse_args(argv)
    b, hq, hkv, d = 16, 32, 8, 128
    for n in a.cache_lens:
        q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        seqlens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        for s in a.splits:
            new = {}
            if a.append:   # every step writes the same position (the lengths do not advance)
                new = dict(k_new=torch.randn(b, hkv, 1, d, device="cuda", dtype=torch.bfloat16))
                new["v_new"] = torch.randn_like(new["k_new"])
                seqlens = torch.full((b,), n - 1, dtype=torch.int32, device="cuda")

            def fn():
                return tileattn.attention_with_kvcache(q, k, v, seqlens, num_splits=s, check_indices=False, **new)
            host, drained = host_us(fn, a.calls)
            ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
            print(f"L={n} splits={s}{' append' if a.append else ''}: host {host:.1f} us/call, host+drain {drained:.1f} us/call, "
                  f"do_bench {ms * 1e3:.1f} us", flush=True)
            if a.stages:
                stages(q, k, v, seqlens, s, a.calls, **new)
    return 0


def host_us(fn, calls: int) -> tuple[float, float]:
    """Microseconds per call of ``fn`` issued ``calls`` times without a sync:
    on the host, and until the GPU has drained them."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return 1e6 * (t1 - t0) / calls, 1e6 * (t2 - t0) / calls


def stages(q, k, v, seqlens, num_splits: int, calls: int, k_new=None, v_new=None) -> None:
    """The host path of one step in parts, then a profile of whole steps."""
    import cProfile
    import pstats

    from tileattn import decode, launch, launch_decode
    n, d = k.shape[2], q.shape[3]
    n_new = 0 if k_new is None else k_new.shape[2]
    args = (q, k, v, seqlens, k_new, v_new, None, True, None, None, None, None, num_splits, False, False)
    key = decode._call_key(*args)
    launcher = dict(n_new=n_new, capacity=n, scale=d ** -0.5, window=(-1, 0), num_splits=num_splits,
                    k_new=k_new, v_new=v_new)
    parts = {
        "call key (decode._call_key)": lambda: decode._call_key(*args),
        "validate (first call of a key only)": lambda: decode._validate(*args),
        "launcher, plan replay by call key": lambda: launch_decode.kvcache_attention(
            q, k, v, seqlens, None, **launcher, call_key=key),
        "launcher, plan replay by tensors": lambda: launch_decode.kvcache_attention(q, k, v, seqlens, None, **launcher),
        "plan key from the tensors": lambda: launch._plan_key("decode", (q, k, v, seqlens, None, None, k_new, v_new),
                                                              n_new, n, d ** -0.5, (-1, 0), None, num_splits, None,
                                                              False),
        "two output allocations": lambda: (torch.empty_like(q),
                                           torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)),
    }
    for name, fn in parts.items():
        print(f"    {name}: {host_us(fn, calls)[0]:.1f} us/call", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        tileattn.attention_with_kvcache(q, k, v, seqlens, num_splits=num_splits, check_indices=False,
                                        k_new=k_new, v_new=v_new)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    raise SystemExit(main())
