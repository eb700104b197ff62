"""Sliding window, softcap, ALiBi, block-sparse layouts and packed
variable-length sequences, on the Triton kernels and on the pure-PyTorch
tiled path, against a float64 reference built from ``standard_attention``
with explicit masks and biases (the builders of ``tileattn.reference``),
under the accuracy rule of ``tileattn.testing``."""
import dataclasses
import zlib

import pytest
import torch

import tileattn
from tileattn import cpu, launch, reference
from tileattn.block_mask import (BLOCK_K, BLOCK_Q, block_mask_from_fn, cached_kernel_block_lists,
                                 clear_block_list_cache, kernel_block_lists)
from tileattn.reference import (alibi_bias, block_mask_dense, causal_mask, standard_attention, varlen_alibi_bias,
                                varlen_mask, window_mask)
from tileattn.testing import check_accuracy

from conftest import DEVICE, DT_NAME, SEED_OFFSET

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def _seed(case_id: str) -> None:
    torch.manual_seed(zlib.crc32(case_id.encode()) + SEED_OFFSET)


def _loss(out, lse, do, dlse):
    loss = (out.to(do.dtype) * do).sum()
    # rows that see no key have lse = -inf: leave them out of the loss
    return loss + (torch.where(torch.isinf(lse), torch.zeros_like(lse), lse) * dlse.to(lse.dtype)).sum()


# ---------------------------------------------------------------------------
# dense batches: window, softcap, ALiBi, block-sparse
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    b: int
    hq: int
    hkv: int
    nq: int
    nk: int
    d: int
    dtype: torch.dtype
    causal: bool = False
    window: tuple | None = None
    softcap: float | None = None
    alibi: str | None = None      # "h": slopes (Hq,); "bh": slopes (B, Hq)
    blocks: str | None = None     # "rand-B1": random (B, 1, ...) layout, "rand-1H", "band": helper-built
    block_density: float = 0.5

    @property
    def id(self) -> str:
        parts = [f"B{self.b}-H{self.hq}x{self.hkv}-Nq{self.nq}-Nk{self.nk}-D{self.d}-{DT_NAME[self.dtype]}"]
        if self.causal:
            parts.append("causal")
        if self.window is not None:
            parts.append(f"win{self.window[0]}_{self.window[1]}")
        if self.softcap is not None:
            parts.append(f"cap{self.softcap:g}")
        if self.alibi:
            parts.append(f"alibi-{self.alibi}")
        if self.blocks:
            parts.append(f"blocks-{self.blocks}" + (f"{self.block_density:g}" if self.blocks.startswith("rand")
                                                    else ""))
        return "-".join(parts)


