"""The attention implementations the benchmark compares.

A :class:`Provider` is a name, a callable ``fn(q, k, v, causal) -> out`` on
``(B, H, N, D)`` tensors (k/v may have fewer heads: GQA) with the default
scale ``1 / sqrt(D)``, and an availability check that returns ``None`` when
the provider can run on a device, else the reason it cannot.  A provider that
cannot run is still reported (status ``"unavailable: <reason>"``), never
dropped.

``bytes_model`` names the IO model whose byte count turns a time into an
achieved bandwidth: ``"tiled"`` (:func:`tileattn.cost.io.tiled_traffic`) for
fused kernels, ``"standard"`` (:func:`tileattn.cost.io.standard_traffic`,
eager fusion) for materialized attention.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

import torch
import torch.nn.functional as F

import tileattn
from tileattn.reference import standard_attention

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]

# compiled FlexAttention recompiles per shape; the sweep visits many shapes and must
# never hit the limit (past it dynamo silently runs flex_attention eagerly)
DYNAMO_RECOMPILE_LIMIT = 4096


@dataclasses.dataclass
class Provider:
    name: str
    fn: AttentionFn
    description: str = ""
    needs_cuda: bool = False
    bytes_model: str = "tiled"                      # "tiled" or "standard"
    check: Optional[Callable[[torch.device], Optional[str]]] = None  # None = available

    def unavailable_reason(self, device: torch.device | str) -> Optional[str]:
        device = torch.device(device)
        if self.needs_cuda and device.type != "cuda":
            return "needs CUDA"
        if self.check is not None:
            try:
                return self.check(device)
            except Exception as e:  # a broken check is a reason too
                return f"{type(e).__name__}: {e}"
        return None


PROVIDERS: dict[str, Provider] = {}


def register(name: str, fn: AttentionFn, *, description: str = "", needs_cuda: bool = False,
             bytes_model: str = "tiled", check=None, replace: bool = False) -> Provider:
    """Add a provider to the registry (``replace=True`` to overwrite one)."""
    if bytes_model not in ("tiled", "standard"):
        raise ValueError(f"bytes_model={bytes_model!r} must be 'tiled' or 'standard'")
    if name in PROVIDERS and not replace:
        raise ValueError(f"provider {name!r} is already registered")
    p = Provider(name, fn, description, needs_cuda, bytes_model, check)
    PROVIDERS[name] = p
    return p


def unregister(name: str) -> None:
    PROVIDERS.pop(name, None)


def get_provider(name: str) -> Provider:
    try:
        return PROVIDERS[name]
    except KeyError:
        raise KeyError(f"unknown provider {name!r}; known: {', '.join(PROVIDERS)}") from None


def available_reason(name: str, device: torch.device | str) -> Optional[str]:
    """``None`` if provider ``name`` can run on ``device``, else why not."""
    return get_provider(name).unavailable_reason(device)


def _gqa(q, k) -> bool:
    return q.shape[1] != k.shape[1]


# ---------------------------------------------------------------------------
# tileattn and standard attention
# ---------------------------------------------------------------------------
def _tileattn(q, k, v, causal):
    return tileattn.attention(q, k, v, causal=causal)


def _tileattn_check(device: torch.device) -> Optional[str]:
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "triton is not installed"
    return None


def _standard(q, k, v, causal):
    return standard_attention(q, k, v, causal=causal)


# ---------------------------------------------------------------------------
# torch SDPA with one backend forced
# ---------------------------------------------------------------------------
_SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def _sdpa_backend(backend: str):
    from torch.nn.attention import SDPBackend
    return getattr(SDPBackend, _SDPA_BACKENDS[backend])


def _make_sdpa(backend: str) -> AttentionFn:
    def fn(q, k, v, causal):
        from torch.nn.attention import sdpa_kernel
        kwargs = {"enable_gqa": True} if _gqa(q, k) else {}
        with sdpa_kernel(_sdpa_backend(backend)):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kwargs)
    fn.__name__ = f"sdpa_{backend}"
    return fn


def _make_sdpa_check(backend: str):
    def check(device: torch.device) -> Optional[str]:
        try:
            from torch.nn.attention import sdpa_kernel  # noqa: F401
            _sdpa_backend(backend)
        except (ImportError, AttributeError):
            return f"this torch ({torch.__version__}) cannot force the {backend} SDPA backend"
        if backend == "cudnn" and not torch.backends.cudnn.is_available():
            return "cuDNN is not available"
        return None
    return check


# ---------------------------------------------------------------------------
# FlexAttention, compiled
# ---------------------------------------------------------------------------
def raise_recompile_limit(limit: int = DYNAMO_RECOMPILE_LIMIT) -> None:
    """Raise torch._dynamo's recompile limits (named ``recompile_limit`` in new
    torch, ``cache_size_limit`` in older releases) so compiled FlexAttention
    never falls back to eager after many shapes."""
    import torch._dynamo.config as cfg
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), limit))


@functools.lru_cache(maxsize=None)
def _flex_compiled():
    from torch.nn.attention.flex_attention import flex_attention
    raise_recompile_limit()
    # the "bwd" mode replays one backward graph (retain_graph=True); a compiled
    # backward with donated buffers refuses that
    import torch._functorch.config as functorch_config
    if hasattr(functorch_config, "donated_buffer"):
        functorch_config.donated_buffer = False
    return torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=64)
def causal_block_mask(seqlen_q: int, seqlen_k: int, device: str):
    """Block mask of bottom-right aligned causal attention (query i sees key j
    iff j <= i + Nk - Nq; for Nq == Nk that is q_idx >= kv_idx)."""
    from torch.nn.attention.flex_attention import create_block_mask
    offset = seqlen_k - seqlen_q

    def mask_mod(b, h, q_idx, kv_idx):
        return q_idx + offset >= kv_idx

    return create_block_mask(mask_mod, B=None, H=None, Q_LEN=seqlen_q, KV_LEN=seqlen_k, device=device)


def _flex(q, k, v, causal):
    mask = causal_block_mask(q.shape[-2], k.shape[-2], str(q.device)) if causal else None
    kwargs = {"enable_gqa": True} if _gqa(q, k) else {}
    return _flex_compiled()(q, k, v, block_mask=mask, **kwargs)


def _flex_check(device: torch.device) -> Optional[str]:
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
    except ImportError:
        return f"this torch ({torch.__version__}) has no FlexAttention"
    return None


# ---------------------------------------------------------------------------
# FlashAttention-4 (CuTe DSL), optional
# ---------------------------------------------------------------------------
# flash_attn.cute.flash_attn_func(q, k, v, causal=..., softmax_scale=None) on
# (B, N, H, D) tensors (read from flash-attn-4 4.0.0b36's interface.py):
# * returns (out, lse), lse None unless it is needed for a backward or asked for;
# * GQA natively: k/v with fewer heads, H a multiple of Hkv;
# * causal aligns the end of the queries with the end of the keys (query i sees
#   key j iff j <= i + Nk - Nq), the same bottom-right convention as tileattn
#   and the flex provider; equal to SDPA's top-left one for Nq == Nk, the
#   bench's shapes;
# * default scale 1 / sqrt(D); fp16 / bf16 only; an autograd Function, so the
#   backward runs through torch.autograd.grad;
# * kernels for compute capability 8.x-12.x; the benchmark asks for 9.0 or
#   newer (Hopper, Blackwell), the architectures FlashAttention-4 targets.
# The (B, H, N, D) inputs go in as transposed views (no copy; the last dim stays
# contiguous), as the other providers get them.
FA4_MIN_CAPABILITY = (9, 0)


def _fa4(q, k, v, causal):
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"fa4: FlashAttention-4 takes float16 or bfloat16 inputs, got {q.dtype}")
    from flash_attn.cute import flash_attn_func
    res = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
    out = res[0] if isinstance(res, tuple) else res
    return out.transpose(1, 2)


def _fa4_check(device: torch.device) -> Optional[str]:
    import importlib.util
    try:
        found = importlib.util.find_spec("flash_attn.cute") is not None
    except (ImportError, ValueError):  # no flash_attn at all, or a broken parent package
        found = False
    if not found:
        return "flash_attn.cute not installed"
    if device.type != "cuda":
        return "needs CUDA"
    cap = torch.cuda.get_device_capability(device)
    if cap < FA4_MIN_CAPABILITY:
        return (f"FlashAttention-4 needs compute capability >= {FA4_MIN_CAPABILITY[0]}.{FA4_MIN_CAPABILITY[1]}, "
                f"this GPU has {cap[0]}.{cap[1]}")
    try:
        from flash_attn.cute import flash_attn_func  # noqa: F401
    except Exception as e:  # installed but its dependencies are not (the CuTe DSL libs, say)
        return f"flash_attn.cute does not import: {type(e).__name__}: {str(e).strip()[:160]}"
    return None


def _register_defaults() -> None:
    register("tileattn", _tileattn, description="tileattn.attention (Triton kernels on GPUs, tiled PyTorch "
             "path elsewhere)", check=_tileattn_check)
    for be, label in (("flash", "FlashAttention-2"), ("cudnn", "cuDNN"), ("efficient", "memory-efficient")):
        register(f"sdpa-{be}", _make_sdpa(be), description=f"torch SDPA, {label} backend forced",
                 needs_cuda=True, check=_make_sdpa_check(be))
    register("flex", _flex, description="FlexAttention, torch.compile'd, causal block mask",
             needs_cuda=True, check=_flex_check)
    register("fa4", _fa4, description="FlashAttention-4, CuTe DSL (flash_attn.cute, package flash-attn-4; "
             "optional)", check=_fa4_check)
    register("standard", _standard, description="standard attention, eager, N x N scores materialized",
             bytes_model="standard")


_register_defaults()
DEFAULT_PROVIDERS = tuple(PROVIDERS)
