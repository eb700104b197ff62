"""Launchers for the Triton kernels: allocate outputs, pick a config, compute
the grid and call the kernels by keyword.  No validation here (``api.py``
validates before anything reaches this module) and no autograd (``ops.py``).
"""
from __future__ import annotations

import dataclasses
import functools
import threading

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from . import configs, launch_hopper
from .block_mask import BLOCK_K as MASK_BLOCK_K, BLOCK_Q as MASK_BLOCK_Q, cached_kernel_block_lists
from .configs import HopperFwdConfig, KernelConfig
from .kernels.bwd import (_attn_bwd_dkdv_kernel, _attn_bwd_dq_convert_kernel, _attn_bwd_dq_kernel,
                          _attn_bwd_preprocess_kernel)
from .kernels.fwd import _attn_fwd_kernel

LOG2E = 1.4426950408889634

# Tests set this to fill outputs with NaN before each launch, so that an
# element a kernel forgets to write shows up as NaN instead of stale memory.
POISON_OUTPUTS = False

# Grid axes 1 and 2 (heads, batch) hold at most this many programs.
MAX_GRID_YZ = 65535

# Tests set this to run the portable pointer path where TMA would be used.
FORCE_POINTER_PATH = False


@functools.lru_cache(maxsize=None)
def _has_tma(device_index: int) -> bool:
    return torch.version.hip is None and torch.cuda.get_device_capability(device_index)[0] >= 9


def use_tma(*tensors: torch.Tensor) -> bool:
    """Whether the kernels load tiles through tensor descriptors (the Hopper
    copy engine; also runs under the interpreter).  Needs unit stride on the
    head dim and 16-byte aligned base and strides; otherwise the portable
    pointer path runs."""
    if FORCE_POINTER_PATH:
        return False
    if not configs.interpreter_active():
        if not tensors[0].is_cuda or not _has_tma(tensors[0].device.index or 0):
            return False
        # fp32 runs IEEE products on CUDA cores, where the compiler's pipeliner
        # rejected descriptor loads (triton 3.6, sm_90): keep fp32 on pointers
        if tensors[0].dtype == torch.float32:
            return False
    for t in tensors:
        if t.stride(-1) != 1 or t.data_ptr() % 16:
            return False
        elem, shape, strides, last = t.element_size(), t.shape, t.stride(), t.dim() - 2
        for i in range(last + 1):
            # dims of size 1 are never stepped over (the row stride always is)
            if (strides[i] * elem) % 16 and (shape[i] > 1 or i == last):
                return False
    return True


def _descriptor_defaults() -> dict | None:
    """Default values of TensorDescriptor's fields beyond (base, shape,
    strides, block_shape), or None if a field has no default (then the
    regular constructor is used)."""
    out = {}
    for f in dataclasses.fields(TensorDescriptor):
        if f.name in ("base", "shape", "strides", "block_shape"):
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # pragma: no cover - not in triton 3.6
            return None
        else:  # pragma: no cover
            return None
    return out


_DESC_DEFAULTS = _descriptor_defaults()


def _descriptor(t: torch.Tensor) -> TensorDescriptor:
    """A host-built descriptor over a whole (B, H, N, D) tensor.  Its box
    (1, 1, rows, BLOCK_D) is set per launch by :func:`_set_boxes`, once the
    config (and so the tile height) is known.  ``use_tma`` has checked the
    alignment already, so the constructor's own checks (a few microseconds
    per descriptor, seven per backward call) are skipped."""
    elem = t.element_size()
    shape, strides = list(t.shape), list(t.stride())
    # a dim of size 1 is never stepped over: give it any 16-byte aligned stride
    for i in range(len(shape) - 2):
        if shape[i] == 1:
            strides[i] = 16 // elem
    if _DESC_DEFAULTS is None:  # pragma: no cover - a future TensorDescriptor
        return TensorDescriptor(t, shape, strides, [1, 1, 16, 16])
    desc = TensorDescriptor.__new__(TensorDescriptor)
    desc.__dict__.update(_DESC_DEFAULTS, base=t, shape=shape, strides=strides, block_shape=[1, 1, 16, 16])
    return desc


