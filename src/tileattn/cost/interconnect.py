"""Interconnect term of the cost model: ring attention across W GPUs.

Ring attention (``tileattn.distributed``) runs W steps.  In each, every rank
computes its queries against the K/V block in hand while the next block
travels one hop around the ring, so a step costs

    t_step = max(t_compute, t_transfer)          (transfer overlapped)

with ``t_compute = FLOPs_step / achieved FLOP/s`` and ``t_transfer =
bytes_step / link bandwidth + latency``.  The transfer hides behind the
compute when ``t_transfer <= t_compute``.  Per rank and step:

* forward bytes: the K and V block, ``B Hkv N_loc (D + Dv) e`` (Dv: V's head
  dim, ``head_dim_v``, default D);
* backward bytes: the K/V block again plus its dK/dV accumulator, which
  travels in float32: ``B Hkv N_loc (D + Dv) (e + 4)``; one more dK/dV hop at
  the end brings each block's gradient home and is not overlapped;
* FLOPs: ``tileattn.cost.attention_flops`` of the part of the block the
  schedule computes (``tileattn.distributed.schedule``): a full block
  ``2 B Hq N_loc^2 (D + Dv)``; with the causal zigzag layout half of that on
  every step (the diagonal step: the causal shard); backward
  ``2 B Hq N_loc^2 (3 D + 2 Dv)`` (2.5x when Dv = D).

FLOPs grow as N_loc^2 and bytes as N_loc, so the transfer hides once the
local shard is long enough: for zigzag causal forward steps,
``N_loc >= Hkv e F / (Hq BW)`` (F achieved FLOP/s, BW link bytes/s),
:func:`break_even_tokens`.  The steps run in lock step (a block can only
leave once its sender has it), so each step costs its slowest rank.

Constants (modelling assumptions, stated once here):

``KERNEL_EFFICIENCY``
    fraction of the dense tensor-core peak the attention kernels reach:
    tileattn v1 on the H200, d = 128, N = 16k, bf16 (docs/perf-notes.md):
    466-475 TFLOP/s forward, 351-371 backward, of 989.
``LINK_EFFICIENCY``
    fraction of the per-direction line rate a large point-to-point copy
    reaches: ~380 of 450 GB/s on H100 NVLink (NVIDIA/nccl issue 1264),
    ~235 of 300 GB/s on A100 NVLink (nccl-tests PR 189 discussion).
``STEP_LATENCY_S``
    fixed cost of one transfer (launch and handshake of a NCCL send/recv).
``MERGE_BYTES`` / ``ACCUMULATE_BYTES``
    HBM bytes per element of the elementwise work between kernels, counted
    from ``tileattn.distributed.ring``: merging a block's output into the
    float32 accumulator (a cast, a product, a rescale and an add: ``e + 28``
    bytes) and adding a block's dQ, dK, dV to float32 accumulators
    (``e + 8``).  Charged to the step's compute at HBM bandwidth.

``python -m tileattn.cost.interconnect`` prints the scaling tables of
docs/distributed.md; ``--update-doc docs/distributed.md`` regenerates them there.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys

from .hardware import Hardware, get_hardware
from .io import LAUNCH_OVERHEAD_S, _check_int, attention_flops, dtype_bytes
from .roofline import peak_dtype
from ..distributed.layout import check_layout, chunks_per_rank
from ..distributed.schedule import BlockPlan, block_plan, source_rank

__all__ = ["RingShape", "StepCost", "RingPrediction", "KERNEL_EFFICIENCY", "LINK_EFFICIENCY", "STEP_LATENCY_S",
           "ACC_BYTES", "link_bandwidth", "ring_step_bytes", "ring_step_flops", "achieved_flops", "step_costs",
           "transfer_hidden", "predict_ring", "break_even_tokens", "scaling_rows", "scaling_markdown",
           "break_even_markdown", "generated_blocks", "update_doc", "main"]

KERNEL_EFFICIENCY = {"fwd": 0.47, "bwd": 0.36}
LINK_EFFICIENCY = 0.8
STEP_LATENCY_S = 20e-6
ACC_BYTES = 4  # dK/dV accumulators travel in float32
MERGE_BYTES = 28      # + e: per merged output element (forward, steps after the first)
ACCUMULATE_BYTES = 8  # + e: per dQ / dK / dV element added (backward)
PHASES = ("fwd", "bwd", "fwd_bwd")
MAX_GPUS_PER_HOST = 8


@dataclasses.dataclass(frozen=True)
class RingShape:
    """One attention layer sharded over ``world_size`` GPUs: the global shape
    (``seqlen`` tokens in total) and the layout."""

    batch: int
    heads: int
    kv_heads: int
    seqlen: int
    head_dim: int
    world_size: int
    causal: bool = True
    layout: str = "zigzag"
    dtype: str = "bf16"
    head_dim_v: int | None = None  # V's head dim Dv, default head_dim

    def __post_init__(self) -> None:
        if self.head_dim_v is None:
            object.__setattr__(self, "head_dim_v", self.head_dim)
        for f in ("batch", "heads", "kv_heads", "seqlen", "head_dim", "head_dim_v", "world_size"):
            object.__setattr__(self, f, _check_int(f, getattr(self, f)))
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")
        check_layout(self.layout)
        dtype_bytes(self.dtype)
        if not isinstance(self.causal, bool):
            raise TypeError(f"causal must be a bool, got {type(self.causal).__name__}")
        chunks = self.world_size * chunks_per_rank(self.layout)
        if self.seqlen % chunks:
            raise ValueError(f"seqlen={self.seqlen} must be a multiple of {chunks} (layout={self.layout!r}, "
                             f"world_size={self.world_size})")

    @property
    def n_local(self) -> int:
        return self.seqlen // self.world_size

    @property
    def elem_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def kv_elems(self) -> int:
        """Elements of one rank's K and V shards (what a ring step moves)."""
        return self.batch * self.kv_heads * self.n_local * (self.head_dim + self.head_dim_v)

    def plan(self, rank: int, step: int) -> BlockPlan:
        return block_plan(self.layout, self.causal, rank, source_rank(rank, step, self.world_size), self.n_local)