def _layout(c: Case):
    """The block layout of a case (None without block sparsity)."""
    nqb, nkb = -(-c.nq // BLOCK_Q), -(-c.nk // BLOCK_K)
    if c.blocks is None:
        return None
    if c.blocks == "band":
        # keys within 150 positions before the aligned diagonal
        diag = c.nk - c.nq
        return block_mask_from_fn(lambda b, h, i, j: (j <= i + diag) & (j >= i + diag - 150), None, c.hq,
                                  c.nq, c.nk, device=DEVICE).mask
    shape = {"rand-B1": (c.b, 1, nqb, nkb), "rand-1H": (1, c.hq, nqb, nkb), "rand-BH": (c.b, c.hq, nqb, nkb)}
    return torch.rand(shape[c.blocks], device=DEVICE) < c.block_density


def make_inputs(c: Case, device=DEVICE):
    _seed(c.id)
    q = torch.randn(c.b, c.hq, c.nq, c.d, device=device).to(c.dtype).requires_grad_()
    k = torch.randn(c.b, c.hkv, c.nk, c.d, device=device).to(c.dtype).requires_grad_()
    v = torch.randn(c.b, c.hkv, c.nk, c.d, device=device).to(c.dtype).requires_grad_()
    do = torch.randn(c.b, c.hq, c.nq, c.d, device=device).to(c.dtype)
    dlse = torch.randn(c.b, c.hq, c.nq, device=device)
    slopes = None
    if c.alibi == "h":
        slopes = torch.rand(c.hq, device=device) * 0.5 + 0.01
    elif c.alibi == "bh":
        slopes = torch.rand(c.b, c.hq, device=device) * 0.5 + 0.01
    return q, k, v, do, dlse, slopes, _layout(c)


def explicit_mask(c: Case, layout):
    """Hidden pairs of a case, written out token by token (None: nothing hidden)."""
    hidden = torch.zeros(c.nq, c.nk, dtype=torch.bool, device=DEVICE)
    if c.causal:
        hidden |= causal_mask(c.nq, c.nk, DEVICE)
    if c.window is not None:
        hidden |= window_mask(c.nq, c.nk, c.window, DEVICE)
    if layout is not None:
        hidden = hidden | block_mask_dense(layout, c.nq, c.nk)
    return hidden


def run_case(c: Case, deterministic=None):
    q, k, v, do, dlse, slopes, layout = make_inputs(c)
    out, lse = tileattn.attention(q, k, v, causal=c.causal, window=c.window, softcap=c.softcap,
                                  alibi_slopes=slopes, block_mask=layout, return_lse=True,
                                  deterministic=deterministic)
    mine = (out, lse) + torch.autograd.grad(_loss(out, lse, do, dlse), (q, k, v))
    mask = explicit_mask(c, layout)

    def ref(qq, kk, vv, g):
        bias = None if slopes is None else alibi_bias(slopes.to(qq.dtype), c.nq, c.nk)
        o, l = standard_attention(qq, kk, vv, softcap=c.softcap, mask=mask, bias=bias, return_lse=True)
        return (o, l) + torch.autograd.grad(_loss(o, l, g, dlse), (qq, kk, vv))

    lowp = ref(q, k, v, do)
    with tileattn.use_backend("torch"):
        ref64 = ref(*(t.detach().double().requires_grad_() for t in (q, k, v)), do.double())
    return mine, lowp, ref64


def assert_case(c: Case, deterministic=None):
    mine, lowp, ref64 = run_case(c, deterministic)
    assert mine[0].shape == (c.b, c.hq, c.nq, c.d) and mine[0].dtype == c.dtype
    assert mine[1].shape == (c.b, c.hq, c.nq) and mine[1].dtype == torch.float32
    for name, got, r64, rlp in zip(("out", "lse", "dq", "dk", "dv"), mine, ref64, lowp):
        check_accuracy(f"{c.id} {name}", got, r64, rlp, c.dtype)


# Interpreter tiles are 32 x 32: lengths of a few tiles cover the masked edge
# stages, the unmasked interior and the skipped tiles; block layouts need
# more than one 128 x 128 block.
WINDOW_CASES = [
    Case(1, 4, 2, 100, 100, 32, F16, window=(16, 16)),
    Case(1, 2, 1, 100, 100, 40, BF16, window=(0, 0)),                       # only the diagonal
    Case(1, 2, 2, 67, 101, 32, F32, window=(0, -1)),                        # keys at/after the diagonal
    Case(1, 2, 2, 101, 67, 32, F16, window=(-1, 0)),                        # causal written as a window
    Case(1, 2, 1, 77, 90, 64, F16, window=(1000, 1000)),                    # wider than N: dense
    Case(2, 2, 2, 100, 80, 32, BF16, causal=True, window=(40, -1)),         # causal + left window
    Case(1, 4, 2, 80, 100, 32, F16, causal=True, window=(7, 9)),            # causal wins on the right
    Case(1, 2, 2, 100, 40, 16, F32, causal=True, window=(0, 0)),            # Nq > Nk: empty rows
    Case(1, 2, 2, 1, 100, 32, F16, window=(20, 3)),                         # one query
    Case(1, 2, 2, 40, 1, 32, F16, window=(2, 2)),                           # one key
]

SOFTCAP_ALIBI_CASES = [
    Case(1, 4, 2, 83, 96, 32, F16, softcap=5.0),
    Case(1, 2, 2, 80, 80, 64, F32, softcap=2.0, causal=True),
    Case(1, 2, 1, 90, 70, 48, BF16, softcap=30.0, window=(20, 5)),
    Case(1, 4, 2, 83, 96, 32, F16, alibi="h"),
    Case(2, 2, 1, 70, 70, 32, F32, alibi="bh", causal=True),
    Case(1, 2, 2, 50, 100, 64, BF16, alibi="bh"),
    Case(2, 2, 2, 90, 60, 32, F16, alibi="h", causal=True, window=(30, -1), softcap=4.0),
]

BLOCK_CASES = [
    Case(1, 2, 1, 260, 200, 16, F16, blocks="rand-1H"),
    Case(2, 1, 1, 200, 260, 16, F32, blocks="rand-B1", block_density=0.4),
    Case(1, 2, 2, 260, 260, 16, BF16, blocks="rand-BH", block_density=0.6, causal=True),
    Case(1, 2, 1, 200, 230, 32, F16, blocks="rand-1H", block_density=0.7, window=(100, 20)),
    Case(1, 1, 1, 260, 260, 16, F16, blocks="band", causal=True, window=(150, -1)),
    Case(1, 2, 2, 200, 200, 16, F32, blocks="rand-1H", block_density=0.6, alibi="h", softcap=3.0),
]


@pytest.mark.parametrize("case", WINDOW_CASES, ids=lambda c: c.id)
def test_window(case, path):
    assert_case(case)


@pytest.mark.parametrize("case", SOFTCAP_ALIBI_CASES, ids=lambda c: c.id)
def test_softcap_alibi(case, path):
    assert_case(case)


@pytest.mark.parametrize("case", BLOCK_CASES, ids=lambda c: c.id)
def test_block_sparse(case, path):
    assert_case(case)


def test_block_sparse_all_off_rows(path):
    """A query block row with every block off: output 0, lse -inf, no NaN."""
    c = Case(1, 1, 1, 200, 260, 16, F16)
    q, k, v, do, dlse, _, _ = make_inputs(c)
    layout = torch.ones(1, 1, 2, 3, dtype=torch.bool, device=DEVICE)
    layout[0, 0, 1] = False                      # rows 128..199 see nothing
    out, lse = tileattn.attention(q, k, v, block_mask=layout, return_lse=True)
    grads = torch.autograd.grad(_loss(out, lse, do, dlse), (q, k, v))
    assert torch.equal(out[:, :, 128:].float(), torch.zeros_like(out[:, :, 128:].float()))
    assert torch.isneginf(lse[:, :, 128:]).all() and torch.isfinite(lse[:, :, :128]).all()
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.equal(grads[0][:, :, 128:].float(), torch.zeros_like(grads[0][:, :, 128:].float()))


def test_block_sparse_off_keys_never_read(path):
    """Keys and values of a block column that is off for every query are
    never read: NaN there leaves every output and gradient finite."""
    c = Case(1, 2, 1, 150, 300, 16, F32)
    q, k, v, do, dlse, _, _ = make_inputs(c)
    layout = torch.rand(1, 2, 2, 3, device=DEVICE) < 0.7
    layout[..., 0] = True
    layout[..., 1] = False                       # keys 128..255: never visible
    with torch.no_grad():
        k[:, :, 128:256] = float("nan")
        v[:, :, 128:256] = float("nan")
    out, lse = tileattn.attention(q, k, v, block_mask=layout, return_lse=True)
    dq, dk, dv = torch.autograd.grad(_loss(out, lse, do, dlse), (q, k, v))
    for name, t in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        assert not torch.isnan(t).any(), f"{name} has NaN: a block that is off was read"
    assert torch.equal(dk[:, :, 128:256], torch.zeros_like(dk[:, :, 128:256]))
    clean = tuple(t.detach().clone() for t in (q, k, v))
    for t in clean[1:]:
        t[:, :, 128:256] = 0.0
    ref = standard_attention(*(t.double() for t in clean), mask=block_mask_dense(layout, c.nq, c.nk))
    assert (out.double() - ref).abs().max() < 1e-5


def test_block_sparse_off_queries_never_read(kernels):
    """The dK/dV kernel consults the layout too: NaN in the queries and output
    gradients of a block row that is off everywhere stays out of dK and dV."""
    c = Case(1, 1, 1, 300, 150, 16, F32)
    q, k, v, do, _, _, _ = make_inputs(c)
    q, k, v = q.detach().clone(), k.detach(), v.detach()
    layout = torch.ones(1, 1, 3, 2, dtype=torch.bool, device=DEVICE)
    layout[:, :, 1] = False                      # query rows 128..255 see nothing
    q[:, :, 128:256] = float("nan")
    do[:, :, 128:256] = float("nan")
    scale = c.d ** -0.5
    out, lse = launch.attn_fwd(q, k, v, False, scale, block_mask=layout)
    assert torch.equal(out[:, :, 128:256], torch.zeros_like(out[:, :, 128:256]))
    assert torch.isneginf(lse[:, :, 128:256]).all()
    dq, dk, dv = launch.attn_bwd(do, q, k, v, out, lse, False, scale, block_mask=layout)
    assert torch.isfinite(dk).all() and torch.isfinite(dv).all()
    assert torch.equal(dq[:, :, 128:256], torch.zeros_like(dq[:, :, 128:256]))
    keep = torch.cat([torch.arange(128), torch.arange(256, 300)])
    ref = standard_attention(q[:, :, keep].double(), k.double(), v.double())
    assert (out[:, :, keep].double() - ref).abs().max() < 1e-5


# ---------------------------------------------------------------------------
# packed sequences
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class VarlenCase:
    lens_q: tuple
    lens_k: tuple | None   # None: same as lens_q
    hq: int
    hkv: int
    d: int
    dtype: torch.dtype
    causal: bool = False
    window: tuple | None = None
    softcap: float | None = None
    alibi: str | None = None
    layout: str = "packed"  # "strided": q/k/v slices of a wider buffer

    @property
    def lk(self):
        return self.lens_q if self.lens_k is None else self.lens_k

    @property
    def id(self) -> str:
        lq = "_".join(map(str, self.lens_q))
        parts = [f"q{lq}" + ("" if self.lens_k is None else "-k" + "_".join(map(str, self.lens_k))),
                 f"H{self.hq}x{self.hkv}-D{self.d}-{DT_NAME[self.dtype]}"]
        if self.causal:
            parts.append("causal")
        if self.window is not None:
            parts.append(f"win{self.window[0]}_{self.window[1]}")
        if self.softcap is not None:
            parts.append(f"cap{self.softcap:g}")
        if self.alibi:
            parts.append(f"alibi-{self.alibi}")
        if self.layout != "packed":
            parts.append(self.layout)
        return "-".join(parts)


def _cu(lens):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=DEVICE)


