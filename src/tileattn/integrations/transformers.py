"""Hugging Face transformers: ``attn_implementation="tileattn"``.

After ``tileattn.register_transformers()``::

    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="tileattn")
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="tileattn")

Registration uses transformers' public interfaces only:
``AttentionInterface.register`` for the attention function and, where it
exists (transformers >= 4.53), ``AttentionMaskInterface.register`` for the
mask builder.

How masks map onto tileattn.  transformers builds one mask per forward and
hands it to every attention layer.  The mask builder registered here returns
``None`` exactly when the mask is the plain causal pattern with the queries
at the end of the keys -- prefill, decoding with a KV cache, chunked prefill,
all without padding: query i (of Nq) sees key j (of Nk) iff
j <= i + Nk - Nq, which is tileattn's bottom-right causal alignment -- or
that pattern inside a sliding window of width W (keys i - W < j <= i:
tileattn's ``window=(W - 1, 0)``).  For those calls the attention function
runs ``tileattn.attention``.  In every other case (padding, packed
sequences, a static cache whose slots are not yet filled, custom mask
functions) it materialises the same boolean mask as transformers' ``"sdpa"``
implementation, and the attention function runs torch's SDPA with that mask:
correct, not accelerated.  Dropout in training mode also runs torch's SDPA.

What the layers pass along travels as tileattn's own arguments: ``scaling``
as ``scale=`` (Gemma's query_pre_attn_scalar, DeepSeek's yarn mscale),
``softcap`` (Gemma 2's attention logit softcapping) as ``softcap=``,
attention sinks (gpt-oss's ``s_aux``, one logit per head) as ``sinks=``, and
a value head dim different from the query/key one (DeepSeek's MLA: q and k
at qk_nope + qk_rope, v at v_head_dim) as it is.  torch's SDPA has neither
softcap nor sinks, so the masked fallback of a call with either computes it
materialised (scores, cap, mask, sink column), as transformers' eager path.

This module imports transformers only inside its functions.
"""
from __future__ import annotations

import math
import numbers
import warnings

import torch

from .. import api
from ..sdpa import TileattnFallbackWarning, _torch_sdpa, _why_not_accelerated, warn_fallback_once

__all__ = ["register_transformers", "tileattn_attention_forward", "tileattn_attention_mask",
           "MIN_TRANSFORMERS"]

MIN_TRANSFORMERS = (4, 50)
# names transformers reserves, and a substring transformers 5 routes to the flash-attn package
_RESERVED = ("eager", "sdpa", "flex_attention", "paged|eager")
_warned_attentions = False   # output_attentions=True: told once a process that no weights come back

# ---------------------------------------------------------------------------
# the attention function
# ---------------------------------------------------------------------------
def _bottom_right_mask(n_q: int, n_k: int, device, window: int | None = None) -> torch.Tensor:
    """Boolean (Nq, Nk), True where query i (at position i + Nk - Nq) sees key j."""
    pos_q = torch.arange(n_q, device=device)[:, None] + (n_k - n_q)
    pos_k = torch.arange(n_k, device=device)[None, :]
    keep = pos_k <= pos_q
    if window is not None:
        keep &= pos_k > pos_q - window
    return keep


