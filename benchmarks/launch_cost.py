"""Unprofiled host cost of each stage of one forward launch (GPU), on a tiny
problem: the launcher's own Python, Triton's argument binder, its cache-key
step, the driver wrapper (tensor-descriptor encoding) and the launch itself.
Tight loops of many calls, no profiler, so the numbers are the real ones.

    python benchmarks/launch_cost.py
"""
from __future__ import annotations

import torch
import triton

import tileattn
from tileattn import launch
from tileattn.bench.host import per_call_us


def main():
    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = 0.125
    launch.attn_fwd(q, k, v, False, scale)
    captured = {}
    real_launch = launch._launch

    def capture(kind, kernel, grid_of, config, interpreter_cfg, **args):
        captured[kind] = (kernel, grid_of, args)
        return real_launch(kind, kernel, grid_of, config, interpreter_cfg, **args)

    launch._launch = capture
    launch.attn_fwd(q, k, v, False, scale)
    launch._launch = lambda *a, **kw: None
    rows = {"launch.attn_fwd without the kernel call": lambda: launch.attn_fwd(q, k, v, False, scale)}
    launch._launch = real_launch
    kernel, grid_of, args = captured["fwd"]
    key = next(kk for kk in launch._TUNED_CHOICE if kk[0] == "fwd")
    meta_, options = launch._TUNED_CHOICE[key]
    meta = {**meta_, **options}
    grid = grid_of(meta)
    kw = {**args, **meta}
    device = triton.runtime.driver.active.get_current_device()
    kernel_cache, key_cache, target, backend, binder = kernel.device_caches[device]
    full = dict(kw, debug=False, instrumentation_mode=triton.knobs.compilation.instrumentation_mode)
    bound, spec, options = binder(**full)
    from triton.runtime.jit import compute_cache_key
    compiled = kernel[grid](**kw)          # JITFunction.run returns the compiled kernel
    stream = triton.runtime.driver.active.get_current_stream(device)
    values = list(bound.values())

    def direct():
        compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, None,
                     None, None, *values)

    def regular():
        saved = launch._direct_enabled
        launch._direct_enabled = lambda: False
        launch.attn_fwd(q, k, v, False, scale)
        launch._direct_enabled = saved

    rows["launch.attn_fwd (all), regular launches"] = regular
    rows.update({
        "launch.attn_fwd (all)": lambda: launch.attn_fwd(q, k, v, False, scale),
        "tileattn.attention fwd (no grad)": lambda: tileattn.attention(q, k, v),
        "launch._launch (hook, tuned lookup, kernel call)": lambda: real_launch("fwd", kernel, grid_of, None, None,
                                                                               **args),
        "kernel[grid](**kw) (JITFunction.run)": lambda: kernel[grid](**kw),
        "binder(**kw)": lambda: binder(**full),
        "compute_cache_key": lambda: compute_cache_key(key_cache, spec, options),
        "compiled.run(...) direct (driver wrapper + launch)": direct,
        "get_current_device + stream": lambda: triton.runtime.driver.active.get_current_stream(
            triton.runtime.driver.active.get_current_device()),
    })
    print(f"{len(kw)} keyword arguments, {len(values)} bound, "
          f"{sum(1 for s in spec if s[0] != 'constexpr')} specialised")
    for name, fn in rows.items():
        print(f"{name:52} {per_call_us(fn, iters=3000, warmup=100):8.1f} us/call", flush=True)
    # the direct launch writes the same output as the regular one
    o_ref = args["O"] if isinstance(args["O"], torch.Tensor) else args["O"].base
    kernel[grid](**kw)
    torch.cuda.synchronize()
    ref = o_ref.clone()
    o_ref.fill_(float("nan"))
    direct()
    torch.cuda.synchronize()
    print("direct launch output equal:", bool(torch.equal(ref, o_ref)))


if __name__ == "__main__":
    main()
