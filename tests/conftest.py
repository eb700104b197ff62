"""Test set-up.

Without a GPU the Triton kernels run under the interpreter: TRITON_INTERPRET
must be set before tileattn (and so the kernels) is imported.

The interpreter computes bf16 ``tl.dot`` and bf16 arithmetic on bit patterns
and returns wrong values, so under the interpreter (only) a shim upcasts bf16
inputs of the kernel launchers to float32 and rounds the results back.  The
kernels' bf16 arithmetic is verified for real by the same tests on a GPU.
"""
import os

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
from tileattn import _env, launch  # noqa: E402
from tileattn.launch import runtime  # noqa: E402  (the launch switches live there)

INTERPRETED = _env.interpreter_active()
from tileattn.testing import DEVICE, DT_NAME, SEED_OFFSET  # noqa: E402,F401  (shared with the case builders)


def _bf16_shim(fn, n_tensor_args):
    def wrapped(*args, **kwargs):
        tensors = args[:n_tensor_args]
        if not any(isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 for t in tensors):
            return fn(*args, **kwargs)
        up = tuple(t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 else t
                   for t in tensors)
        outs = fn(*up, *args[n_tensor_args:], **kwargs)
        # 4-d results (out, dq, dk, dv) return in the caller's dtype; lse stays float32
        return tuple(o.to(torch.bfloat16) if o.dim() == 4 else o for o in outs)
    return wrapped


if INTERPRETED:
    launch.attn_fwd = _bf16_shim(launch.attn_fwd, 3)
    launch.attn_bwd = _bf16_shim(launch.attn_bwd, 6)


@pytest.fixture(autouse=True)
def _poison_outputs():
    """Every kernel output starts as NaN: an element a kernel forgets shows."""
    runtime.POISON_OUTPUTS = True
    yield
    runtime.POISON_OUTPUTS = False


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


def pytest_report_header(config):
    mode = "CUDA: " + torch.cuda.get_device_name() if HAS_CUDA else "CPU, Triton interpreter"
    return f"tileattn tests on {mode}"
