"""The optional FlashAttention-4 provider of ``tileattn bench``: why it is
unavailable (not installed, no CUDA, an old GPU, a broken install), and its
wrapper against a stand-in ``flash_attn.cute`` (layouts, gradients, dtypes)."""
import sys
import types

import pytest
import torch

from tileattn.bench import providers
from tileattn.reference import standard_attention


@pytest.mark.parametrize("reason_case", ["missing", "cpu", "old-gpu", "broken-import"])
def test_fa4_check_reasons(monkeypatch, reason_case):
    import importlib.util
    real_find_spec = importlib.util.find_spec
    present = reason_case != "missing"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        object() if present else None) if name == "flash_attn.cute" else real_find_spec(name, *a))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0) if reason_case == "old-gpu"
                        else (9, 0))
    # what `import flash_attn.cute` finds: a module whose own imports fail
    broken = types.ModuleType("flash_attn.cute")

    def _getattr(name):
        raise ImportError("libcute_dsl_runtime.so: cannot open shared object file")
    broken.__getattr__ = _getattr
    monkeypatch.setitem(sys.modules, "flash_attn.cute", broken)
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    device = torch.device("cpu" if reason_case == "cpu" else "cuda")
    reason = providers.available_reason("fa4", device)
    expect = {"missing": "flash_attn.cute not installed", "cpu": "needs CUDA",
              "old-gpu": "FlashAttention-4 needs compute capability >= 9.0, this GPU has 8.0",
              "broken-import": "flash_attn.cute does not import: ImportError: libcute_dsl_runtime.so: "
                               "cannot open shared object file"}[reason_case]
    assert reason == expect


@pytest.fixture
def fake_flash_attn_cute(monkeypatch):
    """A stand-in for flash_attn.cute with FlashAttention-4's calling convention:
    (B, N, H, D) tensors in and out, (out, lse) returned, GQA by head groups,
    bottom-right causal; it records the layouts it was given."""
    seen = []

    def flash_attn_func(q, k, v, causal=False, softmax_scale=None, **kw):
        assert not kw
        seen.append((tuple(q.shape), tuple(k.shape), causal, q.stride(-1)))
        out = standard_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal,
                                 scale=softmax_scale)
        return out.transpose(1, 2), None

    mod = types.ModuleType("flash_attn.cute")
    mod.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", mod)
    return seen


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fa4_provider_layout_and_gradients(fake_flash_attn_cute, causal):
    fn = providers.get_provider("fa4").fn
    gen = torch.Generator().manual_seed(3)
    b, h, hkv, nq, nk, d = 2, 4, 2, 17, 33, 16
    q = torch.randn(b, h, nq, d, generator=gen).to(torch.bfloat16).requires_grad_(True)
    k, v = (torch.randn(b, hkv, nk, d, generator=gen).to(torch.bfloat16).requires_grad_(True) for _ in range(2))
    out = fn(q, k, v, causal)
    # the wrapper hands over (B, N, H, D) views with a contiguous last dim
    assert fake_flash_attn_cute == [((b, nq, h, d), (b, nk, hkv, d), causal, 1)]
    assert out.shape == (b, h, nq, d) and out.dtype == torch.bfloat16
    ref = standard_attention(q.double(), k.double(), v.double(), causal=causal)
    assert (out.double() - ref).abs().max() < 2e-2
    dout = torch.randn(out.shape, generator=gen).to(torch.bfloat16)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout.double())
    for g, rg in zip(grads, ref_grads):
        assert g.shape == rg.shape and (g.double() - rg).norm() / rg.norm() < 2e-2


def test_fa4_provider_rejects_fp32_by_name(fake_flash_attn_cute):
    q = torch.randn(1, 1, 8, 8)
    with pytest.raises(TypeError, match="fa4: FlashAttention-4 takes float16 or bfloat16"):
        providers.get_provider("fa4").fn(q, q, q, False)
    assert fake_flash_attn_cute == []