def _phase(phase: str) -> str:
    if phase not in PHASES:
        raise ValueError(f"phase={phase!r} is not one of {', '.join(PHASES)}")
    return phase


def link_bandwidth(hw: Hardware, world_size: int, basis: str = "datasheet") -> tuple[float, str]:
    """Per-direction bytes/s one GPU can send to its ring neighbour, and the
    link's name: the GPU fabric (``"fabric"``) if it joins ``world_size``
    GPUs, else PCIe (``"pcie"``) for rings within one host (at most
    ``MAX_GPUS_PER_HOST``).  Larger rings span nodes and their network is not
    in the catalogue: pass ``link_bw=`` to the functions that take it."""
    world_size = _check_int("world_size", world_size)
    fabric, joined = hw.value("interconnect_bandwidth", basis), hw.value("interconnect_gpus", basis)
    if fabric is not None and (joined is None or world_size <= joined.value):
        return float(fabric.value), "fabric"
    pcie = hw.value("pcie_bandwidth", basis)
    if world_size > MAX_GPUS_PER_HOST or pcie is None:
        raise ValueError(f"world_size={world_size}: no link of {hw.name!r} in the catalogue joins that many GPUs "
                         f"(a ring across nodes runs over the network); pass link_bw= (bytes/s per direction)")
    return float(pcie.value), "pcie"


def ring_step_bytes(shape: RingShape, phase: str = "fwd") -> int:
    """Bytes one rank sends in a step that transfers: the K/V block (``fwd``),
    plus its float32 dK/dV accumulator (``bwd``); ``fwd_bwd`` is their sum."""
    kv = shape.kv_elems
    fwd, bwd = kv * shape.elem_bytes, kv * (shape.elem_bytes + ACC_BYTES)
    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd}[_phase(phase)]


def ring_step_flops(shape: RingShape, rank: int, step: int, phase: str = "fwd") -> float:
    """Useful matmul FLOPs of ``rank`` at ``step`` (0 for a hidden block)."""
    plan = shape.plan(rank, step)
    if not plan.computes:
        return 0.0
    return attention_flops(shape.batch, shape.heads, plan.n_q, plan.n_k, shape.head_dim, causal=plan.causal,
                           mode=_phase(phase), head_dim_v=shape.head_dim_v)


def achieved_flops(hw: Hardware, dtype: str, phase: str, basis: str = "datasheet") -> float:
    """FLOP/s the attention kernels are assumed to reach: KERNEL_EFFICIENCY x peak."""
    if phase == "fwd_bwd":
        raise ValueError("achieved_flops: pass 'fwd' or 'bwd'")
    return KERNEL_EFFICIENCY[_phase(phase)] * hw.peak(peak_dtype(dtype), basis)