# Which tile height (meta-parameter) each descriptor argument is read with.
_BOX_ROWS = {
    "fwd": {"Q": "BLOCK_M", "O": "BLOCK_M", "K": "BLOCK_N", "V": "BLOCK_N"},
    "dkdv": {"Q": "BLOCK_M", "DO": "BLOCK_M", "K": "BLOCK_N", "V": "BLOCK_N", "DK": "BLOCK_N", "DV": "BLOCK_N"},
    "dkdv_atomic": {"Q": "BLOCK_M", "DO": "BLOCK_M", "K": "BLOCK_N", "V": "BLOCK_N", "DK": "BLOCK_N",
                    "DV": "BLOCK_N", "DQ_ACC": "BLOCK_M"},
    "dq": {"Q": "BLOCK_M", "DO": "BLOCK_M", "DQ": "BLOCK_M", "K": "BLOCK_N", "V": "BLOCK_N"},
}


def _set_boxes(kind: str):
    def hook(args):
        if args["USE_TMA"]:
            for name, rows in _BOX_ROWS[kind].items():
                if isinstance(args[name], TensorDescriptor):
                    args[name].block_shape = [1, 1, args[rows], args["BLOCK_D"]]
    return hook


def _tensor(x):
    return x.base if isinstance(x, TensorDescriptor) else x


def _empty_like(t: torch.Tensor, dtype=None) -> torch.Tensor:
    out = torch.empty_like(t, dtype=dtype)
    if POISON_OUTPUTS:
        out.fill_(float("nan"))
    return out


def _dq_accumulator(q: torch.Tensor) -> torch.Tensor:
    """The float32 (B, Hq, Nq, D) sum the atomic backward adds dQ into: it
    must start at zero (never poisoned; dq itself is)."""
    return torch.zeros(q.shape, device=q.device, dtype=torch.float32)


def _empty(shape, device) -> torch.Tensor:
    out = torch.empty(shape, device=device, dtype=torch.float32)
    if POISON_OUTPUTS:
        out.fill_(float("nan"))
    return out


def _bucket(n: int) -> int:
    """Autotune key for a sequence length: the next power of two (>= 64), so
    shapes of one size class share their tuning."""
    return max(64, 1 << (int(n) - 1).bit_length())


def _dot_precision(dtype: torch.dtype) -> str:
    # float32 inputs get full fp32 products (tf32 would lose ~3 decimal digits
    # and break the accuracy contract); 16-bit inputs ignore this setting.
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.lru_cache(maxsize=None)
def _smem_per_block(device_index: int) -> int:
    try:
        props = triton.runtime.driver.active.utils.get_device_properties(device_index)
        return int(props["max_shared_mem"])
    except Exception:  # pragma: no cover - unknown driver: be conservative
        return 96 * 1024


def _smem_limit(device: torch.device) -> int:
    """Shared memory per block on ``device`` (queried once per device)."""
    return _smem_per_block(device.index or 0)


