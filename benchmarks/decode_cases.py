"""Named decoding cases replayed from CUDA graphs (GPU time only) beside
SDPA-cuDNN on the contiguous cache, in one process: B=16, Hq=32, Hkv=8,
d=128, bf16, Nq=1, full caches, shuffled block tables (``page<P>i``: pages
in order, the table the identity; ``page<P>s``: shuffled, then each batch
element's pages sorted by address; a trailing ``p`` (``contigp``,
``page256p``): the cache read by pointer, the path of GPUs without the copy
engine).

    python benchmarks/decode_cases.py 4096,16384,65536 cudnn,contig,page16,contig@N128-w4-s4 [tag [rounds]]

A length ``L-r`` leaves the last r rows of each cache of L unused (cache_seqlens
= L - r, a ragged last tile); cuDNN then runs on contiguous copies of the
L - r valid rows.

A case is a layout (``contig`` or ``page<P>``) run through
``tileattn.attention_with_kvcache`` (the default choices), or
``<layout>@[<config>][x<splits>[l<lead>]]`` to fix the config (one of
``DecodeConfig``'s form, else the default one), the split
count (default 1) and the leading split's share in 1/1000 (default 0: even
splits), e.g. ``contig@N64-w4-s3x2``, ``page16@x3l920``, ``contig@x1``;
``cudnn`` is the reference.  For a
paired comparison of two trees run it once per tree, alternating, with
``PYTHONPATH=<tree>/src`` and a tag.  Prints µs, TB/s and the ratio to
cuDNN per case; with ``rounds`` > 1 every case is timed once per round,
cases in order within a round, and the median over the rounds is reported beside
all of them.
"""
from __future__ import annotations

import sys

import torch
from triton.testing import do_bench_cudagraph

import tileattn
from tileattn.configs import DecodeConfig
from tileattn.launch import decode as launch_decode, runtime
from decode_bench import parse_config, sdpa_fn, to_paged

B, HQ, HKV, D = 16, 32, 8, 128


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or not torch.cuda.is_available():
        print(__doc__, file=sys.stderr)
        return 2
    lens = [tuple(int(p) for p in (x.split("-") + ["0"])[:2]) for x in argv[0].split(",")]
    names = argv[1].split(",")
    tag = argv[2] if len(argv) > 2 else ""
    rounds = int(argv[3]) if len(argv) > 3 else 1
    gen = torch.Generator().manual_seed(0)
    for n, ragged in lens:
        q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, HKV, n, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        n_k = n - ragged
        seqlens = torch.full((B,), n_k, dtype=torch.int32, device="cuda")
        gb = 2 * B * HKV * n_k * D * 2 / 1e9
        if ragged:
            cudnn = sdpa_fn("cudnn", q, k[:, :, :n_k].contiguous(), v[:, :, :n_k].contiguous(), enable_gqa=True)
        else:
            cudnn = sdpa_fn("cudnn", q, k, v, enable_gqa=True)
        n_label = f"{n}-{ragged}" if ragged else str(n)
        ref = cudnn().float()
        caches, fns = {}, {}
        for name in names:
            layout, _, cfg = name.partition("@")
            if layout.startswith("cudnn"):  # cudnn2, ...: the reference again (drift)
                fns[name] = cudnn
                continue
            if layout in ("contig", "contigp"):
                kk, vv, table = k, v, None
            else:
                suffix = layout[4:].lstrip("0123456789")
                page = int(layout[4:len(layout) - len(suffix)])
                key = (page, suffix.replace("p", ""))  # read by pointer: the same pages
                if key not in caches:
                    if "i" in suffix:
                        perm = torch.arange(B * (n // page))
                    else:
                        perm = torch.randperm(B * (n // page), generator=gen)
                        if "s" in suffix:  # each batch element's pages in address order
                            perm = perm.view(B, n // page).sort(dim=1).values.reshape(-1)
                    perm = perm.cuda()
                    kp, table = to_paged(k, page, perm)
                    vp, _ = to_paged(v, page, perm)
                    caches[key] = (kp, vp, table)
                kk, vv, table = caches[key]
            if cfg:
                cfg_name, _, splits = cfg.partition("x")
                splits, _, lead = splits.partition("l")
                c: DecodeConfig | None = parse_config(cfg_name) if cfg_name else None

                def call(kk=kk, vv=vv, table=table, c=c, s=int(splits or 1), lead=int(lead or 0)):
                    return launch_decode.kvcache_attention(q, kk, vv, seqlens, table, n_new=0, capacity=n,
                                                           scale=D ** -0.5, window=(-1, 0), num_splits=s,
                                                           lead_permille=lead, config=c)[0]
            else:
                def call(kk=kk, vv=vv, table=table):
                    return tileattn.attention_with_kvcache(q, kk, vv, seqlens, block_table=table,
                                                           check_indices=False)

            def fn(call=call, pointers=layout.endswith("p")):   # a trailing p: read by pointer
                runtime.FORCE_POINTER_PATH = pointers
                try:
                    return call()
                finally:
                    runtime.FORCE_POINTER_PATH = False
            try:
                err = float((fn().float() - ref).norm() / ref.norm())
            except Exception as exc:  # report and go on (a config may not fit)
                print(f"{tag} L={n_label} {name}: failed {type(exc).__name__}: {str(exc).splitlines()[0][:150]}",
                      flush=True)
                continue
            if err > 1e-2:
                print(f"{tag} L={n_label} {name}: relative error {err:.1e} against cuDNN", flush=True)
                continue
            fns[name] = fn
        # rounds: every case once per round, in order, so that drift of the
        # machine spreads over all cases; the median round is reported
        times = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                times[name].append(do_bench_cudagraph(fn, rep=150, return_mode="median") * 1e3)
        med = {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}
        base = med.get("cudnn")
        for name, us in med.items():
            ratio = f"{base / us:.3f}x cudnn" if base else ""
            spread = f"  rounds {' '.join(f'{t:.1f}' for t in times[name])}" if rounds > 1 else ""
            print(f"{tag} L={n_label} {name:<22} {us:8.1f} us {gb * 1e3 / us:5.2f} TB/s {ratio}{spread}", flush=True)
        del caches, k, v, q
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