def _packed(total, h, d, dtype, layout):
    if layout == "strided":  # every other head of a buffer with twice the heads
        return torch.randn(total, 2 * h, d, device=DEVICE).to(dtype)[:, ::2].requires_grad_()
    return torch.randn(total, h, d, device=DEVICE).to(dtype).requires_grad_()


def run_varlen(c: VarlenCase, deterministic=None):
    _seed(c.id)
    tq, tk = sum(c.lens_q), sum(c.lk)
    q = _packed(tq, c.hq, c.d, c.dtype, c.layout)
    k = _packed(tk, c.hkv, c.d, c.dtype, c.layout)
    v = _packed(tk, c.hkv, c.d, c.dtype, c.layout)
    do = torch.randn(tq, c.hq, c.d, device=DEVICE).to(c.dtype)
    dlse = torch.randn(c.hq, tq, device=DEVICE)
    nb = len(c.lens_q)
    slopes = {None: None, "h": torch.rand(c.hq, device=DEVICE) * 0.5 + 0.01,
              "bh": torch.rand(nb, c.hq, device=DEVICE) * 0.5 + 0.01}[c.alibi]
    cu_q, cu_k = _cu(c.lens_q), _cu(c.lk)
    out, lse = tileattn.attention_varlen(q, k, v, cu_q, cu_k, max(c.lens_q), max(c.lk), causal=c.causal,
                                         window=c.window, softcap=c.softcap, alibi_slopes=slopes, return_lse=True,
                                         deterministic=deterministic)
    mine = (out, lse) + torch.autograd.grad(_loss(out, lse, do, dlse), (q, k, v))
    mask = varlen_mask(cu_q, cu_k, causal=c.causal, window=c.window, device=DEVICE)

    def ref(qq, kk, vv, g):
        bias = None if slopes is None else varlen_alibi_bias(slopes.to(qq.dtype), cu_q, cu_k)[None]
        o, l = standard_attention(qq.transpose(0, 1)[None], kk.transpose(0, 1)[None], vv.transpose(0, 1)[None],
                                  softcap=c.softcap, mask=mask, bias=bias, return_lse=True)
        o, l = o[0].transpose(0, 1), l[0]
        return (o, l) + torch.autograd.grad(_loss(o, l, g, dlse), (qq, kk, vv))

    lowp = ref(q, k, v, do)
    with tileattn.use_backend("torch"):
        ref64 = ref(*(t.detach().double().requires_grad_() for t in (q, k, v)), do.double())
    return mine, lowp, ref64