def _torch_fallback(query, key, value, attention_mask, dropout, scaling, causal, window):
    """torch SDPA with an explicit mask (never its top-left ``is_causal`` when Nq != Nk)."""
    hq, hkv = query.shape[1], key.shape[1]
    if hq != hkv:
        key = key.repeat_interleave(hq // hkv, dim=1)
        value = value.repeat_interleave(hq // hkv, dim=1)
    n_q, n_k = query.shape[2], key.shape[2]
    is_causal = False
    mask = attention_mask
    if mask is not None:
        if mask.shape[-1] != n_k:
            mask = mask[..., :n_k]
    elif causal and (n_q > 1 or window is not None):
        if n_q == n_k and window is None:
            is_causal = True
        else:
            mask = _bottom_right_mask(n_q, n_k, query.device, window)
    return _torch_sdpa(query, key, value, attn_mask=mask, dropout_p=dropout, is_causal=is_causal, scale=scaling)


def tileattn_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                               is_causal=None, **kwargs):
    """The attention function transformers calls for ``attn_implementation="tileattn"``.

    query (B, Hq, Nq, D), key (B, Hkv, Nk, D) and value (B, Hkv, Nk, Dv) with
    Hq a multiple of Hkv (no copies) and Dv possibly different from D;
    returns ``(attn_output, None)`` with attn_output (B, Nq, Hq, Dv).
    Causality comes from ``is_causal`` when given, else from
    ``module.is_causal``; with a KV cache it is aligned bottom-right.
    Keyword arguments read: ``sliding_window``, ``softcap``, ``s_aux``.
    """
    global _warned_attentions
    if kwargs.get("output_attentions") and not _warned_attentions:
        _warned_attentions = True
        warnings.warn("attn_implementation='tileattn' never forms the attention weights, so output_attentions=True "
                      "returns no weights for its layers; load the model with attn_implementation='eager' to get "
                      "them (warned once)", UserWarning, stacklevel=2)
    if kwargs.get("position_bias") is not None:
        raise ValueError("attn_implementation='tileattn' does not support 'position_bias'; load this model with "
                         "attn_implementation='eager' or 'sdpa'")
    softcap = kwargs.get("softcap")
    if softcap is not None:
        # eager divides by the cap, so 0 is not tileattn's "no cap" there; negative and non-finite caps neither
        if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real) or \
                not (math.isfinite(softcap) and softcap > 0):
            raise ValueError(f"attn_implementation='tileattn': softcap must be a finite number > 0 or None, "
                             f"got {softcap!r}")
        softcap = float(softcap)
    # gpt-oss: one learnable sink logit per head (s_aux), in the parameters' dtype
    sinks = kwargs.get("s_aux")
    if sinks is not None:
        sinks = sinks.float()
    causal = bool(is_causal) if is_causal is not None else bool(getattr(module, "is_causal", True))
    window = kwargs.get("sliding_window")
    n_k = key.shape[2]
    if window is not None and (not causal or n_k <= window):
        window = None  # the window hides nothing here
    reason = None
    if attention_mask is not None and not causal:
        reason = ("non-causal (bidirectional) calls, which transformers hands an explicit mask, are not "
                  "accelerated")
    elif attention_mask is not None:
        reason = ("calls that need an explicit mask (padding, a static cache, packed sequences) are not "
                  "accelerated")
    elif dropout:
        reason = "attention dropout (training mode) is not accelerated"
    else:
        reason = _why_not_accelerated(query, key, value, None, 0.0, enable_gqa=True)
    if reason is not None:
        explicit = sinks is not None or softcap is not None
        warn_fallback_once("transformers", reason,
                           f"tileattn (transformers): {reason}; these calls run torch's scaled_dot_product_attention, "
                           f"or a materialised computation where they carry a softcap or sinks (warned once)")
        if explicit:
            out = _explicit_fallback(query, key, value, attention_mask, float(dropout or 0.0), scaling, causal,
                                     window, sinks, softcap)
        else:
            out = _torch_fallback(query, key, value, attention_mask, float(dropout or 0.0), scaling, causal,
                                  window)
    else:
        # transformers' sliding window W: query i sees keys i - W < j <= i (bottom-right positions)
        out = api.attention(query, key, value, causal=causal, scale=scaling, sinks=sinks, softcap=softcap,
                            window=None if window is None else (int(window) - 1, 0))
    return out.transpose(1, 2), None


def _explicit_fallback(query, key, value, attention_mask, dropout, scaling, causal, window, sinks, softcap):
    """Calls with sinks or a softcap that need an explicit mask: materialised
    attention (scores, cap, mask, sink column), as transformers' eager path;
    torch's SDPA has neither."""
    from ..reference import standard_attention
    if dropout:
        what = " and ".join(n for n, x in (("attention sinks (s_aux)", sinks), ("softcap", softcap)) if x is not None)
        raise ValueError(f"attn_implementation='tileattn': attention dropout together with {what} is not "
                         f"supported; set the model's attention_dropout to 0 or use 'eager'")
    n_q, n_k = query.shape[2], key.shape[2]
    mask = bias = None
    if attention_mask is not None:
        am = attention_mask[..., :n_k]
        if am.dtype == torch.bool:
            mask = ~am
        else:
            bias = am
    elif causal:
        mask = ~_bottom_right_mask(n_q, n_k, query.device, window)
    return standard_attention(query, key, value, scale=scaling, mask=mask, bias=bias, sinks=sinks, softcap=softcap)


