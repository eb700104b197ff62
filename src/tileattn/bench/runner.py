"""The sweep: shapes, modes, timing, peak memory, correctness.

For every configuration (head dim, causal, mode) and every sequence length N
each provider is timed on the same inputs, in rounds: a round times every
provider that ran once, and round r starts r places further along the
provider list (so with three providers the orders are ABC, BCA, CAB).  A
provider's time is the median over the rounds, so a clock that drifts during
the point (thermals, boost, a neighbour on the machine) moves every provider
alike instead of whichever happened to run last.  Within a round the time is
the median of ``triton.testing.do_bench`` (warm-up included) on CUDA; on the
CPU, where do_bench cannot run, it is the median of a few
``time.perf_counter`` repeats after one warm-up call.  Each round's time is
kept in the row (``ms_rounds``).  TFLOP/s come from
:func:`tileattn.cost.io.attention_flops` (the one FLOP formula; causal counts
the visible pairs) divided by that time, and the achieved HBM bandwidth from
the IO model's bytes for the provider (``Provider.bytes_model``) divided by
that time.

Modes: ``fwd`` times a forward under ``torch.no_grad``; ``bwd`` times
``torch.autograd.grad`` through a graph built once; ``fwd_bwd`` times both.

Peak memory (CUDA), before the rounds, one provider at a time:
``torch.cuda.max_memory_allocated`` over one call of the timed step after a
first (compiling, autotuning) call, less what was alive
before that first call besides the point's inputs (q, k, v, dO).  Memory
that earlier work left behind, such as the cuBLAS workspaces of the float32
reference check, is not the step's; so the figure is the inputs plus
everything the step allocates at its peak.

Correctness: on the first (smallest) N of each configuration every
provider's forward output -- and, for modes with a backward, dq, dk and dv
for the same upstream gradient -- is compared with a float32
``standard_attention`` on the same inputs and with tileattn's.  A relative
error (Frobenius norm) above the tolerance (2e-2 for bf16 / fp16) marks the
provider ``wrong`` for that configuration at every N, so a fast wrong kernel
cannot win.
"""
from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import time
from typing import Callable, Optional

import torch

from tileattn.cost import io as cost_io
from tileattn.reference import standard_attention
from tileattn.validation import MAX_HEAD_DIM

from . import providers as _providers
from .results import METADATA_FIELDS, Row

MODES = ("fwd", "bwd", "fwd_bwd")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_TOLERANCE = {"bf16": 2e-2, "fp16": 2e-2, "fp32": 1e-3}
# FlashAttention-2 paper protocol
FA2_HEAD_DIMS = (64, 128)
FA2_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
FA2_TOKENS = 16384
FA2_HIDDEN = 2048

OOM_ERRORS = tuple({getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError), torch.cuda.OutOfMemoryError})


