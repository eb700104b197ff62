"""Host time against GPU time of short calls: where a call of 512-2k keys is
bound.  For each point (bf16, FA2 protocol: 16k tokens, hidden 2048) and
provider it prints the best host time of one step with the GPU drained
(launches only), the GPU kernels' time of a step (torch.profiler) and the
``do_bench`` median over rounds interleaved as in ``tileattn bench``, with
the ratio to SDPA-cuDNN.  Providers: SDPA cuDNN, tileattn's default call and,
``--before``, the same call on the host path before v25 (the Hopper
descriptors' shared layouts built at every launch, the Hopper kernels
launched through Gluon's own binding, no Hopper launch plans:
:func:`before_v25`).

    python benchmarks/host_cost.py [--mode bwd|fwd] [--points 128:8:1:2048 ...] [--rounds 3] [--before]

A point is ``d:group:causal:N``.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics

import torch
import triton
from sinks_profile import host_us, kernel_times

import tileattn
from tileattn.bench.runner import round_orders
from tileattn.cost.io import attention_flops
from tileattn.launch import hopper_descriptors, runtime

POINTS = ["128:8:1:512", "128:8:1:1024", "128:8:1:2048", "128:4:1:2048", "128:1:1:2048", "64:1:1:2048"]


@contextlib.contextmanager
def before_v25(on: bool):
    """The host path before v25: the Hopper descriptors' shared layouts built
    again at every descriptor, the Hopper kernels launched through Gluon's
    ``kernel[grid](...)`` (argument binding and cache key every call) rather
    than ``launch.runtime.run``'s direct launches, and no launch plans for
    the Hopper calls (``launch.hopper_calls``)."""
    if not on:
        yield
        return
    cached, run, plan_key = runtime.shared_layout, runtime.run, runtime.plan_key
    from tileattn.kernels.bwd_hopper import _attn_bwd_hopper_kernel
    from tileattn.kernels.bwd_hopper_wide import _attn_bwd_hopper_wide_kernel
    from tileattn.kernels.fwd_hopper import _attn_fwd_hopper_kernel
    gluon = {_attn_fwd_hopper_kernel, _attn_bwd_hopper_kernel, _attn_bwd_hopper_wide_kernel}

    def old_run(kernel, grid, options, args):
        if kernel in gluon:
            kernel[grid](**args, **options)
        else:
            run(kernel, grid, options, args)
    def no_hopper_plans(kind, *args):
        return None if kind.startswith("hopper") else plan_key(kind, *args)
    runtime.shared_layout = hopper_descriptors.shared_layout = cached.__wrapped__
    runtime.run, runtime.plan_key = old_run, no_hopper_plans
    try:
        yield
    finally:
        runtime.shared_layout = hopper_descriptors.shared_layout = cached
        runtime.run, runtime.plan_key = run, plan_key


def _sdpa(q, k, v, causal):
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                enable_gqa=k.shape[1] != q.shape[1])


def _tileattn(q, k, v, causal):
    return tileattn.attention(q, k, v, causal=causal)


def step_of(mode: str, fn, q, k, v, do, causal: bool):
    if mode == "fwd":
        return lambda: fn(q, k, v, causal)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves, causal)
    return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("fwd", "bwd"), default="bwd")
    ap.add_argument("--points", nargs="+", default=POINTS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", action="store_true", help="also tileattn on the host path before v25")
    args = ap.parse_args()
    providers = {"sdpa-cudnn": (_sdpa, False), "tileattn": (_tileattn, False)}
    if args.before:
        providers["tileattn-before"] = (_tileattn, True)
    for point in args.points:
        d, group, causal, n = (int(x) for x in point.split(":"))
        causal = bool(causal)
        b, hq = 16384 // n, 2048 // d
        q, do = (torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(b, hq // group, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        steps, host, gpu = {}, {}, {}
        for name, (fn, before) in providers.items():
            step = step_of(args.mode, fn, q, k, v, do, causal)

            def wrapped(step=step, before=before):
                with before_v25(before):
                    return step()
            steps[name] = wrapped
            host[name] = host_us(wrapped)
            gpu[name] = sum(kernel_times(wrapped).values())
        times = {name: [] for name in steps}
        for order in round_orders(list(steps), args.rounds):
            for name in order:
                times[name].append(triton.testing.do_bench(steps[name], warmup=25, rep=100))
        flops = attention_flops(b, hq, n, n, d, causal=causal, mode=args.mode)
        base = statistics.median(times["sdpa-cudnn"])
        for name in steps:
            ms = statistics.median(times[name])
            print(f"{args.mode} d={d} group={group} causal={int(causal)} N={n} {name:18s} host {host[name]:7.0f} us  "
                  f"GPU {gpu[name]:7.0f} us  do_bench {ms * 1e3:7.0f} us  {flops / ms / 1e9:6.1f} TFLOP/s  "
                  f"x{base / ms:.3f}  rounds {[round(t * 1e3) for t in times[name]]}", flush=True)


if __name__ == "__main__":
    main()
