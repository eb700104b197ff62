"""Host cost of a backward that launches Triton kernels, run by autograd on its
device thread (the default for CUDA tensors) or on the calling thread
(``torch.autograd.set_multithreading_enabled(False)``), next to the same
launches made directly.  A cProfile of the backward body is taken on the
thread that runs it.

    python benchmarks/backward_thread.py
"""
from __future__ import annotations

import cProfile

import torch
import triton
import triton.language as tl

from tileattn import launch
from tileattn.bench.host import per_call_us, profile_text


@triton.jit
def _empty_kernel(X, n, BLOCK: tl.constexpr):
    pass


PROFILE: list = []


class _Bwd(torch.autograd.Function):
    """Identity forward; the backward runs ``work`` (and returns g)."""

    @staticmethod
    def forward(ctx, x, work):
        ctx.work = work
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        if PROFILE:
            PROFILE[0].enable()
            ctx.work()
            PROFILE[0].disable()
        else:
            ctx.work()
        return g, None


def main():
    q, k, v, do = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, lse = launch.attn_fwd(q, k, v, False, 0.125)
    x = torch.randn(16, device="cuda", requires_grad=True)
    works = {
        "nothing": lambda: None,
        "one empty triton kernel": lambda: _empty_kernel[(1,)](X=x, n=16, BLOCK=16),
        "launch.attn_bwd": lambda: launch.attn_bwd(do, q, k, v, o, lse, False, 0.125),
    }
    for name, work in works.items():
        step = lambda: _Bwd.apply(x, work).sum().backward()  # noqa: E731

        def same_thread():
            with torch.autograd.set_multithreading_enabled(False):
                _Bwd.apply(x, work).sum().backward()

        print(f"{name:26} direct {per_call_us(work):8.1f} us | autograd, device thread {per_call_us(step):8.1f} us"
              f" | autograd, this thread {per_call_us(same_thread):8.1f} us", flush=True)
    for label, fn in (("device thread", lambda: _Bwd.apply(x, works["launch.attn_bwd"]).sum().backward()),
                      ("this thread", None)):
        pr = cProfile.Profile()
        PROFILE[:] = [pr]
        for _ in range(300):
            if fn is None:
                with torch.autograd.set_multithreading_enabled(False):
                    _Bwd.apply(x, works["launch.attn_bwd"]).sum().backward()
            else:
                fn()
        torch.cuda.synchronize()
        PROFILE.clear()
        print(f"--- cProfile of launch.attn_bwd inside the backward, {label} (300 calls)")
        print(profile_text(pr, top=14, limit=3500))


if __name__ == "__main__":
    main()