@dataclasses.dataclass(frozen=True)
class StepCost:
    """One lock-step ring step: the slowest rank's compute, the transfer."""

    step: int
    flops: float          # the slowest rank's FLOPs
    bytes: int            # sent per rank (0 on a step without transfer)
    compute_s: float
    transfer_s: float

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.transfer_s)

    @property
    def hidden(self) -> bool:
        """The transfer fits behind the compute."""
        return self.transfer_s <= self.compute_s

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "time_s": self.time_s, "hidden": self.hidden}


def _resolve(hw, shape, phase, tflops, link_bw, basis):
    flops = achieved_flops(hw, shape.dtype, phase, basis) if tflops is None else float(tflops) * 1e12
    bw = link_bandwidth(hw, shape.world_size, basis)[0] * LINK_EFFICIENCY if link_bw is None else link_bw
    if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not math.isfinite(bw):
        raise ValueError(f"link_bw must be a finite number of bytes/s, got {link_bw!r}")
    bw = float(bw)
    if flops <= 0 or bw <= 0:
        raise ValueError("tflops and link_bw must be positive")
    return flops, bw


def step_costs(shape: RingShape, hw: Hardware, phase: str = "fwd", *, tflops: float | None = None,
               link_bw: float | None = None, basis: str = "datasheet") -> list[StepCost]:
    """The W steps of one phase (``fwd`` or ``bwd``), plus for ``bwd`` the final
    dK/dV hop (no compute).  ``tflops`` (achieved, TFLOP/s) and ``link_bw``
    (bytes/s per direction, effective) override the defaults derived from
    ``hw``."""
    if phase not in ("fwd", "bwd"):
        raise ValueError(f"phase={phase!r} must be 'fwd' or 'bwd' (predict_ring handles 'fwd_bwd')")
    flops_s, bw = _resolve(hw, shape, phase, tflops, link_bw, basis)
    w = shape.world_size
    kv_bytes = ring_step_bytes(shape, "fwd")
    acc_bytes = shape.kv_elems * ACC_BYTES
    out = []
    for t in range(w):
        per_rank = [_rank_step_compute(shape, hw, r, t, phase, flops_s, basis) for r in range(w)]
        worst, compute = max(per_rank, key=lambda fc: fc[1])
        if phase == "fwd":
            sent = kv_bytes if t < w - 1 else 0
        else:  # K/V ahead of the step, and the previous block's dK/dV behind it
            sent = (kv_bytes if t < w - 1 else 0) + (acc_bytes if t > 0 else 0)
        transfer = sent / bw + STEP_LATENCY_S if sent else 0.0
        out.append(StepCost(t, worst, sent, compute, transfer))
    if phase == "bwd" and w > 1:
        out.append(StepCost(w, 0.0, acc_bytes, 0.0, acc_bytes / bw + STEP_LATENCY_S))
    return out


def _rank_step_compute(shape: RingShape, hw: Hardware, rank: int, step: int, phase: str, flops_s: float,
                       basis: str) -> tuple[float, float]:
    """(FLOPs, seconds) of ``rank``'s work at ``step``: the kernel(s) plus the
    elementwise merge / accumulation around them."""
    plan = shape.plan(rank, step)
    if not plan.computes:
        return 0.0, 0.0
    flops = ring_step_flops(shape, rank, step, phase)
    b, e, d, dv = shape.batch, shape.elem_bytes, shape.head_dim, shape.head_dim_v
    if phase == "fwd":  # the merged output has V's head dim
        kernels, moved = 1, (b * shape.heads * plan.n_q * dv * (e + MERGE_BYTES) if step > 0 else 0)
    else:  # dQ and dK at D, dV at Dv
        kernels = 3
        moved = (b * shape.heads * plan.n_q * d + b * shape.kv_heads * plan.n_k * (d + dv)) * (e + ACCUMULATE_BYTES)
    return flops, flops / flops_s + moved / hw.bandwidth(basis) + kernels * LAUNCH_OVERHEAD_S


