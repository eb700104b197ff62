"""Which path runs a call.

Four implementations stand behind the public functions, and every choice
between them is made here:

* the Hopper forward and backward (Gluon, ``kernels/fwd_hopper.py``,
  ``kernels/bwd_hopper.py``, ``kernels/bwd_hopper_wide.py``): :func:`hopper_fwd_eligible`,
  :func:`hopper_bwd_eligible`;
* the portable Triton kernels (``kernels/``, launched by ``launch/``): every
  other call on a GPU, :func:`uses_triton`;
* torch's fused CPU kernel: :func:`cpu_fused_applies`;
* the tiled PyTorch implementation (``cpu.py``): everything else.

``use_backend`` forces the Triton kernels or the PyTorch path inside a block.
:func:`eager_applies` picks between the two autograd routes to the kernels
(``ops.py``: the custom ops, or the eager fast path past their dispatcher).
This module imports nothing of tileattn's launchers, so that every layer can
ask it.
"""
from __future__ import annotations

import contextlib
import functools

import torch

from . import configs
from ._env import env, interpreter_active
from .validation import MAX_GRID_YZ

__all__ = ["use_backend", "uses_triton", "eager_applies", "cpu_fused_applies", "hopper_fwd_eligible",
           "hopper_bwd_eligible", "default_deterministic", "tma_addressable"]

_BACKENDS = ("auto", "triton", "torch")
_backend = "auto"


@contextlib.contextmanager
def use_backend(name: str):
    """Force a path inside a block: ``"triton"`` (the kernels; on CPU tensors this
    needs ``TRITON_INTERPRET=1`` set before tileattn is imported), ``"torch"``
    (the PyTorch path) or ``"auto"`` (kernels on GPUs, torch elsewhere)."""
    global _backend
    if name not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {name!r}")
    previous, _backend = _backend, name
    try:
        yield
    finally:
        _backend = previous


def uses_triton(t: torch.Tensor) -> bool:
    """Whether a call with ``t`` as query runs the Triton kernels."""
    if _backend == "torch":
        return False
    if _backend == "triton":
        if t.device.type == "cpu" and not interpreter_active():
            raise RuntimeError("use_backend('triton') on CPU tensors runs the kernels under Triton's interpreter: "
                               "set TRITON_INTERPRET=1 in the environment before tileattn is imported")
        return True
    return t.is_cuda and _triton_importable()


def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------
# The autograd route to the kernels
# ---------------------------------------------------------------------------
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _no_dispatch_mode() -> bool:
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode
    except ImportError:  # pragma: no cover - a torch without it: stay on the custom op
        return False
    return _get_current_dispatch_mode() is None


def _no_functorch() -> bool:
    # torch.func transforms (grad, vmap, ...) hand wrapper tensors that have
    # no storage for a kernel; leave such calls to the custom op (which
    # raises torch's own error for transforms it does not support)
    check = getattr(torch._C, "_are_functorch_transforms_active", None)
    return check is not None and not check()


