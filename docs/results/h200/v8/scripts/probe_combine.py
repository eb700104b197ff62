"""Probe: what the separate combine costs a leading split (graph replay).

As run, the "nocombine" cases did not drop the combine: launch plans replay
the recorded launches without calling combine_splits again (set
TILEATTN_DIRECT_LAUNCH=0 for the patch to take effect); see perf-notes v8."""
import sys, torch
from triton.testing import do_bench_cudagraph
sys.path.insert(0, "benchmarks")
from tileattn import launch_decode
from decode_bench import sdpa_fn

B, HQ, HKV, D = 16, 32, 8, 128
real_combine = launch_decode.combine_splits
def noop(*a, **k): pass

for n in [4096, 8192, 16384, 32768]:
    q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, HKV, n, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    seqlens = torch.full((B,), n, dtype=torch.int32, device="cuda")
    sems = torch.zeros(B * HKV, dtype=torch.int32, device="cuda")
    cud = sdpa_fn("cudnn", q, k, v, enable_gqa=True)
    def dec(s, lead, combine=True, memset=False):
        def fn():
            launch_decode.combine_splits = real_combine if combine else noop
            try:
                if memset:
                    sems.zero_()
                return launch_decode.kvcache_attention(q, k, v, seqlens, None, n_new=0, capacity=n, scale=D ** -0.5,
                                                       window=(-1, 0), num_splits=s, lead_permille=lead)[0]
            finally:
                launch_decode.combine_splits = real_combine
        return fn
    o_part = torch.randn(B, HQ, 1, 4, D, device="cuda"); l_part = torch.randn(B, HQ, 1, 4, device="cuda")
    out = torch.empty(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16); lse = torch.empty(B, HQ, 1, device="cuda")
    cases = {"cudnn": cud, "x1": dec(1, 0), "x1+memset": dec(1, 0, memset=True),
             "L4-940": dec(4, 940), "L4-940-nocombine": dec(4, 940, False),
             "L3-920-nocombine": dec(3, 920, False), "L4-970-nocombine": dec(4, 970, False),
             "L4-940-nocombine+memset": dec(4, 940, False, True),
             "combine-alone": lambda: real_combine(o_part, l_part, out, lse)}
    ref = cud().float()
    for name in ("x1", "L4-940"):
        err = float((cases[name]().float() - ref).norm() / ref.norm()); assert err < 1e-2, (name, err)
    res = {c: [] for c in cases}
    for r in range(3):
        for c, fn in cases.items():
            res[c].append(do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3)
    base = sorted(res["cudnn"])[1]
    for c, ts in res.items():
        m = sorted(ts)[1]
        print(f"L={n:6d} {c:26s} " + " ".join(f"{t:7.1f}" for t in ts) + f"  med {m:7.1f} us  {base / m:.3f}x", flush=True)
