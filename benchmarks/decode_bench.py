"""KV-cache decoding benchmark: ``tileattn.attention_with_kvcache`` (split-KV,
contiguous and paged caches) beside PyTorch SDPA's backends and the device's
copy bandwidth.

    python benchmarks/decode_bench.py --out DIR [--cache-lens 4096 ... 131072] [--page-sizes 16 256]

Protocol (bf16, one decoding step): Nq = 1, B = 16, Hq = 32, Hkv = 8, d = 128,
every cache full to the given length (cache_seqlens = L, no appended token).

* Achieved bandwidth = bytes of K and V read (2 x B x Hkv x L x d x 2 bytes)
  / time: the work of one decoding step, whatever the kernel really moves.
* Copy bandwidth: ``dst.copy_(src)`` of a 2 GiB buffer, (read + write) / time.
* SDPA: each backend (flash, efficient, cudnn) on the contiguous K/V of the
  same length with ``enable_gqa=True`` (the paged layouts are compared with
  it too; SDPA cannot read a paged cache: the rows "sdpa-<best> (gathered)"
  time the fastest such backend after gathering the pages into contiguous
  K/V, the copy included); where a backend refuses GQA, K/V
  expanded to Hq heads beforehand (outside the timing; the expanded bytes are
  what it then reads, the row says ``expanded``).  Nq = 1 sees every key, so
  SDPA runs without a mask.  "best" is the fastest backend that ran.
* tileattn is timed with ``check_indices=False`` (what a serving loop runs:
  no host-device sync), as ``tileattn-checked`` with the default checks, and
  as ``tileattn-sinks`` with attention sinks (one logit a query head, folded
  in after the kernels).
* Timing: ``triton.testing.do_bench`` medians (warm-up, L2 flushed between
  calls).  The first call compiles the kernel (not timed); decoding takes
  the first fitting config of ``configs.DECODE_CONFIGS`` unless
  TILEATTN_DECODE_AUTOTUNE=1 (then the first call also autotunes).
* Correctness: on the first cache length every provider's output is compared
  with float32 standard attention (relative Frobenius error, must be < 2e-2),
  and at every length the paged results must match the contiguous one.
* A split sweep (num_splits 1..32 beside the heuristic's choice) runs on
  every layout at every length, a config sweep at --config-sweep-len.

Writes decode_bench.csv and decode_bench.json (rows plus the run's metadata:
GPU, driver, versions, commit) into --out.  Runs in about 2 minutes on an H200.

``--absorbed``: the absorbed MLA layout instead (DeepSeek-V3 decoding: one
kv head, one 576-wide cache whose first 512 channels are the values, passed
as ``v_cache = k_cache[..., :512]``), Nq = 1, --batch sequences,
``--absorbed-heads`` query heads (16: memory-bound, 128: compute-bound on an
H200, ``tileattn.cost.decode``), caches of ``--cache-lens`` (default
4k..64k), bf16:

    python benchmarks/decode_bench.py --absorbed --out results/decode_mla

* tileattn reads each cached key once (576 x 2 bytes a key and sequence; V
  is never loaded on its own); the achieved bandwidth is those bytes over the
  time, beside the copy bandwidth (``frac_copy``), and TFLOP/s are
  2 Hq L (576 + 512) a sequence over the time, beside the roofline's bound
  and time for this GPU where the catalogue has it (``cost.hardware.catalogue_name_for_device``).
* On a GPU tileattn's default call is also replayed from a CUDA graph
  (``tileattn (CUDA graph)``: ``do_bench_cudagraph``, GPU time only), as a
  serving loop runs it; the summary's ``graph %`` is its fraction of the
  copy bandwidth, and in brackets its fraction of a copy replayed the same
  way that moves as many bytes as the call reads (``copy, same bytes``: the
  limit at that size, where a launch and the ramp to full bandwidth are a
  large part of a small call).
* ``--profile``: rows ``kernel: <name>`` with each kernel's GPU time a call
  of tileattn's default (torch.profiler; the CPU ops' self time on a CPU):
  which of the split kernel and the combine a call's time goes to.
* SDPA has no shared layout: each backend runs on K and a materialised copy
  of V (``k_cache[..., :512].contiguous()``, made outside the timing) with
  ``enable_gqa=True``; its row's bytes are K and that copy.  A backend that
  refuses the shape is reported, not dropped.
* On the first cache length both are checked against float32 standard
  attention (relative Frobenius error < 2e-2), and at every length tileattn's
  split sweep (--splits) must agree with its default.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # decode_absorbed.py beside it, also when this file is loaded by its path
    sys.path.insert(0, HERE)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "math": "MATH"}
TOLERANCE = 2e-2


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for decode_bench.csv / .json")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--cache-lens", type=int, nargs="+", default=None,
                    help="cache lengths (default 4k..128k; with --absorbed 4k..64k)")
    ap.add_argument("--page-sizes", type=int, nargs="*", default=[16, 256], help="paged layouts (none: skip)")
    ap.add_argument("--sdpa", nargs="*", default=None, choices=list(SDPA_BACKENDS),
                    help="SDPA backends to time (default flash, efficient, cudnn; with --absorbed also math, "
                         "since the fused backends may refuse D = 576 with Dv = 512)")
    ap.add_argument("--splits", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32],
                    help="split counts timed on every layout (none: skip the sweep)")
    ap.add_argument("--config-sweep-len", type=int, default=16384,
                    help="cache length of the per-config sweep (0: skip)")
    ap.add_argument("--extra-configs", nargs="*", default=[], metavar="N64-w4-s5",
                    help="configs (BLOCK_N, warps, stages) timed in the config sweep beside the table's")
    ap.add_argument("--warmup-ms", type=int, default=25)
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--copy-gib", type=float, default=2.0, help="size of the copy-bandwidth buffer")
    ap.add_argument("--device", default="cuda",
                    help="cuda (the benchmark), or cpu: a functional check of this script on the PyTorch path")
    ap.add_argument("--absorbed", action="store_true",
                    help="time the absorbed MLA layout (D = 576, v_cache = k_cache[..., :512], one kv head) "
                         "beside SDPA on a copied V")
    ap.add_argument("--absorbed-heads", type=int, nargs="+", default=[16, 128],
                    help="query heads of the --absorbed runs")
    ap.add_argument("--profile", action="store_true",
                    help="with --absorbed: each kernel's time a call of tileattn's default (torch.profiler)")
    args = ap.parse_args(argv)
    if args.sdpa is None:
        args.sdpa = ["flash", "efficient", "cudnn"] + (["math"] if args.absorbed else [])
    if args.cache_lens is None:
        args.cache_lens = ([4096, 8192, 16384, 32768, 65536] if args.absorbed
                           else [4096, 8192, 16384, 32768, 65536, 131072])
    return args


def copy_bandwidth(do_bench, device, gib: float) -> float:
    """Device copy bandwidth in bytes/s: (read + write) / time of a ``gib`` GiB copy."""
    n = int(gib * 2**30)
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src))
    del src, dst
    return 2 * n / (ms * 1e-3)


def to_paged(cache: torch.Tensor, page: int, perm: torch.Tensor):
    """A paged copy of a full (B, H, L, D) cache: logical block j of batch
    element b goes to page perm[b * L / page + j]; returns (pages, block_table)."""
    b, h, n, d = cache.shape
    per = n // page
    paged = torch.empty(b * per, h, page, d, dtype=cache.dtype, device=cache.device)
    paged[perm] = cache.view(b, h, per, page, d).permute(0, 2, 1, 3, 4).reshape(b * per, h, page, d)
    return paged, perm.view(b, per).to(torch.int32)


def sdpa_fn(backend: str, q, k, v, enable_gqa: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = getattr(SDPBackend, SDPA_BACKENDS[backend])
    kw = {"enable_gqa": True} if enable_gqa else {}

    def fn():
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, **kw)
    return fn


def sdpa_gathered_fn(backend: str, q, k_pages, v_pages, table, n: int):
    """SDPA on a paged cache: its pages gathered into contiguous (B, H, L, D)
    K/V (one copy per call, timed with the attention), then the backend."""
    def fn():
        b, hkv, d = q.shape[0], k_pages.shape[1], k_pages.shape[3]
        idx = table.long()
        k = k_pages[idx].permute(0, 2, 1, 3, 4).reshape(b, hkv, n, d)
        v = v_pages[idx].permute(0, 2, 1, 3, 4).reshape(b, hkv, n, d)
        return sdpa_fn(backend, q, k, v, enable_gqa=True)()
    return fn


def time_ms(fn, device, warmup_ms: int, rep_ms: int) -> float:
    """Median milliseconds of ``fn``: triton's do_bench on CUDA (L2 flushed
    between calls), a few wall-clock repeats elsewhere."""
    if device.type == "cuda":
        from triton.testing import do_bench
        return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[1]


def empty_cache(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def rel_err(got, ref) -> float:
    return float((got.float() - ref.float()).norm() / ref.float().norm())


def main(argv=None) -> int:
    args = parse_args(argv)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("decode_bench.py needs a CUDA GPU (--device cpu only checks the script)", file=sys.stderr)
        return 2

    import tileattn
    from tileattn.launch import decode as launch_decode
    from tileattn.bench.results import collect_metadata
    from tileattn.reference import standard_attention

    def do_bench(fn):
        return time_ms(fn, dev, args.warmup_ms, args.rep_ms)

    t_start = time.time()
    meta = collect_metadata(dev)
    meta["sms"] = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 1
    dtype = DTYPES[args.dtype]
    b, hq, hkv, d = args.batch, args.heads, args.kv_heads, args.head_dim
    elem = torch.finfo(dtype).bits // 8
    copy_bw = copy_bandwidth(do_bench, dev, args.copy_gib)
    print(f"{meta['gpu']}  torch {meta['torch']}  triton {meta['triton']}  commit {meta['git_commit']}  "
          f"SMs {meta['sms']}")
    print(f"device copy bandwidth: {copy_bw / 1e12:.2f} TB/s")
    if args.absorbed:
        from decode_absorbed import run_absorbed, summarize_absorbed
        rows = run_absorbed(args, dev, dtype, do_bench, copy_bw, meta)
        summary = summarize_absorbed(rows)
        return write_results(args, rows, summary, meta, copy_bw, t_start)
    rows: list[dict] = []
    gen = torch.Generator().manual_seed(0)

    def record(**r):
        r = {**r}
        if r.get("ms"):
            r["tbs"] = r["kv_bytes"] / (r["ms"] * 1e-3) / 1e12
            r["frac_copy"] = r["tbs"] * 1e12 / copy_bw
        rows.append(r)
        ms = f"{r['ms']:.4f} ms" if r.get("ms") else "-"
        tbs = f"{r['tbs']:.2f} TB/s ({100 * r['frac_copy']:.0f}% copy)" if r.get("ms") else ""
        print(f"  L={r['cache_len']:>6} {r['layout']:<8} {r['provider']:<22} splits={r.get('num_splits', '')!s:<4} "
              f"{ms:>12} {tbs} {r.get('status', '')} {r.get('check', '')}", flush=True)

    first = True
    for n in args.cache_lens:
        torch.manual_seed(n)
        q = torch.randn(b, hq, 1, d, device=dev, dtype=dtype)
        k = torch.randn(b, hkv, n, d, device=dev, dtype=dtype)
        v = torch.randn(b, hkv, n, d, device=dev, dtype=dtype)
        seqlens = torch.full((b,), n, dtype=torch.int32, device=dev)
        kv_bytes = 2 * b * hkv * n * d * elem
        base = dict(batch=b, heads=hq, kv_heads=hkv, head_dim=d, dtype=args.dtype, cache_len=n, kv_bytes=kv_bytes)
        ref = None
        if first:
            with torch.no_grad():
                ref = standard_attention(q.float(), k.float(), v.float())

        def check(name, out):
            if ref is None:
                return {}
            e = rel_err(out, ref)
            return {"check": "passed" if e < TOLERANCE else "wrong", "rel_err": e}

        # tileattn, contiguous
        splits0 = launch_decode.choose_splits(b * hkv, n, meta["sms"], launch_decode.descriptor_tiles(k, v, False))[0]
        fn = lambda: tileattn.attention_with_kvcache(q, k, v, seqlens, check_indices=False)  # noqa: E731
        out_contig = fn()
        record(**base, layout="contig", provider="tileattn", num_splits=splits0, ms=do_bench(fn),
               status="ok", **check("tileattn", out_contig))
        fn_checked = lambda: tileattn.attention_with_kvcache(q, k, v, seqlens)  # noqa: E731
        record(**base, layout="contig", provider="tileattn-checked", num_splits=splits0, ms=do_bench(fn_checked),
               status="ok")
        # the same call with attention sinks (gpt-oss): what folding them in after the kernels costs
        sinks = torch.linspace(-1.0, 1.0, hq, device=dev)
        fn_sinks = lambda: tileattn.attention_with_kvcache(q, k, v, seqlens, check_indices=False,  # noqa: E731
                                                           sinks=sinks)
        out_sinks = fn_sinks()
        record(**base, layout="contig", provider="tileattn-sinks", num_splits=splits0, ms=do_bench(fn_sinks),
               status="ok" if torch.isfinite(out_sinks).all() else "non-finite output")
        for s in args.splits:
            f = lambda s=s: tileattn.attention_with_kvcache(q, k, v, seqlens, num_splits=s, check_indices=False)
            out_s = f()
            e = rel_err(out_s, out_contig)
            record(**base, layout="contig", provider="tileattn-splits", num_splits=s, ms=do_bench(f),
                   status="ok" if e < 1e-2 else f"differs from the default split by {e:.2e}")

        # SDPA backends
        for be in args.sdpa:
            res = None
            for gqa_mode in ("enable_gqa", "expanded"):
                try:
                    if gqa_mode == "enable_gqa":
                        f = sdpa_fn(be, q, k, v, enable_gqa=True)
                    else:
                        ke = k.repeat_interleave(hq // hkv, dim=1)
                        ve = v.repeat_interleave(hq // hkv, dim=1)
                        f = sdpa_fn(be, q, ke, ve, enable_gqa=False)
                    with torch.no_grad():
                        out = f()
                        ms = do_bench(f)
                    res = dict(provider=f"sdpa-{be}" + ("" if gqa_mode == "enable_gqa" else " (expanded)"),
                               ms=ms, status="ok", **check(be, out))
                    break
                except Exception as exc:  # a backend that cannot run this shape is reported, not dropped
                    res = dict(provider=f"sdpa-{be}", ms=None,
                               status=f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
                finally:
                    if gqa_mode == "expanded":
                        ke = ve = None
                        empty_cache(dev)
            record(**base, layout="contig", **res)

        # the fastest SDPA backend that read K/V with enable_gqa: also timed on
        # a paged cache gathered into contiguous K/V first (what a PyTorch
        # user with a paged cache would run)
        gqa_ok = [r for r in rows if r["cache_len"] == n and r["provider"].startswith("sdpa-") and r.get("ms")
                  and "(expanded)" not in r["provider"]]
        best_be = min(gqa_ok, key=lambda r: r["ms"])["provider"][len("sdpa-"):] if gqa_ok else None

        # tileattn, paged
        for page in args.page_sizes:
            if n % page:
                continue
            perm = torch.randperm(b * (n // page), generator=gen).to(dev)  # shuffled pages
            kp, table = to_paged(k, page, perm)
            vp, _ = to_paged(v, page, perm)
            if best_be is not None:
                gathered = sdpa_gathered_fn(best_be, q, kp, vp, table, n)
                with torch.no_grad():
                    e = rel_err(gathered(), out_contig)
                    ms = do_bench(gathered)
                record(**base, layout=f"page{page}", provider=f"sdpa-{best_be} (gathered)", ms=ms,
                       status="ok" if e < 1e-2 else f"differs from contiguous by {e:.2e}")
            f = lambda kp=kp, vp=vp, table=table: tileattn.attention_with_kvcache(  # noqa: E731
                q, kp, vp, seqlens, block_table=table, check_indices=False)
            out_p = f()
            e = rel_err(out_p, out_contig)
            splits_p = launch_decode.choose_splits(
                b * hkv, n, meta["sms"], launch_decode.descriptor_tiles(kp, vp, True))[0]
            record(**base, layout=f"page{page}", provider="tileattn", num_splits=splits_p, ms=do_bench(f),
                   status="ok" if e < 1e-2 else f"differs from contiguous by {e:.2e}",
                   **check("paged", out_p))
            fc = lambda kp=kp, vp=vp, table=table: tileattn.attention_with_kvcache(  # noqa: E731
                q, kp, vp, seqlens, block_table=table)
            record(**base, layout=f"page{page}", provider="tileattn-checked", num_splits=splits_p, ms=do_bench(fc),
                   status="ok")
            for s in args.splits:
                f_s = lambda s=s, kp=kp, vp=vp, table=table: tileattn.attention_with_kvcache(  # noqa: E731
                    q, kp, vp, seqlens, block_table=table, num_splits=s, check_indices=False)
                e = rel_err(f_s(), out_contig)
                record(**base, layout=f"page{page}", provider="tileattn-splits", num_splits=s, ms=do_bench(f_s),
                       status="ok" if e < 1e-2 else f"differs from contiguous by {e:.2e}")
            if n == args.config_sweep_len:
                sweep_configs(record, base, f"page{page}", f, do_bench, args.extra_configs)
            del kp, vp, table, perm
        if n == args.config_sweep_len:
            sweep_configs(record, base, "contig", fn, do_bench, args.extra_configs)
        del q, k, v, ref
        empty_cache(dev)
        first = False

    summary = summarize(rows, copy_bw)
    return write_results(args, rows, summary, meta, copy_bw, t_start)


def write_results(args, rows, summary, meta, copy_bw, t_start) -> int:
    """decode_bench.csv / .json into --out; 1 when a check failed."""
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for r in rows:
        r.update({k: v for k, v in meta.items()})
    keys = sorted({k for r in rows for k in r})
    with open(out_dir / "decode_bench.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in keys})
    with open(out_dir / "decode_bench.json", "w") as fh:
        json.dump({"meta": meta, "copy_bandwidth_tbs": copy_bw / 1e12, "summary": summary, "rows": rows}, fh,
                  indent=1, default=str)
    print(f"wrote {out_dir / 'decode_bench.csv'} and {out_dir / 'decode_bench.json'} "
          f"({time.time() - t_start:.0f} s)")
    wrong = [r for r in rows if r.get("check") == "wrong" or str(r.get("status", "")).startswith("differs")]
    return 1 if wrong else 0


def parse_config(name: str):
    """A DecodeConfig from its name, e.g. ``N64-w4-s5``."""
    import re
    from tileattn.configs import DecodeConfig
    m = re.fullmatch(r"N(\d+)-w(\d+)-s(\d+)", name)
    if not m:
        raise SystemExit(f"--extra-configs: {name!r} is not of the form N64-w4-s5")
    return DecodeConfig(int(m[1]), int(m[2]), int(m[3]), "--extra-configs")


def sweep_configs(record, base, layout, fn, do_bench, extra=()):
    """Time every config of the table and the ``extra`` ones; with
    TILEATTN_DECODE_AUTOTUNE=1, also record which config the autotuner chose
    for ``fn`` (by default a call takes the table's first fitting config)."""
    from tileattn import configs
    from tileattn.launch import decode as launch_decode, tuning
    # tuning._CHOICES keys: (kind, device, dtype, *values of launch_decode._TUNE_KEY)
    names = launch_decode._TUNE_KEY
    chosen = []
    for key, (meta, opts) in tuning._CHOICES.items():
        if key[0] != "decode":
            continue
        kv = dict(zip(names, key[3:]))
        chosen.append(f"page {kv.get('PAGE_SIZE')} tma {kv.get('USE_TMA')}: "
                      f"N{meta['BLOCK_N']}-w{opts.get('num_warps')}-s{opts.get('num_stages')}")
    if chosen:
        record(**base, layout=layout, provider="tileattn-autotuned", ms=None,
               status="autotuner choices so far: " + "; ".join(sorted(set(chosen))))
    saved, env = configs.DECODE_CONFIGS, os.environ.get("TILEATTN_AUTOTUNE")
    os.environ["TILEATTN_AUTOTUNE"] = "0"
    try:
        for cfg in list(saved) + [parse_config(x) for x in extra]:
            configs.DECODE_CONFIGS = (cfg,)
            try:
                fn()
                ms = do_bench(fn)
                record(**base, layout=layout, provider=f"tileattn-{cfg.name}", ms=ms, status="ok")
            except Exception as exc:
                record(**base, layout=layout, provider=f"tileattn-{cfg.name}", ms=None,
                       status=f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
    finally:
        configs.DECODE_CONFIGS = saved
        if env is None:
            os.environ.pop("TILEATTN_AUTOTUNE", None)
        else:
            os.environ["TILEATTN_AUTOTUNE"] = env


def summarize(rows, copy_bw) -> list[dict]:
    """Per cache length and layout: tileattn vs the copy bandwidth and vs SDPA's best backend."""
    out = []
    lens = sorted({r["cache_len"] for r in rows})
    print(f"\n{'L':>7} {'layout':<8} {'tileattn ms':>11} {'TB/s':>6} {'%copy':>6} {'SDPA best':>22} "
          f"{'ms':>8} {'speedup':>8}")
    for n in lens:
        sdpa = [r for r in rows if r["cache_len"] == n and r["provider"].startswith("sdpa") and r.get("ms")
                and "(gathered)" not in r["provider"]]
        best = min(sdpa, key=lambda r: r["ms"]) if sdpa else None
        for layout in sorted({r["layout"] for r in rows if r["cache_len"] == n}):
            mine = [r for r in rows if r["cache_len"] == n and r["layout"] == layout and r["provider"] == "tileattn"]
            if not mine:
                continue
            m = mine[0]
            s = {"cache_len": n, "layout": layout, "ms": m["ms"], "tbs": m["tbs"], "frac_copy": m["frac_copy"],
                 "sdpa_best": best["provider"] if best else None, "sdpa_ms": best["ms"] if best else None,
                 "speedup_vs_sdpa": (best["ms"] / m["ms"]) if best else None}
            out.append(s)
            print(f"{n:>7} {layout:<8} {m['ms']:>11.4f} {m['tbs']:>6.2f} {100 * m['frac_copy']:>5.0f}% "
                  f"{(best['provider'] if best else '-'):>22} {(best['ms'] if best else float('nan')):>8.4f} "
                  f"{(s['speedup_vs_sdpa'] or float('nan')):>7.2f}x")
    long = [s for s in out if s["cache_len"] >= 16384]
    if long:
        print(f"\ntargets (H200): >= 70% of copy bandwidth at L >= 16k: min {100 * min(s['frac_copy'] for s in long):.0f}%;"
              f" >= 1.0x SDPA best: min {min((s['speedup_vs_sdpa'] or 0) for s in out):.2f}x")
    return out


if __name__ == "__main__":
    sys.exit(main())