def _prune(kind: str):
    def prune(cfgs, named_args, **kwargs):
        args = {**named_args, **kwargs}
        head_dim = args["HEAD_DIM"]
        q = _tensor(args["Q"])
        elem = q.element_size()
        limit = _smem_limit(q.device)
        allowed = {c.name for c in configs.fitting(configs.candidates(kind, head_dim), head_dim, elem, limit,
                                                   kind=kind)}
        kept = [c for c in cfgs if _name(c) in allowed]
        if args.get("BLOCK_SPARSE"):
            kept = [c for c in kept if _tiles_divide_mask(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"])]
        return kept or cfgs[:1]
    return prune


def _name(cfg: "triton.Config") -> str:
    return KernelConfig(cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages).name


def _triton_configs(kind: str) -> list:
    seen, out = set(), []
    for cfgs in configs.TABLES[kind].values():
        for c in cfgs:
            if c.name not in seen:
                seen.add(c.name)
                out.append(triton.Config(c.as_meta(), num_warps=c.num_warps, num_stages=c.num_stages,
                                         pre_hook=_set_boxes(kind)))
    return out


def _tiles_divide_mask(block_m: int, block_n: int) -> bool:
    """A kernel tile must lie inside one block of a block-sparse layout."""
    return MASK_BLOCK_Q % block_m == 0 and MASK_BLOCK_K % block_n == 0


_TUNE_KEY = ["N_Q_BUCKET", "N_K_BUCKET", "HEAD_DIM", "IS_CAUSAL", "DOT_PRECISION", "USE_TMA",
             "IS_VARLEN", "HAS_WINDOW", "HAS_SOFTCAP", "HAS_ALIBI", "BLOCK_SPARSE"]
_KERNELS = {"fwd": _attn_fwd_kernel, "dkdv": _attn_bwd_dkdv_kernel, "dkdv_atomic": _attn_bwd_dkdv_kernel,
            "dq": _attn_bwd_dq_kernel}


@functools.lru_cache(maxsize=None)
def _tuned(kind: str):
    """The autotuned kernel of each kind (built on first use, GPU only)."""
    return triton.autotune(configs=_triton_configs(kind), key=_TUNE_KEY,
                           prune_configs_by={"early_config_prune": _prune(kind)})(_KERNELS[kind])


def _autotune_enabled() -> bool:
    # TILEATTN_AUTOTUNE=0: take the first config of the table that fits (the
    # tuned choice for the H200) instead of timing the candidates
    return configs.env("TILEATTN_AUTOTUNE", "1") != "0"


# (kind, device, dtype, autotune key values) -> (meta-parameters, launch
# options) of the config the autotuner chose: later calls launch it directly
# and skip the autotuner's bookkeeping
_TUNED_CHOICE: dict = {}


# ---------------------------------------------------------------------------
# Direct launches.  Triton's ``kernel[grid](**kwargs)`` binds ~60 arguments,
# builds a cache key from their specialisation and looks the compiled kernel
# up on every call: ~40 of the ~60 microseconds one launch costs the host
# (H200 host, benchmarks/launch_cost.py).  After the first call of a
# specialisation the compiled kernel is kept here, under a key that holds
# everything Triton specialises on (for triton 3.6: an int's equality to 1,
# divisibility by 16 and 32/64-bit range; a tensor's dtype and 16-byte
# alignment; a descriptor's dtype and block shape; every constexpr value; the
# launch options), and later calls go straight to its launcher.  A key finer
# than Triton's only costs a miss, which takes the regular path.
# The compiled kernel's launcher is called with Triton's own calling
# convention, which is not public API: direct launches are on only for the
# Triton versions this was checked against (tests/test_launch_key.py, and the
# bitwise GPU test in tests/test_gpu.py); other versions take the regular
# path.  TILEATTN_DIRECT_LAUNCH=0 turns them off.
# ---------------------------------------------------------------------------
_DIRECT: dict = {}
_DIRECT_MAX = 4096
_PARAMS: dict = {}
DIRECT_LAUNCH_VERSIONS = ("3.6.",)
_DIRECT_SUPPORTED = triton.__version__.startswith(DIRECT_LAUNCH_VERSIONS)


def _direct_enabled() -> bool:
    return _DIRECT_SUPPORTED and configs.env("TILEATTN_DIRECT_LAUNCH", "1") != "0"


def _params(kernel):
    """((name, default) of each parameter in signature order, the positions of
    the constexpr ones, the positions of the others)."""
    got = _PARAMS.get(kernel)
    if got is None:
        got = _PARAMS[kernel] = (tuple((p.name, p.default) for p in kernel.params),
                                 tuple(i for i, p in enumerate(kernel.params) if p.is_constexpr),
                                 tuple(i for i, p in enumerate(kernel.params) if not p.is_constexpr))
    return got


def _spec(v, constexpr: bool):
    if constexpr:
        return v
    t = type(v)
    if t is int:
        return (v == 1, v % 16 == 0, -2**31 <= v < 2**31, v < 2**63)
    if t is float:
        return float
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.data_ptr() % 16 == 0)
    if t is TensorDescriptor:
        return (v.base.dtype, *v.block_shape, v.padding)
    if v is None or t is bool or t is str:
        return (t, v)
    raise TypeError  # anything else: the regular path


def _run(kernel, grid: tuple, options: dict, args: dict) -> None:
    """``kernel[grid](**args, **options)``, through the direct-launch cache."""
    if not _direct_enabled() or configs.interpreter_active():
        _record(None)
        kernel[grid](**args, **options)
        return
    driver = triton.runtime.driver.active
    device = driver.get_current_device()
    params, constexprs, runtime_args = _params(kernel)
    values = [args[name] if name in args else default for name, default in params]
    grid = tuple(grid) + (1,) * (3 - len(grid))
    try:
        key = (kernel, device, triton.knobs.runtime.debug, *options.items(),
               *[values[i] for i in constexprs], *[_spec(values[i], False) for i in runtime_args])
        compiled = _DIRECT.get(key)
    except TypeError:   # an argument of a type the key does not know, or unhashable
        _record(None)
        kernel[grid](**args, **options)
        return
    if compiled is None:
        compiled = kernel[grid](**args, **options)
        if compiled is not None and not hasattr(compiled, "result"):
            if len(_DIRECT) >= _DIRECT_MAX:
                _DIRECT.clear()
            _DIRECT[key] = compiled
            _record((compiled, grid, values))
        else:
            _record(None)
        return
    _record((compiled, grid, values))
    stream = driver.get_current_stream(device)
    runtime = triton.knobs.runtime
    compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata,
                 compiled.launch_metadata(grid, stream, *values), runtime.launch_enter_hook,
                 runtime.launch_exit_hook, *values)