VARLEN_CASES = [
    VarlenCase((17, 1, 0, 40, 33), None, 2, 1, 32, F16),
    VarlenCase((17, 1, 0, 40, 33), None, 2, 2, 32, BF16, causal=True),
    VarlenCase((5, 40, 1, 50), (9, 31, 0, 70), 2, 1, 40, F32, causal=True),       # Nq != Nk per sequence
    VarlenCase((1, 1, 1), None, 2, 2, 16, F16),
    VarlenCase((0, 0, 45), (3, 0, 20), 2, 2, 32, F16, causal=True),               # empty sequences, Nq > Nk
    VarlenCase((50, 7, 70), None, 4, 1, 32, F16, causal=True, window=(20, -1)),
    VarlenCase((33, 60), (60, 21), 2, 2, 32, BF16, window=(8, 4), softcap=6.0),
    VarlenCase((40, 3, 65), None, 2, 1, 32, F32, alibi="bh", causal=True),
    VarlenCase((40, 3, 45), (21, 60, 9), 2, 2, 32, F16, alibi="h", softcap=3.0),
    VarlenCase((31, 50), None, 2, 1, 32, F16, causal=True, layout="strided"),
]


def assert_varlen(case: VarlenCase, deterministic=None):
    mine, lowp, ref64 = run_varlen(case, deterministic)
    tq = sum(case.lens_q)
    assert mine[0].shape == (tq, case.hq, case.d) and mine[1].shape == (case.hq, tq)
    assert mine[0].dtype == case.dtype and mine[1].dtype == torch.float32
    for name, got, r64, rlp in zip(("out", "lse", "dq", "dk", "dv"), mine, ref64, lowp):
        check_accuracy(f"{case.id} {name}", got, r64, rlp, case.dtype)


@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: c.id)
def test_varlen(case, path):
    assert_varlen(case)


def test_varlen_sequences_are_isolated(path):
    """NaN in one packed sequence stays in it: loads that run past a
    sequence's end (tensor descriptors read the next sequence's rows) are
    zeroed, forward and backward."""
    torch.manual_seed(23)
    lens = (45, 30, 50)
    cu = _cu(lens)
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


