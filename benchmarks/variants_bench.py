"""Benchmark of the attention variants on one GPU (H200, bf16 by default).

Five sections, each a table of rows written to ``--out`` as
``variants.csv`` and ``variants.json`` (with the GPU, versions and commit):

* ``varlen``: 16 packed sequences of mixed lengths totalling 16k tokens
  against the dense kernel on the same token count (16 x 1024), forward and
  forward+backward, causal and not: TFLOP/s of both and their ratio
  (useful FLOPs, ``tileattn.cost``).
* ``window``: causal sliding window, time against the window size at fixed N
  and against N at a fixed window (the time should follow the window, not N).
* ``block_sparse``: time against the density of random block layouts at fixed
  N, beside the dense kernel and the cost model's block-sparse prediction.
* ``window_paths``: a causal sliding window (FA2 protocol: 16k tokens, hidden
  ``--heads`` x ``--head-dim``) on three paths, rounds interleaved (odd ones
  reversed), medians: the Hopper kernels for every width (the forward's
  ``configs.HOPPER_FWD_WINDOW_MIN_SPAN`` set to 1 for the run), the portable
  kernels (``dispatch.HOPPER_FWD`` / ``HOPPER_BWD`` off), and the default
  dispatch; forward, and forward + the default backward (perf-notes v48).
  On a machine without Hopper all three are the portable path.  Where the
  Hopper forward runs, the forward rows also time the persistent Hopper
  forward (``HopperFwdConfig(persistent=True)`` forced, ``hopper_persistent_ms``).
* ``varlen_paths``: the ``varlen`` section's packed sequences on three paths,
  rounds interleaved (odd ones reversed), medians, by the switches
  ``TILEATTN_HOPPER_VARLEN`` / ``TILEATTN_HOPPER_VARLEN_BWD``: the Hopper
  kernels' packed builds forward and backward (``hopper_ms``), the Hopper
  forward with the portable backward (``ms``, the default), the portable
  kernels (``portable_ms``); forward and forward + backward, causal and not
  (perf-notes v50).  Without Hopper all three are the portable path.

    python benchmarks/variants_bench.py --out results/variants
    python benchmarks/variants_bench.py --quick --out /tmp/v     # fewer points
    python benchmarks/variants_bench.py --device cpu --smoke --out /tmp/v   # tiny, CPU path (checks the script)

Timing: ``triton.testing.do_bench`` medians after warm-up.  Autotuning is off
unless ``--autotune`` (the tables' first fitting config), so that each
variant compiles once and the run stays under three minutes.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _time_ms(fn, device, rep_ms):
    from tileattn.bench.runner import time_ms
    return time_ms(fn, device, warmup_ms=max(10, rep_ms // 4), rep_ms=rep_ms, cpu_repeats=1)


def _time_mode(fn, leaves, mode, device, rep_ms):
    """ms per call of ``fn``: its forward under no_grad (``fwd``), or forward
    and backward for one random upstream gradient (``fwd_bwd``)."""
    with torch.no_grad():
        out = fn()
    if mode == "fwd":
        with torch.no_grad():
            return _time_ms(fn, device, rep_ms)
    dout = torch.randn_like(out)

    def run():
        torch.autograd.grad(fn(), leaves, dout)
    return _time_ms(run, device, rep_ms)


def _interleaved(paths: tuple, rounds: int, timed) -> dict:
    """Median ms of ``timed(path)`` for each path over ``rounds`` rounds,
    every path once a round, odd rounds in reverse order (clock drift meets
    every path alike)."""
    ms = {p: [] for p in paths}
    for r in range(rounds):
        for path in paths if r % 2 == 0 else paths[::-1]:
            ms[path].append(timed(path))
    return {p: sorted(x)[len(x) // 2] for p, x in ms.items()}


def mixed_lengths(n_seqs: int, total: int, seed: int = 0, min_len: int = 64) -> list[int]:
    """``n_seqs`` lengths summing to ``total``: log-uniform shares, so that
    long and short sequences mix (e.g. 16 sequences over 16k tokens run from
    ~100 to ~3000 tokens)."""
    rng = random.Random(seed)
    w = [2.0 ** rng.uniform(0, 5) for _ in range(n_seqs)]
    lens = [max(min_len, int(total * x / sum(w))) for x in w]
    lens[lens.index(max(lens))] += total - sum(lens)
    return lens


def bench_varlen(a, device, dtype, rows):
    import tileattn
    from tileattn.cost.sparse import varlen_flops
    lens = mixed_lengths(a.varlen_seqs, a.varlen_tokens)
    total = sum(lens)
    h, d = a.heads, a.head_dim
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=device)
    q, k, v = (torch.randn(total, h, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    dense_n = total // a.varlen_seqs
    qd, kd, vd = (torch.randn(a.varlen_seqs, h, dense_n, d, device=device, dtype=dtype, requires_grad=True)
                  for _ in range(3))
    for causal in (False, True):
        for mode in ("fwd", "fwd_bwd"):
            def packed():
                return tileattn.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal)

            def dense():
                return tileattn.attention(qd, kd, vd, causal=causal)
            res = {}
            for name, fn, leaves, n_lens in (("varlen", packed, (q, k, v), lens),
                                             ("dense", dense, (qd, kd, vd), [dense_n] * a.varlen_seqs)):
                ms = _time_mode(fn, leaves, mode, device, a.rep_ms)
                flops = varlen_flops(n_lens, n_lens, h, d, causal=causal, mode=mode)
                res[name] = (ms, flops / (ms * 1e-3) / 1e12)
            rows.append({"section": "varlen", "mode": mode, "causal": causal, "heads": h, "head_dim": d,
                         "tokens": total, "seqlens": " ".join(map(str, lens)),
                         "dense_shape": f"{a.varlen_seqs}x{dense_n}",
                         "ms": res["varlen"][0], "tflops": res["varlen"][1], "dense_ms": res["dense"][0],
                         "dense_tflops": res["dense"][1], "tflops_ratio": res["varlen"][1] / res["dense"][1]})
            _log(rows[-1])


def bench_varlen_paths(a, device, dtype, rows):
    import tileattn
    from tileattn.cost.sparse import varlen_flops
    lens = mixed_lengths(a.varlen_seqs, a.varlen_tokens)
    h, d = a.heads, a.head_dim
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=device)
    q, k, v = (torch.randn(sum(lens), h, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    switches = {"hopper": ("1", "1"), "default": ("1", "0"), "portable": ("0", "0")}   # (forward, backward)
    saved = {name: os.environ.get(name) for name in ("TILEATTN_HOPPER_VARLEN", "TILEATTN_HOPPER_VARLEN_BWD")}
    try:
        for causal in (False, True):
            def packed():
                return tileattn.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
            for mode in ("fwd", "fwd_bwd"):
                def timed(path):
                    os.environ["TILEATTN_HOPPER_VARLEN"], os.environ["TILEATTN_HOPPER_VARLEN_BWD"] = switches[path]
                    return _time_mode(packed, (q, k, v), mode, device, a.rep_ms)
                med = _interleaved(tuple(switches), a.rounds, timed)
                flops = varlen_flops(lens, lens, h, d, causal=causal, mode=mode)
                rows.append({"section": "varlen_paths", "mode": mode, "causal": causal, "heads": h, "head_dim": d,
                             "tokens": sum(lens), "seqlens": " ".join(map(str, lens)), "ms": med["default"],
                             "hopper_ms": med["hopper"], "portable_ms": med["portable"],
                             "tflops": flops / (med["default"] * 1e-3) / 1e12,
                             "hopper_tflops": flops / (med["hopper"] * 1e-3) / 1e12,
                             "portable_over_hopper": med["portable"] / med["hopper"]})
                _log(rows[-1])
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def bench_window(a, device, dtype, rows):
    import tileattn
    from tileattn.cost.sparse import window_pairs
    h, d = a.heads, a.head_dim
    points = [("vs_window", a.window_n, w) for w in a.windows] + [("vs_n", n, a.window_fixed) for n in a.window_ns]
    for sweep, n, w in points:
        q, k, v = (torch.randn(1, h, n, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        window = None if w < 0 else (w, 0)
        for mode in ("fwd", "fwd_bwd"):
            def fn():
                return tileattn.attention(q, k, v, causal=True, window=window)
            ms = _time_mode(fn, (q, k, v), mode, device, a.rep_ms)
            pairs = window_pairs(n, n, True, window)
            flops = {"fwd": 1.0, "fwd_bwd": 3.5}[mode] * 4.0 * h * pairs * d
            rows.append({"section": "window", "sweep": sweep, "mode": mode, "causal": True, "heads": h,
                         "head_dim": d, "seqlen": n, "window": w, "ms": ms, "us_per_token": ms * 1e3 / n,
                         "tflops": flops / (ms * 1e-3) / 1e12})
            _log(rows[-1])


def bench_window_paths(a, device, dtype, rows):
    import dataclasses
    import tileattn
    from tileattn import configs, dispatch, launch
    h, d = a.heads, a.head_dim
    every_width = {k: 1 for k in configs.HOPPER_FWD_WINDOW_MIN_SPAN}
    persistent = None
    if (d, d) in configs.HOPPER_FWD and d <= 128:
        persistent = dataclasses.replace(configs.HOPPER_FWD[(d, d)], persistent=True)

    saved = dispatch.HOPPER_FWD, dispatch.HOPPER_BWD, configs.HOPPER_FWD_WINDOW_MIN_SPAN
    rule = saved[2]   # the default's width rule (the module attribute is swapped during the run)

    def on(path):   # (HOPPER_FWD and HOPPER_BWD, the forward's width rule) of a path
        return {"hopper": (True, every_width), "portable": (False, rule), "default": (True, rule)}[path]
    try:
        for n in a.paths_ns:
            b = max(1, a.paths_tokens // n)
            q, k, v = (torch.randn(b, h, n, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
            pers = persistent is not None and dispatch.hopper_fwd_eligible(q, k, v)
            for w in a.paths_windows:
                for mode in ("fwd", "fwd_bwd"):
                    def timed(path):
                        if path == "persistent":   # the forward alone, its config forced
                            dispatch.HOPPER_FWD = dispatch.HOPPER_BWD = True

                            def fn():
                                return launch.attn_fwd(q, k, v, True, d ** -0.5, config=persistent, window=(w, 0))[0]
                        else:
                            hopper, span = on(path)
                            dispatch.HOPPER_FWD = dispatch.HOPPER_BWD = hopper
                            configs.HOPPER_FWD_WINDOW_MIN_SPAN = span

                            def fn():
                                return tileattn.attention(q, k, v, causal=True, window=(w, 0))
                        return _time_mode(fn, (q, k, v), mode, device, a.rep_ms)
                    order = ("hopper", "portable", "default") + (("persistent",) if pers and mode == "fwd" else ())
                    med = _interleaved(order, a.rounds, timed)
                    rows.append({"section": "window_paths", "mode": mode, "causal": True, "heads": h,
                                 "head_dim": d, "batch": b, "seqlen": n, "window": w, "ms": med["default"],
                                 "hopper_ms": med["hopper"], "portable_ms": med["portable"],
                                 "portable_over_hopper": med["portable"] / med["hopper"],
                                 "hopper_persistent_ms": med.get("persistent")})
                    _log(rows[-1])
    finally:
        dispatch.HOPPER_FWD, dispatch.HOPPER_BWD, configs.HOPPER_FWD_WINDOW_MIN_SPAN = saved


def bench_block_sparse(a, device, dtype, rows):
    import tileattn
    from tileattn.block_mask import BLOCK_K, BLOCK_Q, density as layout_density
    from tileattn.cost import AttentionShape, get_hardware
    from tileattn.cost.roofline import compare
    from tileattn.cost.sparse import sparse_summary
    h, d, n = a.heads, a.head_dim, a.sparse_n
    q, k, v = (torch.randn(1, h, n, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    nqb, nkb = -(-n // BLOCK_Q), -(-n // BLOCK_K)
    gen = torch.Generator(device="cpu").manual_seed(0)
    comp = None
    if device.type == "cuda":
        try:
            comp = compare(AttentionShape(1, h, n, d, dtype={torch.bfloat16: "bf16", torch.float16: "fp16",
                                                             torch.float32: "fp32"}[dtype]),
                           get_hardware(a.hw))
        except Exception as exc:  # unknown hardware name: no model column
            print(f"no cost model for --hw {a.hw}: {exc}", file=sys.stderr)
    dense_ms = {}
    for target in [1.0] + a.densities:
        layout = None
        if target < 1.0:
            layout = (torch.rand(1, h, nqb, nkb, generator=gen) < target).to(device)
        s = 1.0 if layout is None else layout_density(layout)
        for mode in ("fwd", "fwd_bwd"):
            def fn():
                return tileattn.attention(q, k, v, block_mask=layout)
            ms = _time_mode(fn, (q, k, v), mode, device, a.rep_ms)
            if layout is None:
                dense_ms[mode] = ms
            model = None
            if comp is not None and s > 0:
                ph = {r["phase"]: r for r in sparse_summary(comp, s)["phases"]}[mode]
                model = ph["sparse_time_s"] * 1e3
            flops = s * {"fwd": 1.0, "fwd_bwd": 3.5}[mode] * 4.0 * h * n * n * d
            rows.append({"section": "block_sparse", "mode": mode, "heads": h, "head_dim": d, "seqlen": n,
                         "layout": "dense (no mask)" if layout is None else "random",
                         "target_density": target, "density": s, "ms": ms,
                         "time_vs_dense": ms / dense_ms[mode], "tflops": flops / (ms * 1e-3) / 1e12 if ms else None,
                         "model_ms": model})
            _log(rows[-1])


def _log(row):
    keys = [k for k in ("section", "sweep", "mode", "causal", "seqlen", "window", "density", "ms", "tflops",
                        "dense_tflops", "tflops_ratio", "time_vs_dense", "model_ms", "hopper_ms", "portable_ms",
                        "portable_over_hopper", "hopper_persistent_ms") if row.get(k) is not None]
    print("  ".join(f"{k}={row[k]:.4g}" if isinstance(row[k], float) else f"{k}={row[k]}" for k in keys),
          flush=True)


def write(rows, meta, out: Path):
    out.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for r in rows for k in r)) + list(meta)
    with open(out / "variants.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({**{k: "" for k in fields}, **r, **meta})
    (out / "variants.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return out / "variants.csv", out / "variants.json"


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for variants.csv and variants.json")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--sections", nargs="+", default=["varlen", "window", "block_sparse"],
                    choices=["varlen", "window", "block_sparse", "window_paths", "varlen_paths"])
    ap.add_argument("--varlen-seqs", type=int, default=16)
    ap.add_argument("--varlen-tokens", type=int, default=16384)
    ap.add_argument("--window-n", type=int, default=16384, help="N of the time-vs-window sweep")
    ap.add_argument("--windows", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096, 8192, -1],
                    help="left window sizes (-1: plain causal)")
    ap.add_argument("--window-fixed", type=int, default=1024, help="window of the time-vs-N sweep")
    ap.add_argument("--window-ns", type=int, nargs="+", default=[2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--paths-windows", type=int, nargs="+", default=[128, 1024, 4096],
                    help="window_paths: left windows (causal)")
    ap.add_argument("--paths-ns", type=int, nargs="+", default=[4096, 16384], help="window_paths: sequence lengths")
    ap.add_argument("--paths-tokens", type=int, default=16384, help="window_paths: tokens a batch (batch = this / N)")
    ap.add_argument("--rounds", type=int, default=3, help="window_paths, varlen_paths: interleaved rounds")
    ap.add_argument("--sparse-n", type=int, default=16384)
    ap.add_argument("--densities", type=float, nargs="+", default=[0.9, 0.7, 0.5, 0.3, 0.2, 0.1, 0.05])
    ap.add_argument("--hw", default="nvidia-h200", help="cost-model hardware for the block-sparse prediction")
    ap.add_argument("--rep-ms", type=int, default=60, help="do_bench repetition time per point")
    ap.add_argument("--autotune", action="store_true", help="autotune each variant (slow: minutes)")
    ap.add_argument("--quick", action="store_true", help="fewer points")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (checks the script, e.g. on CPU)")
    ap.add_argument("--plot-from", metavar="JSON", default=None,
                    help="only draw window.png and block_sparse.png into --out from a variants.json")
    a = ap.parse_args(argv)
    if a.quick:
        a.windows, a.window_ns, a.densities = [256, 1024, 4096, -1], [4096, 16384], [0.5, 0.2]
    if a.smoke:
        a.heads, a.head_dim, a.varlen_seqs, a.varlen_tokens = 2, 32, 4, 512
        a.window_n, a.windows, a.window_fixed, a.window_ns = 512, [64, -1], 64, [256, 512]
        a.sparse_n, a.densities, a.rep_ms = 512, [0.5], 10
        a.paths_windows, a.paths_ns, a.paths_tokens, a.rounds = [64], [256], 512, 2
    return a


def plot(rows: list[dict], meta: dict, out: Path) -> list[Path]:
    """Time vs window (fixed N) and vs N (fixed window); time vs block density
    beside the cost model's prediction."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    out.mkdir(parents=True, exist_ok=True)
    title = f"{meta.get('gpu', '')}, {meta.get('dtype', '')}, torch {meta.get('torch', '')}, triton {meta.get('triton', '')}"
    written = []
    win = [r for r in rows if r["section"] == "window"]
    if win:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for mode in sorted({r["mode"] for r in win}):
            w = sorted((r for r in win if r["sweep"] == "vs_window" and r["mode"] == mode),
                       key=lambda r: r["window"] if r["window"] >= 0 else float("inf"))
            if w:
                labels = [str(r["window"]) if r["window"] >= 0 else "none" for r in w]
                axes[0].plot(range(len(w)), [r["ms"] for r in w], marker="o", label=mode)
                axes[0].set_xticks(range(len(w)), labels)
            n = sorted((r for r in win if r["sweep"] == "vs_n" and r["mode"] == mode), key=lambda r: r["seqlen"])
            if n:
                axes[1].plot([r["seqlen"] for r in n], [r["ms"] for r in n], marker="o", label=mode)
        axes[0].set(xlabel="left window (keys before each query; none = causal only)", ylabel="ms",
                    title="time vs window, fixed N")
        axes[1].set(xlabel="sequence length N", ylabel="ms", title="time vs N, fixed window")
        axes[1].set_xscale("log", base=2)
        for ax in axes:
            ax.grid(alpha=0.3)
            ax.legend()
            ax.set_ylim(bottom=0)
        fig.suptitle(f"sliding window: {title}", fontsize=9)
        fig.tight_layout()
        written.append(out / "window.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    sp = [r for r in rows if r["section"] == "block_sparse"]
    if sp:
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for mode in sorted({r["mode"] for r in sp}):
            m = sorted((r for r in sp if r["mode"] == mode), key=lambda r: r["density"])
            ax.plot([r["density"] for r in m], [r["ms"] for r in m], marker="o", label=f"{mode} measured")
            if all(r.get("model_ms") is not None for r in m):
                ax.plot([r["density"] for r in m], [r["model_ms"] for r in m], ls="--", label=f"{mode} model")
        ax.set(xlabel="block density", ylabel="ms", title="block-sparse: time vs density")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_ylim(bottom=0)
        fig.suptitle(title, fontsize=8)
        fig.tight_layout()
        written.append(out / "block_sparse.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    return written


def main(argv=None) -> int:
    a = parse(argv)
    if a.plot_from:
        import json
        data = json.loads(Path(a.plot_from).read_text())
        for p in plot(data["rows"], data.get("meta", {}), Path(a.out)):
            print(f"wrote {p}")
        return 0
    if not a.autotune:
        os.environ.setdefault("TILEATTN_AUTOTUNE", "0")
    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --smoke to check the script", file=sys.stderr)
        return 3
    from tileattn.bench.results import collect_metadata
    device = torch.device(a.device)
    dtype = _DTYPES[a.dtype]
    if device.type == "cpu" and dtype != torch.float32:
        dtype = torch.float32
    meta = collect_metadata(device)
    meta["dtype"] = str(dtype).replace("torch.", "")
    rows: list[dict] = []
    t0 = time.time()
    for section in a.sections:
        print(f"== {section}", flush=True)
        {"varlen": bench_varlen, "window": bench_window, "block_sparse": bench_block_sparse,
         "window_paths": bench_window_paths, "varlen_paths": bench_varlen_paths}[section](
            a, device, dtype, rows)
    meta["wall_s"] = round(time.time() - t0, 1)
    paths = write(rows, meta, Path(a.out))
    print(f"wrote {paths[0]} and {paths[1]} ({meta['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
