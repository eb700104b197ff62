"""The ``--absorbed`` runs of ``decode_bench.py`` (the absorbed MLA layout: one
kv head, one 576-wide cache whose first 512 channels are the values, passed as
``v_cache = k_cache[..., :512]``), and their summary table.  ``decode_bench.py``
imports this module when --absorbed is given; its module docstring describes
the protocol."""
from __future__ import annotations

import statistics

import torch

from decode_bench import TOLERANCE, empty_cache, rel_err, sdpa_fn

# a provider of the graph rounds: ``dst.copy_(src)`` moving the call's bytes, the copy bandwidth at that size
SAME_SIZE_COPY = "copy, same bytes (CUDA graph)"


def same_size_copy(read_bytes: float, dev):
    """(a copy step, the bytes it moves): ``dst.copy_(src)`` of buffers half
    of ``read_bytes`` each (the cost model's bytes are a float), so that it
    reads and writes as many bytes as the call reads."""
    half = int(read_bytes) // 2
    src = torch.empty(half, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    return (lambda: dst.copy_(src)), 2 * half


def kernel_times(fn, dev, reps: int = 20) -> list[tuple[str, float, float]]:
    """(name, µs a call, launches a call) of what ``fn`` runs, slowest first,
    from torch.profiler over ``reps`` calls: the GPU kernels on a CUDA device
    (GPU time: which kernel a call's time goes to), else the CPU ops' self
    time."""
    from torch.profiler import ProfilerActivity, profile
    cuda = dev.type == "cuda"
    fn()
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            fn()
        if cuda:
            torch.cuda.synchronize()
    out = []
    for e in prof.key_averages():
        t = e.self_device_time_total if cuda else e.self_cpu_time_total
        if t > 0:
            out.append((e.key, t / reps, e.count / reps))
    return sorted(out, key=lambda x: -x[1])


def run_absorbed(args, dev, dtype, do_bench, copy_bw, meta) -> list[dict]:
    """The --absorbed runs: tileattn on the shared 576-wide cache, SDPA on K and a copy of V."""
    import tileattn
    from tileattn import dispatch
    from tileattn.cost import DecodeShape, decode_bound, decode_cache_bytes, decode_flops, get_hardware
    from tileattn.cost.hardware import catalogue_name_for_device
    from tileattn.reference import standard_attention
    if dev.type == "cuda":
        from triton.testing import do_bench_cudagraph
    d, dv, b = 576, 512, args.batch
    name = catalogue_name_for_device(meta.get("gpu") or "")   # no catalogue entry: no prediction
    hw = get_hardware(name) if name else None
    rows: list[dict] = []

    def record(**r):
        if r.get("ms"):
            r["tbs"] = r["read_bytes"] / (r["ms"] * 1e-3) / 1e12
            r["frac_copy"] = r["tbs"] * 1e12 / copy_bw
            r["tflops"] = r["flops"] / (r["ms"] * 1e-3) / 1e12
        rows.append(r)
        ms = f"{r['ms']:.4f} ms" if r.get("ms") else "-"
        rate = (f"{r['tbs']:.2f} TB/s ({100 * r['frac_copy']:.0f}% copy) {r['tflops']:.0f} TFLOP/s"
                if r.get("ms") else "")
        print(f"  Hq={r['heads']:>4} L={r['cache_len']:>6} {r['provider']:<22} splits={r.get('num_splits', '')!s:<4} "
              f"{ms:>12} {rate} {r.get('status', '')} {r.get('check', '')}", flush=True)

    first = True
    for n in args.cache_lens:
        for hq in args.absorbed_heads:
            torch.manual_seed(n + hq)
            q = torch.randn(b, hq, 1, d, device=dev, dtype=dtype)
            k = torch.randn(b, 1, n, d, device=dev, dtype=dtype)
            seqlens = torch.full((b,), n, dtype=torch.int32, device=dev)
            shape = DecodeShape.absorbed_mla(b, hq, n, dtype=args.dtype)
            base = dict(batch=b, heads=hq, kv_heads=1, head_dim=d, head_dim_v=dv, dtype=args.dtype, cache_len=n,
                        layout="absorbed", flops=decode_flops(shape))
            if hw is not None:
                pred = decode_bound(shape, hw, basis="measured")
                base.update(bound=pred.bound, predicted_ms=pred.time_s * 1e3, intensity=pred.intensity)
            ref = None
            if first:
                with torch.no_grad():
                    ref = standard_attention(q.float(), k.float(), k[..., :dv].float())

            def check(out, ref=ref):
                if ref is None:
                    return {}
                e = rel_err(out, ref)
                return {"check": "passed" if e < TOLERANCE else "wrong", "rel_err": e}

            fn = lambda q=q, k=k, s=seqlens: tileattn.attention_with_kvcache(  # noqa: E731
                q, k, k[..., :dv], s, check_indices=False)
            out = fn()
            mine = dict(base, read_bytes=decode_cache_bytes(shape))
            record(**mine, provider="tileattn", num_splits=0, ms=do_bench(fn), status="ok", **check(out))
            if dev.type == "cuda":
                # the same call replayed from a CUDA graph (GPU time only, no host time), on the
                # default path and on the portable kernel (the Hopper one off), rounds interleaved
                def portable(fn=fn):
                    saved, dispatch.HOPPER_DECODE = dispatch.HOPPER_DECODE, False
                    try:
                        return fn()
                    finally:
                        dispatch.HOPPER_DECODE = saved
                e = rel_err(portable(), out)
                # the copy engine's limit at this size: a copy moving as many bytes (read + write) as the call reads
                copy, moved = same_size_copy(mine["read_bytes"], dev)
                graphs = {"tileattn (CUDA graph)": fn, "tileattn-portable (CUDA graph)": portable,
                          SAME_SIZE_COPY: copy}
                times = {name: [] for name in graphs}
                for r in range(3):
                    for name in (list(graphs) if r % 2 == 0 else list(graphs)[::-1]):
                        times[name].append(do_bench_cudagraph(graphs[name], rep=args.rep_ms, return_mode="median"))
                for name in graphs:
                    ok = name != "tileattn-portable (CUDA graph)" or e < 1e-2
                    record(**dict(mine, read_bytes=moved) if name == SAME_SIZE_COPY else mine, provider=name,
                           num_splits=0, ms=statistics.median(times[name]),
                           status="ok" if ok else f"differs from the default path by {e:.2e}")
                del copy, graphs
            if args.profile:   # where the call's time goes, kernel by kernel
                for name, us, launches in kernel_times(fn, dev)[:6]:
                    rows.append(dict(base, provider=f"kernel: {name}", us_per_call=us, launches_per_call=launches))
                    print(f"  Hq={hq:>4} L={n:>6} kernel {name[:60]:<60} {us:9.1f} us a call "
                          f"({launches:g} a call)", flush=True)
            for sp in args.splits:
                f = lambda sp=sp, q=q, k=k, s=seqlens: tileattn.attention_with_kvcache(  # noqa: E731
                    q, k, k[..., :dv], s, num_splits=sp, check_indices=False)
                e = rel_err(f(), out)
                record(**mine, provider="tileattn-splits", num_splits=sp, ms=do_bench(f),
                       status="ok" if e < 1e-2 else f"differs from the default split by {e:.2e}")
            v = k[..., :dv].contiguous()   # SDPA needs V as its own tensor: a copy, outside the timing
            copied = decode_cache_bytes(DecodeShape(b, hq, 1, n, d, dv, dtype=args.dtype))
            for be in args.sdpa:
                try:
                    f = sdpa_fn(be, q, k, v, enable_gqa=True)
                    with torch.no_grad():
                        o = f()
                        ms = do_bench(f)
                    record(**base, read_bytes=copied, provider=f"sdpa-{be} (V copied)", ms=ms, status="ok",
                           **check(o))
                except Exception as exc:  # a backend that cannot run this shape is reported, not dropped
                    record(**base, read_bytes=copied, provider=f"sdpa-{be} (V copied)", ms=None,
                           status=f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
            del q, k, v, ref
            empty_cache(dev)
        first = False
    return rows


def summarize_absorbed(rows) -> list[dict]:
    """Per heads and cache length: tileattn's bandwidth (fraction of the copy
    bandwidth), TFLOP/s and the model's bound, beside SDPA's best on a copied V;
    ``graph %``: the fraction of the copy bandwidth replayed from a CUDA graph
    (GPU time only; the default path / the portable kernel), where that was
    timed, and in brackets the default path's fraction of a copy that moves
    as many bytes as the call reads (read + write), replayed the same way:
    the limit at that size, launch and ramp included."""
    out = []
    print(f"\n{'Hq':>4} {'L':>7} {'tileattn ms':>11} {'TB/s':>6} {'%copy':>6} {'graph %':>9} {'TFLOP/s':>8} "
          f"{'bound':>8} {'SDPA best (V copied)':>26} {'ms':>8} {'speedup':>8}")
    for hq in sorted({r["heads"] for r in rows}):
        for n in sorted({r["cache_len"] for r in rows}):
            mine = [r for r in rows if (r["heads"], r["cache_len"], r["provider"]) == (hq, n, "tileattn")]
            if not mine or not mine[0].get("ms"):
                continue
            m = mine[0]
            sdpa = [r for r in rows if r["heads"] == hq and r["cache_len"] == n and r["provider"].startswith("sdpa")
                    and r.get("ms")]
            best = min(sdpa, key=lambda r: r["ms"]) if sdpa else None
            graph = [r for r in rows if (r["heads"], r["cache_len"], r["provider"]) == (hq, n, "tileattn (CUDA graph)")
                     and r.get("ms")]
            portable = [r for r in rows if r.get("ms") and (r["heads"], r["cache_len"], r["provider"])
                        == (hq, n, "tileattn-portable (CUDA graph)")]
            same = [r for r in rows if r.get("ms") and (r["heads"], r["cache_len"], r["provider"])
                    == (hq, n, SAME_SIZE_COPY)]
            # replayed from a graph, tileattn's bandwidth over a copy's moving as many bytes
            frac_same = graph[0]["tbs"] / same[0]["tbs"] if graph and same else None
            s = {"heads": hq, "cache_len": n, "ms": m["ms"], "tbs": m["tbs"], "frac_copy": m["frac_copy"],
                 "tflops": m["tflops"], "bound": m.get("bound"), "predicted_ms": m.get("predicted_ms"),
                 "graph_frac_copy": graph[0]["frac_copy"] if graph else None,
                 "portable_graph_frac_copy": portable[0]["frac_copy"] if portable else None,
                 "same_size_copy_frac_copy": same[0]["frac_copy"] if same else None,
                 "graph_frac_same_size_copy": frac_same,
                 "sdpa_best": best["provider"] if best else None, "sdpa_ms": best["ms"] if best else None,
                 "speedup_vs_sdpa": (best["ms"] / m["ms"]) if best else None}
            out.append(s)
            g = f"{100 * graph[0]['frac_copy']:.0f}%" if graph else "-"
            if portable:
                g += f"/{100 * portable[0]['frac_copy']:.0f}%"
            g += f" ({100 * frac_same:.0f}% of a same-size copy)" if frac_same else ""
            print(f"{hq:>4} {n:>7} {m['ms']:>11.4f} {m['tbs']:>6.2f} {100 * m['frac_copy']:>5.0f}% {g:>9} "
                  f"{m['tflops']:>8.1f} {str(m.get('bound') or '-'):>8} {(best['provider'] if best else '-'):>26} "
                  f"{(best['ms'] if best else float('nan')):>8.4f} {(s['speedup_vs_sdpa'] or float('nan')):>7.2f}x")
    return out
