"""Ring attention: exact attention over a sequence sharded across the ranks of a
process group.

Each rank keeps its query shard; the K/V shards travel around the ring (rank r
sends to r + 1 and receives from r - 1), one hop per step, so after W steps
every query shard has met every K/V block.  Per block the core op
``tileattn::attention_fwd`` returns a partial output and its log-sum-exp, and
the partials merge exactly (docs/distributed.md derives the identity):

    lse = log(exp(lse_a) + exp(lse_b))
    out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b

The transfer of the next block is posted (``batch_isend_irecv``) before the
current block is computed on, so it overlaps the computation.

Backward: the K/V blocks travel the ring again, each with an accumulator for
its dK/dV that every rank adds its share to; one last hop brings each block's
dK/dV home.  Each block's share comes from ``tileattn::attention_bwd`` called
with the *final* merged output and lse of the local queries: P = exp(S - lse)
is then the true softmax restricted to the block and the delta term
rowsum(dO * O) - dlse is the full row's, so the per-block gradients are exact.
"""
from __future__ import annotations

import hashlib
import math
import struct

import torch
import torch.distributed as dist

from .. import api, ops
from .. import validation as val
from ..sinks import with_sinks
from ..cost.io import attention_flops
from .comm import RingCommunicationError, _resolve_group, _Ring
from .layout import LAYOUTS, check_layout, chunks_per_rank
from .profile import RingProfile, _step_timer
from .schedule import BlockPlan, block_plan, source_rank

__all__ = ["ring_attention", "RingCommunicationError"]

_KV_TAG = 0
_DKV_TAG = 1


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
_DTYPE_CODES = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.float64: 4}
_FIELDS = ("status", "batch", "query heads", "key/value heads", "local sequence length", "head_dim",
           "value head_dim", "dtype", "causal flag", "layout", "softmax scale", "gradient requirement", "sinks")
_FIELD_ARGS = {"batch": "q", "query heads": "q", "key/value heads": "k, v", "local sequence length": "q, k, v",
               "head_dim": "q, k", "value head_dim": "v", "dtype": "q, k, v", "causal flag": "causal",
               "layout": "layout", "softmax scale": "scale", "gradient requirement": "q, k, v",
               "sinks": "sinks"}


def _validate_local(q, k, v, causal, scale, layout, group, check_shards, profile) -> float:
    scale = api.validate(q, k, v, causal, scale)  # v's head dim Dv may differ from q's and k's D
    layout = check_layout(layout)
    if not isinstance(check_shards, bool):
        raise TypeError(f"check_shards must be a bool, got {type(check_shards).__name__}")
    if profile is not None and not isinstance(profile, RingProfile):
        raise TypeError(f"profile must be a tileattn.distributed.RingProfile or None, got {type(profile).__name__}")
    n_local = q.shape[2]
    if k.shape[2] != n_local:
        raise ValueError(f"k, v: ring attention shards one sequence, so q, k and v hold the same local length; "
                         f"got q {n_local} and k/v {k.shape[2]}")
    if n_local == 0 or q.shape[0] == 0:
        raise ValueError(f"q: the local shard is empty (shape {tuple(q.shape)}); every rank needs tokens")
    per = chunks_per_rank(layout)
    if n_local % per:
        raise ValueError(f"q, k, v: layout='zigzag' holds two equal chunks per rank, so the local sequence length "
                         f"must be even, got {n_local} (use layout='contiguous', or pad the sequence to a "
                         f"multiple of 2 x world size)")
    backend = str(dist.get_backend(group))
    if backend == "nccl" and not q.is_cuda:
        raise ValueError(f"q, k, v: the process group uses NCCL, which moves CUDA tensors; got {q.device}")
    if backend == "gloo" and q.device.type != "cpu":
        raise ValueError(f"q, k, v: the process group uses gloo, which moves CPU tensors here; got {q.device} "
                         f"(use an NCCL group for CUDA tensors)")
    return scale


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _sinks_check(sinks) -> int:
    """-1 without sinks, else a 56-bit hash of their values' bytes in order
    (the ranks must pass the same sinks; one small device-to-host copy)."""
    if sinks is None:
        return -1
    values = sinks.detach().double().cpu().tolist()
    digest = hashlib.blake2b(struct.pack(f"<{len(values)}d", *values), digest_size=7).digest()
    return int.from_bytes(digest, "little")


def _meta_row(ok: bool, q, k, v, causal, scale, layout, sinks=None) -> list[int]:
    if not ok:
        return [1] + [-1] * (len(_FIELDS) - 1)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return [0, q.shape[0], q.shape[1], k.shape[1], q.shape[2], q.shape[3], v.shape[3], _DTYPE_CODES[q.dtype],
            int(causal), LAYOUTS.index(layout), _bits(scale), int(needs_grad), _sinks_check(sinks)]


