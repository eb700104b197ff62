"""Host-time helpers for the launch-path scripts under ``benchmarks/``
(host_overhead.py, launch_cost.py, backward_thread.py): the wall time of a
call in a tight loop, and a cProfile table as text."""
from __future__ import annotations

import cProfile
import io
import pstats
import time
from typing import Callable

import torch


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def per_call_us(fn: Callable[[], object], iters: int = 2000, warmup: int = 50) -> float:
    """Microseconds per call of ``fn`` over ``iters`` back-to-back calls (after
    ``warmup`` calls), the device drained before and after: with a tiny
    problem this is the host's time per call."""
    for _ in range(warmup):
        fn()
    _sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync()
    return (time.perf_counter() - t0) / iters * 1e6


def profile_text(profile: cProfile.Profile, top: int = 30, limit: int = 7000) -> str:
    """The ``top`` entries of ``profile`` by own time, as text (cut at ``limit``)."""
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()[:limit]
