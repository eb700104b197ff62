"""What every launcher shares: switches, tensor descriptors, allocation,
device queries, direct launches and launch plans.

No kernel and no config choice here (``tuning.py`` chooses configs; the
launchers in ``attention.py``, ``decode.py`` and ``hopper.py`` build the
arguments).  The module-level switches (``POISON_OUTPUTS``,
``FORCE_POINTER_PATH``) are read here at every launch: set them on this
module.
"""
from __future__ import annotations

import dataclasses
import functools
import threading

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from .._env import env, interpreter_active
from ..dispatch import tma_addressable

LOG2E = 1.4426950408889634

# Tests set this to fill outputs with NaN before each launch, so that an
# element a kernel forgets to write shows up as NaN instead of stale memory.
POISON_OUTPUTS = False

# Tests set this to run the portable pointer path where TMA would be used.
FORCE_POINTER_PATH = False


@functools.lru_cache(maxsize=None)
def _has_tma(device_index: int) -> bool:
    return torch.version.hip is None and torch.cuda.get_device_capability(device_index)[0] >= 9


def use_tma(*tensors: torch.Tensor) -> bool:
    """Whether the kernels load tiles through tensor descriptors (the Hopper
    copy engine; also runs under the interpreter).  Needs every tensor
    ``dispatch.tma_addressable`` with the row dim's stride kept (unit stride
    on the head dim, 16-byte aligned base and strides); otherwise the
    portable pointer path runs."""
    if FORCE_POINTER_PATH:
        return False
    if not interpreter_active():
        if not tensors[0].is_cuda or not _has_tma(tensors[0].device.index or 0):
            return False
        # fp32 runs IEEE products on CUDA cores, where the compiler's pipeliner
        # rejected descriptor loads (triton 3.6, sm_90): keep fp32 on pointers
        if tensors[0].dtype == torch.float32:
            return False
    # the descriptors' strides are tma_strides(t, t.dim() - 2): the row stride stays
    return all(tma_addressable(t, t.dim() - 2) for t in tensors)


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


def tma_strides(t: torch.Tensor, n_dims: int) -> list:
    """``t``'s strides, those of its first ``n_dims`` dims of size 1 replaced
    by 16 bytes: such a dim is never stepped over, and the copy engine wants
    every stride 16-byte aligned."""
    elem, shape, strides = t.element_size(), t.shape, list(t.stride())
    for i in range(n_dims):
        if shape[i] == 1:
            strides[i] = 16 // elem
    return strides


def descriptor(t: torch.Tensor) -> TensorDescriptor:
    """A host-built descriptor over a whole (B, H, N, D) tensor.  Its box
    (1, 1, rows, BLOCK_D) is set per launch by :func:`_set_boxes`, once the
    config (and so the tile height) is known.  ``use_tma`` has checked the
    alignment already, so the constructor's own checks (a few microseconds
    per descriptor, seven per backward call) are skipped."""
    shape, strides = list(t.shape), tma_strides(t, t.dim() - 2)
    if _DESC_DEFAULTS is None:  # pragma: no cover - a future TensorDescriptor
        return TensorDescriptor(t, shape, strides, [1, 1, 16, 16])
    desc = TensorDescriptor.__new__(TensorDescriptor)
    desc.__dict__.update(_DESC_DEFAULTS, base=t, shape=shape, strides=strides, block_shape=[1, 1, 16, 16])
    return desc


def base_tensor(x):
    """The tensor behind a kernel argument (a descriptor's base, or ``x``)."""
    return x.base if isinstance(x, TensorDescriptor) else x


def output_like(t: torch.Tensor, dtype=None) -> torch.Tensor:
    """``torch.empty_like(t, dtype=dtype)`` for a kernel output (NaN under POISON_OUTPUTS)."""
    out = torch.empty_like(t, dtype=dtype)
    if POISON_OUTPUTS:
        out.fill_(float("nan"))
    return out


def output_f32(shape, device) -> torch.Tensor:
    """A new float32 kernel output (NaN under POISON_OUTPUTS)."""
    out = torch.empty(shape, device=device, dtype=torch.float32)
    if POISON_OUTPUTS:
        out.fill_(float("nan"))
    return out


