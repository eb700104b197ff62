"""tileattn against torch's default attention on Hopper (SDPA's cuDNN
backend), forward or backward, providers interleaved at every point: each
round times every provider once (rotated, odd rounds reversed), the median over
rounds is reported (clock drift hits all alike).  FlashAttention-2 paper
protocol: 16k tokens, hidden 2048.

Forward providers: SDPA cuDNN and SDPA flash, the portable Triton kernel,
and either the Hopper kernel (forced) beside tileattn's default dispatch or,
with ``--configs``, each Hopper config.  Backward providers (the time of
``torch.autograd.grad`` through a graph built once): tileattn with the
atomic-dQ backward, with the deterministic one, and SDPA cuDNN; with
``--configs`` also the table's Hopper backward config and the same with
``stats_tma`` toggled and with ``dq_turns`` toggled, forced (causal: the
table's with one key block a program, ``pair_blocks=False``, too; non-causal: with
two a program, ``pair_blocks=True``; d = 64: the persistent walk, non-causal also
with its last round split (``split_tail``); GQA: the
table's with each count of head slices forced, 1 to the group; d = 256: the
split kernel's table config (64-query tiles in one slot) and 32-query tiles with 2
and 3 ring slots).
``--sinks``: tileattn's default call with and without attention sinks, beside cuDNN
(forward: also a call whose sinks need a gradient, which stores the output's
rounding remainder, from staging tiles of its own and from O's buffer, and the
call with sinks kept off the persistent kernel, and the one needing a gradient
with ``HopperFwdConfig.defer_o`` (where persistent, the copies of O and of the
remainder waited on under the next work item), the one needing a gradient
with non-causal calls on the causal table's config (d = 64: two softmax
warpgroups), and the one whose backward will take the per-head sums of
``HopperBwdConfig.sink_sums`` (no remainder); backward: also the sinks'
gradient from the kernels' dS row sums and from those per-head sums, the
forward keeping no remainder in both).
``--even-k`` (forward): each tileattn provider also with ``TILEATTN_HOPPER_EVEN_K=1``
(``-even-k``: non-causal calls whose keys fill their tiles take the build without
the mask step, ``launch.hopper.even_k``).
``--memory`` (backward): each provider's forward+backward peak over the
tensors a training step must hold.
``--plot DIR``: TFLOP/s and ratio-to-cuDNN figures of the rows (``tflops.png``,
``vs_cudnn.png``, by ``tileattn.bench.plots``); ``--replot JSON ...`` draws them
from earlier ``--json`` files instead of timing (no GPU needed).
``--order``: the grid orders of ``launch/grid_order.py`` beside the default
call and cuDNN (no deterministic provider): the table's config forced, the
same with ``group_rows=1`` (one (head, batch) pair's blocks after another)
and, backward at d <= 128, in mirror-image pairs (forward: the table's
one-program-a-tile config, whatever the persistent bound says).

    python benchmarks/vs_cudnn.py [--mode fwd|bwd] [--head-dim 64 128] [--seqlen 2048 ...]
                                  [--dtype bf16] [--group 1] [--rounds 3] [--configs | --order | --sinks] [--memory]
                                  [--only REGEX] [--json out.json] [--plot DIR]
    python benchmarks/vs_cudnn.py --replot a.json [b.json ...] --plot DIR [--tree REV]
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import re
import statistics

import torch
import triton

import tileattn
from tileattn import configs, dispatch, launch
from tileattn.bench.runner import round_orders
from tileattn.configs import HopperFwdConfig
from tileattn.cost.io import attention_flops


def providers(head_dim: int, per_config: bool = True) -> dict:
    def sdpa(backend):
        def fn(q, k, v, causal):
            with torch.nn.attention.sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                        enable_gqa=k.shape[1] != q.shape[1])
        return fn

    def portable(q, k, v, causal):
        dispatch.HOPPER_FWD = False
        try:
            return tileattn.attention(q, k, v, causal=causal)
        finally:
            dispatch.HOPPER_FWD = True

    def hopper(cfg):
        return lambda q, k, v, causal: launch.attn_fwd(q, k, v, causal, head_dim ** -0.5, config=cfg)[0]

    out = {"sdpa-cudnn": sdpa(torch.nn.attention.SDPBackend.CUDNN_ATTENTION),
           "sdpa-flash": sdpa(torch.nn.attention.SDPBackend.FLASH_ATTENTION),
           "portable": portable}
    d64 = dict(num_stages=2, pingpong=False, row_tree=True)   # the table's (ping-pong turns on: v26, lost)
    wg3 = dict(d64, warpgroups=3, maxnreg=128, early_p=True)    # three softmax warpgroups, 192 query rows
    d128 = dict(num_stages=2)
    variants = {64: [d64, dict(d64, persistent=True), dict(d64, early_p=True),
                     dict(d64, persistent=True, early_p=True), dict(d64, persistent=True, stream_k=True),
                     dict(d64, persistent=True, defer_o=True), wg3,
                     dict(wg3, persistent=True), dict(wg3, persistent=True, pingpong=True),
                     dict(wg3, persistent=True, defer_o=True)],
                128: [d128, dict(d128, persistent=True), dict(d128, persistent=True, defer_o=True), dict(num_stages=3),
                      dict(d128, pingpong=False), dict(d128, row_tree=True), dict(d128, persistent=True, row_tree=True),
                      dict(d128, persistent=True, row_tree=True, stream_k=True),
                      dict(d128, persistent=True, row_tree=True, stream_k=True, defer_o=True),
                      dict(d128, row_tree=True, early_p=True),
                      dict(d128, persistent=True, row_tree=True, early_p=True)]}
    if per_config == "order":   # the table's one-program-a-tile config, causal tiles grouped or not, and the default
        table = configs.HOPPER_FWD[(head_dim, head_dim)]
        out = {"sdpa-cudnn": out["sdpa-cudnn"], "tileattn": lambda q, k, v, causal: tileattn.attention(
            q, k, v, causal=causal)}
        for cfg in (table, dataclasses.replace(table, group_rows=1)):
            out[cfg.name] = hopper(cfg)
        return out
    if not per_config:
        out["hopper"] = hopper(configs.HOPPER_FWD[(head_dim, head_dim)])
        out["tileattn"] = lambda q, k, v, causal: tileattn.attention(q, k, v, causal=causal)
        return out
    for kw in variants.get(head_dim, [{}]):
        cfg = HopperFwdConfig(**kw)
        out[cfg.name] = hopper(cfg)
    return out


def _even_k(fn):
    """``fn`` run with ``TILEATTN_HOPPER_EVEN_K=1`` (read at every launch).  The
    variable is set and put back by hand: ``mock.patch.dict(os.environ)``
    clears and refills the whole environment on exit, ~0.1-0.3 ms a call, as
    long as a 2k forward's kernel (it made the switch read 0.52x at d = 128,
    2k, with the same kernel time; perf-notes v58)."""
    name = "TILEATTN_HOPPER_EVEN_K"

    def run(*args, **kwargs):
        old = os.environ.get(name)
        os.environ[name] = "1"
        try:
            return fn(*args, **kwargs)
        finally:
            if old is None:
                del os.environ[name]
            else:
                os.environ[name] = old
    return run


def with_sinks_providers(mode: str) -> dict:
    """tileattn's default call beside the same call with attention sinks
    (one random logit per head): what the sinks cost."""
    def plain(q, k, v, causal):
        return tileattn.attention(q, k, v, causal=causal)

    def sinks(q, k, v, causal, grad=mode == "bwd"):
        logits = torch.linspace(-2.0, 2.0, q.shape[1], device=q.device, requires_grad=grad)
        return tileattn.attention(q, k, v, causal=causal, sinks=logits)
    # bwd_providers' cuDNN call is a plain forward: the backward mode differentiates through it
    provs = {"sdpa-cudnn": bwd_providers()["sdpa-cudnn"], "tileattn": plain, "tileattn-sinks": sinks}
    if mode == "fwd":   # sinks that need a gradient: the forward also stores its output's rounding remainder
        provs["tileattn-sinks-train"] = functools.partial(sinks, grad=True)

        from unittest import mock

        from tileattn import configs

        def one_per_tile(q, k, v, causal):   # sinks calls off the persistent kernel (one program a query tile)
            with mock.patch.dict(configs.HOPPER_FWD_PERSISTENT_MAX_KEYS, clear=True):
                return sinks(q, k, v, causal)
        provs["tileattn-sinks-tile"] = one_per_tile

        def deferred(q, k, v, causal):   # persistent items leave O's and the remainder's copies in flight
            dims = (q.shape[-1], v.shape[-1])
            tables = [configs.HOPPER_FWD] + ([configs.HOPPER_FWD_NONCAUSAL] if dims in configs.HOPPER_FWD_NONCAUSAL
                                             else [])
            with contextlib.ExitStack() as stack:
                for table in tables:
                    stack.enter_context(mock.patch.dict(table, {dims: dataclasses.replace(table[dims],
                                                                                          defer_o=True)}))
                return sinks(q, k, v, causal, grad=True)
        provs["tileattn-sinks-train-dfo"] = deferred

        def two_warpgroups(q, k, v, causal):   # non-causal calls with the causal table's config (d = 64: 2 WG)
            with mock.patch.dict(configs.HOPPER_FWD_NONCAUSAL, clear=True):
                return sinks(q, k, v, causal, grad=True)
        provs["tileattn-sinks-train-2wg"] = two_warpgroups

        def train_ss(q, k, v, causal):   # the backward will take per-head sums: the forward keeps no remainder
            with _sink_sums_table():
                return sinks(q, k, v, causal, grad=True)
        provs["tileattn-sinks-train-ss"] = train_ss
    else:   # the forward keeps no remainder: the kernels sum dS for the sinks' gradient
        provs["tileattn-sinks-dS-sums"] = sinks
        provs["tileattn-sinks-ss"] = sinks   # ... or per-head sums in the dK/dV kernel (_bwd_step's table)
    return provs


def _sink_sums_table():
    """The Hopper backward table with ``sink_sums`` on (d <= 128), as a
    reusable context: calls with sinks take their gradient from the dK/dV
    kernel's per-head sums, and their forward keeps no output remainder
    (``dispatch.hopper_sink_sums``)."""
    from unittest import mock

    from tileattn import configs
    return mock.patch.dict(configs.HOPPER_BWD, {dims: dataclasses.replace(cfg, sink_sums=True)
                                                for dims, cfg in configs.HOPPER_BWD.items() if dims[0] <= 128})


@contextlib.contextmanager
def _without_remainder(on: bool):
    """With ``on``: calls with sinks keep no output remainder (while the
    graph is built), so their backward sums dS for the sinks' gradient."""
    from tileattn import ops
    saved = ops.keeps_remainder
    if on:
        ops.keeps_remainder = lambda *args: False
    try:
        yield
    finally:
        ops.keeps_remainder = saved