def eager_applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether a dense call can take the eager fast path (``ops.py``): the
    kernels, plain tensors, and nothing that traces or transforms the call."""
    return (type(q) in _PLAIN and type(k) in _PLAIN and type(v) in _PLAIN
            and uses_triton(q) and not torch.compiler.is_compiling() and _no_dispatch_mode()
            and _no_functorch())


# ---------------------------------------------------------------------------
# The CPU path: torch's fused kernel or the tiled implementation
# ---------------------------------------------------------------------------
_FUSED_DTYPES = (torch.float32,)
_aten = torch.ops.aten
_HAS_FUSED = hasattr(_aten, "_scaled_dot_product_flash_attention_for_cpu") and hasattr(
    _aten, "_scaled_dot_product_flash_attention_for_cpu_backward")


def cpu_fused_applies(q: torch.Tensor, k: torch.Tensor, causal: bool, variants: dict | None = None) -> bool:
    """Whether a dense call off the kernels runs torch's fused CPU kernel:
    non-empty float32 CPU tensors, no variant, and a mask it means the same
    way (none, or causal with Nq == Nk; ``cpu.py`` says why)."""
    # empty tensors stay tiled: the fused kernel divides by zero on them (SIGFPE)
    return (_HAS_FUSED and not variants and q.device.type == "cpu" and q.dtype in _FUSED_DTYPES
            and q.numel() > 0 and k.numel() > 0 and (not causal or q.shape[2] == k.shape[2]))


# ---------------------------------------------------------------------------
# The Hopper forward or the portable kernels
# ---------------------------------------------------------------------------
# ``HOPPER_FWD = False`` (or TILEATTN_HOPPER_FWD=0) keeps every forward on the
# portable kernels.
HOPPER_FWD = True
_HOPPER_DTYPES = (torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=None)
def _hopper_device(device_index: int) -> bool:
    if torch.version.hip is not None or torch.cuda.get_device_capability(device_index) != (9, 0):
        return False
    return _gluon_ok()


@functools.lru_cache(maxsize=None)
def _gluon_ok() -> bool:
    try:
        from .kernels import fwd_hopper  # noqa: F401
    except Exception:  # pragma: no cover - a triton without Gluon's Hopper API
        return False
    return True


def hopper_device(device: torch.device) -> bool:
    """Whether ``device`` runs the Gluon Hopper kernels (compute capability 9.0, Gluon importable)."""
    return _hopper_device(device.index if device.index is not None else torch.cuda.current_device())


# ``HOPPER_DECODE = False`` (or TILEATTN_HOPPER_DECODE=0) keeps decoding on the
# absorbed MLA cache on the portable partial kernel (launch/decode_hopper.py).
HOPPER_DECODE = True


def tma_addressable(t: torch.Tensor, n_dims: int | None = None) -> bool:
    """Whether the copy engine can address ``t`` through a tensor descriptor
    whose strides are ``launch.runtime.tma_strides(t, n_dims)``: unit stride
    on the last dim, a 16-byte aligned base, and 16-byte aligned strides on
    every other dim, except the first ``n_dims`` dims where they have size 1
    (never stepped over; tma_strides gives those a 16-byte stride) or 0.

    The one rule for both kinds of descriptor: the Hopper forward's rewrite
    every dim but the last (``n_dims`` None: ``t.dim() - 1``); the portable
    kernels' rewrite the leading dims but not the row dim
    (``launch.runtime.use_tma`` passes ``t.dim() - 2``), whose stride they
    always step over, so a size-1 row dim still needs an aligned stride."""
    if t.stride(-1) != 1 or t.data_ptr() % 16:
        return False
    n_dims = t.dim() - 1 if n_dims is None else n_dims
    elem = t.element_size()
    for i, (size, stride) in enumerate(zip(t.shape[:-1], t.stride()[:-1])):
        if (stride * elem) % 16 and (size > 1 or i >= n_dims):
            return False
    return True


def hopper_fwd_preferred(head_dim: int, causal: bool, n_k: int) -> bool:
    """Whether the default dispatch takes the Hopper kernel at this size
    (``configs.HOPPER_FWD_MIN_KEYS``: where the portable kernel measured as
    fast or faster); a forced Hopper config skips this."""
    return n_k >= configs.HOPPER_FWD_MIN_KEYS.get((head_dim, bool(causal)), 0)


def hopper_fwd_eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether a plain (no variant) forward of these tensors runs the Hopper
    kernel: a CUDA device of compute capability 9.0, fp16 or bf16, a (QK, V)
    pair of head dims the kernel has a config for (``configs.HOPPER_FWD``) and
    tensors the copy engine can address.  Gluon is imported on first use only."""
    if (not HOPPER_FWD or (q.shape[-1], v.shape[-1]) not in configs.HOPPER_FWD
            or env("TILEATTN_HOPPER_FWD", "1") == "0"):
        return False
    return _hopper_eligible(q, k, v)


def _hopper_eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """The rules the Hopper forward and backward share (among them one head
    dim for q and k; V's is each kernel's own rule)."""
    if k.shape[-1] != q.shape[-1]:
        return False
    if not q.is_cuda or q.dtype not in _HOPPER_DTYPES or interpreter_active():
        return False
    if not _hopper_device(q.device.index if q.device.index is not None else torch.cuda.current_device()):
        return False
    b, hq, n_q, _ = q.shape
    if b > MAX_GRID_YZ or hq > MAX_GRID_YZ or n_q == 0 or k.shape[2] == 0 or b == 0:
        return False
    return tma_addressable(q) and tma_addressable(k) and tma_addressable(v)


# ``HOPPER_BWD = False`` (or TILEATTN_HOPPER_BWD=0) keeps every backward on
# the portable kernels.
HOPPER_BWD = True


def hopper_bwd_eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                        sinks: bool = False) -> bool:
    """Whether a plain, non-deterministic backward of these tensors runs a
    Hopper dK/dV kernel (``kernels/bwd_hopper.py``, or ``bwd_hopper_wide.py``
    where V's head dim is narrower than Q's): the forward's rules
    (:func:`hopper_fwd_eligible`), a (QK, V) pair of head dims in
    ``configs.HOPPER_BWD``, and a dO the copy engine can address.  With
    ``sinks`` (a sinks gradient from the kernel's dS row sums, i.e. without
    the forward's output remainder) only the kernel that sums dS (Dv = D <= 128)."""
    pair = (q.shape[-1], v.shape[-1])
    if not HOPPER_BWD or pair not in configs.HOPPER_BWD or env("TILEATTN_HOPPER_BWD", "1") == "0":
        return False
    if do.dtype != q.dtype or (sinks and (pair[0] != pair[1] or pair[0] > 128)):
        return False
    return _hopper_eligible(q, k, v) and tma_addressable(do)


# ``HOPPER_WINDOW = False`` (or TILEATTN_HOPPER_WINDOW=0) keeps the default
# dispatch of sliding-window calls on the portable kernels (a forced Hopper
# config still runs one).
HOPPER_WINDOW = True


def hopper_window(forced: bool = False) -> bool:
    """Whether a call whose only variant is a sliding window may take the
    Hopper kernels (``forced``: a Hopper config was given)."""
    return forced or (HOPPER_WINDOW and env("TILEATTN_HOPPER_WINDOW", "1") != "0")


