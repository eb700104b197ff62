"""Rows that see nothing, empty inputs, NaN propagation, determinism, every
config of the tables, and the references against each other."""
import pytest
import torch

import tileattn
from tileattn import configs, launch
from tileattn.cpu import tiled_attention
from tileattn.reference import standard_attention
from tileattn.testing import Case, assert_case, check_accuracy

from conftest import DEVICE


@pytest.mark.parametrize("case", [
    Case(1, 2, 1, 200, 50, 64, True, torch.float16),     # rows 0..149 see nothing
    Case(2, 2, 2, 33, 1, 40, True, torch.float32),       # one key: only the last row sees it
    Case(1, 4, 2, 130, 70, 128, True, torch.bfloat16),
], ids=lambda c: c.id)
def test_fully_masked_rows(case, path):
    """Causal with Nq > Nk: rows i < Nq - Nk see no key: output 0, lse -inf,
    no NaN forward or backward."""
    from tileattn.testing import run_case
    (out, lse, dq, dk, dv), _, _ = run_case(case)
    hidden = case.nq - case.nk
    assert torch.equal(out[:, :, :hidden].float(), torch.zeros_like(out[:, :, :hidden].float()))
    assert torch.isneginf(lse[:, :, :hidden]).all()
    assert torch.isfinite(lse[:, :, hidden:]).all()
    for g in (dq, dk, dv):
        assert torch.isfinite(g).all()
    assert torch.equal(dq[:, :, :hidden].float(), torch.zeros_like(dq[:, :, :hidden].float()))
    assert_case(case)


@pytest.mark.parametrize("shape", [(0, 2, 5, 16), (2, 2, 0, 16)], ids=["batch0", "nq0"])
def test_empty_inputs_return_empty(shape, path):
    b, h, n, d = shape
    q = torch.randn(b, h, n, d, device=DEVICE, requires_grad=True)
    k = torch.randn(b, h, 7, d, device=DEVICE, requires_grad=True)
    v = torch.randn(b, h, 7, d, device=DEVICE, requires_grad=True)
    out, lse = tileattn.attention(q, k, v, return_lse=True)
    assert out.shape == (b, h, n, d) and lse.shape == (b, h, n)
    out.sum().backward()
    assert k.grad.shape == k.shape and torch.equal(k.grad, torch.zeros_like(k))


