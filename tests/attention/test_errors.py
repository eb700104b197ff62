"""Bad input gets a clear TypeError/ValueError naming the argument, before any
kernel launch."""
import pytest
import torch

import tileattn
from tileattn import launch
from tileattn.testing import forbidden

from conftest import DEVICE, HAS_CUDA


def t(*shape, dtype=torch.float16, device=DEVICE):
    return torch.randn(*shape, device=device).to(dtype)


CASES = {
    "q-not-tensor": (lambda: ([1.0], t(1, 1, 4, 8), t(1, 1, 4, 8)), {}, TypeError, "q must be a torch.Tensor"),
    "q-rank3": (lambda: (t(1, 4, 8), t(1, 1, 4, 8), t(1, 1, 4, 8)), {}, ValueError, "q must have 4 dimensions"),
    "k-sparse": (lambda: (t(1, 1, 4, 8), t(1, 1, 4, 8).to_sparse(), t(1, 1, 4, 8)), {}, TypeError,
                 "k must be a dense"),
    "v-rank5": (lambda: (t(1, 1, 4, 8), t(1, 1, 4, 8), t(1, 1, 1, 4, 8)), {}, ValueError, "v must have 4 dimensions"),
    "batch-mismatch": (lambda: (t(2, 1, 4, 8), t(1, 1, 4, 8), t(1, 1, 4, 8)), {}, ValueError, "batch size"),
    "headdim-mismatch": (lambda: (t(1, 1, 4, 8), t(1, 1, 4, 16), t(1, 1, 4, 16)), {}, ValueError, "head_dim"),
    "nk-mismatch": (lambda: (t(1, 1, 4, 8), t(1, 1, 5, 8), t(1, 1, 6, 8)), {}, ValueError, "same sequence length"),
    "kv-heads-mismatch": (lambda: (t(1, 4, 4, 8), t(1, 2, 4, 8), t(1, 1, 4, 8)), {}, ValueError,
                          "same number of heads"),
    "hq-not-multiple": (lambda: (t(1, 3, 4, 8), t(1, 2, 4, 8), t(1, 2, 4, 8)), {}, ValueError, "multiple"),
    "mixed-dtypes": (lambda: (t(1, 1, 4, 8), t(1, 1, 4, 8, dtype=torch.float32), t(1, 1, 4, 8)), {}, TypeError,
                     "share one dtype"),
    "int-dtype": (lambda: (t(1, 1, 4, 8, dtype=torch.int32),) * 3, {}, TypeError, "not supported"),
    "headdim-0": (lambda: (t(1, 1, 4, 0), t(1, 1, 4, 0), t(1, 1, 4, 0)), {}, ValueError, "head_dim"),
    "headdim-513": (lambda: (t(1, 1, 4, 513), t(1, 1, 4, 513), t(1, 1, 4, 513)), {}, ValueError, r"1\.\.512"),
    "causal-not-bool": (lambda: (t(1, 1, 4, 8),) * 3, {"causal": 1}, TypeError, "causal must be a bool"),
    "scale-string": (lambda: (t(1, 1, 4, 8),) * 3, {"scale": "0.1"}, TypeError, "scale must be a real number"),
    "scale-nan": (lambda: (t(1, 1, 4, 8),) * 3, {"scale": float("nan")}, ValueError, "scale must be finite"),
    "return-lse-not-bool": (lambda: (t(1, 1, 4, 8),) * 3, {"return_lse": "yes"}, TypeError,
                            "return_lse must be a bool"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_raises_before_launch(name, path, monkeypatch):
    make, kwargs, exc, msg = CASES[name]
    monkeypatch.setattr(launch, "attn_fwd", forbidden())
    monkeypatch.setattr(tileattn.cpu, "attention_fwd", forbidden())
    with pytest.raises(exc, match=msg):
        tileattn.attention(*make(), **kwargs)


def test_float64_rejected_on_gpu_path(kernels):
    x = t(1, 1, 4, 8, dtype=torch.float64)
    with pytest.raises(TypeError, match="float64 runs on CPU tensors"):
        tileattn.attention(x, x, x)


def test_mixed_devices():
    other = "cpu" if HAS_CUDA else "meta"
    with pytest.raises(ValueError, match="one device"):
        tileattn.attention(t(1, 1, 4, 8), t(1, 1, 4, 8), torch.empty(1, 1, 4, 8, dtype=torch.float16, device=other))


def test_triton_backend_on_cpu_tensors_needs_the_interpreter(monkeypatch):
    """use_backend("triton") with CPU tensors and no TRITON_INTERPRET: a
    RuntimeError that says what to set, not Triton's driver error."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(launch, "attn_fwd", forbidden())
    x = torch.randn(1, 1, 4, 8)
    with tileattn.use_backend("triton"), pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        tileattn.attention(x, x, x)


def test_unknown_backend_name():
    with pytest.raises(ValueError, match="backend must be one of"):
        with tileattn.use_backend("cuda"):
            pass
