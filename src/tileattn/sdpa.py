"""A drop-in for ``torch.nn.functional.scaled_dot_product_attention``.

``scaled_dot_product_attention`` has torch's signature and torch's semantics;
the calls tileattn can compute exactly (no ``attn_mask``, no dropout, head
dims of at most 512, ...) run ``tileattn.attention``, every other call runs
torch's own function after a one-time warning per reason (so the answer is
never wrong, only sometimes not accelerated).

Causal alignment.  torch aligns ``is_causal`` top-left: query i sees key j iff
j <= i, whatever Nq and Nk are.  ``tileattn.attention`` aligns bottom-right
(j <= i + Nk - Nq, the convention of KV-cache decoding).  The two agree when
Nq == Nk; otherwise this module maps top-left onto bottom-right calls:

* Nq < Nk: the keys past Nq are never seen, so it is ``attention`` over the
  first Nq keys, causal (square, where both alignments coincide);
* Nq > Nk: the first Nk queries see a square causal block; every later query
  sees all Nk keys.  Two calls, concatenated along the query axis.

No row is ever empty under top-left alignment (query i always sees key 0).

``patched_sdpa()`` routes ``torch.nn.functional.scaled_dot_product_attention``
to this function inside a ``with`` block.
"""
from __future__ import annotations

import contextlib
import math
import threading
import warnings

import torch
import torch.nn.functional as F

from . import api, dispatch, validation

__all__ = ["scaled_dot_product_attention", "patched_sdpa", "TileattnFallbackWarning"]

# torch's function as it was when tileattn was imported: the fallback calls this
# one, never the attribute (which may be patched to point back here).
_torch_sdpa = F.scaled_dot_product_attention

# enable_gqa arrived in torch 2.5; older versions get the repeated heads instead
_TORCH_HAS_GQA = tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in torch.__version__.split(".")[:2]) >= (2, 5)


class TileattnFallbackWarning(UserWarning):
    """A call that tileattn does not accelerate ran PyTorch's implementation instead."""


# (who, reason) pairs already reported, for this drop-in and the transformers
# backend alike
_warned: set[tuple[str, str]] = set()
_warn_lock = threading.Lock()


def warn_fallback_once(who: str, reason: str, message: str) -> None:
    """Warn ``message`` (a TileattnFallbackWarning) the first time ``who``
    falls back for ``reason``; silent while tracing (a warning would break
    the graph).  The warning points at the caller of the function that
    called this one (call it from the public function)."""
    if torch.compiler.is_compiling():
        return
    with _warn_lock:
        if (who, reason) in _warned:
            return
        _warned.add((who, reason))
    warnings.warn(message, TileattnFallbackWarning, stacklevel=3)


def reset_fallback_warnings() -> None:
    """Forget which fallback reasons were already reported (each warns again once)."""
    with _warn_lock:
        _warned.clear()


def _why_not_accelerated(query, key, value, attn_mask, dropout_p, enable_gqa) -> str | None:
    """None when tileattn.attention computes the call exactly, else the reason it does not."""
    if attn_mask is not None:
        return "attn_mask is not accelerated (only is_causal masking is)"
    if dropout_p > 0.0:
        return "dropout_p > 0 is not accelerated"
    if query.dtype not in validation.CPU_DTYPES:
        return f"dtype {query.dtype} is not accelerated"
    if not (query.dim() == key.dim() == value.dim()):
        return "query, key and value with different numbers of dimensions are not accelerated"
    if query.shape[:-3] != key.shape[:-3] or key.shape[:-3] != value.shape[:-3]:
        return "broadcast batch dimensions are not accelerated"
    # the value head dim may differ from the query/key one (the output has it)
    for d in (query.shape[-1], value.shape[-1]):
        if not 1 <= d <= validation.MAX_HEAD_DIM:
            return f"head dim {d} is not accelerated (1..{validation.MAX_HEAD_DIM} is)"
    if query.shape[-2] == 0 or key.shape[-2] == 0:
        return "empty sequences are not accelerated"
    if query.dim() >= 3:
        hq, hkv = query.shape[-3], key.shape[-3]
        if value.shape[-3] != hkv or hkv == 0 or hq % hkv != 0:
            return "these head counts are not accelerated"
        # without enable_gqa torch broadcasts a single key/value head (MQA) and
        # rejects any other mismatch: leave that error to torch
        if not enable_gqa and hkv not in (1, hq):
            return "query and key/value head counts differ without enable_gqa"
    if dispatch.uses_triton(query):
        if query.dtype not in validation.GPU_DTYPES:
            return f"dtype {query.dtype} is not accelerated on the GPU"
        batch = math.prod(query.shape[:-3]) if query.dim() > 3 else 1
        hq = query.shape[-3] if query.dim() >= 3 else 1
        if batch > validation.MAX_GRID_YZ or hq > validation.MAX_GRID_YZ:
            return f"batch or heads above {validation.MAX_GRID_YZ} are not accelerated on the GPU"
    return None


