"""Outputs, lse and gradients of ``tileattn.attention`` against a float64
reference, under the accuracy rule (see ``tileattn.testing``), on the Triton
kernels and on the pure-PyTorch tiled path."""
import dataclasses
import functools
import zlib

import pytest
import torch

import tileattn
from tileattn.reference import standard_attention
from tileattn.testing import check_accuracy

from conftest import DEVICE, DT_NAME, SEED_OFFSET


@dataclasses.dataclass(frozen=True)
class Case:
    b: int
    hq: int
    hkv: int
    nq: int
    nk: int
    d: int
    causal: bool
    dtype: torch.dtype
    layout: str = "bhnd"  # "bnhd": a (B, N, H, D) tensor transposed to (B, H, N, D)

    @property
    def id(self) -> str:
        return (f"B{self.b}-H{self.hq}x{self.hkv}-Nq{self.nq}-Nk{self.nk}-D{self.d}-"
                f"{'causal' if self.causal else 'full'}-{DT_NAME[self.dtype]}-{self.layout}")


def make_tensor(b, h, n, d, dtype, layout, scale=1.0, device=DEVICE):
    if layout == "bnhd":
        x = torch.randn(b, n, h, d, device=device).mul_(scale).to(dtype).transpose(1, 2)
    else:
        x = torch.randn(b, h, n, d, device=device).mul_(scale).to(dtype)
    return x.detach().requires_grad_()


def run_case(c: Case, input_scale=1.0, with_lse_grad=True, device=DEVICE, deterministic=None):
    """Forward + backward of tileattn (with ``deterministic`` passed on),
    standard attention in c.dtype and in float64."""
    torch.manual_seed(zlib.crc32(c.id.encode()) + SEED_OFFSET)
    q = make_tensor(c.b, c.hq, c.nq, c.d, c.dtype, c.layout, input_scale, device)
    k = make_tensor(c.b, c.hkv, c.nk, c.d, c.dtype, c.layout, input_scale, device)
    v = make_tensor(c.b, c.hkv, c.nk, c.d, c.dtype, c.layout, device=device)
    do = torch.randn(c.b, c.hq, c.nq, c.d, device=device).to(c.dtype)
    dlse = torch.randn(c.b, c.hq, c.nq, device=device) if with_lse_grad else None

    def fwd_bwd(fn, qq, kk, vv, g):
        out, lse = fn(qq, kk, vv, causal=c.causal, return_lse=True)
        loss = (out.to(g.dtype) * g).sum()
        if dlse is not None:
            # rows that see no key have lse = -inf: leave them out of the loss
            loss = loss + (torch.where(torch.isinf(lse), torch.zeros_like(lse), lse) * dlse.to(lse.dtype)).sum()
        grads = torch.autograd.grad(loss, (qq, kk, vv))
        return (out, lse) + grads

    mine = fwd_bwd(functools.partial(tileattn.attention, deterministic=deterministic), q, k, v, do)
    lowp = fwd_bwd(standard_attention, q, k, v, do)
    with tileattn.use_backend("torch"):
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref = fwd_bwd(standard_attention, q64, k64, v64, do.double())
    return mine, lowp, ref


def assert_case(c: Case, logit_floor=False, **kw):
    mine, lowp, ref = run_case(c, **kw)
    assert mine[0].dtype == c.dtype and mine[0].shape == (c.b, c.hq, c.nq, c.d)
    assert mine[1].dtype == torch.float32 and mine[1].shape == (c.b, c.hq, c.nq)
    smax = None
    if logit_floor:
        # float32 with scores near 1e3: P is recomputed from the saved lse, and
        # an exponent of size |s| carries |s| * 2^-24 of rounding that no
        # float32 kernel can avoid; the floor grows with it
        lse = ref[1][torch.isfinite(ref[1])]
        smax = float(lse.abs().max())
    for name, got, r64, rlp in zip(("out", "lse", "dq", "dk", "dv"), mine, ref, lowp):
        floor = None
        if smax is not None:
            floor = 4 * 2.0**-24 * smax * float(r64[torch.isfinite(r64)].abs().max())
        check_accuracy(f"{c.id} {name}", got, r64, rlp, c.dtype, floor=floor)


