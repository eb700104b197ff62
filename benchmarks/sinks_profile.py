"""Where a backward with attention sinks spends the time beyond the same call
without them: each GPU kernel's time (torch.profiler, mean over 20 steps),
the host time of one step (best of 20, launches only) and ``do_bench``
medians, plain and with sinks (the default call: the forward keeps its
output's rounding remainder), bf16, FA2 protocol (16k tokens, hidden 2048).

    python benchmarks/sinks_profile.py
    python benchmarks/sinks_profile.py --forward   # the forward alone: plain, sinks, sinks needing a gradient
    ncu --clock-control none --section WarpStateStats -k regex:attn_fwd_hopper --launch-skip 2 --launch-count 1 \
        python benchmarks/sinks_profile.py --forward --variant train --seqlen 16384 --calls 3   # one build under ncu

``--forward`` (perf-notes v59): d = 64 non-causal at 2k (the persistent
three-warpgroup build) and 16k (one program a tile), the forward kernel's
time with sinks that need no gradient and with sinks that do (the build
that also stores the output's rounding remainder) beside the plain call.
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
import triton
from torch.profiler import ProfilerActivity, profile

import tileattn

POINTS = [(128, True, 2048), (64, True, 2048), (128, True, 16384), (128, False, 2048)]   # (d, causal, N)
FORWARD_POINTS = [(64, False, 2048), (64, False, 16384)]


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


def forward_step(q, k, v, causal: bool, sinks: str):
    """A forward call: ``sinks`` "none", "infer" (no gradient) or "train"
    (a gradient to come: the forward keeps its output's remainder)."""
    def step():
        if sinks == "none":
            return tileattn.attention(q, k, v, causal=causal)
        logits = torch.linspace(-2.0, 2.0, q.shape[1], device=q.device, requires_grad=sinks == "train")
        return tileattn.attention(q, k, v, causal=causal, sinks=logits)
    return step


def forward_main():
    for d, causal, n in FORWARD_POINTS:
        b, h = 16384 // n, 2048 // d
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for sinks in ("none", "infer", "train"):
            times = kernel_times(forward_step(q, k, v, causal, sinks))
            fwd = {name: us for name, us in times.items() if "fwd" in name}
            print(f"d={d} causal={int(causal)} N={n} sinks={sinks}: forward kernel "
                  + ", ".join(f"{name} {us:.1f} us" for name, us in fwd.items())
                  + f"; all kernels {sum(times.values()):.1f} us", flush=True)


def forward_calls(variant: str, n: int, calls: int) -> None:
    """``calls`` forward calls of one variant at d = 64 non-causal, N = ``n``,
    nothing else launched between them (for a profiler that picks launches)."""
    q, k, v = (torch.randn(16384 // n, 32, n, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    step = forward_step(q, k, v, False, variant)
    for _ in range(calls):
        step()
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--forward", action="store_true", help="the forward alone (plain, sinks, sinks with a gradient)")
    ap.add_argument("--variant", choices=("none", "infer", "train"), default=None,
                    help="with --forward: only run --calls calls of this variant (no timing; for ncu)")
    ap.add_argument("--seqlen", type=int, default=16384, help="with --variant: N (batch 16384 / N, 32 heads)")
    ap.add_argument("--calls", type=int, default=3, help="with --variant: calls to run")
    args = ap.parse_args()
    if args.variant is not None and not args.forward:
        ap.error("--variant needs --forward")
    if args.forward:
        return forward_main() if args.variant is None else forward_calls(args.variant, args.seqlen, args.calls)
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
