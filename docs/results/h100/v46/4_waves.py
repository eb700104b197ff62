# Is the persistent forward's last partial wave idle time? Rate per unit of work at a unit count of 31.03 / 15.52
# waves (the FA2 protocol's) against an exact multiple of the SMs (one more head).
import torch, dataclasses, triton
from tileattn import launch, configs
sm = torch.cuda.get_device_properties(0).multi_processor_count
print("SMs", sm)
cases = [(64, 2048, 8, 32), (64, 2048, 8, 33), (64, 8192, 2, 32), (64, 8192, 2, 33),
         (128, 2048, 8, 16), (128, 2048, 4, 33), (128, 4096, 4, 16), (128, 4096, 2, 33)]
res = {c: [] for c in cases}
data = {}
for c in cases:
    d, n, b, h = c
    data[c] = [torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
for rnd in range(5):
    for c in (cases if rnd % 2 == 0 else cases[::-1]):
        d, n, b, h = c
        q, k, v = data[c]
        cfg = dataclasses.replace(configs.HOPPER_FWD[(d, d)], persistent=True)
        ms = triton.testing.do_bench(lambda: launch.attn_fwd(q, k, v, False, d ** -0.5, config=cfg), rep=200)
        res[c].append(4 * b * h * n * n * d / ms / 1e9)
for c in cases:
    d, n, b, h = c
    units = b * h * n // 128
    r = sorted(res[c])[2]
    print(f"d={d} N={n} B={b} H={h} units={units} waves={units / sm:.2f} TFLOP/s={r:.1f}")
