"""Test set-up.

Without a GPU the Triton kernels run under the interpreter: TRITON_INTERPRET
must be set before tileattn (and so the kernels) is imported.

The interpreter computes bf16 ``tl.dot`` and bf16 arithmetic on bit patterns
and returns wrong values, so under the interpreter (only) a shim upcasts bf16
inputs of the kernel launchers to float32 and rounds the results back.  The
kernels' bf16 arithmetic is verified for real by the same tests on a GPU.
"""
import fcntl
import gc
import os
import tempfile

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:
    # correctness runs use the table's first fitting config (each shape would
    # otherwise compile and time every candidate); test_every_table_config
    # forces each candidate once
    os.environ.setdefault("TILEATTN_AUTOTUNE", "0")

import tileattn  # noqa: E402  (after TRITON_INTERPRET)
from tileattn import _env, configs, launch  # noqa: E402
from tileattn.launch import decode as launch_decode, runtime  # noqa: E402  (the launch switches live there)
from tileattn.sinks import decode_remainder, encode_remainder, remainder_like  # noqa: E402

INTERPRETED = _env.interpreter_active()
from tileattn.testing import DEVICE, DT_NAME, SEED_OFFSET, case_number  # noqa: E402,F401  (shared with cases)


def _bf16_shim(fn, n_tensor_args):
    def wrapped(*args, **kwargs):
        tensors = args[:n_tensor_args]
        if not any(isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 for t in tensors):
            return fn(*args, **kwargs)
        up = tuple(t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 else t
                   for t in tensors)
        if kwargs.get("o_lo") is not None:   # the forward's remainder code: into the float32 output (code 0 left)
            up = up[:4] + (decode_remainder(args[4], kwargs["o_lo"]),) + up[5:]
            kwargs = dict(kwargs, o_lo=torch.zeros_like(kwargs["o_lo"]))
        outs = fn(*up, *args[n_tensor_args:], **kwargs)
        # 4-d results (out, dq, dk, dv) return in the caller's dtype; lse stays float32
        rounded = tuple(o.to(torch.bfloat16) if o.dim() == 4 else o for o in outs)
        if kwargs.get("remainder"):   # (out, lse, out_lo): the code of what rounding the float32 out to bf16 drops
            rounded = rounded[:2] + (remainder_like(rounded[0]).copy_(encode_remainder(outs[0], rounded[0])),)
        return rounded
    return wrapped


if INTERPRETED:
    launch.attn_fwd = _bf16_shim(launch.attn_fwd, 3)
    launch.attn_bwd = _bf16_shim(launch.attn_bwd, 6)


@pytest.fixture
def decode_bf16_upcast(monkeypatch):
    """Under the interpreter (only), bf16 decoding attention runs the kernel on
    float32 copies and rounds the output back (the interpreter's bf16
    arithmetic is wrong, as above).  The append kernel, which only moves bf16
    bits, runs on the bf16 cache itself.  The decoding tests that run
    ``tileattn.testing_decode``'s cases ask for it in their ``pytestmark``."""
    if not INTERPRETED:
        yield
        return
    real = launch_decode.kvcache_attention

    def upcast(q, k_cache, v_cache, cache_seqlens, block_table, *args, k_new=None, v_new=None, call_key=None,
               **kwargs):
        if q.dtype != torch.bfloat16:
            return real(q, k_cache, v_cache, cache_seqlens, block_table, *args, k_new=k_new, v_new=v_new,
                        call_key=call_key, **kwargs)
        if k_new is not None:
            launch_decode.append_kv(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, kwargs["capacity"])
        out, lse = real(q.float(), k_cache.float(), v_cache.float(), cache_seqlens, block_table, *args, **kwargs)
        return out.to(torch.bfloat16), lse

    monkeypatch.setattr(launch_decode, "kvcache_attention", upcast)
    yield


@pytest.fixture(autouse=True)
def _gpu_share(request):
    """On a GPU every test holds a shared lock on one file and a test marked
    ``gpu_exclusive`` an exclusive one, so that pytest-xdist's other workers
    do not run out of memory beside it (the >2^31-element test takes ~50 GB;
    under ``-n 15`` it took the tests beside it down, perf-notes v55).  The
    exclusive test hands its cached blocks back when it ends."""
    if not HAS_CUDA:
        yield
        return
    exclusive = request.node.get_closest_marker("gpu_exclusive") is not None
    with open(_GPU_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            if exclusive:
                gc.collect()
                torch.cuda.empty_cache()
            fcntl.flock(f, fcntl.LOCK_UN)


_GPU_LOCK = os.path.join(tempfile.gettempdir(), f"tileattn-tests-gpu-{os.getuid()}.lock")


@pytest.fixture(autouse=True)
def _poison_outputs():
    """Every kernel output starts as NaN: an element a kernel forgets shows."""
    runtime.POISON_OUTPUTS = True
    yield
    runtime.POISON_OUTPUTS = False


@pytest.fixture(autouse=True)
def _seed_from_the_test_id(request):
    """torch's global generator seeded from the test's id (and TILEATTN_TEST_SEED)
    for the tests that draw from it without a seed of their own: their inputs
    do not depend on which tests a worker ran before them."""
    torch.manual_seed(case_number(request.node.nodeid) + SEED_OFFSET)


@pytest.fixture(params=["kernels", "torch"])
def path(request):
    """Run a test on the Triton kernels and on the pure-PyTorch tiled path."""
    name = "triton" if request.param == "kernels" else "torch"
    with tileattn.use_backend(name):
        yield request.param


@pytest.fixture
def pointer_path():
    """The portable path (per-thread addresses) where tensor descriptors would run."""
    runtime.FORCE_POINTER_PATH = True
    with tileattn.use_backend("triton"):
        yield
    runtime.FORCE_POINTER_PATH = False


@pytest.fixture
def kernels():
    with tileattn.use_backend("triton"):
        yield


@pytest.fixture
def decode_loops(monkeypatch):
    """``force(one_loop, loads, table)``: the decoding partial kernel with one
    loop structure (ONE_LOOP or the masked head / unmasked body / masked
    tail) on one load path ("descriptors" or "pointers"), 32-key tiles (the
    interpreter's config, and on a GPU the only candidate of
    ``configs.<table>``), no launch plans (a plan recorded by another test
    would replay without asking ``launch_decode.one_loop``)."""
    def force(one_loop: bool, loads: str, table: str):
        if loads == "pointers":
            monkeypatch.setattr(runtime, "FORCE_POINTER_PATH", True)
        monkeypatch.setattr(launch_decode, "one_loop", lambda descriptors, paged: one_loop)
        monkeypatch.setenv("TILEATTN_DIRECT_LAUNCH", "0")
        monkeypatch.setattr(configs, "INTERPRETER_DECODE", configs.DecodeConfig(32, 4, 1))
        if not INTERPRETED:
            monkeypatch.setattr(configs, table, (configs.DecodeConfig(32, 4, 2),))
            monkeypatch.setenv("TILEATTN_AUTOTUNE", "0")
    return force


def pytest_report_header(config):
    mode = "CUDA: " + torch.cuda.get_device_name() if HAS_CUDA else "CPU, Triton interpreter"
    return f"tileattn tests on {mode}"