# ---------------------------------------------------------------------------
# Launch plans.  Even with direct launches, ``attn_fwd`` / ``attn_bwd`` spend
# most of their host time in Python that gives the same answer for every call
# of one shape: choosing the path and config, building ~60 keyword arguments
# per kernel, keying them for the direct-launch cache.  For a plain (no
# variant) call, a *plan* keeps what the launchers passed to each compiled
# kernel on the previous call of the same key (kind, current device, every
# input's shape, strides, dtype, device and 16-byte alignment, the scalar
# arguments, the switches that change a launch) with the per-call tensors
# left out; a later call allocates its outputs and launches the recorded
# kernels with its own tensors filled in.  A plan never holds a tensor (only
# descriptor fields without their base), so it keeps no memory alive.
# ---------------------------------------------------------------------------
_PLANS: dict = {}
_PLANS_MAX = 1024
_RECORDING = threading.local()


def _record(entry) -> None:
    """Note one launch (compiled kernel, grid, argument values), or None for a
    launch that did not go through a compiled kernel (no plan then)."""
    launches = getattr(_RECORDING, "launches", None)
    if launches is not None:
        launches.append(entry)


@dataclasses.dataclass(frozen=True)
class _PlannedLaunch:
    compiled: object
    grid: tuple
    template: tuple            # argument values; per-call tensors as None
    slots: tuple               # (position, tensor name, descriptor fields or None)


def _plan_key(kind: str, tensors: tuple, *scalars):
    """The key of a plan, or None when plans are off."""
    if not _direct_enabled() or configs.interpreter_active():
        return None
    key = [kind, triton.runtime.driver.active.get_current_device(), triton.knobs.runtime.debug,
           FORCE_POINTER_PATH, POISON_OUTPUTS, _autotune_enabled(), *scalars]
    for t in tensors:
        if t is None:
            key.append(None)
        else:
            key += (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)
    return tuple(key)


def _begin_record():
    _RECORDING.launches = []


def _end_record(key, tensors: dict) -> None:
    """Turn the launches recorded since :func:`_begin_record` into the plan of
    ``key``.  No plan when a launch did not go through a compiled kernel, an
    argument is a tensor that is not one of ``tensors``, or two names of
    ``tensors`` are one object (a later call need not alias them)."""
    launches, _RECORDING.launches = getattr(_RECORDING, "launches", None), None
    if key is None or not launches or any(x is None for x in launches):
        return
    names = {id(t): name for name, t in tensors.items()}
    if len(names) != len(tensors):
        return
    plan = []
    for compiled, grid, values in launches:
        template, slots = list(values), []
        for i, val in enumerate(values):
            if type(val) is TensorDescriptor:
                name = names.get(id(val.base))
                fields = {f: x for f, x in val.__dict__.items() if f != "base"}
            elif isinstance(val, torch.Tensor):
                name, fields = names.get(id(val)), None
            else:
                continue
            if name is None:
                return
            template[i] = None
            slots.append((i, name, fields))
        plan.append(_PlannedLaunch(compiled, grid, tuple(template), tuple(slots)))
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = tuple(plan)


def _abandon_record() -> None:
    _RECORDING.launches = None


