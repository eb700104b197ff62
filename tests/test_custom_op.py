"""The custom ops: opcheck, torch.compile(fullgraph=True) forward and backward."""
import pytest
import torch

import tileattn
from tileattn.testing import assert_compiled_matches

from conftest import DEVICE


def _inputs(dtype=torch.float32, hq=4, hkv=2, nq=40, nk=56, d=32):
    torch.manual_seed(2)
    q = torch.randn(2, hq, nq, d, device=DEVICE, dtype=dtype, requires_grad=True)
    k = torch.randn(2, hkv, nk, d, device=DEVICE, dtype=dtype, requires_grad=True)
    v = torch.randn(2, hkv, nk, d, device=DEVICE, dtype=dtype, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_opcheck_forward(causal, path):
    q, k, v = _inputs()
    torch.library.opcheck(torch.ops.tileattn.attention_fwd.default, (q, k, v, causal, 0.2))


def test_opcheck_backward(path):
    q, k, v = (t.detach() for t in _inputs())  # the backward op has no double backward
    with torch.no_grad():
        out, lse, _ = torch.ops.tileattn.attention_fwd(q, k, v, True, 0.2)
    do = torch.randn_like(out)
    torch.library.opcheck(torch.ops.tileattn.attention_bwd.default, (do, q, k, v, out, lse, None, True, 0.2))
    torch.library.opcheck(torch.ops.tileattn.attention_bwd.default,
                          (do, q, k, v, out, lse, torch.randn_like(lse), True, 0.2))


def test_compile_fullgraph_forward_backward(path):
    q, k, v = _inputs()

    def layer(q, k, v):
        out, lse = tileattn.attention(q, k, v, causal=True, return_lse=True)
        return (out * out).sum() + lse.sum()

    assert_compiled_matches(layer, (q, k, v))


def test_output_keeps_query_layout(path):
    """A (B, N, H, D) query transposed to (B, H, N, D) gives an output with the
    same strides (no hidden copy when the caller transposes back)."""
    q = torch.randn(2, 30, 4, 16, device=DEVICE).transpose(1, 2)
    out = tileattn.attention(q, q, q)
    assert out.stride() == q.stride()
