"""Per-step timing of the ring: compute time against time spent waiting for
transfers.

Pass a :class:`RingProfile` as ``ring_attention(..., profile=p)``; every step of
the forward (and, later, of the backward) appends a :class:`StepRecord`.  On
CUDA the times come from CUDA events on the current stream and are read when
:meth:`RingProfile.records` is called (which synchronizes); elsewhere they are
host wall-clock times.

``wait_ms`` is the time the computation sat idle waiting for the step's
transfers after its own work was done: the *exposed* communication.  A
transfer hidden behind compute has ``wait_ms`` near zero.  The transfer time
itself (what would be exposed without overlap) is measured apart, by
:func:`time_ring_exchange` on buffers of the same size.
"""
from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time

import torch

__all__ = ["RingProfile", "StepRecord", "time_ring_exchange"]


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One ring step on this rank.

    ``phase`` is ``"forward"`` or ``"backward"``; ``step`` counts from 0 (the
    backward's last record, ``kind="dkdv-return"``, is the final hop that
    brings each rank its own dK/dV and has no compute).  ``source`` is the rank
    whose K/V block was computed on; ``kind`` one of
    :data:`tileattn.distributed.schedule.KINDS`.  ``flops`` are the useful
    matmul FLOPs of the step (``tileattn.cost.attention_flops``),
    ``bytes_sent`` what this rank sent during the step.
    """

    phase: str
    step: int
    source: int
    kind: str
    flops: float
    bytes_sent: int
    compute_ms: float
    wait_ms: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class _Pending:
    """A step whose timing marks may still be CUDA events."""

    def __init__(self, phase, step, source, kind, flops, bytes_sent, cuda):
        self.info = (phase, step, source, kind, float(flops), int(bytes_sent))
        self.cuda = cuda
        self.segments: list[tuple[str, object, object]] = []

    def _mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    @contextlib.contextmanager
    def time(self, label: str):
        start = self._mark()
        try:
            yield
        finally:
            self.segments.append((label, start, self._mark()))

    def resolve(self) -> StepRecord:
        totals = {"compute": 0.0, "wait": 0.0}
        for label, a, b in self.segments:
            if self.cuda:
                b.synchronize()
                ms = a.elapsed_time(b)
            else:
                ms = (b - a) * 1e3
            totals[label] += ms
        return StepRecord(*self.info, compute_ms=totals["compute"], wait_ms=totals["wait"])


class _NoTiming:
    """Stand-in when no profile is asked for."""

    def time(self, label: str):
        return contextlib.nullcontext()


_NO_TIMING = _NoTiming()


class RingProfile:
    """Collects a :class:`StepRecord` per ring step of the calls it is passed to.

    Example::

        prof = RingProfile()
        out = ring_attention(q, k, v, causal=True, profile=prof)
        out.sum().backward()
        for r in prof.records():
            print(r.phase, r.step, r.kind, r.compute_ms, r.wait_ms)
        print(prof.summary())
    """

    def __init__(self) -> None:
        self._pending: list[_Pending] = []
        self._done: list[StepRecord] = []

    def _step(self, phase, step, source, kind, flops, bytes_sent, device: torch.device) -> _Pending:
        p = _Pending(phase, step, source, kind, flops, bytes_sent, device.type == "cuda")
        self._pending.append(p)
        return p

    def records(self) -> list[StepRecord]:
        """All steps recorded so far, in order (synchronizes CUDA if needed)."""
        if self._pending:
            self._done.extend(p.resolve() for p in self._pending)
            self._pending.clear()
        return list(self._done)

    def clear(self) -> None:
        self._pending.clear()
        self._done.clear()

    def summary(self) -> dict:
        """Totals per phase: steps, compute_ms, wait_ms, flops, bytes_sent and
        ``exposed_fraction`` = wait / (compute + wait)."""
        out: dict[str, dict] = {}
        for r in self.records():
            s = out.setdefault(r.phase, {"steps": 0, "compute_ms": 0.0, "wait_ms": 0.0, "flops": 0.0,
                                         "bytes_sent": 0})
            s["steps"] += 1
            s["compute_ms"] += r.compute_ms
            s["wait_ms"] += r.wait_ms
            s["flops"] += r.flops
            s["bytes_sent"] += r.bytes_sent
        for s in out.values():
            busy = s["compute_ms"] + s["wait_ms"]
            s["exposed_fraction"] = s["wait_ms"] / busy if busy > 0 else 0.0
        return out


def _step_timer(profile: RingProfile | None, phase, step, source, kind, flops, bytes_sent, device):
    if profile is None:
        return _NO_TIMING
    return profile._step(phase, step, source, kind, flops, bytes_sent, device)


def time_ring_exchange(nbytes: int, *, group=None, device=None, repeats: int = 10, warmup: int = 2) -> float:
    """Median milliseconds of one ring step's transfer alone: every rank sends
    ``nbytes`` to the next rank and receives as much from the previous one
    (the same ``batch_isend_irecv`` as :func:`ring_attention`), no compute.

    Collective: every rank of ``group`` must call it with the same arguments.
    ``device`` defaults to the current CUDA device under NCCL, else the CPU.
    """
    import torch.distributed as dist

    from .comm import _Ring, _resolve_group

    group = _resolve_group(group)
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
        raise ValueError(f"nbytes must be a positive int, got {nbytes!r}")
    if device is None:
        nccl = "nccl" in str(dist.get_backend(group))
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    device = torch.device(device)
    ring = _Ring(group)
    send = torch.empty(nbytes, dtype=torch.uint8, device=device)
    recv = torch.empty_like(send)
    cuda = device.type == "cuda"
    times = []
    for i in range(warmup + repeats):
        if cuda:
            torch.cuda.synchronize(device)
        dist.barrier(group=group)
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        ring.finish(ring.start(send, recv, 0, "exchange timing"), "exchange timing")
        if cuda:
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)
