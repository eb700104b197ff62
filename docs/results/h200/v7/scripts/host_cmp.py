# host time per call (no sync inside the loop) of SDPA-cuDNN and tileattn decoding, 4k cache
import sys, time, torch
sys.path.insert(0, "benchmarks")
from decode_bench import sdpa_fn, to_paged
import tileattn
B, HQ, HKV, D, n = 16, 32, 8, 128, 4096
q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16)
k = torch.randn(B, HKV, n, D, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
sl = torch.full((B,), n, dtype=torch.int32, device="cuda")
perm = torch.randperm(B * n // 256).cuda(); kp, table = to_paged(k, 256, perm); vp, _ = to_paged(v, 256, perm)
fns = {"cudnn": sdpa_fn("cudnn", q, k, v, enable_gqa=True),
       "flash": sdpa_fn("flash", q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), enable_gqa=False),
       "contig": lambda: tileattn.attention_with_kvcache(q, k, v, sl, check_indices=False),
       "page256": lambda: tileattn.attention_with_kvcache(q, kp, vp, sl, block_table=table, check_indices=False)}
for rnd in range(3):
    for name, fn in fns.items():
        for _ in range(20): fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(100): fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        print(f"r{rnd} {name:8s} host {(t1 - t0) * 1e4:6.1f} us/call  drained {(t2 - t0) * 1e4:6.1f} us/call", flush=True)