def bwd_providers() -> dict:
    def sdpa(q, k, v, causal):
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                    enable_gqa=k.shape[1] != q.shape[1])
    return {"sdpa-cudnn": sdpa,
            "tileattn-atomic": lambda q, k, v, causal: tileattn.attention(q, k, v, causal=causal, deterministic=False),
            "tileattn-deterministic": lambda q, k, v, causal: tileattn.attention(q, k, v, causal=causal,
                                                                                 deterministic=True)}


def bwd_config_steps(q, k, v, do, causal, order: bool = False) -> dict:
    """Backward: each Hopper config forced, through the launcher (no autograd);
    ``order``: only the table's beside its causal grid one (row, batch) pair
    after another (``group_rows=1``), in pairs of key blocks and (d = 64)
    persistent."""
    from tileattn import configs, launch
    d = q.shape[-1]
    scale = d ** -0.5
    out, lse = launch.attn_fwd(q, k, v, causal, scale)
    table = configs.HOPPER_BWD[(d, d)]
    if order:
        cfgs = [table, dataclasses.replace(table, group_rows=1)] + (
            [dataclasses.replace(table, pair_blocks=True)] if d <= 128 else []) + (
            [dataclasses.replace(table, persistent=True)] if d == 64 else [])
    elif d > 128:   # the split kernel: the table's (64-query tiles, one slot), 2 and 3 ring slots of 32-query tiles
        cfgs = [table] + [dataclasses.replace(table, block_m=32, num_stages=st) for st in (2, 3)]
    else:
        cfgs = [table, dataclasses.replace(table, stats_tma=not table.stats_tma),
                dataclasses.replace(table, dq_turns=not table.dq_turns),
                dataclasses.replace(table, pair_blocks=not causal)] + (
            [dataclasses.replace(table, head_slices=s) for s in (1, 2, 4, 8) if (q.shape[1] // k.shape[1]) % s == 0]
            if q.shape[1] > k.shape[1] else []) + ([dataclasses.replace(table, persistent=True)] + (
                [] if causal else [dataclasses.replace(table, persistent=True, split_tail=True)]) if d == 64 else [])
    return {c.name: (lambda c=c: launch.attn_bwd(do, q, k, v, out, lse, causal, scale, config=c,
                                                 deterministic=False)) for c in cfgs}


def _peak_ratio(fn, q, k, v, do, causal) -> float:
    """Forward+backward peak allocation over the tensors a training step
    must hold (inputs, dO, output, gradients, lse)."""
    lse_bytes = q.shape[0] * q.shape[1] * q.shape[2] * 4
    must = (4 * q.numel() + 2 * k.numel() + 2 * v.numel()) * q.element_size() + lse_bytes
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    held = sum(t.numel() * t.element_size() for t in leaves) + do.numel() * do.element_size()
    base = torch.cuda.memory_allocated() - held
    torch.cuda.reset_peak_memory_stats()
    torch.autograd.grad(fn(*leaves, causal), leaves, do)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / must


def time_interleaved(steps: dict, rounds: int) -> dict:
    """name -> do_bench milliseconds, one per round; each round times every
    step once, in ``tileattn bench``'s orders (rotated by one a round, odd
    rounds reversed: rotation alone biased neighbours, perf-notes v23)."""
    names = list(steps)
    times = {name: [] for name in names}
    for order in round_orders(names, rounds):
        for name in order:
            times[name].append(triton.testing.do_bench(steps[name], warmup=25, rep=100))
    return times


def _payload(rows: list) -> dict:
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "rows": rows}


def write_json(path: str, rows: list) -> None:
    with open(path, "w") as f:
        json.dump(_payload(rows), f, indent=1)


def plot_rows(sources: list[dict], out_dir: str, tree: str | None = None) -> list:
    """TFLOP/s and ratio-to-cuDNN figures of ``--json`` payloads (dicts with
    ``device``, ``torch``, ``triton``, ``rows``), in the schema of
    ``tileattn.bench.plots`` (the backward's atomic-dQ provider drawn as
    ``tileattn``, the default call's backward)."""
    from pathlib import Path

    from tileattn.bench import plots
    rows = []
    for src in sources:
        for r in src["rows"]:
            name = "tileattn" if r["provider"] == "tileattn-atomic" else r["provider"]
            rows.append(dict(head_dim=r["d"], causal=r["causal"], mode=r["mode"], provider=name,
                             seqlen_q=r["n"], tflops=r["tflops"], ms=r["ms"], status="ok",
                             gpu=src["device"], dtype=r["dtype"], torch=src["torch"], triton=src["triton"],
                             git_commit=tree or "?"))
    if not rows:
        raise ValueError("no rows to plot")
    out = Path(out_dir)
    return [plots.plot_tflops(rows, out / "tflops.png"),
            plots.plot_speedup(rows, out / "vs_cudnn.png", baseline="sdpa-cudnn")]


def _bwd_step(fn, q, k, v, do, causal, sums: bool = False, sink_sums: bool = False):
    """``sink_sums``: the graph built and the backward run under
    ``_sink_sums_table`` (the table is read again at the backward)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    table = _sink_sums_table() if sink_sums else contextlib.nullcontext()   # made once, entered each step
    with _without_remainder(sums), table:
        out = fn(*leaves, causal)

    def step():
        with table:
            return torch.autograd.grad(out, leaves, do, retain_graph=True)
    return step


def _only(named: dict, pattern: str | None) -> dict:
    """The entries whose name matches ``pattern`` (all without one), and always sdpa-cudnn (the baseline)."""
    return {name: x for name, x in named.items() if pattern is None or name == "sdpa-cudnn" or re.search(pattern, name)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlen", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--memory", action="store_true", help="also report the forward+backward memory peak")
    ap.add_argument("--sinks", action="store_true", help="tileattn with and without attention sinks (their cost)")
    ap.add_argument("--mode", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--even-k", action="store_true",
                    help="forward: each tileattn provider also with TILEATTN_HOPPER_EVEN_K=1 (name-even-k)")
    ap.add_argument("--group", type=int, default=1, help="query heads a kv head (GQA; 1: none)")
    ap.add_argument("--configs", action="store_true",
                    help="time each Hopper config (forward: instead of the default; backward: beside it)")
    ap.add_argument("--order", action="store_true",
                    help="the table's config beside its causal grid in the order before v34 (and backward: in pairs)")
    ap.add_argument("--plot", default=None, metavar="DIR", help="draw tflops.png and vs_cudnn.png into DIR")
    ap.add_argument("--replot", nargs="+", default=None, metavar="JSON",
                    help="draw --plot's figures from earlier --json files instead of timing")
    ap.add_argument("--tree", default=None, help="the commit the rows were measured on (figure titles)")
    ap.add_argument("--only", default=None, metavar="REGEX",
                    help="time only the providers whose name matches (sdpa-cudnn, the baseline, always)")
    args = ap.parse_args()
    if args.replot:
        if not args.plot:
            ap.error("--replot needs --plot DIR")
        sources = []
        for path in args.replot:
            with open(path) as f:
                sources.append(json.load(f))
        for path in plot_rows(sources, args.plot, args.tree):
            print(path)
        return
    if args.group < 1 or any((2048 // d) % args.group for d in args.head_dim):
        ap.error(f"--group {args.group} must divide the query heads (2048 // head dim)")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    rows = []
    for d in args.head_dim:
        if args.sinks:
            provs = with_sinks_providers(args.mode)
        else:
            provs = providers(d, "order" if args.order else args.configs) if args.mode == "fwd" else bwd_providers()
            if args.order:   # the grid orders beside the default call and cuDNN only
                provs.pop("tileattn-deterministic", None)
        if args.even_k and args.mode == "fwd":
            provs.update({f"{name}-even-k": _even_k(fn) for name, fn in list(provs.items())
                          if name.startswith("tileattn") or name.startswith("hopper")})
        provs = _only(provs, args.only)
        for causal in map(bool, args.causal):
            for n in args.seqlen:
                b, h = max(1, 16384 // n), 2048 // d
                q = torch.randn(b, h, n, d, device="cuda", dtype=dtype)
                k, v = (torch.randn(b, h // args.group, n, d, device="cuda", dtype=dtype) for _ in range(2))
                errs = {}
                if args.mode == "fwd":
                    ref = provs["sdpa-cudnn"](q, k, v, causal).float()
                    steps = {name: (lambda fn=fn: fn(q, k, v, causal)) for name, fn in provs.items()}
                    for name, step in steps.items():
                        errs[name] = float((step().float() - ref).abs().max())
                else:
                    do = torch.randn_like(q)
                    steps = {name: _bwd_step(fn, q, k, v, do, causal, sums=name.endswith("-dS-sums"),
                                             sink_sums=name.endswith("-ss"))
                             for name, fn in provs.items()}
                    if args.configs or args.order:
                        steps.update(_only(bwd_config_steps(q, k, v, do, causal, order=args.order), args.only))
                    ref = [g.float() for g in steps["sdpa-cudnn"]()]
                    for name, step in steps.items():
                        errs[name] = max(float((g.float() - r).abs().max()) for g, r in zip(step(), ref))
                names = list(steps)
                times = time_interleaved(steps, args.rounds)
                flops = attention_flops(b, h, n, n, d, causal=causal, mode=args.mode)
                base = statistics.median(times["sdpa-cudnn"])
                for name in names:
                    ms = statistics.median(times[name])
                    rows.append(dict(mode=args.mode, dtype=args.dtype, d=d, group=args.group, causal=causal, n=n,
                                     provider=name, ms=ms,
                                     tflops=flops / ms * 1e-9, vs_cudnn=base / ms, max_diff_vs_cudnn=errs[name],
                                     rounds=times[name]))
                line = "  ".join(f"{r['provider']}={r['tflops']:.0f}({r['vs_cudnn']:.3f}x,"
                                 f"e{r['max_diff_vs_cudnn']:.0e})" for r in rows[-len(names):])
                del steps
                if args.memory and args.mode == "bwd":
                    print("  memory peak / (q, k, v, dO, O, dQ, dK, dV, lse): " + "  ".join(
                        f"{name}={_peak_ratio(fn, q, k, v, do, causal):.3f}" for name, fn in provs.items()), flush=True)
                gqa = f" group={args.group}" if args.group > 1 else ""
                print(f"{args.mode} {args.dtype} d={d}{gqa} causal={int(causal)} N={n}: {line}", flush=True)
    if args.json:
        write_json(args.json, rows)
    if args.plot:
        for path in plot_rows([_payload(rows)], args.plot, args.tree):
            print(path)


if __name__ == "__main__":
    main()
