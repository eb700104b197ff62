"""tileattn beside FlexAttention and each SDPA backend at the head dims of
today's open models: QK 192 / V 128 (MLA training and prefill), 256 and 512
(Gemma), forward or backward, providers interleaved at every point (each
round times every provider once, rotated, odd rounds reversed; medians over rounds).
A provider that refuses a shape (SDPA's flash backend above 256, a kernel
out of shared memory) is reported as refused with its error, not dropped.

    python benchmarks/head_dims.py [--mode fwd|bwd] [--shapes 192x128 256x256 512x512]
                                   [--seqlen 4096 16384] [--causal 0 1] [--heads 16]
                                   [--tokens 16384] [--rounds 3] [--providers ...] [--json out.json]

``tileattn-portable`` (on request only) is tileattn with its Hopper kernels
turned off: the two beside each other say where the dispatch should switch.
``tileattn-one-by-one`` (on request only): the Hopper kernels' causal grids
one (row, batch) pair after another (``group_rows=1``, before v34).

TFLOP/s by ``tileattn.cost.attention_flops`` (with ``head_dim_v``); ratios
are against FlexAttention measured in the same run: its default tiles, or
above head dim 256, where those do not fit, ``flex-small`` (``FLEX_SMALL``).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics

import torch

import tileattn
from tileattn import configs, dispatch
from tileattn.cost.flops import attention_flops
from vs_cudnn import time_interleaved, write_json  # this folder is on sys.path when run as a script


# FlexAttention's tiles for head dims above 256, where its default ones
# need more shared memory than a Hopper block has (the forward's 262,144 B
# at d = 512): the smallest its block masks allow, one stage
FLEX_SMALL = {"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1,
              "BLOCK_M1": 16, "BLOCK_N1": 32, "BLOCK_M2": 32, "BLOCK_N2": 16}


def providers() -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    flex = torch.compile(flex_attention, dynamic=False)
    masks = {}

    def flex_with(options):
        def call(q, k, v, causal):
            kw = {} if options is None else {"kernel_options": options}
            if not causal:
                return flex(q, k, v, **kw)
            key = (q.shape[2], k.shape[2], q.device)
            if key not in masks:
                masks[key] = create_block_mask(lambda b, h, i, j: i >= j, None, None, q.shape[2], k.shape[2],
                                               device=q.device)
            return flex(q, k, v, block_mask=masks[key], **kw)
        return call

    def sdpa(backend):
        def fn(q, k, v, causal):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return fn

    return {"flex": flex_with(None), "flex-small": flex_with(FLEX_SMALL),
            "tileattn": lambda q, k, v, causal: tileattn.attention(q, k, v, causal=causal),
            "tileattn-portable": lambda q, k, v, causal: tileattn.attention(q, k, v, causal=causal),
            "tileattn-one-by-one": lambda q, k, v, causal: tileattn.attention(q, k, v, causal=causal),
            "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
            "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
            "sdpa-efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION)}


# providers on request only that run the default call on changed tables: (dims, config) -> config
TABLE_VARIANTS = {
    # the Hopper kernels' causal grids one (row, batch) pair's blocks after another (before perf-notes v34)
    "tileattn-one-by-one": lambda dims, c: dataclasses.replace(c, group_rows=1),
}


@contextlib.contextmanager
def _tables(name: str):
    """The Hopper forward and backward tables as ``TABLE_VARIANTS[name]``
    makes them while the block runs (unchanged for any other provider)."""
    saved = [(table, dict(table)) for table in (configs.HOPPER_FWD, configs.HOPPER_BWD)]
    if name in TABLE_VARIANTS:
        for table, entries in saved:
            table.update({dims: TABLE_VARIANTS[name](dims, c) for dims, c in entries.items()})
    try:
        yield
    finally:
        for table, entries in saved:
            table.update(entries)


@contextlib.contextmanager
def _portable(on: bool):
    """With ``on``: tileattn's Hopper kernels off (``dispatch.HOPPER_FWD`` /
    ``HOPPER_BWD``), so the call runs the portable kernels, as it would
    where the Hopper ones do not apply; this sets where the dispatch
    switches (``configs.HOPPER_FWD_MIN_KEYS``)."""
    saved = dispatch.HOPPER_FWD, dispatch.HOPPER_BWD
    if on:
        dispatch.HOPPER_FWD = dispatch.HOPPER_BWD = False
    try:
        yield
    finally:
        dispatch.HOPPER_FWD, dispatch.HOPPER_BWD = saved


def _step(name, fn, q, k, v, do, causal, mode):
    portable = name == "tileattn-portable"
    if mode == "fwd":
        def fwd():
            with _portable(portable), _tables(name):
                return fn(q, k, v, causal)
        return fwd
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with _portable(portable):
        out = fn(*leaves, causal)

    def bwd():
        with _portable(portable), _tables(name):
            return torch.autograd.grad(out, leaves, do, retain_graph=True)
    return bwd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--shapes", nargs="+", default=["192x128", "256x256", "512x512"])
    ap.add_argument("--seqlen", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16384, help="batch = tokens // seqlen")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--providers", nargs="+", default=None,
                    help="time only these (default: all but tileattn-portable); flex or flex-small is the ratios' base")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    provs = providers()
    wanted = args.providers or [name for name in provs if name != "tileattn-portable" and name not in TABLE_VARIANTS]
    unknown = sorted(set(wanted) - set(provs))
    if unknown:
        ap.error(f"--providers: unknown {unknown}; known: {sorted(provs)}")
    provs = {name: fn for name, fn in provs.items() if name in wanted}
    rows = []
    for shape in args.shapes:
        d, dv = (int(x) for x in shape.split("x"))
        for causal in map(bool, args.causal):
            for n in args.seqlen:
                b, h = max(1, args.tokens // n), args.heads
                q, k = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(2))
                v = torch.randn(b, h, n, dv, device="cuda", dtype=dtype)
                do = torch.randn(b, h, n, dv, device="cuda", dtype=dtype)
                steps, refused, outs = {}, {}, {}
                for name, fn in provs.items():
                    if name == "flex-small" and d <= 256:   # its default tiles fit there
                        continue
                    try:
                        step = _step(name, fn, q, k, v, do, causal, args.mode)
                        res = step()
                        torch.cuda.synchronize()
                    except Exception as exc:  # a provider that cannot run this shape
                        refused[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                        continue
                    steps[name] = step
                    outs[name] = [r.float() for r in (res if isinstance(res, tuple) else (res,))]
                base_name = next((x for x in ("flex", "flex-small") if x in steps), None)
                ref = outs.get(base_name)
                names = list(steps)
                times = time_interleaved(steps, args.rounds)
                flops = attention_flops(b, h, n, n, d, causal=causal, mode=args.mode, head_dim_v=dv)
                base = statistics.median(times[base_name]) if base_name else None
                cells = []
                for name in names:
                    ms = statistics.median(times[name])
                    err = (max(float((a - b_).abs().max()) for a, b_ in zip(outs[name], ref))
                           if ref is not None else None)
                    rows.append(dict(mode=args.mode, dtype=args.dtype, d=d, dv=dv, causal=causal, n=n, batch=b,
                                     heads=h, provider=name, ms=ms, tflops=flops / ms * 1e-9,
                                     vs_flex=None if base is None else base / ms, max_diff_vs_flex=err,
                                     rounds=times[name]))
                    ratio = "" if base is None else f"{base / ms:.3f}x"
                    cells.append(f"{name}={flops / ms * 1e-9:.0f}({ratio})")
                for name, why in refused.items():
                    rows.append(dict(mode=args.mode, dtype=args.dtype, d=d, dv=dv, causal=causal, n=n, batch=b,
                                     heads=h, provider=name, refused=why))
                    cells.append(f"{name}=refused")
                print(f"{args.mode} {args.dtype} d={d}/{dv} causal={int(causal)} N={n}: " + "  ".join(cells),
                      flush=True)
                for name, why in refused.items():
                    print(f"    {name}: {why}", flush=True)
                del steps, outs
    if args.json:
        write_json(args.json, rows)


if __name__ == "__main__":
    main()