def hopper_window_fwd(q: torch.Tensor, v: torch.Tensor, bounds: tuple[int, int], forced: bool = False) -> bool:
    """Whether a sliding window's forward (its kernel ``bounds``, causal
    folded in) takes the Hopper kernel, given :func:`hopper_fwd_eligible`:
    QK = V head dim 64 or 128 and a window at least
    ``configs.HOPPER_FWD_WINDOW_MIN_SPAN`` keys wide (narrower ones ran
    faster on the portable kernel), or a forced Hopper config."""
    if forced:
        return True
    span = configs.HOPPER_FWD_WINDOW_MIN_SPAN.get(q.shape[-1]) if q.shape[-1] == v.shape[-1] else None
    return span is not None and bounds[0] + bounds[1] + 1 >= span and hopper_window()


def hopper_window_bwd(q: torch.Tensor, v: torch.Tensor, forced: bool = False) -> bool:
    """Whether a sliding window's backward may run the Hopper dK/dV kernel
    (``kernels/bwd_hopper.py``, QK = V head dim <= 128; the wide and split
    kernels have no window), given :func:`hopper_bwd_eligible`."""
    return q.shape[-1] == v.shape[-1] <= 128 and hopper_window(forced)


# Whether the default dispatch sends packed sequences' forward to the Hopper
# kernel's packed build (``TILEATTN_HOPPER_VARLEN=1`` / ``=0`` overrides it; a
# forced Hopper config runs it either way).  The backward's packed build is
# opt-in (perf-notes v49: an illegal instruction on an H100; v50: fixed, its
# GPU tests pass, no clean timing yet), so it runs only with
# ``TILEATTN_HOPPER_VARLEN_BWD=1``.
HOPPER_VARLEN = True


def hopper_varlen_fwd(q: torch.Tensor, v: torch.Tensor, causal: bool, max_seqlen_k: int,
                      forced: bool = False) -> bool:
    """Whether packed sequences' forward (no variant but a sliding window,
    which :func:`hopper_window_fwd` decides apart) takes the Hopper kernel,
    given :func:`hopper_fwd_eligible` of the (1, H, total, D) views: QK = V
    head dim 64 or 128 (no sinks in the kernel: ``attention_varlen`` applies
    them after it) and a longest sequence of at least
    :func:`hopper_fwd_preferred`'s keys, or a forced Hopper config."""
    if q.shape[-1] != v.shape[-1] or q.shape[-1] not in (64, 128):
        return False
    return forced or (hopper_varlen() and hopper_fwd_preferred(q.shape[-1], causal, max_seqlen_k))


def hopper_varlen(forced: bool = False) -> bool:
    """Whether packed sequences may take the Hopper kernels (``forced``: a
    Hopper config was given; else ``TILEATTN_HOPPER_VARLEN`` where set,
    ``HOPPER_VARLEN`` where not)."""
    flag = env("TILEATTN_HOPPER_VARLEN", "")
    return forced or (flag == "1" if flag else HOPPER_VARLEN)


def hopper_varlen_bwd(q: torch.Tensor, v: torch.Tensor, forced: bool = False) -> bool:
    """Whether packed sequences' backward may run the Hopper dK/dV kernel's
    packed build (QK = V head dim <= 128), given :func:`hopper_bwd_eligible`
    of the (1, H, total, D) views: only with ``TILEATTN_HOPPER_VARLEN_BWD=1``
    (opt-in, see ``HOPPER_VARLEN``), then as the forward's switch says."""
    return (env("TILEATTN_HOPPER_VARLEN_BWD", "0") == "1" and q.shape[-1] == v.shape[-1] <= 128
            and hopper_varlen(forced))


def hopper_sink_sums(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plain: bool) -> bool:
    """Whether the non-deterministic backward of a call with sinks would take
    their gradient from the Hopper kernel's per-head sums (the table's
    ``HopperBwdConfig.sink_sums``), so that its forward needs no output
    remainder.  ``plain``: as :func:`default_deterministic`'s."""
    cfg = configs.HOPPER_BWD.get((q.shape[-1], v.shape[-1]))
    do = q if v.shape[-1] == q.shape[-1] else v   # dO is as wide as V
    return plain and cfg is not None and cfg.sink_sums and hopper_bwd_eligible(q, k, v, do, sinks=True)


def default_deterministic(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plain: bool,
                          sinks: bool = False) -> bool:
    """``deterministic=None`` resolved: the atomic Hopper backward where it
    runs (the faster one there, docs/perf-notes.md v12), the deterministic
    kernels everywhere else (where the portable atomic kernel is slower) and
    whenever ``torch.use_deterministic_algorithms`` is on.  ``plain``: the
    call has no variant the Hopper backward lacks (none, or a sliding window
    alone where :func:`hopper_window_bwd`)."""
    if torch.are_deterministic_algorithms_enabled():
        return True
    do = q if v.shape[-1] == q.shape[-1] else v   # dO is as wide as V
    return not (plain and hopper_bwd_eligible(q, k, v, do, sinks))