def transfer_hidden(shape: RingShape, hw: Hardware, phase: str = "fwd", **kw) -> bool:
    """Whether every transfer of ``phase`` fits behind its step's compute
    (the backward's final dK/dV hop, which has nothing to hide behind, aside)."""
    steps = [s for s in step_costs(shape, hw, phase, **kw) if s.flops or s.step < shape.world_size]
    return all(s.hidden for s in steps if s.bytes and s.step < shape.world_size)


@dataclasses.dataclass(frozen=True)
class RingPrediction:
    """Predicted time of ring attention against one GPU doing the whole sequence."""

    shape: RingShape
    hardware: str
    phase: str
    link: str
    steps: tuple[StepCost, ...]
    time_s: float
    single_gpu_s: float
    transfer_s: float          # all transfers, as if not overlapped
    exposed_transfer_s: float  # the part the compute did not hide

    @property
    def speedup(self) -> float:
        return self.single_gpu_s / self.time_s

    @property
    def efficiency(self) -> float:
        """Speedup per GPU: 1.0 is perfect scaling."""
        return self.speedup / self.shape.world_size

    @property
    def hidden(self) -> bool:
        return all(s.hidden for s in self.steps if s.bytes and s.step < self.shape.world_size)

    def as_dict(self) -> dict:
        return {"shape": dataclasses.asdict(self.shape), "hardware": self.hardware, "phase": self.phase,
                "link": self.link, "time_s": self.time_s, "single_gpu_s": self.single_gpu_s,
                "speedup": self.speedup, "efficiency": self.efficiency, "transfer_s": self.transfer_s,
                "exposed_transfer_s": self.exposed_transfer_s, "hidden": self.hidden,
                "steps": [s.as_dict() for s in self.steps]}


def _single_gpu_s(shape: RingShape, hw: Hardware, phase: str, tflops, basis) -> float:
    f = attention_flops(shape.batch, shape.heads, shape.seqlen, shape.seqlen, shape.head_dim, causal=shape.causal,
                        mode=phase, head_dim_v=shape.head_dim_v)
    rate = achieved_flops(hw, shape.dtype, phase, basis) if tflops is None else float(tflops) * 1e12
    return f / rate + (1 if phase == "fwd" else 3) * LAUNCH_OVERHEAD_S


def predict_ring(shape: RingShape, hw: Hardware, phase: str = "fwd", *, tflops: dict | None = None,
                 link_bw: float | None = None, basis: str = "datasheet") -> RingPrediction:
    """Predicted ring time for ``phase`` (``fwd``, ``bwd`` or ``fwd_bwd``) next
    to one GPU running the whole sequence at the same kernel efficiency.
    ``tflops`` maps ``"fwd"``/``"bwd"`` to achieved TFLOP/s (e.g. measured)."""
    _phase(phase)
    tflops = tflops or {}
    phases = ("fwd", "bwd") if phase == "fwd_bwd" else (phase,)
    steps, single = [], 0.0
    for ph in phases:
        steps += step_costs(shape, hw, ph, tflops=tflops.get(ph), link_bw=link_bw, basis=basis)
        single += _single_gpu_s(shape, hw, ph, tflops.get(ph), basis)
    total = sum(s.time_s for s in steps)
    transfer = sum(s.transfer_s for s in steps)
    exposed = sum(s.time_s - s.compute_s for s in steps)
    link = link_bandwidth(hw, shape.world_size, basis)[1] if link_bw is None else "given"
    return RingPrediction(shape, hw.name, phase, link, tuple(steps), total, single, transfer, exposed)


def break_even_tokens(hw: Hardware, *, heads: int, kv_heads: int, head_dim: int, world_size: int = 8,
                      causal: bool = True, layout: str = "zigzag", dtype: str = "bf16", phase: str = "fwd",
                      basis: str = "datasheet", head_dim_v: int | None = None) -> int:
    """Smallest local shard length N_loc (tokens per GPU) at which a ring step's
    transfer fits behind its kernel's compute (batch 1; batch scales both
    sides; the merge work, which also hides transfers, is left out)."""
    if phase not in ("fwd", "bwd"):
        raise ValueError(f"phase={phase!r} must be 'fwd' or 'bwd'")
    shape = RingShape(1, heads, kv_heads, 2 * world_size, head_dim, world_size, causal, layout, dtype, head_dim_v)
    flops_s, bw = _resolve(hw, shape, phase, None, None, basis)
    # zigzag causal steps are half blocks; contiguous causal has full blocks on the slowest rank
    frac = 0.5 if causal and layout == "zigzag" else 1.0
    per_token = kv_heads * (head_dim + shape.head_dim_v) * (dtype_bytes(dtype) + (ACC_BYTES if phase == "bwd" else 0))
    per_pair = attention_flops(1, heads, 1, 1, head_dim, mode=phase, head_dim_v=shape.head_dim_v)
    a = per_pair * frac / flops_s                           # compute seconds per N_loc^2
    b = per_token / bw                                      # transfer seconds per N_loc
    c = STEP_LATENCY_S - (3 if phase == "bwd" else 1) * LAUNCH_OVERHEAD_S
    n = (b + math.sqrt(b * b + 4 * a * max(c, 0.0))) / (2 * a)
    return max(1, math.ceil(n))