@dataclasses.dataclass
class BenchConfig:
    head_dims: tuple = FA2_HEAD_DIMS
    seqlens: tuple = FA2_SEQLENS
    modes: tuple = MODES
    causal: tuple = (False, True)
    providers: tuple = _providers.DEFAULT_PROVIDERS
    dtype: str = "bf16"
    tokens: int = FA2_TOKENS          # batch = tokens // N unless batch is given
    hidden: int = FA2_HIDDEN          # heads = hidden // d unless heads is given
    kv_heads: Optional[int] = None    # GQA: k/v heads; None = as many as query heads
    batch: Optional[int] = None
    heads: Optional[int] = None
    device: str = "cuda"
    warmup_ms: int = 25               # do_bench warm-up and measurement (ms)
    rep_ms: int = 100
    cpu_repeats: int = 3              # timing repeats without CUDA
    rounds: int = 3                   # timing rounds per point (round_orders: rotated, odd ones reversed)
    tolerance: Optional[float] = None
    seed: int = 0

    def __post_init__(self):
        self.seqlens = tuple(sorted(dict.fromkeys(self.seqlens)))
        self.head_dims = tuple(dict.fromkeys(self.head_dims))
        self.modes = tuple(dict.fromkeys(self.modes))
        self.providers = tuple(dict.fromkeys(self.providers))

    @property
    def tol(self) -> float:
        return self.tolerance if self.tolerance is not None else DEFAULT_TOLERANCE[self.dtype]

    def shape(self, n: int, d: int) -> tuple[int, int, int]:
        """(batch, heads, kv_heads) of the point with sequence length n and head dim d."""
        b = self.batch if self.batch is not None else max(1, self.tokens // n)
        h = self.heads if self.heads is not None else self.hidden // d
        return b, h, self.kv_heads if self.kv_heads is not None else h

    def validate(self) -> None:
        """Raise ValueError naming the offending option."""
        def positive(flag, values):
            bad = [x for x in values if not isinstance(x, int) or x < 1]
            if bad:
                raise ValueError(f"{flag}: values must be integers >= 1, got {bad[0]!r}")
        positive("--seqlens", self.seqlens)
        positive("--head-dims", self.head_dims)
        if not self.seqlens or not self.head_dims or not self.modes or not self.causal or not self.providers:
            raise ValueError("--seqlens, --head-dims, --modes, --causal and --providers need at least one value")
        for d in self.head_dims:
            if d > MAX_HEAD_DIM:
                raise ValueError(f"--head-dims: {d} exceeds {MAX_HEAD_DIM}, the largest head dim tileattn supports")
        for flag, v in (("--tokens", self.tokens), ("--hidden", self.hidden), ("--kv-heads", self.kv_heads),
                        ("--batch", self.batch), ("--heads", self.heads), ("--warmup", self.warmup_ms),
                        ("--rep", self.rep_ms), ("--repeats", self.cpu_repeats), ("--rounds", self.rounds)):
            if v is not None and v < 1:
                raise ValueError(f"{flag} must be >= 1, got {v}")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"--modes: unknown mode {bad[0]!r} (choose from {', '.join(MODES)})")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype: {self.dtype!r} is not one of {', '.join(DTYPES)}")
        unknown = [p for p in self.providers if p not in _providers.PROVIDERS]
        if unknown:
            raise ValueError(f"--providers: unknown provider {unknown[0]!r} "
                             f"(known: {', '.join(_providers.PROVIDERS)})")
        if self.tolerance is not None and not self.tolerance > 0:
            raise ValueError(f"--tolerance must be > 0, got {self.tolerance}")
        for d in self.head_dims:
            if self.heads is None and self.hidden < d:
                raise ValueError(f"--hidden {self.hidden} is smaller than head dim {d} (heads = hidden / d)")
            if self.heads is None and self.hidden % d:
                raise ValueError(f"--hidden {self.hidden} is not a multiple of head dim {d} (heads = hidden / d)")
            for n in self.seqlens:
                b, h, hkv = self.shape(n, d)
                if h % hkv:
                    raise ValueError(f"--kv-heads {hkv} must divide the number of query heads ({h} at d={d})")

    def points(self):
        """(d, causal, mode, index, n) in sweep order."""
        for d in self.head_dims:
            for causal in self.causal:
                for mode in self.modes:
                    for i, n in enumerate(self.seqlens):
                        yield d, causal, mode, i, n

    def total_steps(self) -> int:
        return (len(self.head_dims) * len(self.causal) * len(self.modes) * len(self.seqlens)
                * len(self.providers))