def _replay(plan, tensors: dict) -> None:
    """Launch a plan's kernels with this call's tensors."""
    driver = triton.runtime.driver.active
    stream = driver.get_current_stream(driver.get_current_device())
    runtime = triton.knobs.runtime
    for step in plan:
        values = list(step.template)
        for i, name, fields in step.slots:
            t = tensors[name]
            if fields is None:
                values[i] = t
            else:
                desc = TensorDescriptor.__new__(TensorDescriptor)
                desc.__dict__.update(fields, base=t)
                values[i] = desc
        compiled, grid = step.compiled, step.grid
        compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata,
                     compiled.launch_metadata(grid, stream, *values), runtime.launch_enter_hook,
                     runtime.launch_exit_hook, *values)


def _aligned(*tensors) -> bool:
    for t in tensors:
        if t.data_ptr() % 16:
            return False
    return True


def _launch(kind: str, kernel, grid_of, config: KernelConfig | None, interpreter_cfg: KernelConfig, **args):
    """Run ``kernel`` with a forced config, the interpreter's single config, the
    table's first fitting config (autotuning off), or autotuning."""
    if config is None and configs.interpreter_active():
        config = interpreter_cfg
    # the atomic backward is never autotuned: the autotuner's trial launches
    # would each add their dQ into the same accumulator
    if config is None and (not _autotune_enabled() or kind == "dkdv_atomic"):
        head_dim, q = args["HEAD_DIM"], _tensor(args["Q"])
        fits = configs.fitting(configs.candidates(kind, head_dim), head_dim, q.element_size(),
                               _smem_limit(q.device), kind=kind)
        if args.get("BLOCK_SPARSE"):
            fits = [c for c in fits if _tiles_divide_mask(c.block_m, c.block_n)] or fits
        config = fits[0]
    if config is not None and args.get("BLOCK_SPARSE") and not _tiles_divide_mask(config.block_m, config.block_n):
        raise ValueError(f"config {config.name}: block-sparse attention needs tiles that divide the layout's "
                         f"{MASK_BLOCK_Q} x {MASK_BLOCK_K} blocks")
    if config is not None:
        meta = config.as_meta()
        full = {**args, **meta}
        _set_boxes(kind)(full)
        _run(kernel, grid_of(meta), {"num_warps": config.num_warps, "num_stages": config.num_stages}, full)
        return
    q = _tensor(args["Q"])
    key = (kind, q.device, q.dtype, *(args.get(k) for k in _TUNE_KEY))
    chosen = _TUNED_CHOICE.get(key)
    if chosen is None:
        _record(None)
        tuned = _tuned(kind)
        tuned[grid_of](**args)
        best = tuned.best_config
        _TUNED_CHOICE[key] = (best.kwargs, {k: v for k, v in best.all_kwargs().items() if k not in best.kwargs})
        return
    meta, options = chosen
    full = {**args, **meta}
    _set_boxes(kind)(full)
    _run(kernel, grid_of(meta), options, full)


_STRIDE_NAMES: dict = {}


def _strides4(t: torch.Tensor, prefix: str) -> dict:
    names = _STRIDE_NAMES.get(prefix)
    if names is None:
        names = _STRIDE_NAMES[prefix] = tuple(f"stride_{prefix}{s}" for s in "bhnd")
    return dict(zip(names, t.stride()))


