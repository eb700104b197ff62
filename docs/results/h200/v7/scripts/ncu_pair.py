# one decoding step of cuDNN SDPA or tileattn, run a few times inside cudaProfilerStart/Stop for ncu
import sys, torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import tileattn
which, n = sys.argv[1], int(sys.argv[2])
b, hq, hkv, d = 16, 32, 8, 128
q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
k = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
sl = torch.full((b,), n, dtype=torch.int32, device="cuda")
def step():
    if which == "cudnn":
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return tileattn.attention_with_kvcache(q, k, v, sl, check_indices=False)
for _ in range(3): step()
torch.cuda.synchronize()
torch.cuda.profiler.start()
for _ in range(3): step()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