# ---------------------------------------------------------------------------
# timing and the IO model
# ---------------------------------------------------------------------------
def time_ms(fn: Callable[[], object], device: torch.device, *, warmup_ms: int = 25, rep_ms: int = 100,
            cpu_repeats: int = 3) -> float:
    """Median time of ``fn()`` in milliseconds (do_bench on CUDA; perf_counter repeats elsewhere)."""
    if device.type == "cuda":
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    fn()  # warm-up
    times = []
    for _ in range(cpu_repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def tflops_of(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def _device_cache(device: torch.device):
    """L2 reuse model and shared memory per block of the CUDA device (None, None elsewhere)."""
    if device.type != "cuda":
        return None, None
    props = torch.cuda.get_device_properties(device)
    l2 = getattr(props, "L2_cache_size", 0)
    sms = getattr(props, "multi_processor_count", 0)
    smem_sm = getattr(props, "shared_memory_per_multiprocessor", None)
    smem_block = getattr(props, "shared_memory_per_block_optin", None)
    cache = cost_io.CacheModel(float(l2), sms, smem_sm) if l2 and sms else None
    return cache, smem_block


BYTES_MODEL_NOTE = ("achieved GB/s = IO-model HBM bytes / time: the tiled model (tileattn.cost.io.tiled_traffic, "
                    "with the device's L2 reuse model on CUDA) for tileattn, sdpa-*, flex and fa4; the eager standard "
                    "model (standard_traffic, fusion='eager') for standard")


def model_bytes(bytes_model: str, b: int, h: int, hkv: int, n: int, d: int, causal: bool, dtype: str, mode: str,
                device: torch.device) -> tuple[Optional[float], str]:
    """HBM bytes of one call under the IO model, and the model's label."""
    phase = {"fwd": "fwd", "bwd": "bwd", "fwd_bwd": None}[mode]
    cache, smem = _device_cache(device)
    try:
        shape = cost_io.AttentionShape(b, h, n, d, seqlen_k=n, kv_heads=hkv, causal=causal, dtype=dtype)
        if bytes_model == "standard":
            est = cost_io.standard_traffic(shape, fusion="eager", l2_bytes=cache.l2_bytes if cache else None)
            return est.bytes(phase), "standard-eager"
        est = cost_io.tiled_traffic(shape, cache=cache, smem_per_block=smem)
        return est.bytes(phase), "tiled+L2" if cache else "tiled"
    except ValueError:
        return None, ""


# ---------------------------------------------------------------------------
# one provider on one point
# ---------------------------------------------------------------------------
def _leaves(q, k, v):
    return [t.detach().requires_grad_(True) for t in (q, k, v)]


def _outputs(fn, q, k, v, causal, dout) -> dict[str, torch.Tensor]:
    """Forward output, and dq/dk/dv for upstream gradient ``dout`` when given (float32, on the CPU)."""
    if dout is None:
        with torch.no_grad():
            res = {"out": fn(q, k, v, causal)}
    else:
        leaves = _leaves(q, k, v)
        out = fn(*leaves, causal)
        dq, dk, dv = torch.autograd.grad(out, leaves, dout)
        res = {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv}
    return {name: t.detach().float().cpu() for name, t in res.items()}


def _reference(q, k, v, causal, dout) -> dict[str, torch.Tensor]:
    def fp32(q, k, v, causal):
        return standard_attention(q, k, v, causal=causal)
    return _outputs(fp32, q.float(), k.float(), v.float(), causal, None if dout is None else dout.float())


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| (Frobenius); NaN when x has NaNs or the shapes differ."""
    if x.shape != ref.shape:
        return math.nan
    den = float(ref.norm())
    return float((x - ref).norm()) / (den if den > 0 else 1.0)


def _errors(outs, ref) -> tuple[float, str]:
    errs = {name: rel_err(outs[name], ref[name]) for name in ref if name in outs}
    worst = max(errs.values(), key=lambda e: math.inf if math.isnan(e) else e)
    return worst, ", ".join(f"{k} {v:.2e}" for k, v in errs.items())


def _prepare(fn, q, k, v, causal, mode, dout) -> Callable[[], object]:
    """The callable that is timed for ``mode``."""
    if mode == "fwd":
        def step():
            with torch.no_grad():
                return fn(q, k, v, causal)
        return step
    leaves = _leaves(q, k, v)
    if mode == "bwd":
        out = fn(*leaves, causal)
        return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)

    def step():
        out = fn(*leaves, causal)
        return torch.autograd.grad(out, leaves, dout)
    return step


def _failure(e: BaseException) -> str:
    msg = (str(e).strip().splitlines() or [""])[0]
    return f"failed: {type(e).__name__}: {msg[:160]}"


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _residue_bytes(device, *inputs) -> int:
    """Bytes allocated on ``device`` beyond the given tensors' storages."""
    if device.type != "cuda":
        return 0
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in inputs if t is not None}
    return max(0, torch.cuda.memory_allocated(device) - sum(storages.values()))


def _clear(device):
    # tensors held by reference cycles (an out-of-memory error's traceback
    # frames, say) would otherwise stay alive into the next measurement.  Where
    # no memory is measured (the CPU) the error paths collect themselves
    # (_clear_after_error): a full collection costs ~0.1-0.3 s with torch and
    # triton loaded, more than a tiny point
    if device.type == "cuda":
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _clear_after_error(device):
    gc.collect()
    _clear(device)


def round_orders(names: list[str], rounds: int) -> list[list[str]]:
    """The order of each timing round: round r is ``names`` rotated left by
    r, and reversed in odd rounds.  The rotation moves every provider through
    the positions (clock drift favours none); the reversal swaps who follows
    whom: with rotation alone a provider stayed behind the same neighbour
    every round, and on the H200 one timed after a low-power provider ran up
    to 6 % faster than its own twin elsewhere in the list (perf-notes v23)."""
    orders = []
    for r in range(rounds):
        k = r % len(names) if names else 0
        order = names[k:] + names[:k]
        orders.append(order[::-1] if r % 2 else order)
    return orders


def run_sweep(cfg: BenchConfig, *, metadata: Optional[dict] = None,
              on_step: Optional[Callable[[str], None]] = None,
              on_row: Optional[Callable[[Row], None]] = None) -> list[Row]:
    """Run the sweep; return one :class:`Row` per (point, provider).  ``on_step``
    is called with a description before each provider's set-up (correctness
    check, compile, peak memory) and before each timing round, ``on_row`` with
    each finished row (a point's rows finish together, after its rounds)."""
    cfg.validate()
    device = torch.device(cfg.device)
    dtype = DTYPES[cfg.dtype]
    meta = metadata or {}
    reasons = {p: _providers.available_reason(p, device) for p in cfg.providers}
    # tileattn first: the others are checked against its outputs
    order = sorted(cfg.providers, key=lambda p: p != "tileattn")
    rows: list[Row] = []
    wrong_at: dict[tuple, int] = {}
    for d, causal, mode, i, n in cfg.points():
        b, h, hkv = cfg.shape(n, d)
        label = f"d={d} {'causal' if causal else 'full'} {mode} N={n}"
        gen = torch.Generator(device=device).manual_seed(cfg.seed)
        q = torch.randn(b, h, n, d, device=device, dtype=dtype, generator=gen)
        k, v = (torch.randn(b, hkv, n, d, device=device, dtype=dtype, generator=gen) for _ in range(2))
        dout = torch.randn(b, h, n, d, device=device, dtype=dtype, generator=gen) if mode != "fwd" else None
        flops = cost_io.attention_flops(b, h, n, n, d, causal=causal, mode=mode)
        ref, tile_outs, ref_note = None, None, ""
        if i == 0:
            try:
                ref = _reference(q, k, v, causal, dout)
            except OOM_ERRORS:
                ref_note = "skipped: the float32 reference ran out of memory"
            _clear(device)
        point: dict[str, Row] = {}
        ready: list[str] = []      # set up without error: timed in the rounds
        for name in order:
            if on_step:
                on_step(f"{label} {name}")
            prov = _providers.get_provider(name)
            row = point[name] = Row(
                provider=name, status="", mode=mode, causal=causal, batch=b, heads=h, kv_heads=hkv,
                seqlen_q=n, seqlen_k=n, head_dim=d, dtype=cfg.dtype, device=str(device), flops=flops,
                **{k_: meta.get(k_, "") for k_ in METADATA_FIELDS})
            if reasons[name]:
                row.status = f"unavailable: {reasons[name]}"
                continue
            step, failed = None, True
            try:
                _clear(device)
                if i == 0:
                    if ref is None:
                        row.check = ref_note
                    else:
                        outs = _outputs(prov.fn, q, k, v, causal, dout)
                        row.rel_err_ref, row.check_detail = _errors(outs, ref)
                        if name == "tileattn":
                            tile_outs, row.rel_err_tileattn = outs, 0.0
                        elif tile_outs is not None:
                            row.rel_err_tileattn, _ = _errors(outs, tile_outs)
                        del outs
                        ok = row.rel_err_ref <= cfg.tol  # False for NaN
                        row.check = "passed" if ok else "wrong"
                        if not ok:
                            wrong_at[(d, causal, mode, name)] = n
                        _clear(device)
                # what is alive now besides this point's inputs (cuBLAS
                # workspaces left by the float32 reference check, other
                # providers' caches) is not the step's: out of its peak
                residue = _residue_bytes(device, q, k, v, dout)
                step = _prepare(prov.fn, q, k, v, causal, mode, dout)
                # a first call compiles and autotunes (the autotuner's timing
                # buffers are not the step's); the peak is of the second
                step()
                _sync(device)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                step()
                _sync(device)
                if device.type == "cuda":
                    row.peak_mem_bytes = int(torch.cuda.max_memory_allocated(device)) - residue
                ready.append(name)
                failed = False
            except OOM_ERRORS:
                row.status = "oom"
            except Exception as e:  # reported, never dropped
                row.status = _failure(e)
            finally:
                step = None
                (_clear_after_error if failed else _clear)(device)

        # timing: every ready provider once per round, in round_orders' order
        # (rotated, reversed in odd rounds); a provider that fails in a round leaves the later ones
        times: dict[str, list[float]] = {name: [] for name in ready}
        for r, names in enumerate(round_orders(ready, cfg.rounds)):
            if on_step and names:
                on_step(f"{label} timing round {r + 1}/{cfg.rounds}")
            for name in names:
                if name not in times:
                    continue
                step = None
                try:
                    step = _prepare(_providers.get_provider(name).fn, q, k, v, causal, mode, dout)
                    times[name].append(time_ms(step, device, warmup_ms=cfg.warmup_ms, rep_ms=cfg.rep_ms,
                                               cpu_repeats=cfg.cpu_repeats))
                    step = None  # the step's graph goes by reference count; a full _clear
                    _sync(device)  # (gc.collect) between rounds is only needed after an error
                except OOM_ERRORS:
                    point[name].status = "oom"
                    del times[name]
                    step = None
                    _clear_after_error(device)
                except Exception as e:
                    point[name].status = _failure(e)
                    del times[name]
                    step = None
                    _clear_after_error(device)
        for name, ms_rounds in times.items():
            row = point[name]
            row.rounds, row.ms_rounds = len(ms_rounds), ms_rounds
            row.ms = statistics.median(ms_rounds)
            row.tflops = tflops_of(flops, row.ms)
            row.model_bytes, row.bytes_model = model_bytes(_providers.get_provider(name).bytes_model, b, h, hkv,
                                                           n, d, causal, cfg.dtype, mode, device)
            if row.model_bytes is not None:
                row.hbm_gbs = row.model_bytes / (row.ms * 1e-3) / 1e9
            row.status = "ok"

        for name in order:
            row = point[name]
            n0 = wrong_at.get((d, causal, mode, name))
            if n0 is not None and i == 0:
                row.status = (f"wrong: relative error {row.rel_err_ref:.2e} > {cfg.tol:g} "
                              f"vs float32 standard attention")
            elif n0 is not None and row.status == "ok":
                row.status = f"wrong: failed the correctness check at N={n0}"
            rows.append(row)
            if on_row:
                on_row(row)
        del q, k, v, dout, ref, tile_outs
        _clear(device)
    return rows