class _Variants:
    """The kernel arguments of the variants that are on (none for a plain call).

    Packed sequences arrive as (1, H, total, D) views with ``cu_seqlens_*``;
    the batch axis of the grid then runs over the sequences."""

    def __init__(self, q, k, causal, scale, *, window=None, softcap=None, alibi_slopes=None, block_mask=None,
                 cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
        self.varlen = cu_seqlens_q is not None
        n_q, n_k = q.shape[2], k.shape[2]
        self.batch = cu_seqlens_q.numel() - 1 if self.varlen else q.shape[0]
        self.len_q = int(max_seqlen_q) if self.varlen else n_q   # rows per sequence the grid covers
        self.len_k = int(max_seqlen_k) if self.varlen else n_k
        self.causal = bool(causal)   # IS_CAUSAL of the kernels
        self.window = window
        self.block_mask = block_mask
        self.args = {}
        if self.varlen:
            self.args.update(CU_SEQLENS_Q=cu_seqlens_q, CU_SEQLENS_K=cu_seqlens_k, IS_VARLEN=True)
        if window is not None:
            left, right = window
            if causal:
                right = 0
            # unbounded sides: a bound past every sequence (no int32 overflow)
            left = self.len_k if left < 0 else min(left, self.len_k)
            right = self.len_q if right < 0 else min(right, self.len_q)
            # causal is folded into the window's right side
            self.args.update(win_left=left, win_right=right, HAS_WINDOW=True)
            self.causal = False
        if softcap:
            self.args.update(softcap_scale=scale / softcap, softcap_log2=softcap * LOG2E, HAS_SOFTCAP=True)
        if alibi_slopes is not None:
            slopes = alibi_slopes.to(device=q.device, dtype=torch.float32)
            if slopes.dim() == 1:
                self.args.update(ALIBI=slopes, stride_ab=0, stride_ah=slopes.stride(0))
            else:
                self.args.update(ALIBI=slopes, stride_ab=slopes.stride(0), stride_ah=slopes.stride(1))
            self.args["HAS_ALIBI"] = True
        self.lists = None
        if block_mask is not None:
            self.lists = cached_kernel_block_lists(block_mask, n_q, n_k, causal=causal, window=window)

    def kernel_args(self, kind: str) -> dict:
        """Arguments for the ``fwd``, ``dkdv`` or ``dq`` kernel."""
        args = dict(self.args)
        if self.lists is not None:
            lst = self.lists
            full_num, full_idx, part_num, part_idx = (
                (lst.q_full_num, lst.q_full_idx, lst.q_part_num, lst.q_part_idx) if kind == "dkdv" else
                (lst.kv_full_num, lst.kv_full_idx, lst.kv_part_num, lst.kv_part_idx))
            bb, hb = full_idx.shape[0], full_idx.shape[1]
            # broadcast layouts (batch or heads of size 1) get stride 0
            args.update(BS_FULL_NUM=full_num, BS_FULL_IDX=full_idx, BS_PART_NUM=part_num, BS_PART_IDX=part_idx,
                        stride_bs_nb=full_num.stride(0) if bb > 1 else 0,
                        stride_bs_nh=full_num.stride(1) if hb > 1 else 0,
                        stride_bs_ib=full_idx.stride(0) if bb > 1 else 0,
                        stride_bs_ih=full_idx.stride(1) if hb > 1 else 0,
                        stride_bs_ir=full_idx.stride(2), BLOCK_SPARSE=True,
                        MASK_BLOCK_Q=MASK_BLOCK_Q, MASK_BLOCK_K=MASK_BLOCK_K)
        return args


def attn_fwd(q, k, v, causal: bool, scale: float, config: KernelConfig | None = None, **variants):
    """Forward launch. Returns (out like q, lse float32 (B, Hq, Nq)).

    ``variants``: ``window=(left, right)``, ``softcap=c``, ``alibi_slopes``,
    ``block_mask`` (see ``tileattn.attention``) and, for packed sequences
    given as (1, H, total, D) views, ``cu_seqlens_q``, ``cu_seqlens_k``,
    ``max_seqlen_q``, ``max_seqlen_k`` (lse is then (1, Hq, total_q))."""
    if (not variants and (config is None or isinstance(config, HopperFwdConfig)) and launch_hopper.eligible(q, k, v)
            and (config is not None or launch_hopper.preferred(q.shape[-1], causal, k.shape[2]))):
        return launch_hopper.attn_fwd(q, k, v, causal, scale, config, poison=POISON_OUTPUTS)
    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]
    plan_key = None
    if not variants and config is None and q.is_cuda:
        plan_key = _plan_key("fwd", (q, k, v), bool(causal), float(scale))
        plan = _PLANS.get(plan_key) if plan_key is not None else None
        if plan is not None:
            o, lse = _empty_like(q), _empty((b, hq, n_q), q.device)
            if _aligned(o, lse):
                _replay(plan, {"q": q, "k": k, "v": v, "o": o, "lse": lse})
                return o, lse
            plan_key = None
    var = _Variants(q, k, causal, scale, **variants)
    o = _empty_like(q)
    lse = _empty((b, hq, n_q), q.device)
    if n_q == 0 or b == 0 or var.batch == 0:
        return o, lse
    if n_k == 0:  # nothing to attend to: every row is empty
        return o.zero_(), lse.fill_(float("-inf"))
    if plan_key is not None:
        _begin_record()
    try:
        _attn_fwd_launch(q, k, v, o, lse, var, scale, config)
    except BaseException:
        _abandon_record()
        raise
    if plan_key is not None:
        _end_record(plan_key, {"q": q, "k": k, "v": v, "o": o, "lse": lse})
    return o, lse