def test_window_skips_keys_outside_every_window(kernels):
    """Key tiles outside every row's window are never loaded: NaN there leaves
    outputs and gradients finite (forward, dK/dV and dQ kernels)."""
    torch.manual_seed(24)
    q = torch.randn(1, 2, 40, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 2, 200, 16, device=DEVICE)
    v = torch.randn(1, 2, 200, 16, device=DEVICE)
    with torch.no_grad():
        k[:, :, :128] = float("nan")             # rows see keys [i + 150, i + 160] only
        v[:, :, :128] = float("nan")
    k.requires_grad_()
    v.requires_grad_()
    out = tileattn.attention(q, k, v, causal=True, window=(10, -1))
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    for name, t in (("out", out), ("dq", dq), ("dk", dk[:, :, 128:]), ("dv", dv[:, :, 128:])):
        assert torch.isfinite(t).all(), f"{name}: a tile outside the window was read"
    assert torch.equal(dk[:, :, :128], torch.zeros_like(dk[:, :, :128]))
    mask = causal_mask(40, 200, DEVICE) | window_mask(40, 200, (10, -1), DEVICE)
    ref = standard_attention(q.detach().double(), k.detach()[:, :, 128:].double(), v.detach()[:, :, 128:].double(),
                             mask=mask[:, 128:])
    assert (out.double() - ref).abs().max() < 1e-5


def test_varlen_matches_dense_per_sequence(path):
    """Each packed sequence gives what ``attention`` gives on it alone."""
    torch.manual_seed(21)
    lens = (37, 1, 64)
    q, k, v = (torch.randn(sum(lens), 2, 16, device=DEVICE, dtype=F16) for _ in range(3))
    cu = _cu(lens)
    out = tileattn.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True, window=(9, -1))
    for s0, s1 in zip(cu[:-1].tolist(), cu[1:].tolist()):
        seq = [t[s0:s1].transpose(0, 1)[None] for t in (q, k, v)]
        ref = tileattn.attention(*seq, causal=True, window=(9, -1))
        assert (out[s0:s1].float() - ref[0].transpose(0, 1).float()).abs().max() < 2e-3


# ---------------------------------------------------------------------------
# the portable pointer path (where tensor descriptors would run)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", [WINDOW_CASES[5], SOFTCAP_ALIBI_CASES[-1], BLOCK_CASES[2]], ids=lambda c: c.id)
def test_pointer_path_variants(case, pointer_path):
    assert_case(case)


@pytest.mark.parametrize("case", [VARLEN_CASES[1], VARLEN_CASES[5]], ids=lambda c: c.id)
def test_pointer_path_varlen(case, pointer_path):
    assert_varlen(case)


def test_block_sparse_needs_tiles_inside_blocks(kernels):
    """A forced config whose tiles straddle the layout's blocks is refused."""
    from tileattn.configs import KernelConfig
    q = torch.randn(1, 1, 300, 16, device=DEVICE)
    layout = torch.ones(1, 1, 3, 3, dtype=torch.bool, device=DEVICE)
    with pytest.raises(ValueError, match="tiles that divide"):
        launch.attn_fwd(q, q, q, False, 0.25, config=KernelConfig(32, 256, 4, 1), block_mask=layout)


# ---------------------------------------------------------------------------
# block layouts: the helper and the kernels' block lists
# ---------------------------------------------------------------------------
def test_block_mask_from_fn_matches_brute_force():
    torch.manual_seed(4)
    nq, nk, h = 300, 520, 3

    def fn(b, hh, i, j):
        return ((j <= i + 40) & (j >= i - 200 * (hh + 1))) | (j < 16)

    layout = block_mask_from_fn(fn, None, h, nq, nk, rows_per_chunk=128)
    i = torch.arange(nq)[:, None]
    j = torch.arange(nk)[None, :]
    dense = torch.stack([fn(0, hh, i, j) for hh in range(h)])[None]
    expect = torch.zeros(1, h, 3, 5, dtype=torch.bool)
    for qb in range(3):
        for kb in range(5):
            expect[:, :, qb, kb] = dense[:, :, qb * 128:(qb + 1) * 128, kb * 128:(kb + 1) * 128].flatten(2).any(-1)
    assert torch.equal(layout.mask, expect)
    assert layout.density == pytest.approx(float(expect.float().mean()))
    assert 0 < layout.density < 1
    full = block_mask_from_fn(lambda b, hh, i, j: i >= 0, 2, None, 129, 1, device=DEVICE)
    assert full.mask.shape == (2, 1, 2, 1) and full.density == 1.0