def _shown(field: str, value: int):
    if field == "softmax scale":
        return struct.unpack("<d", struct.pack("<q", value))[0]
    if field == "dtype":
        return {c: str(d).replace("torch.", "") for d, c in _DTYPE_CODES.items()}.get(value, value)
    if field == "layout":
        return LAYOUTS[value]
    if field in ("causal flag", "gradient requirement"):
        return bool(value)
    if field == "sinks":
        return "none" if value == -1 else f"given (hash {value:014x})"
    return value


def _agree(ring: _Ring, row: list[int], device) -> None:
    """All ranks exchange a small row describing their call (one all_gather);
    every rank raises the same ValueError if the calls disagree or a rank
    rejected its arguments."""
    t = torch.tensor(row, dtype=torch.int64, device=device)
    rows = [torch.empty_like(t) for _ in range(ring.world)]
    try:
        dist.all_gather(rows, t, group=ring.group)
    except Exception as exc:
        raise RingCommunicationError(f"ring_attention: the argument check on rank {ring.rank} of {ring.world} "
                                     f"failed: a peer rank failed or did not make the same call. "
                                     f"Backend error: {exc}") from exc
    table = [r.tolist() for r in rows]
    rejected = [i for i, r in enumerate(table) if r[0] != 0]
    if rejected:
        if row[0] != 0:
            return  # the caller re-raises its own error
        raise ValueError(f"ring_attention: rank(s) {rejected} rejected their arguments (the error is raised there); "
                         f"every rank of the group stops")
    for j, field in enumerate(_FIELDS[1:], start=1):
        values = [r[j] for r in table]
        if any(x != values[0] for x in values):
            per_rank = ", ".join(f"rank {i}: {_shown(field, x)}" for i, x in enumerate(values))
            raise ValueError(f"{_FIELD_ARGS[field]}: the ranks' calls disagree on the {field} ({per_rank}); "
                             f"every rank must pass shards of one sequence with the same arguments")


def _comm_device(group, q) -> torch.device:
    if isinstance(q, torch.Tensor):
        return q.device
    if "nccl" in str(dist.get_backend(group)) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ---------------------------------------------------------------------------
# Per-block compute (module functions: the tests patch them to inject faults)
# ---------------------------------------------------------------------------
def _block_forward(q, k, v, plan: BlockPlan, scale: float):
    qs = q[:, :, plan.q_start:plan.q_stop]
    return ops.attention_fwd(qs, k[:, :, plan.k_start:plan.k_stop], v[:, :, plan.k_start:plan.k_stop],
                             plan.causal, scale)[:2]


def _block_backward(dout, q, k, v, out, lse, dlse, plan: BlockPlan, scale: float):
    rows = slice(plan.q_start, plan.q_stop)
    keys = slice(plan.k_start, plan.k_stop)
    # (dq, dk, dv): the fourth output, the sinks' gradient, is empty here (the
    # sinks are folded in after the ranks' results are merged)
    return ops.attention_bwd(dout[:, :, rows], q[:, :, rows], k[:, :, keys], v[:, :, keys], out[:, :, rows],
                             lse[:, :, rows], None if dlse is None else dlse[:, :, rows], plan.causal, scale)[:3]


def _merge_(out_acc, lse_acc, out_blk, lse_blk) -> None:
    """In place: (out_acc, lse_acc) <- merge with a block's (out, lse).  Rows
    where both are empty (lse -inf) stay out 0, lse -inf."""
    lse_blk = lse_blk.to(lse_acc.dtype)
    lse_new = torch.logaddexp(lse_acc, lse_blk)
    ref = torch.where(torch.isneginf(lse_new), torch.zeros_like(lse_new), lse_new)
    w_acc = torch.exp(lse_acc - ref).unsqueeze(-1)
    w_blk = torch.exp(lse_blk - ref).unsqueeze(-1)
    out_acc.mul_(w_acc).add_(out_blk.to(out_acc.dtype) * w_blk)
    lse_acc.copy_(lse_new)


def _pack(k, v) -> torch.Tensor:
    """K and V of a block in one flat buffer, K first: one send and one receive
    per step, whatever V's head dim."""
    return torch.cat((k.reshape(-1), v.reshape(-1)))


