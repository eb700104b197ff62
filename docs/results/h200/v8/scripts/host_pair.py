"""Host time per eager decoding step of the tileattn on PYTHONPATH (B=16, Hq=32, Hkv=8, d=128, bf16, 4k)."""
import sys, time, torch, tileattn
tag = sys.argv[1]
b, hq, hkv, d, n = 16, 32, 8, 128, 4096
q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
k = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
kn = torch.randn(b, hkv, 1, d, device="cuda", dtype=torch.bfloat16); vn = torch.randn_like(kn)
seq = torch.full((b,), n - 1, dtype=torch.int32, device="cuda")
cases = {"attend": lambda: tileattn.attention_with_kvcache(q, k, v, seq, check_indices=False),
         "append+attend": lambda: tileattn.attention_with_kvcache(q, k, v, seq, k_new=kn, v_new=vn, check_indices=False)}
if len(sys.argv) > 2:   # SDPA (cuDNN) in the same loop: the cache row written by a copy, then attention
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    def sdpa_step(append):
        if append:
            k[:, :, n - 1:n].copy_(kn); v[:, :, n - 1:n].copy_(vn)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    cases["sdpa attend"] = lambda: sdpa_step(False)
    cases["sdpa append+attend"] = lambda: sdpa_step(True)
for name, fn in cases.items():
    for _ in range(20): fn()
    torch.cuda.synchronize()
    res = []
    for r in range(7):
        t0 = time.perf_counter()
        for _ in range(300): fn()
        t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
        res.append(((t1 - t0) / 300 * 1e6, (t2 - t0) / 300 * 1e6))
    hs = sorted(x[0] for x in res); ds = sorted(x[1] for x in res)
    print(f"{tag:4s} {name:18s} host {hs[3]:6.1f} us/call (min {hs[0]:.1f})  drained {ds[3]:6.1f} us/call", flush=True)
