import torch, dataclasses
from torch.profiler import profile, ProfilerActivity
from tileattn import launch, configs
from tileattn.configs import HopperFwdConfig
for d, h, n in ((64, 32, 2048), (64, 32, 8192), (128, 16, 2048), (128, 16, 4096)):
    b = 16384 // n
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    base = dataclasses.replace(configs.HOPPER_FWD[(d, d)], persistent=True)
    for cfg in (base, dataclasses.replace(base, stream_k=True)):
        for _ in range(3):
            launch.attn_fwd(q, k, v, False, d ** -0.5, config=cfg)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                launch.attn_fwd(q, k, v, False, d ** -0.5, config=cfg)
            torch.cuda.synchronize()
        rows = {}
        for e in prof.key_averages():
            if e.device_type.name == "CUDA" and ("attn" in e.key or "stream_k" in e.key):
                rows[e.key[:40]] = round(e.device_time / 1, 1) if hasattr(e, "device_time") else e.cuda_time
        print(d, n, cfg.name, rows, flush=True)
