"""Public functions ``attention`` and ``attention_varlen``.  Inputs are
checked (``validation.py``) before anything is launched; ``dispatch.py``
picks the path and ``ops.py`` holds the autograd routes."""
from __future__ import annotations

import torch

from . import configs, dispatch, ops
from .sinks import with_sinks
from . import validation as val

__all__ = ["attention", "attention_varlen", "validate", "check_shared_memory"]


def validate(q, k, v, causal, scale) -> float:
    """The dense checks of :func:`attention` on the path ``q`` selects;
    returns the softmax scale to use."""
    return val.check_qkv(q, k, v, causal, scale, uses_kernels=dispatch.uses_triton)


def check_shared_memory(q, k, v, sinks, deterministic: bool) -> None:
    """On the kernels, before anything runs: the forward and, when a gradient
    will be asked for, the backward have a tile that fits the GPU's shared
    memory (ValueError otherwise, e.g. float32 at head dim 512 on a 99 KB
    part; ``configs.check_fits``).  Under ``torch.compile`` the launchers'
    own check runs instead."""
    if (max(q.shape[-1], v.shape[-1]) <= configs.SMEM_CHECKED_ABOVE or not dispatch.uses_triton(q)
            or torch.compiler.is_compiling()):
        return
    from .launch import attention as launch_attention
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks))
    kinds = ("fwd",) + (launch_attention.bwd_kinds(deterministic) if grad else ())
    launch_attention.check_shared_memory(q, v, kinds)