def _attn_fwd_launch(q, k, v, o, lse, var, scale, config):
    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]

    def grid(meta):
        return (triton.cdiv(var.len_q, meta["BLOCK_M"]), hq, var.batch)

    tma = use_tma(q, k, v, o)
    tiles = (lambda t: _descriptor(t)) if tma else (lambda t: t)
    _launch("fwd", _attn_fwd_kernel, grid, config, configs.INTERPRETER_FWD,
            Q=tiles(q), K=tiles(k), V=tiles(v), O=o if var.varlen else tiles(o), LSE=lse,
            **_strides4(q, "q"), **_strides4(k, "k"), **_strides4(v, "v"), **_strides4(o, "o"),
            stride_lb=lse.stride(0), stride_lh=lse.stride(1),
            GROUP_SIZE=hq // hkv, N_Q=n_q, N_K=n_k, qk_scale=scale * LOG2E,
            N_Q_BUCKET=_bucket(var.len_q), N_K_BUCKET=_bucket(var.len_k),
            HEAD_DIM=d, BLOCK_D=configs.block_d(d), IS_CAUSAL=var.causal,
            DOT_PRECISION=_dot_precision(q.dtype), USE_TMA=tma, **var.kernel_args("fwd"))


def attn_bwd(do, q, k, v, o, lse, causal: bool, scale: float, dlse=None,
             config: KernelConfig | dict | None = None, deterministic: bool = True, **variants):
    """Backward launch. Returns (dq like q, dk like k, dv like v).

    ``deterministic=True``: the dK/dV kernel, then the dQ kernel (bitwise
    reproducible).  ``False``: the dK/dV kernel also adds its share of dQ
    into a float32 accumulator with atomics (5 tile matmuls instead of 7;
    dq is then reproducible only up to the order of the float32 adds), and
    a small kernel converts the sum into dq.  ``config`` forces every
    kernel's config, or {"dkdv": ..., "dq": ..., "dkdv_atomic": ...} each;
    ``variants`` as for :func:`attn_fwd`."""
    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]
    deterministic = bool(deterministic)
    plan_key = None
    if not variants and config is None and q.is_cuda:
        plan_key = _plan_key("bwd", (do, q, k, v, o, lse, dlse), bool(causal), float(scale), deterministic)
        plan = _PLANS.get(plan_key) if plan_key is not None else None
        if plan is not None:
            dq, dk, dv = _empty_like(q), _empty_like(k), _empty_like(v)
            delta, lse2 = _empty((b, hq, n_q), q.device), _empty((b, hq, n_q), q.device)
            tensors = {"do": do, "q": q, "k": k, "v": v, "o": o, "lse": lse, "dlse": dlse,
                       "dq": dq, "dk": dk, "dv": dv, "delta": delta, "lse2": lse2}
            if not deterministic:
                tensors["dq_acc"] = _dq_accumulator(q)
            if _aligned(dq, dk, dv, delta, lse2):
                _replay(plan, tensors)
                return dq, dk, dv
            plan_key = None
    var = _Variants(q, k, causal, scale, **variants)
    dq, dk, dv = _empty_like(q), _empty_like(k), _empty_like(v)
    if b == 0 or n_k == 0 or n_q == 0 or var.batch == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    delta = _empty((b, hq, n_q), q.device)
    lse2 = _empty((b, hq, n_q), q.device)
    dq_acc = None if deterministic else _dq_accumulator(q)
    if plan_key is not None:
        _begin_record()
    try:
        _attn_bwd_launch(do, q, k, v, o, lse, dlse, dq, dk, dv, delta, lse2, var, scale, config, dq_acc)
    except BaseException:
        _abandon_record()
        raise
    if plan_key is not None:
        tensors = {"do": do, "q": q, "k": k, "v": v, "o": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv,
                   "delta": delta, "lse2": lse2}
        if dlse is not None:
            tensors["dlse"] = dlse
        if dq_acc is not None:
            tensors["dq_acc"] = dq_acc
        _end_record(plan_key, tensors)
    return dq, dk, dv