def _unpack(buf: torch.Tensor, k_shape, v_shape) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of ``buf`` (from :func:`_pack`, or an accumulator of its size) as
    the block's K (or dK) and V (or dV)."""
    n_k = math.prod(k_shape)
    return buf[:n_k].view(k_shape), buf[n_k:].view(v_shape)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _like(template: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(template).copy_(values)


def _step_flops(q, v, plan: BlockPlan, mode: str) -> float:
    if not plan.computes:
        return 0.0
    b, hq, _, d = q.shape
    return attention_flops(b, hq, plan.n_q, plan.n_k, d, causal=plan.causal, mode=mode, head_dim_v=v.shape[-1])


# ---------------------------------------------------------------------------
# Forward and backward rings
# ---------------------------------------------------------------------------
def _ring_forward(q, k, v, causal: bool, scale: float, layout: str, ring: _Ring, profile):
    world, rank, n_local = ring.world, ring.rank, q.shape[2]
    acc_t = _acc_dtype(q.dtype)
    kv = _pack(k, v)
    spare = torch.empty_like(kv) if world > 1 else None
    kv_bytes = kv.numel() * kv.element_size()
    out_acc = lse_acc = None
    for step in range(world):
        plan = block_plan(layout, causal, rank, source_rank(rank, step, world), n_local)
        last = step == world - 1
        timer = _step_timer(profile, "forward", step, plan.source, plan.kind, _step_flops(q, v, plan, "fwd"),
                            0 if last else kv_bytes, q.device)
        what = f"forward step {step}"
        works = [] if last else ring.start(kv, spare, _KV_TAG, what)  # travels while this block computes
        with timer.time("compute"):
            if plan.computes:
                out_blk, lse_blk = _block_forward(q, *_unpack(kv, k.shape, v.shape), plan, scale)
                if out_acc is None:  # step 0 is the rank's own block: it covers every query row
                    out_acc, lse_acc = out_blk.to(acc_t), lse_blk.to(acc_t)
                else:
                    rows = slice(plan.q_start, plan.q_stop)
                    _merge_(out_acc[:, :, rows], lse_acc[:, :, rows], out_blk, lse_blk)
        with timer.time("wait"):
            ring.finish(works, what)
        if not last:
            kv, spare = spare, kv
    return out_acc, lse_acc


def _ring_backward(dout, dlse, q, k, v, out, lse, causal: bool, scale: float, layout: str, ring: _Ring, profile):
    world, rank, n_local = ring.world, ring.rank, q.shape[2]
    acc_t = _acc_dtype(q.dtype)
    kv = _pack(k, v)
    spare = torch.empty_like(kv) if world > 1 else None
    kv_bytes = kv.numel() * kv.element_size()
    dq = torch.zeros(q.shape, dtype=acc_t, device=q.device)
    # dK/dV accumulators travel with their blocks; two buffers alternate
    # between "being added to and sent" and "being received into"
    dkv_bufs = [torch.zeros(kv.shape, dtype=acc_t, device=q.device)]
    if world > 1:
        dkv_bufs.append(torch.empty_like(dkv_bufs[0]))
    dkv_bytes = dkv_bufs[0].numel() * dkv_bufs[0].element_size()
    incoming = []  # the dK/dV exchange posted at the end of the previous step
    for step in range(world):
        plan = block_plan(layout, causal, rank, source_rank(rank, step, world), n_local)
        last = step == world - 1
        timer = _step_timer(profile, "backward", step, plan.source, plan.kind, _step_flops(q, v, plan, "bwd"),
                            (0 if last else kv_bytes) + (dkv_bytes if world > 1 else 0), q.device)
        what = f"backward step {step}"
        works = [] if last else ring.start(kv, spare, _KV_TAG, what)
        with timer.time("compute"):
            if plan.computes:
                dq_blk, dk_blk, dv_blk = _block_backward(dout, q, *_unpack(kv, k.shape, v.shape), out, lse, dlse,
                                                         plan, scale)
                dq[:, :, plan.q_start:plan.q_stop].add_(dq_blk)
        with timer.time("wait"):
            ring.finish(incoming, what + " (dK/dV accumulator)")
        acc = dkv_bufs[step % 2]  # holds the block's dK/dV so far (zeros at step 0)
        with timer.time("compute"):
            if plan.computes:
                keys = slice(plan.k_start, plan.k_stop)
                acc_k, acc_v = _unpack(acc, k.shape, v.shape)
                acc_k[:, :, keys].add_(dk_blk)
                acc_v[:, :, keys].add_(dv_blk)
        if world > 1:
            incoming = ring.start(acc, dkv_bufs[(step + 1) % 2], _DKV_TAG, what + " (dK/dV accumulator)")
        with timer.time("wait"):
            ring.finish(works, what)
        if not last:
            kv, spare = spare, kv
    if world > 1:
        timer = _step_timer(profile, "backward", world, rank, "dkdv-return", 0.0, 0, q.device)
        with timer.time("wait"):
            ring.finish(incoming, "backward dK/dV return")
    dkv = dkv_bufs[world % 2 if world > 1 else 0]  # this rank's own block, with every rank's share
    return (dq,) + _unpack(dkv, k.shape, v.shape)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, layout, ring, profile):
        out_acc, lse = _ring_forward(q, k, v, causal, scale, layout, ring, profile)
        out = ops._out_like(q, v).copy_(out_acc)  # q's layout when Dv = D, as tileattn.attention
        # the op's lse dtype (float64 for float64 inputs keeps the backward exact)
        lse = lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (causal, scale, layout, ring, profile)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        causal, scale, layout, ring, profile = ctx.args
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        dq, dk, dv = _ring_backward(dout, dlse, q, k, v, out, lse, causal, scale, layout, ring, profile)
        return _like(q, dq), _like(k, dk), _like(v, dv), None, None, None, None, None


