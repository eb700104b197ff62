"""``tileattn calibrate``: measure this GPU and store a ``measured`` hardware entry."""
from __future__ import annotations

import datetime as _dt
import json
import re
import statistics
from pathlib import Path

from .hardware import Hardware, hardware_from_dict, user_hardware_dir


class NoGPUError(RuntimeError):
    pass


def _median_ms(fn, repeats: int, warmup: int = 3) -> float:
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def calibrate(name: str | None = None, output=None, repeats: int = 20, size_mb: int = 1024,
              matmul_n: int = 8192) -> tuple[Path, Hardware]:
    """Time a device-to-device copy (bytes read + written per second) and a
    square bf16 matmul (2 n^3 FLOP per call), median of ``repeats`` after
    warm-up, plus the device properties the model uses; write JSON."""
    for arg, v in (("repeats", repeats), ("size_mb", size_mb), ("matmul_n", matmul_n)):
        if v < 1:
            raise ValueError(f"{arg}={v} must be >= 1")
    try:
        import torch
    except ImportError:  # pragma: no cover
        raise NoGPUError("no GPU: calibrate needs PyTorch with CUDA") from None
    if not torch.cuda.is_available():
        raise NoGPUError("no GPU: calibrate needs a CUDA device (torch.cuda.is_available() is False)")
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    name = name or slug(props.name) + "-measured"
    n = size_mb * 1024 * 1024 // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").uniform_()
    dst = torch.empty_like(src)
    copy_ms = _median_ms(lambda: dst.copy_(src), repeats)
    bandwidth = 2 * src.numel() * 2 / (copy_ms * 1e-3)   # read + write
    a = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device="cuda")
    mm_ms = _median_ms(lambda: a @ b, repeats)
    flops = 2 * matmul_n ** 3 / (mm_ms * 1e-3)
    when = _dt.date.today().isoformat()
    src_txt = f"tileattn calibrate on {props.name}, {when}, torch {torch.__version__}"
    props_src = f"torch.cuda.get_device_properties on {props.name}"
    data = {
        "name": name, "display_name": f"{props.name} (measured)", "vendor": "measured", "basis": "measured",
        "source": src_txt,
        "peak_flops": {"bf16": {"value": flops, "source": src_txt + f": {matmul_n}^3 bf16 matmul, median of "
                                                                   f"{repeats}", "basis": "measured"}},
        "hbm_bandwidth": {"value": bandwidth, "source": src_txt + f": {size_mb} MiB device-to-device copy, "
                                                                 f"read + write, median of {repeats}",
                          "basis": "measured"},
        "memory_capacity": {"value": props.total_memory, "source": props_src, "basis": "measured"},
        "sm_count": {"value": props.multi_processor_count, "source": props_src, "basis": "measured"},
        "measured": {"hbm_bandwidth": {"value": bandwidth, "source": src_txt},
                     "peak_flops.bf16": {"value": flops, "source": src_txt}},
    }
    for field, attr in (("l2_bytes", "L2_cache_size"), ("smem_per_block", "shared_memory_per_block_optin"),
                        ("smem_per_sm", "shared_memory_per_multiprocessor")):
        v = getattr(props, attr, None)
        if v:
            data[field] = {"value": int(v), "source": props_src, "basis": "measured"}
    hw = hardware_from_dict(data, origin="calibrate")
    path = Path(output) if output else user_hardware_dir() / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path, hw
