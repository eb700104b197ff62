"""Host-side cost of one call (GPU): a tiny problem, so that the time per
call is the Python/launch path, not the kernel.  Prints microseconds per
call for each layer of the stack and the top of a cProfile of the public
call.

    python benchmarks/host_overhead.py
"""
from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch
import torch.nn.functional as F

import tileattn
from tileattn import launch, ops


def per_call_us(fn, iters=2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def main():
    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    scale = 0.125
    o, lse = launch.attn_fwd(qd, kd, vd, False, scale)
    do = torch.randn_like(o)
    out = tileattn.attention(q, k, v)
    rows = {
        "sdpa flash fwd": lambda: F.scaled_dot_product_attention(qd, kd, vd),
        "tileattn.attention fwd (no grad)": lambda: tileattn.attention(qd, kd, vd),
        "ops.attention_fwd": lambda: ops.attention_fwd(qd, kd, vd, False, scale),
        "launch.attn_fwd": lambda: launch.attn_fwd(qd, kd, vd, False, scale),
        "launch.attn_bwd": lambda: launch.attn_bwd(do, qd, kd, vd, o, lse, False, scale),
        "tileattn fwd+bwd (autograd)": lambda: tileattn.attention(q, k, v).backward(do),
        "sdpa flash fwd+bwd (autograd)": lambda: F.scaled_dot_product_attention(q, k, v).backward(do),
    }
    for name, fn in rows.items():
        print(f"{name:36} {per_call_us(fn):8.1f} us/call", flush=True)
    for name, fn in (("forward", lambda: tileattn.attention(qd, kd, vd)),
                     ("forward+backward", lambda: tileattn.attention(q, k, v).backward(do))):
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(300):
            fn()
        torch.cuda.synchronize()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
        print(f"--- cProfile, {name} (300 calls)")
        print(s.getvalue()[:7000])


if __name__ == "__main__":
    main()
