"""The Hopper forward and backward as ``launch/attention.py`` runs them once
the dispatch chose the Hopper kernels: the backward's steps around the dK/dV
kernel (``bwd_steps``: the portable preprocess and convert; ``bwd_memory``:
memory chunks) and launch plans (``runtime.py``).

A plan keeps what the launchers passed to each compiled kernel on the first
call of a key; a later call of the same key allocates its outputs and
launches the recorded kernels with its own tensors, building no descriptor
and binding no argument.  At 512-2k keys a call's host time was close to its
GPU time (perf-notes v25), which lets the GPU idle between calls.  The key
holds everything the launchers decide from (shapes, strides, dtypes,
alignment, the scalars, the chosen config and, in the backward, the memory
plan and the causal pairing); calls that a plan cannot replay take no plan:
variants, a forced config, poisoned outputs, backward calls with sinks, and
backward calls in memory chunks or head slices (their float32 sums are
zeroed and rounded by PyTorch between launches, which a plan does not
record).  Forward calls with sinks, and those that keep the output's
rounding remainder, have plans too (perf-notes v29), and so do persistent
backward calls whose last round is cut: their zeroed workspace is one of
the named tensors (``hopper_persistent.bwd_workspace``).
"""
from __future__ import annotations

import dataclasses

import torch

from ..sinks import kernel_sink_grad, remainder_like, sink_sums_grad
from . import bwd_memory, bwd_steps, grid_order, hopper, hopper_persistent, runtime
from .runtime import aligned, output_f32, output_like


def _fwd_tensors(q, k, v, o, lse, sinks, o_lo, workspace) -> dict:
    """A forward's tensors by the names its plan knows (sinks, the
    remainder and the stream-K workspace where the call has them)."""
    tensors = {"q": q, "k": k, "v": v, "o": o, "lse": lse, **workspace}
    if sinks is not None:
        tensors["sinks"] = sinks
    if o_lo is not None:
        tensors["o_lo"] = o_lo
    return tensors


def fwd(q, k, v, causal: bool, scale: float, config=None, sinks=None, remainder: bool = False, window=None,
        varlen=None):
    """``hopper.attn_fwd``, through a plan for a call with the table's
    config (with or without sinks and the output's remainder; ``window``:
    a sliding window's kernel bounds, ``causal`` folded into them;
    ``varlen``: packed sequences, as the launcher takes them, no plan)."""
    key = None
    if sinks is not None:   # as the launcher passes them, so that a plan can name the tensor
        sinks = sinks.float().contiguous()
    cfg = config or hopper.call_config(q.shape[-1], v.shape[-1], k.shape[2], causal, window, varlen)
    if config is None and not runtime.POISON_OUTPUTS and varlen is None:
        key = runtime.plan_key("hopper_fwd", (q, k, v, sinks), bool(causal), float(scale), cfg, bool(remainder),
                               window, hopper.even_k(k.shape[2], causal, window, varlen, cfg))
        plan = runtime.PLANS.get(key) if key is not None else None
        if plan is not None:
            o, lse = hopper.fwd_outputs(q, v)
            o_lo = remainder_like(o) if remainder else None
            if aligned(o, lse, *(() if o_lo is None else (o_lo,))):
                runtime.replay(plan, _fwd_tensors(q, k, v, o, lse, sinks, o_lo,
                                                  hopper.fwd_workspace(q, k, v, causal, cfg)))
                return (o, lse) if o_lo is None else (o, lse, o_lo)
            key = None
    workspace = hopper.fwd_workspace(q, k, v, causal, cfg)
    if key is not None:
        runtime.begin_record()
    try:
        out = hopper.attn_fwd(q, k, v, causal, scale, config, poison=runtime.POISON_OUTPUTS, sinks=sinks,
                              remainder=remainder, workspace=workspace, window=window, varlen=varlen)
    except BaseException:
        runtime.abandon_record()
        raise
    if key is not None:
        runtime.end_record(key, _fwd_tensors(q, k, v, out[0], out[1], sinks, out[2] if remainder else None,
                                             workspace))
    return out


def _stats(q, cfg):
    """(delta, lse2): rows padded for the copy engine where the kernel reads them through it."""
    b, hq, n_q, _ = q.shape
    if cfg.stats_tma:   # the kernel's copy engine reads them: rows padded to 16 bytes
        return hopper.stats_rows(b, hq, n_q, q.device)
    return output_f32((b, hq, n_q), q.device), output_f32((b, hq, n_q), q.device)