def test_no_keys_gives_zero_rows(path):
    q = torch.randn(1, 2, 5, 16, device=DEVICE)
    k = torch.randn(1, 2, 0, 16, device=DEVICE)
    out, lse = tileattn.attention(q, k, k, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


@pytest.mark.parametrize("which", ["q", "k"])
def test_nan_propagates_like_reference(which, path):
    torch.manual_seed(7)
    q, k, v = (torch.randn(1, 2, 70, 32, device=DEVICE) for _ in range(3))
    (q if which == "q" else k)[0, 1, 40, 3] = float("nan")
    for causal in (False, True):
        ref = standard_attention(q.double(), k.double(), v.double(), causal=causal)
        out = tileattn.attention(q, k, v, causal=causal)
        assert torch.equal(torch.isnan(out), torch.isnan(ref)), f"causal={causal}"
        fin = ~torch.isnan(ref)
        assert (out.double()[fin] - ref[fin]).abs().max() < 1e-5


def test_backward_is_deterministic(kernels):
    """Repeated backward passes are bitwise identical (no atomics)."""
    torch.manual_seed(3)
    q = torch.randn(2, 4, 150, 64, device=DEVICE, dtype=torch.float16, requires_grad=True)
    k = torch.randn(2, 2, 190, 64, device=DEVICE, dtype=torch.float16, requires_grad=True)
    v = torch.randn(2, 2, 190, 64, device=DEVICE, dtype=torch.float16, requires_grad=True)
    do = torch.randn(2, 4, 150, 64, device=DEVICE, dtype=torch.float16)
    first = None
    for _ in range(3):
        grads = torch.autograd.grad(tileattn.attention(q, k, v, causal=True), (q, k, v), do)
        if first is None:
            first = grads
        else:
            for a, b in zip(first, grads):
                assert torch.equal(a, b)


@pytest.mark.parametrize("kind,bucket,cfg", configs.all_configs(),
                         ids=[f"{k}-D{b}-{c.name}" for k, b, c in configs.all_configs()])
def test_every_table_config(kind, bucket, cfg, kernels):
    """Force each config of the tables once on a small awkward shape (the
    "dkdv_atomic" ones on the atomic backward, the others on the deterministic)."""
    torch.manual_seed(11)
    d = {64: 48, 128: 128, 256: 192, 512: 320}[bucket]
    dtype = torch.float16
    q = torch.randn(1, 2, 150, d, device=DEVICE, dtype=dtype)
    k = torch.randn(1, 1, 230, d, device=DEVICE, dtype=dtype)
    v = torch.randn(1, 1, 230, d, device=DEVICE, dtype=dtype)
    do = torch.randn(1, 2, 150, d, device=DEVICE, dtype=dtype)
    scale = d ** -0.5
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref_out, ref_lse = standard_attention(q64, k64, v64, causal=True, return_lse=True)
    ref_grads = torch.autograd.grad(ref_out, (q64, k64, v64), do.double())
    ql, kl, vl = (t.clone().requires_grad_() for t in (q, k, v))
    low_out, low_lse = standard_attention(ql, kl, vl, causal=True, return_lse=True)
    low_grads = torch.autograd.grad(low_out, (ql, kl, vl), do)
    fwd_cfg = cfg if kind == "fwd" else None
    out, lse = launch.attn_fwd(q, k, v, True, scale, config=fwd_cfg)
    check_accuracy(f"{cfg.name} out", out, ref_out, low_out, dtype)
    check_accuracy(f"{cfg.name} lse", lse, ref_lse, low_lse, dtype)
    if kind != "fwd":
        grads = launch.attn_bwd(do, q, k, v, out, lse, True, scale, config={kind: cfg},
                                deterministic=kind != "dkdv_atomic")
        for name, g, r, lo in zip(("dq", "dk", "dv"), grads, ref_grads, low_grads):
            check_accuracy(f"{cfg.name} {name}", g, r, lo, dtype)


def test_tiled_reference_matches_standard():
    """The rescaling identity, executable: the online softmax over blocks equals
    the softmax over the whole row (float64, any block size)."""
    torch.manual_seed(5)
    q = torch.randn(2, 4, 97, 24, dtype=torch.float64)
    k = torch.randn(2, 2, 131, 24, dtype=torch.float64)
    v = torch.randn(2, 2, 131, 24, dtype=torch.float64)
    for causal in (False, True):
        ref, ref_lse = standard_attention(q, k, v, causal=causal, return_lse=True)
        for block in (1, 16, 50, 1000):
            out, lse = tiled_attention(q, k, v, causal=causal, block_n=block, return_lse=True)
            assert (out - ref).abs().max() < 1e-12
            assert (lse - ref_lse).abs().max() < 1e-12


def test_tma_rule_for_a_size1_row_dim(kernels):
    """One rule (dispatch.tma_addressable) for both kinds of descriptor: a
    (1, H, 1, D) query whose row stride is not 16-byte aligned is addressable
    by the Hopper descriptors (they give size-1 dims, the row dim included, a
    16-byte stride) but not by the portable kernels' (their row stride stays),
    so those take the pointer path, and the result is right."""
    from tileattn import dispatch
    from tileattn.launch import runtime
    torch.manual_seed(31)
    buf = torch.randn(96, device=DEVICE).to(torch.float16)
    q = buf.as_strided((1, 2, 1, 16), (96, 24, 3, 1))       # row stride 6 bytes, head stride 48
    aligned = buf.as_strided((1, 2, 1, 16), (96, 24, 8, 1))
    assert dispatch.tma_addressable(q) and all(s * 2 % 16 == 0 for s in runtime.tma_strides(q, 3)[:-1])
    assert not dispatch.tma_addressable(q, q.dim() - 2)
    assert not runtime.use_tma(q)
    assert runtime.use_tma(aligned) == runtime.use_tma(q.contiguous())  # only the row stride decided
    k = torch.randn(1, 2, 40, 16, device=DEVICE).to(torch.float16)
    v = torch.randn(1, 2, 40, 16, device=DEVICE).to(torch.float16)
    out = tileattn.attention(q, k, v)
    ref = standard_attention(q.double(), k.double(), v.double())
    assert (out.double() - ref).abs().max() < 2e-3
