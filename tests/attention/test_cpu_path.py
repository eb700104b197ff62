"""The CPU path's dispatch: calls whose semantics torch's fused CPU kernel
shares run it and agree with the tiled path (and with float64) under the
accuracy rule; every other call -- the variants, float64, bottom-right causal
with Nq != Nk, half precision, a gradient flowing into lse -- still takes
the tiled path."""
import pytest
import torch

import tileattn
from tileattn import cpu, dispatch
from tileattn.testing import Case, check_accuracy, run_case

NAMES = ("out", "lse", "dq", "dk", "dv")


@pytest.fixture
def calls(monkeypatch):
    """Counts of the fused kernel's forward and backward calls."""
    seen = {"fwd": 0, "bwd": 0}

    def spy(name, fn):
        def wrapped(*a, **k):
            seen[name] += 1
            return fn(*a, **k)
        return wrapped
    monkeypatch.setattr(cpu, "_fused_fwd", spy("fwd", cpu._fused_fwd))
    monkeypatch.setattr(cpu, "_fused_bwd", spy("bwd", cpu._fused_bwd))
    return seen


FUSED = [
    Case(1, 4, 4, 300, 300, 64, False, torch.float32),
    Case(1, 4, 4, 300, 300, 64, True, torch.float32),
    Case(2, 3, 3, 77, 190, 40, False, torch.float32),               # Nq != Nk without a mask
    Case(1, 6, 2, 129, 129, 64, True, torch.float32),               # GQA, group 3
    Case(2, 4, 1, 1, 57, 16, False, torch.float32, "bnhd"),         # MQA, one query row, transposed layout
    Case(1, 2, 2, 113, 113, 1, True, torch.float32),                # head dim 1
    Case(1, 2, 2, 65, 65, 256, False, torch.float32, "bnhd"),
    Case(1, 4, 2, 97, 131, 80, False, torch.float32),
]


def _tiled_only(monkeypatch):
    monkeypatch.setattr(dispatch, "cpu_fused_applies", lambda *a, **k: False)


@pytest.mark.parametrize("case", FUSED, ids=lambda c: c.id)
def test_fused_cases_match_tiled_and_float64(case, calls, monkeypatch):
    mine, lowp, ref = run_case(case, with_lse_grad=False, device="cpu")
    assert calls == {"fwd": 1, "bwd": 1}
    assert mine[0].dtype == case.dtype
    assert mine[1].dtype == torch.float32 and mine[1].shape == (case.b, case.hq, case.nq)
    _tiled_only(monkeypatch)
    tiled, _, _ = run_case(case, with_lse_grad=False, device="cpu")
    assert calls == {"fwd": 1, "bwd": 1}  # the second run was tiled
    for name, got, t, r64, rlp in zip(NAMES, mine, tiled, ref, lowp):
        check_accuracy(f"fused {name}", got, r64, rlp, case.dtype)
        check_accuracy(f"tiled {name}", t, r64, rlp, case.dtype)
        # the two paths against each other: within the rule's budget of either
        check_accuracy(f"fused vs tiled {name}", got, t.double(), rlp, case.dtype, factor=4.0)


def test_fused_keeps_the_query_layout(calls):
    x = torch.randn(2, 50, 3, 32)  # (B, N, H, D) viewed as (B, H, N, D)
    q, k, v = (x.clone().transpose(1, 2) for _ in range(3))
    out = tileattn.attention(q, k, v)
    assert calls["fwd"] == 1 and out.stride() == q.stride()


def test_fused_reads_a_strided_head_dim(calls):
    """The fused kernel assumes a unit stride along D; the path copies such inputs."""
    q, k, v = (torch.randn(1, 2, 40, 64)[..., ::2] for _ in range(3))
    out = tileattn.attention(q, k, v, causal=True)
    ref = tileattn.reference.standard_attention(q.double(), k.double(), v.double(), causal=True)
    assert calls["fwd"] == 1
    check_accuracy("out", out, ref, tileattn.reference.standard_attention(q, k, v, causal=True), torch.float32)