# ---------------------------------------------------------------------------
# Tables (docs/distributed.md is generated from these)
# ---------------------------------------------------------------------------
def scaling_rows(hw: Hardware, *, world_size: int, seqlens, heads: int = 32, kv_heads: int = 8,
                 head_dim: int = 128, batch: int = 1, dtype: str = "bf16", basis: str = "datasheet") -> list[dict]:
    rows = []
    for n in seqlens:
        for causal, layout in ((True, "zigzag"), (False, "zigzag")):
            shape = RingShape(batch, heads, kv_heads, n, head_dim, world_size, causal, layout, dtype)
            fwd = predict_ring(shape, hw, "fwd", basis=basis)
            both = predict_ring(shape, hw, "fwd_bwd", basis=basis)
            # an off-diagonal step's compute (merge included), the transfer posted at step 0
            compute, transfer = fwd.steps[min(1, world_size - 1)].compute_s, fwd.steps[0].transfer_s
            rows.append({"hardware": hw.name, "world_size": world_size, "seqlen": n, "n_local": shape.n_local,
                         "causal": causal, "layout": layout, "link": fwd.link,
                         "step_bytes_fwd": ring_step_bytes(shape, "fwd"),
                         "step_compute_ms_fwd": compute * 1e3, "step_transfer_ms_fwd": transfer * 1e3,
                         "hidden_fwd": fwd.hidden, "hidden_bwd": both.hidden,
                         "fwd_ms": fwd.time_s * 1e3, "fwd_bwd_ms": both.time_s * 1e3,
                         "single_fwd_bwd_ms": both.single_gpu_s * 1e3, "speedup_fwd_bwd": both.speedup,
                         "efficiency_fwd_bwd": both.efficiency, "exposed_ms_fwd_bwd": both.exposed_transfer_s * 1e3})
    return rows


def _tokens(n: int) -> str:
    return f"{n // 1048576}M" if n % 1048576 == 0 else f"{n // 1024}k" if n % 1024 == 0 else str(n)