def attention(q, k, v, *, causal=False, scale=None, return_lse=False, window=None, softcap=None,
              alibi_slopes=None, block_mask=None, sinks=None, deterministic=None):
    """Exact attention, softmax(scale * q k^T) v, computed tile by tile.

    Args:
        q: (B, Hq, Nq, D) queries.
        k, v: (B, Hkv, Nk, D) keys and (B, Hkv, Nk, Dv) values (V's head dim
            Dv may differ from D, each 1..512); Hq must be a multiple of Hkv
            (grouped-query / multi-query attention, no copies of k and v).
            Any strides; no copies are made.
        causal: bottom-right aligned causal mask: query i sees key j iff
            j <= i + Nk - Nq (as FlashAttention >= 2.1).  A row that sees no
            key returns 0 and lse -inf (with sinks: lse = sinks[h]).
        scale: softmax scale, default 1/sqrt(D).
        return_lse: also return the natural-log log-sum-exp of the scaled
            scores, float32 (B, Hq, Nq).  It is differentiable.
        window: sliding window ``(left, right)``: query i sees key j iff
            i + Nk - Nq - left <= j <= i + Nk - Nq + right; -1 leaves a side
            unbounded.  With ``causal`` the right side is 0.  Key tiles
            outside the window are never visited.
        softcap: ``c > 0`` caps the scaled scores at c * tanh(s / c) (Gemma 2,
            Grok); None or 0 for none.
        alibi_slopes: ALiBi slopes, (Hq,) or (B, Hq) floats: the bias
            -slope * |i + Nk - Nq - j| is added to the (capped) scaled scores.
            The slopes are not differentiated.
        block_mask: block-sparse layout, bool (B or 1, Hq or 1,
            ceil(Nq / 128), ceil(Nk / 128)) (``tileattn.block_mask.BLOCK_Q``,
            ``BLOCK_K``), or the result of ``tileattn.block_mask_from_fn``:
            query block i attends to key block j only where the entry is True;
            blocks switched off are never loaded or computed.  Combines with
            ``causal`` and ``window``.  The kernels' block lists are kept per
            layout tensor until a torch operation changes it in place; after a
            write through ``.numpy()`` or ``.data`` pass a new tensor.
        sinks: attention sinks, float32 (Hq,), differentiable: one extra
            logit per head in every row's softmax denominator (gpt-oss): row
            i of head h uses sum_j exp(s_ij) + exp(sinks[h]); the sink is a
            raw logit (not scaled) and carries no value.  The returned lse is
            the log of that whole denominator, so a row that sees no key
            returns 0 and lse = sinks[h].  Combines with every variant.
            A sink of -inf is no sink for its head; +inf or NaN give
            undefined rows (the paths differ), and the values are not
            checked for being finite (that would wait for the device).
        deterministic: which backward the kernels run.  True: dK/dV and
            dQ by separate kernels, bitwise reproducible.  False: one kernel
            computes dK/dV and adds dQ into a float32 sum with atomics
            (5 instead of 7 tile matmuls; faster, but dq may differ in the
            last bits from run to run; so may dk and dv of a causal GQA call
            from 4096 keys on the Hopper kernel, whose head slices add them
            into float32 sums too).  None (default): the faster one for the
            call -- False where the Hopper backward runs it (a plain
            fp16/bf16 call at d = 64 or 128 on a compute capability 9.0 GPU:
            0.95-1.07x cuDNN there, against 0.61-0.88x for the deterministic
            kernels, docs/perf-notes.md v12-v24), True everywhere else (where
            the portable atomic kernel is the slower one) and whenever
            ``torch.use_deterministic_algorithms`` is on.  The pure-PyTorch
            path ignores it (it is deterministic).

    Returns:
        out (B, Hq, Nq, Dv) in the input dtype, or (out, lse).

    fp16, bf16 and fp32 run the Triton kernels on GPUs; on other devices (and
    for float64 on CPU) the CPU path runs: torch's fused CPU attention kernel
    where its semantics match (a plain call), else a pure-PyTorch tiled
    implementation of the same algorithm.
    """
    scale = validate(q, k, v, causal, scale)
    val.check_bool("return_lse", return_lse)
    det = val.check_deterministic(deterministic)
    b, hq, n_q, _ = q.shape
    left, right = val.check_window(window)
    cap = val.check_softcap(softcap)
    slopes = val.check_alibi(alibi_slopes, q, b, hq)
    mask = val.check_block_mask(block_mask, q, b, hq, n_q, k.shape[2])
    sinks = val.check_sinks(sinks, q, hq)
    # (`is None`, not a tuple ==: a tensor == None breaks torch.compile's graph on torch 2.11)
    plain_scores = cap == 0.0 and slopes is None and mask is None   # no softcap, ALiBi or block mask
    plain = plain_scores and left == -1 and right == -1
    # a 16-bit call with sinks that will be differentiated keeps its output's
    # rounding remainder, so its backward needs no dS sums for their gradient
    remainder = ops.keeps_remainder(q, sinks, ops.wants_remainder(q, k, v, sinks))
    # the Hopper backward runs plain calls and sliding windows alone (d <= 128)
    hopper_ok = plain or (plain_scores and dispatch.hopper_window_bwd(q, v))
    if det is None:
        det = dispatch.default_deterministic(q, k, v, hopper_ok, sinks is not None and not remainder)
    if remainder and not det and dispatch.hopper_sink_sums(q, k, v, hopper_ok):
        remainder = False   # the Hopper backward's per-head sums give the sinks' gradient without it
    check_shared_memory(q, k, v, sinks, det)
    if dispatch.eager_applies(q, k, v):
        # same launchers, without the custom-op dispatch (host time; see ops.py)
        out, lse = ops.eager_attention(q, k, v, causal, scale,
                                       None if plain else ops.variant_kwargs(left, right, cap, slopes, mask), det,
                                       sinks, remainder)
    elif plain and sinks is None:
        out, lse, _ = ops.attention_fwd(q, k, v, causal, scale, deterministic=det)
    else:
        out, lse, _ = ops.attention_fwd(q, k, v, causal, scale, left, right, cap, slopes, mask, det, sinks,
                                        remainder)
    if return_lse:
        return out, lse.float()
    return out