def dot_precision(dtype: torch.dtype) -> str:
    """The kernels' DOT_PRECISION for inputs of ``dtype``."""
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


def smem_limit(device: torch.device) -> int:
    """Shared memory per block on ``device`` (queried once per device)."""
    return _smem_per_block(device.index or 0)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (queried once per device); 1
    off CUDA (the interpreter runs programs one after another)."""
    if device.type == "cuda":
        return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 1


_STRIDE_NAMES: dict = {}


def strides4(t: torch.Tensor, prefix: str) -> dict:
    """A 4-d tensor's strides as the kernels' keyword arguments stride_<prefix>{b,h,n,d}."""
    names = _STRIDE_NAMES.get(prefix)
    if names is None:
        names = _STRIDE_NAMES[prefix] = tuple(f"stride_{prefix}{s}" for s in "bhnd")
    return dict(zip(names, t.stride()))


def aligned(*tensors) -> bool:
    """Whether every tensor's data starts 16-byte aligned."""
    for t in tensors:
        if t.data_ptr() % 16:
            return False
    return True


def autotune_enabled() -> bool:
    """Whether configs are timed (autotuned) rather than taken first-fit."""
    # TILEATTN_AUTOTUNE=0: take the first config of the table that fits (the
    # tuned choice for the H200) instead of timing the candidates
    return env("TILEATTN_AUTOTUNE", "1") != "0"


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


# the descriptor classes a launch key and a plan know: Triton's, and Gluon's
# once a Gluon launcher registers it (launch/decode_hopper.py; Gluon is not
# imported here, so a CPU install never does)
_DESCRIPTOR_TYPES = {TensorDescriptor}


def register_descriptor_type(cls) -> None:
    """Let direct launches and plans take descriptors of ``cls`` (a dataclass
    with Triton's fields: base, shape, strides, block_shape, padding, and
    Gluon's layout)."""
    _DESCRIPTOR_TYPES.add(cls)


def _direct_enabled() -> bool:
    return _DIRECT_SUPPORTED and env("TILEATTN_DIRECT_LAUNCH", "1") != "0"


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
    if t in _DESCRIPTOR_TYPES:
        return (t, v.base.dtype, *v.block_shape, v.padding, getattr(v, "layout", None))
    if v is None or t is bool or t is str:
        return (t, v)
    raise TypeError  # anything else: the regular path


def _scratch(size: int, alignment: int, stream):
    return torch.empty(size, device="cuda", dtype=torch.int8)


def scratch_allocator() -> None:
    """Give Triton an allocator for the global scratch memory of kernels
    that make tensor descriptors on the device (packed sequences' edge
    tiles), unless one is set.  Triton keeps it in a context variable: set
    again in each thread that launches (autograd's backward runs in its own)."""
    try:   # Triton's own null allocator (private names: a Triton without them gets ours)
        from triton.runtime import _allocation
        current = _allocation._allocator.get()
        unset = current is _allocation._NULL_ALLOCATOR
    except (ImportError, AttributeError):
        unset = True
    if unset:
        triton.set_allocator(_scratch)


def run(kernel, grid: tuple, options: dict, args: dict) -> None:
    """``kernel[grid](**args, **options)``, through the direct-launch cache."""
    if not _direct_enabled() or interpreter_active():
        record(None)
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
        record(None)
        kernel[grid](**args, **options)
        return
    if compiled is None:
        compiled = kernel[grid](**args, **options)
        if compiled is not None and not hasattr(compiled, "result"):
            if len(_DIRECT) >= _DIRECT_MAX:
                _DIRECT.clear()
            _DIRECT[key] = compiled
            record((compiled, grid, values))
        else:
            record(None)
        return
    record((compiled, grid, values))
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
PLANS: dict = {}
PLANS_MAX = 1024
PLANS_ON = True   # False: every call takes the launchers (``testing.counting_calls`` counts them)
_RECORDING = threading.local()


def record(entry) -> None:
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
    slots: tuple               # (position, tensor name, (descriptor class, its fields) or None)