def test_block_list_cache_reuses_and_invalidates():
    """A layout's lists are built once per (layout, shape, causal, window);
    an in-place write, another shape or another window builds them anew, and
    a freed layout leaves the cache."""
    import gc
    from tileattn import block_mask as bm
    clear_block_list_cache()
    layout = torch.rand(1, 2, 3, 2) < 0.5
    first = cached_kernel_block_lists(layout, 300, 200, causal=True)
    assert cached_kernel_block_lists(layout, 300, 200, causal=True) is first
    assert cached_kernel_block_lists(layout, 300, 200, causal=False) is not first
    assert cached_kernel_block_lists(layout, 300, 200, causal=True, window=(50, 0)) is not first
    layout[0, 0, 0, 0] = not bool(layout[0, 0, 0, 0])        # in place: the version counter moves
    second = cached_kernel_block_lists(layout, 300, 200, causal=True)
    assert second is not first
    fresh = kernel_block_lists(layout, 300, 200, causal=True)
    for a, b in zip(second, fresh):
        assert torch.equal(a, b)
    n = len(bm._LIST_CACHE)
    del layout
    gc.collect()
    assert len(bm._LIST_CACHE) < n
    clear_block_list_cache()


def test_block_list_cache_size_bound():
    from tileattn import block_mask as bm
    clear_block_list_cache()
    layouts = [torch.ones(1, 1, 1, 1, dtype=torch.bool) for _ in range(bm._LIST_CACHE_SIZE + 5)]
    for lay in layouts:
        cached_kernel_block_lists(lay, 64, 64)
    assert len(bm._LIST_CACHE) == bm._LIST_CACHE_SIZE
    clear_block_list_cache()


def test_block_sparse_layout_edited_in_place_between_calls(kernels):
    """The kernels see a layout's new contents after an in-place edit (the
    cached block lists are not reused for it)."""
    c = Case(1, 1, 1, 256, 256, 16, F32)
    q, k, v, _, _, _, _ = make_inputs(c)
    q, k, v = q.detach(), k.detach(), v.detach()
    layout = torch.ones(1, 1, 2, 2, dtype=torch.bool, device=DEVICE)
    for step in range(2):
        out = tileattn.attention(q, k, v, block_mask=layout)
        ref = standard_attention(q.double(), k.double(), v.double(), mask=block_mask_dense(layout, c.nq, c.nk))
        assert (out.double() - ref).abs().max() < 1e-5, f"step {step}"
        layout[0, 0, 1, 0] = False


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (False, (130, 40)), (True, (200, -1)),
                                           (False, (-1, 0)), (True, (0, 0))],
                         ids=["full", "causal", "win130_40", "causal-win200", "win-1_0", "causal-win0_0"])