def bwd(do, q, k, v, o, lse, dlse, causal: bool, scale: float, config=None, sinks=None, o_lo=None, window=None,
        varlen=None):
    """The atomic-dQ backward, Hopper's dK/dV kernel between the portable
    preprocess and convert: (dq, dk, dv), then the sinks' gradient if any
    (from ``o_lo`` where given, else the dS row sums); ``window``: a sliding
    window's kernel bounds, ``causal`` folded into them; ``varlen``: packed
    sequences (``hopper.attn_bwd_dkdv``'s, no plan)."""
    b, hq, n_q, d = q.shape
    plain = sinks is None and window is None and varlen is None
    cfg = config or hopper.bwd_call_config(q, k, v, causal, plain=plain)
    if varlen is not None and cfg.stats_tma:   # a sequence's rows start anywhere: lse2 and Δ by pointer loads
        cfg = dataclasses.replace(cfg, stats_tma=False)
    chunks = bwd_memory.memory_chunks(q, k, v, causal, cfg)   # checks head_slices before any launch
    key = None
    if (config is None and sinks is None and varlen is None and len(chunks) == 1
            and not hopper.transposed_dq(d, v.shape[-1])
            and hopper.head_slices(q, k, causal, cfg) == 1):
        key = runtime.plan_key("hopper_bwd", (do, q, k, v, o, lse, dlse), bool(causal), float(scale), cfg,
                               grid_order.paired(q, k, causal, cfg), window)
        plan = runtime.PLANS.get(key) if key is not None else None
        if plan is not None:
            tensors = _bwd_tensors(do, q, k, v, o, lse, dlse, cfg, causal, plain)
            if aligned(*(tensors[name] for name in ("dq", "dk", "dv", "delta", "lse2", "dq_acc"))):
                runtime.replay(plan, tensors)
                return tensors["dq"], tensors["dk"], tensors["dv"]
            key = None
    if key is not None:
        runtime.begin_record()
    try:
        got = _bwd_launch(do, q, k, v, o, lse, dlse, causal, scale, cfg, chunks, sinks, o_lo, window, varlen)
    except BaseException:
        runtime.abandon_record()
        raise
    if key is not None:
        runtime.end_record(key, got[-1])
    return got[:-1]


def _bwd_tensors(do, q, k, v, o, lse, dlse, cfg, causal, plain) -> dict:
    """A one-launch call's tensors by the names its plan knows, outputs fresh
    (``plain``: the persistent walk's split-tail workspace, where it cuts one)."""
    delta, lse2 = _stats(q, cfg)
    tensors = {"do": do, "q": q, "k": k, "v": v, "o": o, "lse": lse, "dq": output_like(q), "dk": output_like(k),
               "dv": output_like(v), "delta": delta, "lse2": lse2, "dq_acc": bwd_steps.dq_accumulator(q),
               **(hopper_persistent.bwd_workspace(k, causal, cfg) if plain else {})}
    if dlse is not None:
        tensors["dlse"] = dlse
    return tensors


def _bwd_launch(do, q, k, v, o, lse, dlse, causal, scale, cfg, chunks, sinks, o_lo, window=None, varlen=None) -> tuple:
    """The launches; returns (dq, dk, dv[, dsinks], tensors by name for a plan)."""
    b, hq, n_q, d = q.shape
    one = len(chunks) == 1
    if one and not hopper.transposed_dq(d, v.shape[-1]):   # the tensors themselves, by the names a plan knows
        tensors = _bwd_tensors(do, q, k, v, o, lse, dlse, cfg, causal, sinks is None and window is None
                               and varlen is None and hopper.head_slices(q, k, causal, cfg) == 1)
        dq, dk, dv, delta, lse2 = (tensors[name] for name in ("dq", "dk", "dv", "delta", "lse2"))
    else:
        dq, dk, dv = output_like(q), output_like(k), output_like(v)
        delta, lse2 = _stats(q, cfg)
        tensors = {}
    # sinks without the forward's output remainder: their gradient from the kernel's dS row sums, or its
    # per-head sums (cfg.sink_sums)
    sums_ds = sinks is not None and o_lo is None and not cfg.sink_sums
    ds_sum = torch.zeros((b, hq, n_q), device=q.device, dtype=torch.float32) if sums_ds else None
    per_head = sinks is not None and o_lo is None and cfg.sink_sums
    sink_sums = torch.zeros(hq, device=q.device, dtype=torch.float32) if per_head else None
    sinks32 = sinks.float().contiguous() if per_head else None
    dsinks = bwd_steps.preprocess(do, o, lse, dlse, delta, lse2, o_lo, sinks)
    new_sum = hopper.dq_sum_transposed if hopper.transposed_dq(d, v.shape[-1]) else bwd_steps.dq_accumulator
    dq_acc = None   # one float32 dQ sum for every chunk (bwd_memory: a bound on the peak)
    for bs, hs, hks in chunks:
        def part(t, idx, bs=bs):   # this chunk's view; one chunk: the tensor itself
            return t if one or t is None else t[bs, idx]

        def heads(t, hs=hs):   # a per-head vector's view
            return t if one or t is None else t[hs]
        if dq_acc is None:
            dq_acc = tensors["dq_acc"] if tensors else new_sum(part(q, hs))
        else:
            dq_acc.zero_()
        hopper.attn_bwd_dkdv(part(do, hs), part(q, hs), part(k, hks), part(v, hks), dq_acc, part(dk, hks),
                             part(dv, hks), part(lse2, hs), part(delta, hs), causal, scale, cfg, part(ds_sum, hs),
                             window=window, varlen=varlen, sink_sums=heads(sink_sums), sinks=heads(sinks32),
                             workspace=tensors.get("ws"))
        bwd_steps.dq_convert(dq_acc, part(dq, hs), scale)
    if sinks is not None and dsinks is None:
        dsinks = (sink_sums_grad(sinks, lse, dlse, sink_sums) if per_head
                  else kernel_sink_grad(sinks, lse, dlse, delta, ds_sum))
    grads = (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks)
    return grads + (tensors,)