def scaling_markdown(hw: Hardware, *, world_size: int, seqlens, heads: int = 32, kv_heads: int = 8,
                     head_dim: int = 128, batch: int = 1, dtype: str = "bf16", basis: str = "datasheet") -> str:
    rows = scaling_rows(hw, world_size=world_size, seqlens=seqlens, heads=heads, kv_heads=kv_heads,
                        head_dim=head_dim, batch=batch, dtype=dtype, basis=basis)
    bw, link = link_bandwidth(hw, world_size, basis)
    lines = [f"{world_size}x {hw.display_name}: {link} link {bw / 1e9:.0f} GB/s per direction "
             f"(x{LINK_EFFICIENCY} achieved), {achieved_flops(hw, dtype, 'fwd', basis) / 1e12:.0f} / "
             f"{achieved_flops(hw, dtype, 'bwd', basis) / 1e12:.0f} TFLOP/s fwd / bwd; B={batch}, Hq={heads}, "
             f"Hkv={kv_heads}, D={head_dim}, {dtype}", "",
             "| N | mask | N/GPU | K/V per step | step compute (fwd) | step transfer (fwd) | hidden fwd/bwd "
             "| fwd | fwd+bwd | 1 GPU fwd+bwd | speedup | efficiency |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mask = "causal, zigzag" if r["causal"] else "none"
        lines.append(
            f"| {_tokens(r['seqlen'])} | {mask} | {_tokens(r['n_local'])} | {r['step_bytes_fwd'] / 1e6:.0f} MB "
            f"| {r['step_compute_ms_fwd']:.2f} ms | {r['step_transfer_ms_fwd']:.2f} ms "
            f"| {'yes' if r['hidden_fwd'] else 'no'}/{'yes' if r['hidden_bwd'] else 'no'} "
            f"| {r['fwd_ms']:.1f} ms | {r['fwd_bwd_ms']:.1f} ms | {r['single_fwd_bwd_ms']:.0f} ms "
            f"| {r['speedup_fwd_bwd']:.2f}x | {r['efficiency_fwd_bwd']:.1%} |")
    return "\n".join(lines)


def break_even_markdown(hw_names, *, world_size: int = 8, heads: int = 32, head_dim: int = 128,
                        dtype: str = "bf16") -> str:
    lines = [f"Tokens per GPU from which every ring step's transfer hides behind its compute "
             f"(Hq={heads}, D={head_dim}, {dtype}, {world_size} GPUs, causal zigzag):", "",
             "| hardware | link | GQA Hkv=8 fwd | GQA Hkv=8 bwd | MHA Hkv=32 fwd | MHA Hkv=32 bwd |",
             "|---|---|---|---|---|---|"]
    for name in hw_names:
        hw = get_hardware(name)
        bw, link = link_bandwidth(hw, world_size)
        cells = [str(break_even_tokens(hw, heads=heads, kv_heads=hkv, head_dim=head_dim, world_size=world_size,
                                       dtype=dtype, phase=ph))
                 for hkv in (8, heads) for ph in ("fwd", "bwd")]
        lines.append(f"| {hw.display_name} | {link}, {bw / 1e9:.4g} GB/s | " + " | ".join(cells) + " |")
    return "\n".join(lines)


_GENERATED = re.compile(r"(<!-- generated: python -m tileattn\.cost\.interconnect(.*?) -->\n)(.*?)(\n<!-- end -->)",
                        re.S)


def generated_blocks(text: str) -> list[tuple[str, str]]:
    """(arguments, body) of each block marked ``<!-- generated: python -m
    tileattn.cost.interconnect ARGS -->`` ... ``<!-- end -->`` in a document."""
    return [(m.group(2), m.group(3)) for m in _GENERATED.finditer(text)]


def update_doc(path) -> int:
    """Regenerate every marked block of the document at ``path`` in place;
    return how many there were."""
    import contextlib
    import io
    import shlex
    from pathlib import Path

    path = Path(path)
    text = path.read_text()

    def render(m):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            if main(shlex.split(m.group(2))) != 0:
                raise ValueError(f"{path}: the command in {m.group(1).strip()} failed")
        return m.group(1) + buf.getvalue().strip() + m.group(4)

    new, count = _GENERATED.subn(render, text)
    path.write_text(new)
    return count


def _parse_tokens(text: str) -> int:
    t = text.strip().lower()
    mult = {"k": 1024, "m": 1024 * 1024}.get(t[-1:], 1)
    try:
        return int(t[:-1] if mult > 1 else t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a token count (e.g. 131072, 128k, 1M)") from None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tileattn.cost.interconnect",
                                description="Predicted ring-attention scaling (markdown tables).")
    p.add_argument("--hw", nargs="+", default=["nvidia-h100-sxm", "nvidia-h200"])
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--seqlens", nargs="+", type=_parse_tokens, default=[_parse_tokens(s) for s in
                                                                          ("128k", "256k", "512k", "1M")])
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--update-doc", metavar="PATH", default=None,
                   help="regenerate the tables marked in a markdown file (e.g. docs/distributed.md) and exit")
    p.add_argument("--break-even", nargs="*", default=None, metavar="HW",
                   help="print the break-even table instead, for these hardware names (all if none given)")
    args = p.parse_args(argv)
    if args.update_doc:
        try:
            n = update_doc(args.update_doc)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{args.update_doc}: {n} tables regenerated")
        return 0
    try:
        if args.break_even is not None:  # the break-even table alone
            from .hardware import CATALOGUE
            blocks = [break_even_markdown(args.break_even or list(CATALOGUE), world_size=args.world,
                                          heads=args.heads, head_dim=args.head_dim, dtype=args.dtype)]
        else:
            blocks = [scaling_markdown(get_hardware(h), world_size=args.world, seqlens=args.seqlens,
                                       heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
                                       batch=args.batch, dtype=args.dtype) for h in args.hw]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n\n".join(blocks))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