def _fallback(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """torch's own function, as it would have been called."""
    kw = dict(attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    if enable_gqa:
        if _TORCH_HAS_GQA:
            kw["enable_gqa"] = True
        elif query.dim() >= 3:   # key and value heads repeated each on their own, as torch does
            key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
            value = value.repeat_interleave(query.shape[-3] // value.shape[-3], dim=-3)
    return _torch_sdpa(query, key, value, **kw)


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    """(..., H, N, D) -> (B, H, N, D): leading dimensions flattened, missing ones added."""
    if t.dim() == 2:
        return t[None, None]
    if t.dim() == 3:
        return t[None]
    if t.dim() == 4:
        return t
    return t.reshape(-1, *t.shape[-3:])


def _top_left_causal(q, k, v, scale):
    """torch's top-left causal alignment from bottom-right calls (see module docstring)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    if n_q == n_k:
        return api.attention(q, k, v, causal=True, scale=scale)
    if n_q < n_k:
        return api.attention(q, k[:, :, :n_q], v[:, :, :n_q], causal=True, scale=scale)
    head = api.attention(q[:, :, :n_k], k, v, causal=True, scale=scale)
    tail = api.attention(q[:, :, n_k:], k, v, causal=False, scale=scale)
    return torch.cat((head, tail), dim=2)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                                 scale=None, enable_gqa=False):
    """``torch.nn.functional.scaled_dot_product_attention`` computed by tileattn.

    Same signature, shapes and results as torch's function: query (N, ..., Hq, L, E),
    key (N, ..., H, S, E), value (N, ..., H, S, Ev) -> (N, ..., Hq, L, Ev).
    ``is_causal`` is aligned top-left as in torch (query i sees key j iff j <= i),
    which differs from ``tileattn.attention``'s bottom-right alignment when L != S.

    Accelerated: no ``attn_mask``, ``dropout_p == 0``, E and Ev in 1..512, equal
    batch dimensions, Hq == H, H == 1 (broadcast) or ``enable_gqa`` with Hq a
    multiple of H; fp16/bf16/fp32 (and fp64 off the GPU).  Every other call runs
    torch's implementation after a one-time :class:`TileattnFallbackWarning`.

    Arguments torch would reject with a RuntimeError (dtype or device mismatch,
    head dim or length mismatch, dropout_p outside [0, 1]) raise TypeError or
    ValueError naming the argument.
    """
    if any(isinstance(t, torch.Tensor) and t.is_nested for t in (query, key, value)):
        reason = "nested tensors are not accelerated"
    else:
        validation.check_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        reason = _why_not_accelerated(query, key, value, attn_mask, dropout_p, enable_gqa)
    if reason is not None:
        warn_fallback_once("sdpa", reason, f"tileattn.scaled_dot_product_attention: {reason}; running torch's "
                                           f"scaled_dot_product_attention for such calls (warned once)")
        return _fallback(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    q4, k4, v4 = _as_4d(query), _as_4d(key), _as_4d(value)
    scale = None if scale is None else float(scale)
    if is_causal:
        out = _top_left_causal(q4, k4, v4, scale)
    else:
        out = api.attention(q4, k4, v4, causal=False, scale=scale)
    return out.reshape(query.shape[:-1] + (value.shape[-1],))


# ---------------------------------------------------------------------------
# routing torch.nn.functional.scaled_dot_product_attention
# ---------------------------------------------------------------------------
_patch_lock = threading.Lock()
_patch_depth = 0
_patch_saved = None


@contextlib.contextmanager
def patched_sdpa():
    """Route ``torch.nn.functional.scaled_dot_product_attention`` to
    :func:`scaled_dot_product_attention` inside a ``with`` block.

    Code that looks the function up when it calls it (``F.scaled_dot_product_attention(...)``,
    as PyTorch modules and transformers' ``"sdpa"`` implementation do) is routed;
    a name bound earlier with ``from torch.nn.functional import
    scaled_dot_product_attention`` is not.

    The original is restored when the outermost block exits, also on an
    exception.  Blocks nest.  Thread safety: the patch is one module attribute,
    so while any block is open it applies to every thread of the process; entry
    and exit are counted under a lock, so blocks opened and closed from several
    threads (in any order) leave torch's function in place once the last one
    exits.
    """
    global _patch_depth, _patch_saved
    with _patch_lock:
        if _patch_depth == 0:
            _patch_saved = F.scaled_dot_product_attention
            F.scaled_dot_product_attention = scaled_dot_product_attention
        _patch_depth += 1
    try:
        yield scaled_dot_product_attention
    finally:
        with _patch_lock:
            _patch_depth -= 1
            if _patch_depth == 0:
                F.scaled_dot_product_attention = _patch_saved
                _patch_saved = None
