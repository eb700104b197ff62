"""Host-side cost of one call (GPU): a tiny problem, so that the time per
call is the Python/launch path, not the kernel.  Prints microseconds per
call for each layer of the stack and the top of a cProfile of the public
call.

    python benchmarks/host_overhead.py [--trace DIR] [--no-cprofile]

Besides the public calls it times the pieces of a forward+backward step apart:
the launchers back to back without autograd, an identity autograd.Function
(the engine's own cost), the step with the backward run on the calling thread
(``torch.autograd.set_multithreading_enabled(False)``), and an empty Triton
kernel launch.  ``--trace DIR`` writes a torch.profiler trace of a few steps
(CPU activity of every thread, with Python stacks).
"""
from __future__ import annotations

import argparse
import cProfile
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import tileattn
from tileattn import launch, ops
from tileattn.bench.host import per_call_us, profile_text


@triton.jit
def _empty_kernel(X, n, BLOCK: tl.constexpr):
    pass


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", help="directory for a torch.profiler trace of five forward+backward steps")
    ap.add_argument("--no-cprofile", action="store_true")
    args = ap.parse_args()
    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    scale = 0.125
    o, lse = launch.attn_fwd(qd, kd, vd, False, scale)
    do = torch.randn_like(o)
    out = tileattn.attention(q, k, v)
    x = torch.randn(16, device="cuda", requires_grad=True)
    gx = torch.ones_like(x)

    def launchers_only():
        o2, lse2 = launch.attn_fwd(qd, kd, vd, False, scale)
        launch.attn_bwd(do, qd, kd, vd, o2, lse2, False, scale)

    def on_calling_thread():
        with torch.autograd.set_multithreading_enabled(False):
            tileattn.attention(q, k, v).backward(do)

    rows = {
        "empty triton kernel launch": lambda: _empty_kernel[(1,)](X=x, n=16, BLOCK=16),
        "identity autograd.Function fwd+bwd": lambda: _Identity.apply(x).backward(gx),
        "launch.attn_fwd + attn_bwd (no autograd)": launchers_only,
        "tileattn fwd+bwd (backward on this thread)": on_calling_thread,
        "sdpa flash fwd": lambda: F.scaled_dot_product_attention(qd, kd, vd),
        "tileattn.attention fwd (no grad)": lambda: tileattn.attention(qd, kd, vd),
        "ops.attention_fwd": lambda: ops.attention_fwd(qd, kd, vd, False, scale),
        "launch.attn_fwd": lambda: launch.attn_fwd(qd, kd, vd, False, scale),
        "launch.attn_bwd": lambda: launch.attn_bwd(do, qd, kd, vd, o, lse, False, scale),
        "tileattn fwd+bwd (autograd)": lambda: tileattn.attention(q, k, v).backward(do),
        "sdpa flash fwd+bwd (autograd)": lambda: F.scaled_dot_product_attention(q, k, v).backward(do),
    }
    for name, fn in rows.items():
        print(f"{name:44} {per_call_us(fn):8.1f} us/call", flush=True)
    if args.trace:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
            for _ in range(5):
                tileattn.attention(q, k, v).backward(do)
            torch.cuda.synchronize()
        Path(args.trace).mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(Path(args.trace) / "host_trace.json"))
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    if args.no_cprofile:
        return
    for name, fn in (("forward", lambda: tileattn.attention(qd, kd, vd)),
                     ("forward+backward", lambda: tileattn.attention(q, k, v).backward(do))):
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(300):
            fn()
        torch.cuda.synchronize()
        pr.disable()
        print(f"--- cProfile, {name} (300 calls)")
        print(profile_text(pr))


if __name__ == "__main__":
    main()