def test_fused_backward_is_deterministic(calls):
    q, k, v = (torch.randn(1, 4, 200, 32, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 4, 200, 32)
    grads = [torch.autograd.grad(tileattn.attention(q, k, v, causal=True), (q, k, v), do) for _ in range(3)]
    assert calls["bwd"] == 3
    for g in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(g, grads[0]))


def test_lse_gradient_takes_the_tiled_backward(calls):
    """return_lse with the lse in the loss: fused forward, tiled backward, correct."""
    case = Case(1, 4, 2, 120, 120, 32, True, torch.float32)
    mine, lowp, ref = run_case(case, with_lse_grad=True, device="cpu")
    assert calls == {"fwd": 1, "bwd": 0}
    for name, got, r64, rlp in zip(NAMES, mine, ref, lowp):
        check_accuracy(name, got, r64, rlp, case.dtype)


def test_unused_lse_keeps_the_fused_backward(calls):
    q, k, v = (torch.randn(1, 2, 64, 16, requires_grad=True) for _ in range(3))
    out, lse = tileattn.attention(q, k, v, return_lse=True)
    out.sum().backward()
    assert calls == {"fwd": 1, "bwd": 1}


def _x(b=1, h=2, n=70, d=16, dtype=torch.float32):
    return torch.randn(b, h, n, d, dtype=dtype, requires_grad=True)


# name -> (q, k, v, keyword arguments): calls the fused kernel does not mean the same way
TILED = {
    "window": (lambda: (_x(), _x(), _x()), {"window": (8, 0)}),
    "softcap": (lambda: (_x(), _x(), _x()), {"softcap": 5.0}),
    "alibi": (lambda: (_x(), _x(), _x()), {"alibi_slopes": torch.tensor([0.5, 0.25])}),
    "block-mask": (lambda: (_x(n=300), _x(n=300), _x(n=300)),
                   {"block_mask": torch.tensor([[True, False, True], [False, True, True], [True, True, False]])
                    .expand(1, 2, 3, 3)}),
    "fp64": (lambda: (_x(dtype=torch.float64),) * 3, {"causal": True}),
    "fp16": (lambda: (_x(dtype=torch.float16),) * 3, {}),
    "bf16": (lambda: (_x(dtype=torch.bfloat16),) * 3, {"causal": True}),
    "causal-nq-lt-nk": (lambda: (_x(n=30), _x(n=70), _x(n=70)), {"causal": True}),
    "causal-nq-gt-nk": (lambda: (_x(n=70), _x(n=30), _x(n=30)), {"causal": True}),
}


@pytest.mark.parametrize("name", sorted(TILED))
def test_variants_take_the_tiled_path(name, calls):
    make, kwargs = TILED[name]
    q, k, v = make()
    out, lse = tileattn.attention(q, k, v, return_lse=True, **kwargs)
    out.sum().backward()
    assert calls == {"fwd": 0, "bwd": 0}
    ref = tileattn.reference.standard_attention(q.double(), k.double(), v.double(), **kwargs)
    lowp = tileattn.reference.standard_attention(q, k, v, **kwargs)
    check_accuracy("out", out, ref, lowp, q.dtype)


def test_use_backend_torch_off_cpu_is_tiled():
    """The fused kernel is for CPU tensors only (use_backend("torch") on a GPU stays tiled)."""
    x = torch.randn(1, 1, 4, 8, device="meta")
    assert not dispatch.cpu_fused_applies(x, x, False)
    y = torch.randn(1, 1, 4, 8)
    assert dispatch.cpu_fused_applies(y, y, False) and dispatch.cpu_fused_applies(y, y, True)
    assert not dispatch.cpu_fused_applies(y, y, False, {"softcap": 1.0})
    assert not dispatch.cpu_fused_applies(y.half(), y.half(), False)
    assert not dispatch.cpu_fused_applies(y[:0], y[:0], False) and not dispatch.cpu_fused_applies(y[:, :, :0], y, False)