@pytest.mark.parametrize("nq,nk", [(300, 300), (260, 500), (500, 260), (128, 256)], ids=lambda n: str(n))
def test_kernel_block_lists(causal, window, nq, nk):
    """Full / partial block lists against a token-level count per block."""
    torch.manual_seed(9)
    nqb, nkb = -(-nq // 128), -(-nk // 128)
    layout = torch.rand(2, 1, nqb, nkb) < 0.7
    lists = kernel_block_lists(layout, nq, nk, causal=causal, window=window)
    hidden = reference.attention_mask(nq, nk, causal=causal, window=window)
    vis = torch.ones(nq, nk, dtype=torch.bool) if hidden is None else ~hidden
    for qb in range(nqb):
        for kb in range(nkb):
            blk = vis[qb * 128:(qb + 1) * 128, kb * 128:(kb + 1) * 128]
            is_full = bool(blk.all()) and (kb + 1) * 128 <= nk
            for b in range(2):
                on = bool(layout[b, 0, qb, kb]) and bool(blk.any())
                kf = lists.kv_full_idx[b, 0, qb, :lists.kv_full_num[b, 0, qb]].tolist()
                kp = lists.kv_part_idx[b, 0, qb, :lists.kv_part_num[b, 0, qb]].tolist()
                qf = lists.q_full_idx[b, 0, kb, :lists.q_full_num[b, 0, kb]].tolist()
                qp = lists.q_part_idx[b, 0, kb, :lists.q_part_num[b, 0, kb]].tolist()
                assert (kb in kf) == (on and is_full) == (qb in qf), (b, qb, kb)
                assert (kb in kp) == (on and not is_full) == (qb in qp), (b, qb, kb)
                assert kf == sorted(kf) and kp == sorted(kp)


# ---------------------------------------------------------------------------
# custom ops and torch.compile
# ---------------------------------------------------------------------------
def test_opcheck_variants(path):
    torch.manual_seed(2)
    q = torch.randn(2, 2, 40, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(2, 1, 50, 16, device=DEVICE, requires_grad=True)
    v = torch.randn(2, 1, 50, 16, device=DEVICE, requires_grad=True)
    slopes = torch.rand(2, 2, device=DEVICE)
    layout = torch.tensor([True, False], device=DEVICE).reshape(1, 2, 1, 1)
    op = torch.ops.tileattn.attention_fwd.default
    torch.library.opcheck(op, (q, k, v, True, 0.2, 30, -1, 4.0, slopes, layout))
    qd, kd, vd = (t.detach() for t in (q, k, v))
    with torch.no_grad():
        out, lse = op(qd, kd, vd, False, 0.2, 20, 10, 0.0, None, layout)
    torch.library.opcheck(torch.ops.tileattn.attention_bwd.default,
                          (torch.randn_like(out), qd, kd, vd, out, lse, torch.randn_like(lse), False, 0.2, 20, 10,
                           0.0, None, layout))


def test_opcheck_varlen(path):
    torch.manual_seed(3)
    lens = (17, 0, 40)
    cu = _cu(lens)
    q = torch.randn(sum(lens), 2, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(sum(lens), 1, 16, device=DEVICE, requires_grad=True)
    v = torch.randn(sum(lens), 1, 16, device=DEVICE, requires_grad=True)
    slopes = torch.rand(2, device=DEVICE)
    torch.library.opcheck(torch.ops.tileattn.attention_varlen_fwd.default,
                          (q, k, v, cu, cu, 40, 40, True, 0.2, 8, -1, 3.0, slopes))
    qd, kd, vd = (t.detach() for t in (q, k, v))
    with torch.no_grad():
        out, lse = torch.ops.tileattn.attention_varlen_fwd(qd, kd, vd, cu, cu, 40, 40, True, 0.2)
    torch.library.opcheck(torch.ops.tileattn.attention_varlen_bwd.default,
                          (torch.randn_like(out), qd, kd, vd, out, lse, None, cu, cu, 40, 40, True, 0.2))


def test_compile_fullgraph_variants(path):
    torch.manual_seed(4)
    q = torch.randn(1, 2, 140, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 1, 140, 16, device=DEVICE, requires_grad=True)
    v = torch.randn(1, 1, 140, 16, device=DEVICE, requires_grad=True)
    lens = (30, 1, 109)
    cu = _cu(lens)
    slopes = torch.rand(2, device=DEVICE)
    layout = torch.tensor([[True, False], [True, True]], device=DEVICE)[None, None]

    def layer(q, k, v):
        out, lse = tileattn.attention(q, k, v, causal=True, window=(50, -1), softcap=5.0, alibi_slopes=slopes,
                                      block_mask=layout, return_lse=True)
        packed = tileattn.attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                           cu, cu, 109, 109, causal=True, alibi_slopes=slopes)
        return (out * out).sum() + lse.sum() + (packed * packed).sum()

    torch._dynamo.reset()
    # aot_eager traces the ops through their fake impls and autograd formulas
    # like the default backend, without code generation (test_custom_op.py
    # covers inductor)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    loss = compiled(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    ref_loss = layer(q, k, v)
    ref_grads = torch.autograd.grad(ref_loss, (q, k, v))
    assert torch.allclose(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------
def _t(*shape, dtype=F16):
    return torch.randn(*shape, device=DEVICE).to(dtype)


def _qkv(nq=4, nk=4, h=2):
    return _t(1, h, nq, 8), _t(1, h, nk, 8), _t(1, h, nk, 8)


BAD = {
    "window-int": (_qkv, {"window": 4}, TypeError, "window must be None or a pair"),
    "window-3": (_qkv, {"window": (1, 2, 3)}, TypeError, "window must be None or a pair"),
    "window-float": (_qkv, {"window": (1.5, 2)}, TypeError, "window left must be an int"),
    "window-neg": (_qkv, {"window": (2, -3)}, ValueError, "window right must be >= -1"),
    "softcap-neg": (_qkv, {"softcap": -1.0}, ValueError, "softcap must be a finite number > 0"),
    "softcap-inf": (_qkv, {"softcap": float("inf")}, ValueError, "softcap must be a finite number"),
    "softcap-str": (_qkv, {"softcap": "3"}, TypeError, "softcap must be a positive real"),
    "alibi-list": (_qkv, {"alibi_slopes": [0.1, 0.2]}, TypeError, "alibi_slopes must be a torch.Tensor"),
    "alibi-int": (_qkv, {"alibi_slopes": torch.ones(2, dtype=torch.int32, device=DEVICE)}, TypeError,
                  "alibi_slopes must be a floating-point"),
    "alibi-shape": (_qkv, {"alibi_slopes": torch.ones(3, device=DEVICE)}, ValueError,
                    r"alibi_slopes must have shape \(2,\) or \(1, 2\)"),
    "block-dtype": (lambda: _qkv(200, 300), {"block_mask": torch.ones(1, 1, 2, 3, device=DEVICE)}, TypeError,
                    "block_mask must have dtype torch.bool"),
    "block-shape": (lambda: _qkv(200, 300), {"block_mask": torch.ones(1, 1, 2, 2, dtype=torch.bool,
                                                                     device=DEVICE)}, ValueError,
                    r"block_mask must have shape \(1 or 1, 1 or 2, 2, 3\)"),
    "block-heads": (lambda: _qkv(200, 300), {"block_mask": torch.ones(1, 3, 2, 3, dtype=torch.bool,
                                                                     device=DEVICE)}, ValueError,
                    "block_mask must have shape"),
    "block-rank": (_qkv, {"block_mask": torch.ones(1, 1, dtype=torch.bool, device=DEVICE)}, ValueError,
                   "block_mask must have shape"),
    "block-list": (_qkv, {"block_mask": [[True]]}, TypeError, "block_mask must be a bool torch.Tensor"),
}


def _no_launch(*a, **k):
    raise AssertionError("a kernel was launched for bad input")


@pytest.fixture
def no_launch(monkeypatch):
    for mod, name in ((launch, "attn_fwd"), (launch, "attn_bwd"), (cpu, "attention_fwd"),
                      (cpu, "tiled_attention_varlen")):
        monkeypatch.setattr(mod, name, _no_launch)


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_variant_input(name, path, no_launch):
    make, kwargs, exc, msg = BAD[name]
    with pytest.raises(exc, match=msg):
        tileattn.attention(*make(), **kwargs)


def _packed_args(lens_q=(3, 5), lens_k=None, hq=2, hkv=2):
    lens_k = lens_q if lens_k is None else lens_k
    return [_t(sum(lens_q), hq, 8), _t(sum(lens_k), hkv, 8), _t(sum(lens_k), hkv, 8), _cu(lens_q), _cu(lens_k),
            max(lens_q), max(lens_k)]


def _with(i, value, **kw):
    def make():
        args = _packed_args(**kw)
        args[i] = value(args) if callable(value) else value
        return args
    return make


BAD_VARLEN = {
    "q-rank4": (_with(0, lambda a: a[0][None]), {}, ValueError, "q must have 3 dimensions"),
    "k-not-tensor": (_with(1, 3.0), {}, TypeError, "k must be a torch.Tensor"),
    "v-sparse": (_with(2, lambda a: a[2].to_sparse()), {}, TypeError, "v must be a dense"),
    "cu-sparse": (_with(4, lambda a: a[4].to_sparse()), {}, TypeError, "cu_seqlens_k must be a dense"),
    "cu-int64": (_with(3, lambda a: a[3].long()), {}, TypeError, "cu_seqlens_q must have dtype torch.int32"),
    "cu-2d": (_with(4, lambda a: a[4][None]), {}, ValueError, "cu_seqlens_k must be 1-D"),
    "cu-list": (_with(3, [0, 3, 8]), {}, TypeError, "cu_seqlens_q must be a torch.Tensor"),
    "cu-lengths-differ": (_with(4, lambda a: _cu((3, 4, 1))), {}, ValueError, "same length"),
    "cu-not-monotone": (_with(3, lambda a: torch.tensor([0, 9, 8], dtype=torch.int32, device=DEVICE)), {},
                        ValueError, "cu_seqlens_q must be non-decreasing"),
    "cu-not-zero-start": (_with(4, lambda a: torch.tensor([1, 3, 8], dtype=torch.int32, device=DEVICE)), {},
                          ValueError, "cu_seqlens_k must start at 0"),
    "cu-total-mismatch": (_with(3, lambda a: torch.tensor([0, 3, 7], dtype=torch.int32, device=DEVICE)), {},
                          ValueError, r"cu_seqlens_q\[-1\] = 7 must equal the number of packed tokens \(8\)"),
    "max-too-small": (_with(5, 4), {}, ValueError, "max_seqlen_q = 4 is smaller than the longest sequence"),
    "maxk-too-small": (_with(6, 2), {}, ValueError, "max_seqlen_k = 2 is smaller"),
    "max-negative": (_with(6, -1), {}, ValueError, "max_seqlen_k must be >= 0"),
    "max-float": (_with(5, 5.0), {}, TypeError, "max_seqlen_q must be an int"),
    "heads": (lambda: _packed_args(hq=3, hkv=2), {}, ValueError, "multiple"),
    "alibi-shape": (_packed_args, {"alibi_slopes": torch.ones(3, 2, device=DEVICE)}, ValueError,
                    r"alibi_slopes must have shape \(2,\) or \(2, 2\)"),
    "window": (_packed_args, {"window": (-2, 0)}, ValueError, "window left must be >= -1"),
    "causal-int": (_packed_args, {"causal": 1}, TypeError, "causal must be a bool"),
}


@pytest.mark.parametrize("name", sorted(BAD_VARLEN))
def test_bad_varlen_input(name, path, no_launch):
    make, kwargs, exc, msg = BAD_VARLEN[name]
    with pytest.raises(exc, match=msg):
        tileattn.attention_varlen(*make(), **kwargs)


def test_cu_seqlens_checked_again_after_in_place_change(path):
    """A cu_seqlens tensor that passed is not copied to the host again, unless
    it changes in place."""
    q = _t(8, 2, 16, dtype=F32)
    cu = _cu((3, 5))
    tileattn.attention_varlen(q, q, q, cu, cu, 5, 5)
    tileattn.attention_varlen(q, q, q, cu, cu, 5, 5)
    cu[1] = 9
    with pytest.raises(ValueError, match="cu_seqlens_q must be non-decreasing"):
        tileattn.attention_varlen(q, q, q, cu, cu, 5, 5)