# ---------------------------------------------------------------------------
# Public function
# ---------------------------------------------------------------------------
def ring_attention(q, k, v, *, group=None, causal=False, scale=None, layout="zigzag", sinks=None,
                   return_lse=False, check_shards=True, profile=None):
    """Exact attention over a sequence sharded across the ranks of ``group``.

    Every rank of the group calls this with its shard of one sequence, in
    the same layout; the result on each rank is its shard of what
    ``tileattn.attention`` returns on the whole sequence.

    Args:
        q: (B, Hq, N_local, D) this rank's queries.
        k, v: (B, Hkv, N_local, D) this rank's keys, (B, Hkv, N_local, Dv)
            its values: V's head dim Dv may differ from D (1..512, as in
            ``tileattn.attention``); Hq a multiple of Hkv (GQA/MQA).
        group: the process group (default: the default group).  NCCL for
            CUDA tensors, gloo for CPU tensors.
        causal: causal mask over the *global* positions (query i sees key j
            iff j <= i in the full sequence).
        scale: softmax scale, default 1/sqrt(D).
        layout: ``"zigzag"`` (default: the sequence in 2W equal chunks, rank r
            holds chunks r and 2W-1-r; equal causal work on every rank;
            N_local even) or ``"contiguous"`` (rank r holds the r-th of W
            chunks; any N_local).  :func:`shard_sequence` makes the shards.
        sinks: float32 (Hq,) attention sinks, as in ``tileattn.attention``,
            the same on every rank: counted once per row (folded in after the
            ranks' partial results are merged).  Each rank's gradient of
            ``sinks`` is its own rows' share; sum it across the group (as
            data-parallel training does with replicated parameters).
        return_lse: also return the log-sum-exp over the whole sequence,
            float32 (B, Hq, N_local); differentiable.
        check_shards: first check, with one small all_gather, that all ranks
            pass the same shapes, dtype, arguments and sinks (a mismatch raises the
            same ValueError on every rank instead of a hang).  Costs a
            host synchronization; turn it off in a tuned training loop.
        profile: a :class:`RingProfile` that receives per-step compute and
            wait times of the forward and backward.

    Returns:
        out (B, Hq, N_local, Dv) in the input dtype (in q's layout when
        Dv = D), or (out, lse).

    Every rank must call the forward, and the backward, the same number of
    times.  A rank that fails mid-run makes the others raise
    :class:`RingCommunicationError` when their transfers fail (gloo: at once
    if the process died, else after the process group's timeout; NCCL: the
    watchdog aborts after the timeout) -- set ``timeout=`` in
    ``init_process_group``.  Extra memory per rank: two K/V blocks (forward),
    plus two float32 dK/dV blocks and a float32 dQ (backward); no N x N matrix.
    """
    group = _resolve_group(group)
    ring = _Ring(group)
    try:
        scale = _validate_local(q, k, v, causal, scale, layout, group, check_shards, profile)
        sinks = val.check_sinks(sinks, q, q.shape[1])
    except (TypeError, ValueError):
        if check_shards is True:  # let the other ranks stop too instead of waiting for this one
            _agree(ring, _meta_row(False, q, k, v, causal, scale, layout), _comm_device(group, q))
        raise
    if check_shards:
        _agree(ring, _meta_row(True, q, k, v, causal, scale, layout, sinks), q.device)
    out, lse = _RingAttention.apply(q, k, v, causal, scale, layout, ring, profile)
    out, lse = with_sinks(out, lse, sinks)   # on float64 lse for float64 inputs
    return (out, lse.float()) if return_lse else out
