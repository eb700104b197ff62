"""Where a backward with attention sinks spends the time beyond the same call
without them: each GPU kernel's time (torch.profiler, mean over 20 steps),
the host time of one step (best of 20, launches only) and ``do_bench``
medians, plain and with sinks (the default call: the forward keeps its
output's rounding remainder), bf16, FA2 protocol (16k tokens, hidden 2048).

    python benchmarks/sinks_profile.py
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch
import triton
from torch.profiler import ProfilerActivity, profile

import tileattn

POINTS = [(128, True, 2048), (64, True, 2048), (128, True, 16384), (128, False, 2048)]   # (d, causal, N)


def backward_step(q, k, v, do, causal: bool, sinks: bool):
    """The time-able step: ``torch.autograd.grad`` through a graph built once."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    logits = torch.linspace(-2.0, 2.0, q.shape[1], device=q.device, requires_grad=True) if sinks else None
    out = tileattn.attention(*leaves, causal=causal, sinks=logits)
    return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)


def kernel_times(step, reps: int = 20) -> dict:
    """Kernel name (first 60 characters) -> mean GPU microseconds a step."""
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step()
        torch.cuda.synchronize()
    acc = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            acc[e.name[:60]] += e.device_time / reps
    return acc


def host_us(step, reps: int = 20) -> float:
    """The best host time of one step's launches (the GPU drained between)."""
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    torch.cuda.synchronize()
    return best * 1e6


def main():
    for d, causal, n in POINTS:
        b, h = 16384 // n, 2048 // d
        q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        for sinks in (False, True):
            step = backward_step(q, k, v, do, causal, sinks)
            ms = [triton.testing.do_bench(step, warmup=25, rep=200) for _ in range(3)]
            times = kernel_times(step)
            print(f"d={d} causal={int(causal)} N={n} sinks={int(sinks)}: do_bench {['%.3f' % m for m in ms]} ms, "
                  f"GPU kernels {sum(times.values()):.0f} us, host {host_us(step):.0f} us", flush=True)
            for name, us in sorted(times.items(), key=lambda kv: -kv[1]):
                print(f"    {us:8.1f} us  {name}")


if __name__ == "__main__":
    main()