# ---------------------------------------------------------------------------
# Packed variable-length sequences
# ---------------------------------------------------------------------------
def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None,
                     window=None, softcap=None, alibi_slopes=None, sinks=None, return_lse=False,
                     deterministic=None):
    """Exact attention over packed sequences of different lengths (no padding).

    Sequence b owns query rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` and key
    rows ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``; each attends only within
    itself, with ``causal`` and ``window`` aligned bottom-right per sequence
    (as in :func:`attention`).  Lengths 0 and 1 are allowed; a query row whose
    sequence has no keys returns 0 (lse -inf; with sinks lse = sinks[h]).

    Args:
        q: (total_q, Hq, D); k: (total_k, Hkv, D); v: (total_k, Hkv, Dv),
            Dv V's own head dim (as in :func:`attention`); Hq a multiple of Hkv.
        cu_seqlens_q, cu_seqlens_k: int32 (B + 1,) cumulative lengths,
            starting at 0, non-decreasing, ending at total_q / total_k.
        max_seqlen_q, max_seqlen_k: ints >= the longest sequence (they size
            the kernels' grid).
        causal, scale, window, softcap: as in :func:`attention`.
        alibi_slopes: (Hq,) or (B, Hq) floats, as in :func:`attention`.
        sinks: float32 (Hq,) attention sinks, as in :func:`attention`.
        return_lse: also return the log-sum-exp, float32 (Hq, total_q).
        deterministic: the backward, as in :func:`attention` (``None``: the
            deterministic kernels, but the atomic Hopper backward where its
            opt-in packed build is asked for with
            ``TILEATTN_HOPPER_VARLEN_BWD=1``).

    Returns:
        out (total_q, Hq, Dv), or (out, lse).

    The cumulative lengths are checked before anything is launched (one
    small device-to-host copy the first time a ``cu_seqlens`` tensor is seen,
    again after a torch operation modifies it in place; a write that bypasses
    torch's version counter, through ``.numpy()`` or ``.data``, is not seen:
    pass a new tensor after one).  A strided ``cu_seqlens`` view is copied
    to a dense one first.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        val.check_tensor(name, t, 3, "total_tokens, heads, head_dim")
    # the dense checks on (1, H, total, D) views: dtype, device, heads, head_dim
    scale = validate(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], causal, scale)
    val.check_bool("return_lse", return_lse)
    val.check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q)
    val.check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q)
    # the kernels read the lengths by raw pointer: a strided view (a column of a table) as a dense copy
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
                         f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    max_q = val.check_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_k = val.check_max_seqlen("max_seqlen_k", max_seqlen_k)
    batch = cu_seqlens_q.numel() - 1
    hq = q.shape[1]
    if dispatch.uses_triton(q) and batch > val.MAX_GRID_YZ:
        raise ValueError(f"the number of sequences ({batch}) must be at most {val.MAX_GRID_YZ} on the GPU path; "
                         f"split the call")
    left, right = val.check_window(window)
    cap = val.check_softcap(softcap)
    slopes = val.check_alibi(alibi_slopes, q, batch, hq)
    sinks = val.check_sinks(sinks, q, hq)
    det = val.check_deterministic(deterministic)
    if det is None:   # the atomic Hopper backward where it runs (d <= 128, no softcap or ALiBi), else deterministic
        qv, kv, vv = (t.transpose(0, 1)[None] for t in (q, k, v))
        hopper_ok = (cap == 0.0 and slopes is None and dispatch.hopper_varlen_bwd(qv, vv)
                     and ((left == -1 and right == -1) or dispatch.hopper_window_bwd(qv, vv)))
        det = dispatch.default_deterministic(qv, kv, vv, hopper_ok)
    check_shared_memory(q, k, v, sinks, det)
    out, lse = ops.attention_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_q), int(max_k), causal, scale,
                                        left, right, cap, slopes, det)
    out, lse = with_sinks(out, lse, sinks, head_dim=0)
    if return_lse:
        return out, lse.float()
    return out
