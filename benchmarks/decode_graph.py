"""Decoding steps replayed from CUDA graphs (GPU time only, no host time)
beside eager calls: tileattn (check_indices=False) and SDPA-cuDNN on the
contiguous cache, B=16, Hq=32, Hkv=8, d=128, bf16, contiguous caches and
16- and 256-token pages with shuffled block tables.

    python benchmarks/decode_graph.py [--cache-lens 4096 16384]

Needs a CUDA GPU with SDPA's cuDNN backend.  H200 results:
docs/results/h200/v5/graph/.
"""
from __future__ import annotations

import argparse
import sys

import torch
from triton.testing import do_bench, do_bench_cudagraph

import tileattn
from decode_bench import sdpa_fn, to_paged


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache-lens", type=int, nargs="+", default=[4096, 16384])
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("decode_graph.py needs a CUDA GPU", file=sys.stderr)
        return 2
    b, hq, hkv, d = 16, 32, 8, 128
    gen = torch.Generator().manual_seed(0)
    for n in args.cache_lens:
        q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        seqlens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        cudnn = sdpa_fn("cudnn", q, k, v, enable_gqa=True)
        cudnn()
        ref_graph = do_bench_cudagraph(cudnn, rep=200)
        ref_eager = do_bench(cudnn, warmup=25, rep=200, return_mode="median")
        print(f"L={n} sdpa-cudnn graph {ref_graph * 1e3:.1f} us eager {ref_eager * 1e3:.1f} us", flush=True)
        layouts = [("contig", k, v, None)]
        for page in (16, 256):
            perm = torch.randperm(b * (n // page), generator=gen).cuda()
            kp, table = to_paged(k, page, perm)
            vp, _ = to_paged(v, page, perm)
            layouts.append((f"page{page}", kp, vp, table))
        for name, kk, vv, table in layouts:
            def step(kk=kk, vv=vv, table=table):
                return tileattn.attention_with_kvcache(q, kk, vv, seqlens, block_table=table, check_indices=False)
            for _ in range(3):
                step()
            graph = do_bench_cudagraph(step, rep=200)
            eager = do_bench(step, warmup=25, rep=200, return_mode="median")
            print(f"L={n} {name:<8} graph {graph * 1e3:.1f} us ({ref_graph / graph:.3f}x cudnn graph)  "
                  f"eager {eager * 1e3:.1f} us ({ref_eager / eager:.3f}x cudnn eager)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