def _attn_bwd_launch(do, q, k, v, o, lse, dlse, dq, dk, dv, delta, lse2, var, scale, config, dq_acc=None):
    """The backward's launches; with ``dq_acc`` (a zeroed float32 tensor
    shaped like q) the atomic path: the dK/dV kernel adds dQ into it and
    the convert kernel writes dq from it."""
    per_kind = config if isinstance(config, dict) else {"dkdv": config, "dq": config, "dkdv_atomic": config}
    b, hq, n_q, d = q.shape
    hkv, n_k = k.shape[1], k.shape[2]
    lse = lse.contiguous()
    pre_block = configs.INTERPRETER_BWD.block_m if configs.interpreter_active() else 64
    has_dlse = dlse is not None
    _run(_attn_bwd_preprocess_kernel, (triton.cdiv(n_q, pre_block), hq, b), {}, dict(
        O=o, DO=do, LSE=lse, DLSE=dlse.contiguous() if has_dlse else lse, DELTA=delta, LSE2=lse2,
        **_strides4(o, "o"), **_strides4(do, "do"),
        N_HEADS=hq, N_Q=n_q, HEAD_DIM=d, BLOCK_D=configs.block_d(d), BLOCK_M=pre_block,
        HAS_DLSE=has_dlse))

    tma = use_tma(q, k, v, do, dq, dk, dv)
    tiles = (lambda t: _descriptor(t)) if tma else (lambda t: t)
    common = dict(Q=tiles(q), K=tiles(k), V=tiles(v), DO=tiles(do), LSE2=lse2, DELTA=delta,
                  **_strides4(q, "q"), **_strides4(k, "k"), **_strides4(v, "v"), **_strides4(do, "do"),
                  N_HEADS=hq, GROUP_SIZE=hq // hkv, N_Q=n_q, N_K=n_k,
                  sm_scale=scale, qk_scale=scale * LOG2E,
                  N_Q_BUCKET=_bucket(var.len_q), N_K_BUCKET=_bucket(var.len_k),
                  HEAD_DIM=d, BLOCK_D=configs.block_d(d), IS_CAUSAL=var.causal,
                  DOT_PRECISION=_dot_precision(q.dtype), USE_TMA=tma)
    # packed sequences store through pointers, clipped at each sequence's end
    out_tiles = (lambda t: t) if var.varlen else tiles

    def grid_kv(meta):
        return (triton.cdiv(var.len_k, meta["BLOCK_N"]), hkv, var.batch)

    def grid_q(meta):
        return (triton.cdiv(var.len_q, meta["BLOCK_M"]), hq, var.batch)

    if dq_acc is None:
        _launch("dkdv", _attn_bwd_dkdv_kernel, grid_kv, per_kind.get("dkdv"), configs.INTERPRETER_BWD,
                DK=out_tiles(dk), DV=out_tiles(dv), **_strides4(dk, "dk"), **_strides4(dv, "dv"), **common,
                **var.kernel_args("dkdv"))
        _launch("dq", _attn_bwd_dq_kernel, grid_q, per_kind.get("dq"), configs.INTERPRETER_BWD,
                DQ=out_tiles(dq), **_strides4(dq, "dq"), **common, **var.kernel_args("dq"))
        return
    # the copy engine's bulk reduce clips at the tensor's edges only, so
    # packed sequences (and the interpreter, which lacks it) add by pointer
    dq_tma = tma and not var.varlen and not configs.interpreter_active()
    _launch("dkdv_atomic", _attn_bwd_dkdv_kernel, grid_kv, per_kind.get("dkdv_atomic"), configs.INTERPRETER_BWD,
            DK=out_tiles(dk), DV=out_tiles(dv), **_strides4(dk, "dk"), **_strides4(dv, "dv"), **common,
            **var.kernel_args("dkdv"), DQ_ACC=_descriptor(dq_acc) if dq_tma else dq_acc,
            **_strides4(dq_acc, "dqa"), ATOMIC_DQ=True, DQ_TMA=dq_tma)
    _run(_attn_bwd_dq_convert_kernel, (triton.cdiv(n_q, pre_block), hq, b), {}, dict(
        DQ_ACC=dq_acc, DQ=dq, **_strides4(dq_acc, "dqa"), **_strides4(dq, "dq"), N_Q=n_q, sm_scale=scale,
        HEAD_DIM=d, BLOCK_D=configs.block_d(d), BLOCK_M=pre_block))