# ---------------------------------------------------------------------------
# the mask builder
# ---------------------------------------------------------------------------
def _is_plain_bottom_right_causal(kwargs) -> bool:
    """Whether transformers asks for the plain causal mask with the queries at
    the end of the keys and no padding: tileattn's bottom-right ``causal=True``."""
    from transformers.masking_utils import causal_mask_function
    if not kwargs.get("allow_is_causal_skip", True):
        return False
    window = kwargs.get("local_size")
    mask_function = kwargs.get("mask_function", causal_mask_function)
    if window is None:
        if mask_function is not causal_mask_function:
            return False
    elif not _is_sliding_causal(mask_function, window):
        return False
    kv_length, kv_offset = kwargs.get("kv_length"), kwargs.get("kv_offset", 0)
    if "q_length" in kwargs:  # transformers >= 5
        q_length, q_offset = kwargs["q_length"], kwargs.get("q_offset", 0)
    elif kwargs.get("cache_position") is not None:  # transformers 4.5x: the query positions
        positions = kwargs["cache_position"]
        if torch.compiler.is_compiling() or positions.dim() != 1 or positions.numel() == 0:
            return False
        q_length, q_offset = positions.numel(), int(positions[0])
        if int(positions[-1]) != q_offset + q_length - 1:
            return False
    else:
        return False
    for n in (kv_length, kv_offset, q_length, q_offset):
        if isinstance(n, bool) or not isinstance(n, int):  # tensors: static caches, tracing
            return False
    if q_offset + q_length != kv_offset + kv_length:
        return False
    padding = kwargs.get("attention_mask")
    if padding is not None:
        if torch.compiler.is_compiling() or padding.dim() != 2 or padding.shape[-1] < kv_offset + kv_length:
            return False
        if not bool(padding[:, kv_offset:kv_offset + kv_length].all()):
            return False
    return True


def _is_sliding_causal(mask_function, window) -> bool:
    """Whether ``mask_function`` is the plain sliding-window causal pattern of
    width ``window`` (key j visible from query i iff i - window < j <= i),
    which the attention function runs as tileattn's ``window=(window - 1, 0)``
    with ``causal=True``: probed on a small grid of positions."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        return False
    i = torch.arange(3 * window + 2)[:, None]
    j = torch.arange(3 * window + 2)[None, :]
    try:
        got = mask_function(torch.tensor(0), torch.tensor(0), i, j)
    except Exception:   # a mask function written for vmap only: not recognised, materialised
        return False
    return isinstance(got, torch.Tensor) and got.shape == (i.shape[0], j.shape[1]) and \
        torch.equal(got.bool(), (j <= i) & (j > i - window))


def tileattn_attention_mask(**kwargs):
    """The mask builder transformers calls for ``attn_implementation="tileattn"``:
    ``None`` for the plain bottom-right causal case (tileattn's ``causal=True``),
    otherwise the boolean mask of transformers' ``"sdpa"`` builder, always
    materialised (never its top-left ``is_causal`` shortcut)."""
    if _is_plain_bottom_right_causal(kwargs):
        return None
    from transformers import AttentionMaskInterface
    sdpa_mask = AttentionMaskInterface()["sdpa"]
    kwargs["allow_is_causal_skip"] = False
    kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(**kwargs)


# ---------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------
def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def register_transformers(name: str = "tileattn") -> str:
    """Register tileattn with Hugging Face transformers under ``name``.

    Afterwards ``attn_implementation=name`` works in ``from_config`` /
    ``from_pretrained`` (and ``model.set_attn_implementation(name)``).  Safe to
    call more than once.  Returns the name.

    Raises ImportError without transformers (>= 4.50) and ValueError for a
    name transformers reserves or routes elsewhere (any name containing
    "flash" is taken by transformers 5 for the flash-attn package).
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if "flash" in name.lower() or name in _RESERVED or name.startswith("paged|"):
        raise ValueError(f"name {name!r} is reserved by transformers (names containing 'flash' load the "
                         f"flash-attn package); use e.g. 'tileattn'")
    try:
        import transformers
    except ImportError:
        raise ImportError("register_transformers needs Hugging Face transformers: "
                          "pip install 'tileattn[hf]'") from None
    if _version_tuple(transformers.__version__) < MIN_TRANSFORMERS:
        raise ImportError(f"register_transformers needs transformers >= "
                          f"{'.'.join(map(str, MIN_TRANSFORMERS))}, found {transformers.__version__}")
    from transformers import AttentionInterface
    AttentionInterface.register(name, tileattn_attention_forward)
    try:
        from transformers import AttentionMaskInterface
    except ImportError:
        # transformers < 4.53: models build full 4-d masks themselves for custom
        # implementations, so every call takes the (correct) torch path
        warnings.warn(f"transformers {transformers.__version__} builds a full attention mask for every custom "
                      f"attention implementation, so attn_implementation={name!r} will run torch's "
                      f"scaled_dot_product_attention everywhere (correct, not accelerated); transformers >= 4.53 "
                      f"runs tileattn", TileattnFallbackWarning, stacklevel=3)
    else:
        AttentionMaskInterface.register(name, tileattn_attention_mask)
    return name
