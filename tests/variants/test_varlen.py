"""Packed variable-length sequences (``attention_varlen``), with the variants
on them, on the Triton kernels, the pointer path and the pure-PyTorch tiled
path, against a float64 reference per sequence under the accuracy rule of
``tileattn.testing``."""
import pytest
import torch

import tileattn
from tileattn.reference import standard_attention
from tileattn.testing import VarlenCase, assert_varlen_case, cu_seqlens

from conftest import DEVICE

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


# ---------------------------------------------------------------------------
# packed sequences
# ---------------------------------------------------------------------------
# The cases named here also run on the pointer path (test_pointer_path_varlen).
VARLEN_CAUSAL = VarlenCase((17, 1, 0, 40, 33), None, 2, 2, 32, BF16, causal=True)
VARLEN_GQA_WINDOW = VarlenCase((50, 7, 70), None, 4, 1, 32, F16, causal=True, window=(20, -1))

VARLEN_CASES = [
    VarlenCase((17, 1, 0, 40, 33), None, 2, 1, 32, F16),
    VARLEN_CAUSAL,
    VarlenCase((5, 40, 1, 50), (9, 31, 0, 70), 2, 1, 40, F32, causal=True),       # Nq != Nk per sequence
    VarlenCase((1, 1, 1), None, 2, 2, 16, F16),
    VarlenCase((0, 0, 45), (3, 0, 20), 2, 2, 32, F16, causal=True),               # empty sequences, Nq > Nk
    VARLEN_GQA_WINDOW,
    VarlenCase((33, 60), (60, 21), 2, 2, 32, BF16, window=(8, 4), softcap=6.0),
    VarlenCase((40, 3, 65), None, 2, 1, 32, F32, alibi="bh", causal=True),
    VarlenCase((40, 3, 45), (21, 60, 9), 2, 2, 32, F16, alibi="h", softcap=3.0),
    VarlenCase((31, 50), None, 2, 1, 32, F16, causal=True, layout="strided"),
]


@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: c.id)
def test_varlen(case, path):
    assert_varlen_case(case)


def test_varlen_sequences_are_isolated(path):
    """NaN in one packed sequence stays in it: loads that run past a
    sequence's end (tensor descriptors read the next sequence's rows) are
    zeroed, forward and backward."""
    torch.manual_seed(23)
    lens = (45, 30, 50)
    cu = cu_seqlens(lens)
    # 16-bit inputs: on a GPU they take the tensor-descriptor loads that read past a sequence's end
    q, k, v = (torch.randn(sum(lens), 2, 16, device=DEVICE, dtype=F16).requires_grad_() for _ in range(3))
    with torch.no_grad():
        for t in (q, k, v):
            t[45:75] = float("nan")              # the middle sequence
    out = tileattn.attention_varlen(q, k, v, cu, cu, 50, 50, causal=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    keep = torch.cat([torch.arange(45), torch.arange(75, 125)])
    for name, t in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        assert torch.isfinite(t[keep]).all(), f"NaN of another sequence reached {name}"
    for s0, s1 in ((0, 45), (75, 125)):
        seq = [t[s0:s1].detach().transpose(0, 1)[None].double() for t in (q, k, v)]
        ref = standard_attention(*seq, causal=True)[0].transpose(0, 1)
        assert (out[s0:s1].double() - ref).abs().max() < 5e-3


def test_varlen_matches_dense_per_sequence(path):
    """Each packed sequence gives what ``attention`` gives on it alone."""
    torch.manual_seed(21)
    lens = (37, 1, 64)
    q, k, v = (torch.randn(sum(lens), 2, 16, device=DEVICE, dtype=F16) for _ in range(3))
    cu = cu_seqlens(lens)
    out = tileattn.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True, window=(9, -1))
    for s0, s1 in zip(cu[:-1].tolist(), cu[1:].tolist()):
        seq = [t[s0:s1].transpose(0, 1)[None] for t in (q, k, v)]
        ref = tileattn.attention(*seq, causal=True, window=(9, -1))
        assert (out[s0:s1].float() - ref[0].transpose(0, 1).float()).abs().max() < 2e-3


def test_varlen_strided_cu_seqlens(path):
    """cu_seqlens given as strided views (a column of a table whose other
    column holds values that would be wrong lengths): the same result as
    the dense tensors, not the other column's values."""
    torch.manual_seed(24)
    lens = (3, 1, 5)
    q, k, v = (torch.randn(sum(lens), 2, 8, device=DEVICE) for _ in range(3))
    cu = cu_seqlens(lens)
    table = torch.stack([cu, torch.full_like(cu, 7)], dim=1)
    strided = table[:, 0]
    assert not strided.is_contiguous()
    want = tileattn.attention_varlen(q, k, v, cu, cu, 5, 5, causal=True)
    got = tileattn.attention_varlen(q, k, v, strided, strided, 5, 5, causal=True)
    assert torch.equal(got, want)


# ---------------------------------------------------------------------------
# the portable pointer path (where tensor descriptors would run)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", [VARLEN_CAUSAL, VARLEN_GQA_WINDOW], ids=lambda c: c.id)
def test_pointer_path_varlen(case, pointer_path):
    assert_varlen_case(case)
