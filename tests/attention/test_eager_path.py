"""The eager fast path (plain autograd.Function) and the custom-op path run
the same launchers: same outputs and gradients, bit for bit; anything that
traces the call stays on the custom op."""
import pytest
import torch

import tileattn
from tileattn import dispatch, ops

# the kernels run on the GPU where there is one, else under the interpreter
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _run(q, k, v, do, causal, route, monkeypatch, **variants):
    monkeypatch.setattr(dispatch, "eager_applies", lambda *a: route == "eager")
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = tileattn.attention(qq, kk, vv, causal=causal, return_lse=True, **variants)
    (out * do).sum().backward()
    return out, lse, qq.grad, kk.grad, vv.grad


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_eager_route_matches_custom_op_bitwise(kernels, causal, monkeypatch):
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 4, 40, 32, generator=g).to(DEV)
    k, v = (torch.randn(1, 2, 48, 32, generator=g).to(DEV) for _ in range(2))
    do = torch.randn(1, 4, 40, 32, generator=g).to(DEV)
    a = _run(q, k, v, do, causal, "eager", monkeypatch)
    b = _run(q, k, v, do, causal, "op", monkeypatch)
    for name, x, y in zip(("out", "lse", "dq", "dk", "dv"), a, b):
        assert torch.equal(x, y), name
    ref = tileattn.reference.standard_attention(q.cpu().double(), k.cpu().double(), v.cpu().double(), causal=causal)
    assert (a[0].cpu().double() - ref).abs().max() < 1e-4


VARIANTS = {
    "window": lambda g: {"window": (20, 5)},
    "softcap-alibi": lambda g: {"softcap": 3.0, "alibi_slopes": torch.rand(4, generator=g).to(DEV)},
    "block-sparse": lambda g: {"block_mask": torch.tensor([[[[True, False], [True, True]]]], device=DEV)},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_eager_route_matches_custom_op_bitwise_with_variants(kernels, variant, monkeypatch):
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 4, 200, 16, generator=g).to(DEV)
    k, v = (torch.randn(1, 2, 230, 16, generator=g).to(DEV) for _ in range(2))
    do = torch.randn(1, 4, 200, 16, generator=g).to(DEV)
    kw = VARIANTS[variant](g)
    a = _run(q, k, v, do, True, "eager", monkeypatch, **kw)
    b = _run(q, k, v, do, True, "op", monkeypatch, **kw)
    for name, x, y in zip(("out", "lse", "dq", "dk", "dv"), a, b):
        assert torch.equal(x, y), name
    assert torch.isfinite(a[0]).all() and torch.isfinite(a[2]).all()


def test_eager_route_taken_for_plain_tensors_on_the_kernels(kernels, monkeypatch):
    calls = []
    real = ops._KernelAttention.apply
    monkeypatch.setattr(ops._KernelAttention, "apply", lambda *a: calls.append(1) or real(*a))
    q = torch.randn(1, 2, 16, 16, device=DEV)
    tileattn.attention(q, q.clone(), q.clone())
    assert calls == [1]


def test_lse_gradient_flows_on_eager_route(kernels):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=g).to(DEV).requires_grad_() for _ in range(3))
    out, lse = tileattn.attention(q, k, v, return_lse=True)
    (lse.sum() + out.sum()).backward()
    q64, k64, v64 = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    o64, l64 = tileattn.reference.standard_attention(q64, k64, v64, return_lse=True)
    (l64.sum() + o64.sum()).backward()
    for x, y in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert (x.cpu().double() - y).abs().max() < 1e-4


def test_traced_calls_stay_on_the_custom_op(kernels):
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(1, 2, 16, 16)
        assert not dispatch.eager_applies(q, q, q)
    plain = torch.randn(1, 2, 16, 16, device=DEV)
    assert dispatch.eager_applies(plain, plain, plain)


def test_func_transforms_do_not_take_the_eager_route(kernels):
    """Under torch.func transforms the tensors are wrappers without storage:
    the call goes to the custom op, as it did before the eager route."""
    seen = []

    def loss(q):
        seen.append(dispatch.eager_applies(q, q, q))
        return q.sum()

    torch.func.grad(loss)(torch.randn(1, 2, 8, 16, device=DEV))
    assert seen == [False]


def test_torch_path_never_takes_the_eager_route():
    with tileattn.use_backend("torch"):
        q = torch.randn(1, 2, 16, 16)
        assert not dispatch.uses_triton(q) and not dispatch.eager_applies(q, q, q)