def plan_key(kind: str, tensors: tuple, *scalars):
    """The key of a plan, or None when plans are off."""
    if not PLANS_ON or not _direct_enabled() or interpreter_active():
        return None
    key = [kind, triton.runtime.driver.active.get_current_device(), triton.knobs.runtime.debug,
           FORCE_POINTER_PATH, POISON_OUTPUTS, autotune_enabled(), *scalars]
    for t in tensors:
        if t is None:
            key.append(None)
        else:
            key += (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)
    return tuple(key)


def begin_record():
    """Start recording this thread's launches for :func:`end_record`."""
    _RECORDING.launches = []


def end_record(key, tensors: dict) -> None:
    """Turn the launches recorded since :func:`begin_record` into the plan of
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
            if type(val) in _DESCRIPTOR_TYPES:
                name = names.get(id(val.base))
                fields = (type(val), {f: x for f, x in val.__dict__.items() if f != "base"})
            elif isinstance(val, torch.Tensor):
                name, fields = names.get(id(val)), None
            else:
                continue
            if name is None:
                return
            template[i] = None
            slots.append((i, name, fields))
        plan.append(_PlannedLaunch(compiled, grid, tuple(template), tuple(slots)))
    if len(PLANS) >= PLANS_MAX:
        PLANS.clear()
    PLANS[key] = tuple(plan)


def abandon_record() -> None:
    """Stop recording without making a plan."""
    _RECORDING.launches = None


def replay(plan, tensors: dict) -> None:
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
                cls, kept = fields
                desc = cls.__new__(cls)
                desc.__dict__.update(kept, base=t)
                values[i] = desc
        compiled, grid = step.compiled, step.grid
        compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata,
                     compiled.launch_metadata(grid, stream, *values), runtime.launch_enter_hook,
                     runtime.launch_exit_hook, *values)


@functools.lru_cache(maxsize=64)
def shared_layout(block: tuple, dtype: str):
    """The default swizzled shared layout of a Gluon copy box, or with ``dtype``
    "rows" the unswizzled float32 one of lse₂/Δ rows: frozen values, built
    once (building them was most of a launch's host time, perf-notes v24)."""
    from triton.experimental.gluon import language as gl
    if dtype == "rows":
        return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=len(block))
    return gl.NVMMASharedLayout.get_default_for(list(block), getattr(gl, dtype))


def bundled_ptxas(arch: int = 90) -> str:
    """The path of the ptxas Triton bundles (its nvdisasm sits beside it)."""
    from triton.backends.nvidia.compiler import get_ptxas
    try:
        return get_ptxas(arch).path
    except TypeError:   # a triton whose get_ptxas takes no architecture
        return get_ptxas().path


def ptxas_report(ptx: str, arch: int = 90) -> dict:
    """What the assembler Triton bundles says of a kernel's PTX (``ptxas -v``
    for ``sm_<arch>a`` from 90 on, else ``sm_<arch>``): whether it serialized
    the warpgroup MMAs (any of its "wgmma.mma_async instructions are
    serialized" warnings: C7512, too few registers to keep them in flight,
    cost an option 12-18 %, perf-notes v28; C7514, other instructions reading
    an MMA's accumulator registers while it is in flight, v40), the bytes it
    spilled and the registers a thread (None where the log has no count).  A
    compile check's tool: its imports stay out of the launch path's module
    load."""
    import os
    import re
    import subprocess
    import tempfile
    tool = bundled_ptxas(arch)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
        done = subprocess.run([tool, f"-arch={gpu}", "-v", src, "-o", os.path.join(tmp, "kernel.cubin")],
                              capture_output=True, text=True, check=True)
    log = done.stdout + done.stderr
    spills = re.search(r"(\d+) bytes spill stores", log)
    regs = re.search(r"Used (\d+) registers", log)
    serialized = re.search(r"\(C\d+\)[^\n]*wgmma\.mma_async instructions are serialized", log)
    return {"wgmma_serialized": serialized is not None, "spill_stores": int(spills.group(1)) if spills else 0,
            "registers": int(regs.group(1)) if regs else None}