# -- the grid ---------------------------------------------------------------

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_HEADS = ((2, 2), (8, 2), (4, 1))  # group sizes 1, 4 and all-shared (MQA)
_SEQ = ((1, 1), (1, 17), (17, 1), (17, 17), (113, 113), (113, 255), (255, 113), (128, 128),
        (255, 257), (257, 255), (17, 1000), (1000, 1000))
_HEAD_DIMS = (16, 40, 64, 72, 80, 96, 128, 160, 192, 256)


def _seq_cases():
    out = []
    for i, (nq, nk) in enumerate(_SEQ):
        for causal in (False, True):
            j = 2 * i + causal
            big = max(nq, nk) >= 1000
            hq, hkv = (1, 1) if big else _HEADS[j % 3]
            out.append(Case(1 if big else 2, hq, hkv, nq, nk, (64, 40, 128, 16)[j % 4], causal,
                            _DTYPES[j % 3], ("bhnd", "bnhd")[i % 2]))
    return out


def _head_dim_cases():
    return [Case(1, 2, 1, 113, 200 - 17 * (i % 3), d, bool(i % 2), _DTYPES[i % 3], ("bhnd", "bnhd")[(i // 2) % 2])
            for i, d in enumerate(_HEAD_DIMS + (1, 8))]


def _dtype_layout_cases():
    return [Case(2, hq, hkv, 100, 150, 64, causal, dt, layout)
            for dt in _DTYPES for layout in ("bhnd", "bnhd") for (hq, hkv), causal in zip(_HEADS, (False, True, True))]


@pytest.mark.parametrize("case", _seq_cases(), ids=lambda c: c.id)
def test_sequence_lengths(case, path):
    assert_case(case)


@pytest.mark.parametrize("case", _head_dim_cases(), ids=lambda c: c.id)
def test_head_dims(case, path):
    assert_case(case)


@pytest.mark.parametrize("case", _dtype_layout_cases(), ids=lambda c: c.id)
def test_dtypes_layouts_gqa(case, path):
    assert_case(case)


@pytest.mark.parametrize("case", [Case(1, 2, 2, 200, 300, 64, True, torch.float16),
                                  Case(1, 4, 2, 129, 129, 128, False, torch.bfloat16),
                                  Case(1, 2, 1, 64, 96, 64, False, torch.float32)], ids=lambda c: c.id)
def test_large_logits(case, path):
    """Inputs x30: scores in the thousands; the running max keeps exp2 finite."""
    mine, _, _ = run_case(case, input_scale=30.0)
    for t in mine:
        assert torch.isfinite(t).all(), "non-finite values with large logits"
    assert_case(case, logit_floor=case.dtype == torch.float32, input_scale=30.0)


def test_float64_cpu_path():
    """float64 runs the PyTorch tiled path on CPU tensors, float64-exact."""
    c = Case(1, 4, 2, 70, 90, 48, True, torch.float64)
    mine, _, ref = run_case(c, device="cpu")
    for name, got, r in zip(("out", "lse", "dq", "dk", "dv"), mine, ref):
        tol = 1e-6 if name == "lse" else 1e-10  # the public lse is float32
        assert (got.double() - r).abs().nan_to_num(0).max() <= tol, name


@pytest.fixture
def pointer_path():
    """The portable path (per-thread addresses) where tensor descriptors would run."""
    from tileattn import launch
    launch.FORCE_POINTER_PATH = True
    with tileattn.use_backend("triton"):
        yield
    launch.FORCE_POINTER_PATH = False


@pytest.mark.parametrize("case", _seq_cases()[::3] + _head_dim_cases()[1::4], ids=lambda c: c.id)
def test_pointer_path(case, pointer_path):
    assert_case(case)
