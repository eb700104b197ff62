"""``tileattn.attention_with_kvcache`` against a float64 reference under the
accuracy rule (``tileattn.testing``), on the Triton kernels and on the
PyTorch path: contiguous and paged caches (shuffled block tables), lengths
that differ per batch element (including 0), with and without appended
tokens, GQA/MQA, sliding windows, softcap, ALiBi, split counts, the split
heuristic, the in-place append, and bad input.

The reference gathers each batch element's logical sequence (the cache
contents before the call, built by the test, plus k_new) and runs
``standard_attention`` on it with the masks and biases written out
explicitly.  Cache slots that hold no valid entry are NaN, so a kernel that
reads one shows it.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import zlib
from typing import Optional

import pytest
import torch

import tileattn
from tileattn import configs, reference_decode
from tileattn.launch import decode as launch_decode, runtime, tuning
from tileattn.reference import standard_attention
from tileattn.testing import (FLOOR, check_accuracy, forbidden, shuffled_block_table, variant_id_parts,
                              write_tokens)

from conftest import DEVICE, DT_NAME as DT, HAS_CUDA, INTERPRETED, SEED_OFFSET


@dataclasses.dataclass(frozen=True)
class Case:
    hq: int
    hkv: int
    nq: int
    d: int
    dtype: torch.dtype
    seqlens: tuple            # valid cache entries per batch element, before the append
    n_new: int = 0
    page: int = 0             # 0: contiguous cache; else the page size of a paged cache
    causal: bool = True
    window: Optional[tuple] = None
    softcap: Optional[float] = None
    alibi: str = ""           # "" | "heads" (Hq,) | "batch" (B, Hq)
    splits: int = 1
    layout: str = "bhnd"      # "bnhd": tensors made as (B, N, H, D) and transposed (FlashAttention's layout);
                              # "mixed": v_cache/v_new "bnhd", the rest "bhnd" (K and V strides differ)

    @property
    def b(self) -> int:
        return len(self.seqlens)

    @property
    def id(self) -> str:
        parts = [f"B{self.b}", f"H{self.hq}x{self.hkv}", f"Nq{self.nq}", f"D{self.d}", DT[self.dtype],
                 "L" + "-".join(map(str, self.seqlens)), f"new{self.n_new}",
                 f"page{self.page}" if self.page else "contig", "causal" if self.causal else "full"]
        parts += variant_id_parts(self.window, self.softcap, self.alibi)
        parts += [f"split{self.splits}", self.layout]
        return "-".join(parts)


# ---------------------------------------------------------------------------
# inputs: a cache whose logical contents the test knows
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Inputs:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_seqlens: torch.Tensor
    block_table: Optional[torch.Tensor]
    k_new: Optional[torch.Tensor]
    v_new: Optional[torch.Tensor]
    alibi: Optional[torch.Tensor]
    k_seq: list                # per batch element: (Hkv, n_k, D) logical keys after the append
    v_seq: list
    k_expected: torch.Tensor   # the caches as they must be after the call
    v_expected: torch.Tensor


def _randn(shape, dtype, layout, scale=1.0):
    """(B, H, N, D) values; "bnhd" stores them as (B, N, H, D) in memory."""
    if layout == "bnhd":
        b, h, n, d = shape
        return torch.randn(b, n, h, d, device=DEVICE).mul_(scale).to(dtype).transpose(1, 2)
    return torch.randn(*shape, device=DEVICE).mul_(scale).to(dtype)


def _nan_cache(shape, dtype, layout):
    x = _randn(shape, dtype, layout)
    return x.fill_(float("nan"))


def make_inputs(c: Case, input_scale: float = 1.0) -> Inputs:
    torch.manual_seed(zlib.crc32(c.id.encode()) + SEED_OFFSET)
    b, dt = c.b, c.dtype
    need = max([s + c.n_new for s in c.seqlens] + [1])
    if c.page:
        used = [-(-(s + c.n_new) // c.page) for s in c.seqlens]
        num_pages = sum(used) + 3
        block_table = shuffled_block_table(used, -(-need // c.page) + 1, num_pages, num_pages + 1000).to(DEVICE)
        cache_shape = (num_pages, c.hkv, c.page, c.d)
    else:
        block_table = None
        cache_shape = (b, c.hkv, need + 3, c.d)
    k_layout = "bhnd" if c.layout == "mixed" else c.layout
    v_layout = "bnhd" if c.layout == "mixed" else c.layout
    k_cache = _nan_cache(cache_shape, dt, k_layout)
    v_cache = _nan_cache(cache_shape, dt, v_layout)
    q = _randn((b, c.hq, c.nq, c.d), dt, k_layout, input_scale)
    k_new = v_new = None
    if c.n_new:
        k_new = _randn((b, c.hkv, c.n_new, c.d), dt, k_layout, input_scale)
        v_new = _randn((b, c.hkv, c.n_new, c.d), dt, v_layout)
    k_seq, v_seq = [], []
    for i, s in enumerate(c.seqlens):
        ks = (torch.randn(c.hkv, s, c.d, device=DEVICE) * input_scale).to(dt)
        vs = torch.randn(c.hkv, s, c.d, device=DEVICE).to(dt)
        write_tokens(k_cache, block_table, i, 0, ks)
        write_tokens(v_cache, block_table, i, 0, vs)
        if c.n_new:
            ks, vs = torch.cat([ks, k_new[i]], dim=1), torch.cat([vs, v_new[i]], dim=1)
        k_seq.append(ks)
        v_seq.append(vs)
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    if c.n_new:
        for i, s in enumerate(c.seqlens):
            write_tokens(k_expected, block_table, i, s, k_new[i])
            write_tokens(v_expected, block_table, i, s, v_new[i])
    alibi = None
    if c.alibi == "heads":
        alibi = torch.tensor([2.0 ** (-4.0 * (h + 1) / c.hq) for h in range(c.hq)], device=DEVICE)
    elif c.alibi == "batch":
        alibi = torch.rand(b, c.hq, device=DEVICE) * 0.9 + 0.05
    seqlens = torch.tensor(c.seqlens, dtype=torch.int32, device=DEVICE)
    return Inputs(q, k_cache, v_cache, seqlens, block_table, k_new, v_new, alibi, k_seq, v_seq,
                  k_expected, v_expected)


# ---------------------------------------------------------------------------
# the reference: standard attention with explicit masks and biases
# ---------------------------------------------------------------------------
def hidden_mask(n_q: int, n_k: int, causal: bool, window) -> torch.Tensor:
    """(Nq, Nk) bool, True where key j is hidden from query i: bottom-right
    aligned (row i's diagonal is key i + Nk - Nq), window (left, right) with
    -1 unbounded."""
    i = torch.arange(n_q, device=DEVICE)[:, None]
    j = torch.arange(n_k, device=DEVICE)[None, :]
    diag = i + n_k - n_q
    hidden = torch.zeros(n_q, n_k, dtype=torch.bool, device=DEVICE)
    left, right = window if window is not None else (-1, -1)
    if causal:
        hidden |= j > diag
    if left >= 0:
        hidden |= j < diag - left
    if right >= 0:
        hidden |= j > diag + right
    return hidden


def alibi_bias(slopes: torch.Tensor, n_q: int, n_k: int) -> torch.Tensor:
    """(Hq, Nq, Nk): -slope * |i + Nk - Nq - j| (FlashAttention's convention)."""
    i = torch.arange(n_q, device=slopes.device)[:, None]
    j = torch.arange(n_k, device=slopes.device)[None, :]
    return -slopes[:, None, None] * (i + n_k - n_q - j).abs()


_STD = inspect.signature(standard_attention).parameters
_STD_EXPLICIT = {"mask", "bias", "softcap"} <= _STD.keys()


def _textbook(q, k, v, scale, hidden, bias, softcap):
    """standard_attention's steps with an explicit mask/bias and softcap (for a
    standard_attention without those arguments)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if bias is not None:
        s = s + bias.to(s.dtype)
    empty = hidden.all(dim=-1, keepdim=True)
    s = s.masked_fill(hidden & ~empty, float("-inf")).masked_fill(empty, 0.0)
    p = torch.softmax(s, dim=-1).masked_fill(empty, 0.0)
    lse = torch.logsumexp(s.float() if s.dtype != torch.float64 else s, dim=-1)
    return torch.matmul(p, v), lse.masked_fill(empty.squeeze(-1), float("-inf"))


def reference_attention(q, k, v, *, scale, causal, window, softcap, slopes):
    """One batch element: q (1, Hq, Nq, D), k, v (1, Hkv, Nk, D) -> (out, lse)."""
    n_q, n_k = q.shape[2], k.shape[2]
    if window is None and softcap is None and slopes is None:
        return standard_attention(q, k, v, causal=causal, scale=scale, return_lse=True)
    hidden = hidden_mask(n_q, n_k, causal, window)
    bias = None if slopes is None else alibi_bias(slopes.to(q.dtype), n_q, n_k)[None]
    if _STD_EXPLICIT:
        return standard_attention(q, k, v, scale=scale, mask=hidden, bias=bias, softcap=softcap, return_lse=True)
    return _textbook(q, k, v, scale, hidden, bias, softcap)


def reference(c: Case, x: Inputs, dtype):
    """(out, lse) of the whole batch in ``dtype`` (float64: the reference;
    c.dtype: standard attention's own low-precision error)."""
    scale = 1.0 / math.sqrt(c.d)
    outs, lses = [], []
    for i in range(c.b):
        slopes = None
        if x.alibi is not None:
            slopes = x.alibi if x.alibi.dim() == 1 else x.alibi[i]
        o, lse = reference_attention(x.q[i:i + 1].to(dtype), x.k_seq[i][None].to(dtype), x.v_seq[i][None].to(dtype),
                                     scale=scale, causal=c.causal, window=c.window, softcap=c.softcap,
                                     slopes=None if slopes is None else slopes.double())
        outs.append(o)
        lses.append(lse.reshape(1, c.hq, c.nq))
    return torch.cat(outs), torch.cat(lses)


def run(c: Case, x: Inputs, **kw):
    kwargs = dict(k_new=x.k_new, v_new=x.v_new, block_table=x.block_table, causal=c.causal, window=c.window,
                  softcap=c.softcap, alibi_slopes=x.alibi, num_splits=c.splits, return_lse=True)
    kwargs.update(kw)
    return tileattn.attention_with_kvcache(x.q, x.k_cache, x.v_cache, x.cache_seqlens, **kwargs)


def assert_cache_appended(x: Inputs):
    for name, got, want in (("k_cache", x.k_cache, x.k_expected), ("v_cache", x.v_cache, x.v_expected)):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{name}: {m}")


def assert_case(c: Case, input_scale: float = 1.0):
    x = make_inputs(c, input_scale)
    out, lse = run(c, x)
    assert out.shape == x.q.shape and out.dtype == c.dtype
    assert lse.shape == (c.b, c.hq, c.nq) and lse.dtype == torch.float32
    assert_cache_appended(x)
    ref_out, ref_lse = reference(c, x, torch.float64)
    low_out, low_lse = reference(c, x, c.dtype)
    check_accuracy(f"{c.id} out", out, ref_out, low_out, c.dtype)
    check_accuracy(f"{c.id} lse", lse, ref_lse, low_lse, c.dtype)
    return out, lse


@pytest.fixture(autouse=True)
def _bf16_upcast_in_interpreter(monkeypatch):
    """Under the interpreter (only), bf16 attention runs the kernel on float32
    copies and rounds the output back (the interpreter's bf16 arithmetic is
    wrong; see conftest.py).  The append kernel, which only moves bf16 bits,
    runs on the bf16 cache itself."""
    if not INTERPRETED:
        yield
        return
    real = launch_decode.kvcache_attention

    def upcast(q, k_cache, v_cache, cache_seqlens, block_table, *args, k_new=None, v_new=None, call_key=None,
               **kwargs):
        if q.dtype != torch.bfloat16:
            return real(q, k_cache, v_cache, cache_seqlens, block_table, *args, k_new=k_new, v_new=v_new,
                        call_key=call_key, **kwargs)
        if k_new is not None:
            launch_decode.append_kv(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, kwargs["capacity"])
        out, lse = real(q.float(), k_cache.float(), v_cache.float(), cache_seqlens, block_table, *args, **kwargs)
        return out.to(torch.bfloat16), lse

    monkeypatch.setattr(launch_decode, "kvcache_attention", upcast)
    yield


# ---------------------------------------------------------------------------
# the cases
# ---------------------------------------------------------------------------
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32

# cases that the code-path tests run again (test_pointer_path, test_64bit_page_offsets)
CONTIG_APPEND3 = Case(8, 2, 3, 40, F16, (33, 64), n_new=3, splits=3)
PAGED16 = Case(8, 2, 1, 32, F16, (0, 16, 45), n_new=1, page=16, splits=2)
PAGED32_BNHD = Case(4, 4, 1, 64, F32, (31, 70, 2), n_new=2, page=32, layout="bnhd")
MIXED_CONTIG = Case(8, 2, 1, 32, F16, (21, 50), n_new=1, layout="mixed", splits=2)
MIXED_PAGED = Case(8, 2, 2, 32, F16, (40, 3), n_new=2, page=16, layout="mixed")
EVERY_VARIANT_PAGED = Case(4, 1, 2, 32, F32, (50, 19), n_new=2, window=(20, -1), softcap=2.0, alibi="heads", page=16,
                           splits=3)

BASIC = [
    # contiguous caches
    Case(4, 4, 1, 32, F16, (0, 5, 37), n_new=1),
    Case(8, 2, 1, 64, F32, (17, 0, 70), splits=2),
    CONTIG_APPEND3,
    Case(4, 1, 2, 16, F32, (1, 50), n_new=2, layout="bnhd", splits=0),
    Case(8, 2, 1, 64, BF16, (40, 9), n_new=1, splits=2),
    Case(16, 1, 5, 32, F16, (20, 3), n_new=5, splits=2),        # 80 packed rows: two query blocks
    Case(4, 2, 3, 32, F32, (0, 1), n_new=1),                     # Nq > Nk: rows that see no key
    Case(4, 2, 1, 32, F16, (0, 0), splits=2),                    # an empty cache: out 0, lse -inf
    Case(4, 2, 2, 32, F32, (30, 12), n_new=2, causal=False),
    # paged caches, shuffled block tables
    PAGED16,
    PAGED32_BNHD,
    Case(8, 2, 3, 48, F16, (29, 60), n_new=3, page=16, splits=0),
    Case(8, 2, 1, 32, BF16, (50, 7), n_new=1, page=32, splits=3),
    Case(4, 1, 2, 32, F32, (64, 0), page=16, causal=False, splits=4),
    # k_cache and v_cache with different strides (V's tiles cannot reuse K's row offsets)
    MIXED_CONTIG,
    MIXED_PAGED,
]

VARIANTS = [
    Case(8, 2, 1, 32, F16, (40, 9, 0), n_new=1, window=(3, -1), splits=2),
    Case(4, 2, 3, 32, F32, (30, 22), n_new=3, causal=False, window=(2, 1)),
    Case(4, 2, 2, 32, F32, (30, 5), causal=False, window=(0, 0), page=16, splits=2),
    Case(4, 4, 1, 32, F16, (33, 6), n_new=1, window=(1000, -1), page=32),
    Case(4, 2, 2, 32, F32, (25, 40), causal=False, window=(-1, 4), splits=3),
    Case(4, 2, 1, 32, F32, (45, 12), n_new=1, softcap=1.5, splits=2),
    Case(8, 2, 2, 32, F16, (37, 18), n_new=2, softcap=3.0, page=16),
    Case(8, 2, 1, 32, F32, (60, 20), n_new=1, alibi="heads", splits=2),
    Case(4, 2, 3, 32, F16, (26, 41), n_new=1, causal=False, alibi="batch", page=32),
    EVERY_VARIANT_PAGED,
    Case(8, 2, 1, 32, BF16, (35, 13), n_new=1, window=(8, -1), softcap=2.5, alibi="batch", splits=2),
]


@pytest.mark.parametrize("case", BASIC, ids=lambda c: c.id)
def test_kvcache_attention(case, path):
    assert_case(case)


@pytest.mark.parametrize("case", VARIANTS, ids=lambda c: c.id)
def test_variants(case, path):
    assert_case(case, input_scale=2.0 if case.softcap else 1.0)


def test_reference_helpers_match_standard_attention():
    """The explicit-mask reference equals standard_attention's own causal
    masking in float64, for Nq < Nk, Nq = Nk and Nq > Nk."""
    torch.manual_seed(0)
    for n_q, n_k in ((1, 9), (3, 9), (5, 5), (6, 2)):
        q = torch.randn(1, 4, n_q, 16, dtype=torch.float64, device=DEVICE)
        k, v = (torch.randn(1, 2, n_k, 16, dtype=torch.float64, device=DEVICE) for _ in range(2))
        want = standard_attention(q, k, v, causal=True, scale=0.3, return_lse=True)
        got = _textbook(q, k, v, 0.3, hidden_mask(n_q, n_k, True, None), None, None)
        for g, w in zip(got, want):
            assert torch.allclose(g, w, atol=1e-12, equal_nan=False) or torch.equal(g, w)
        # the ALiBi bias of FlashAttention's convention, written out
        slopes = torch.tensor([0.5, 0.25], dtype=torch.float64, device=DEVICE)
        bias = alibi_bias(slopes, n_q, n_k)
        assert bias[1, n_q - 1, n_k - 1] == 0 and bias[0, 0, 0] == -0.5 * abs(n_k - n_q)


# ---------------------------------------------------------------------------
# split-KV
# ---------------------------------------------------------------------------
SPLIT_CASES = [
    Case(8, 2, 1, 32, F16, (70, 45, 0), n_new=1),
    Case(4, 2, 2, 32, F32, (66, 17), n_new=2, page=16, window=(40, -1)),
    # long enough that 40 splits leave no chunk of the combine empty
    Case(4, 2, 1, 32, F16, (700, 333), n_new=1),
]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: c.id)
def test_split_counts_agree(case, path):
    """1..40 splits (more splits than key tiles included: empty splits; 40:
    the combine merges them in three chunks) give the same result up to
    rounding, each within the accuracy rule."""
    first = None
    x0 = make_inputs(case)
    ref_out, ref_lse = reference(case, x0, torch.float64)
    low_out, low_lse = reference(case, x0, case.dtype)
    eps = torch.finfo(case.dtype).eps
    for splits in (1, 2, 3, 5, 8, 16, 40):
        x = make_inputs(case)  # same seed: same inputs, a fresh cache to append to
        out, lse = run(case, x, num_splits=splits)
        assert_cache_appended(x)
        check_accuracy(f"{case.id} splits={splits} out", out, ref_out, low_out, case.dtype)
        check_accuracy(f"{case.id} splits={splits} lse", lse, ref_lse, low_lse, case.dtype)
        if first is None:
            first = (out, lse)
            continue
        # different splits only regroup the sums: a few roundings of the output apart
        tol = 8 * eps * float(ref_out.abs().max()) + FLOOR[case.dtype]
        assert (out.double() - first[0].double()).abs().max() <= tol, f"splits={splits} vs 1"
        fin = torch.isfinite(first[1])
        assert torch.equal(fin, torch.isfinite(lse))
        assert (lse[fin] - first[1][fin]).abs().max() <= 1e-5 + 8 * 2**-24 * float(ref_lse[fin].abs().max())


LEAD_CASES = SPLIT_CASES + [
    Case(4, 1, 1, 32, F16, (300, 0, 129, 1), n_new=1, page=32, alibi="heads"),
    Case(8, 4, 3, 64, F32, (200, 96), n_new=3, window=(50, 0), softcap=20.0),
]


@pytest.mark.parametrize("case", LEAD_CASES, ids=lambda c: c.id)
def test_leading_split_agrees(case, kernels, monkeypatch):
    """A leading split (split 0 takes a share of the tiles, the others divide
    the rest) gives one split's result up to rounding, each within the
    accuracy rule -- shares that leave the trailing splits nothing or
    everything included -- and is what num_splits=0 launches when
    choose_lead asks for one."""
    x0 = make_inputs(case)
    ref_out, ref_lse = reference(case, x0, torch.float64)
    low_out, low_lse = reference(case, x0, case.dtype)
    eps = torch.finfo(case.dtype).eps
    first = run(case, make_inputs(case), num_splits=1)
    seen = []
    # no launch plans: a plan recorded by an earlier round of the loop (same
    # shapes) would replay its split without asking choose_lead
    monkeypatch.setenv("TILEATTN_DIRECT_LAUNCH", "0")
    monkeypatch.setattr(launch_decode, "choose_num_splits", lambda *a, **k: 1)
    for splits, lead in ((2, 500), (3, 920), (3, 999), (5, 700), (2, 1), (4, 80)):
        monkeypatch.setattr(launch_decode, "LEAD_SPLITS", splits)
        monkeypatch.setattr(launch_decode, "choose_lead", lambda *a, lead=lead, **k: seen.append(lead) or lead)
        x = make_inputs(case)
        out, lse = run(case, x, num_splits=0)
        name = f"{case.id} lead {lead}/1000 of {splits} splits"
        assert_cache_appended(x)
        check_accuracy(f"{name} out", out, ref_out, low_out, case.dtype)
        check_accuracy(f"{name} lse", lse, ref_lse, low_lse, case.dtype)
        tol = 8 * eps * float(ref_out.abs().max()) + FLOOR[case.dtype]
        assert (out.double() - first[0].double()).abs().max() <= tol, name
        fin = torch.isfinite(first[1])
        assert torch.equal(fin, torch.isfinite(lse)), name
        assert (lse[fin] - first[1][fin]).abs().max() <= 1e-5 + 8 * 2**-24 * float(ref_lse[fin].abs().max()), name
    assert seen == [500, 920, 999, 700, 1, 80]


@pytest.mark.parametrize("splits", [2, 5, 16, 40, 256])
def test_combine_kernel(splits, kernels):
    """The combine merges partials exactly (float64 logsumexp weights), also
    across chunks of 16 splits whose later chunk holds the largest lse, with
    empty splits (lse -inf) anywhere and a row whose splits are all empty
    (output 0, lse -inf)."""
    b, hq, n_q, d = 2, 3, 2, 40
    o_part = torch.randn(b, hq, n_q, splits, d, device=DEVICE)
    l_part = torch.randn(b, hq, n_q, splits, device=DEVICE) * 4
    l_part[0, 0, 0, -1] = 30.0                       # the largest lse in the last chunk
    l_part[0, 1, 1, ::3] = float("-inf")             # empty splits among full ones
    l_part[1, 2, 0, :] = float("-inf")               # a row that saw no key
    out = torch.full((b, hq, n_q, d), float("nan"), device=DEVICE, dtype=torch.float16)
    lse = torch.full((b, hq, n_q), float("nan"), device=DEVICE)
    launch_decode.combine_splits(o_part, l_part, out, lse)
    lp = l_part.double()
    ref_lse = torch.logsumexp(lp, dim=-1)
    w = torch.exp(lp - ref_lse[..., None]).nan_to_num(0.0)
    ref_out = (w[..., None] * o_part.double()).sum(-2)
    assert torch.equal(torch.isfinite(lse), torch.isfinite(ref_lse))
    fin = torch.isfinite(ref_lse)
    assert (lse[fin].double() - ref_lse[fin]).abs().max() < 1e-5
    assert torch.all(out[1, 2, 0] == 0)
    torch.testing.assert_close(out.double(), ref_out, rtol=2e-3, atol=2e-3)


def test_leading_split_needs_two_splits():
    """Raised before anything is written: the append of k_new has not happened."""
    q = torch.randn(1, 2, 1, 16, device=DEVICE)
    k = torch.randn(1, 1, 32, 16, device=DEVICE)
    before = k.clone()
    k_new = torch.randn(1, 1, 1, 16, device=DEVICE)
    with pytest.raises(ValueError, match="num_splits >= 2"):
        launch_decode.kvcache_attention(q, k, k, torch.tensor([31], dtype=torch.int32, device=DEVICE), None,
                                        n_new=1, capacity=32, scale=0.25, num_splits=1, lead_permille=500,
                                        k_new=k_new, v_new=k_new.clone())
    assert torch.equal(k, before)


def test_leading_split_rule():
    """choose_lead: a leading split only where one split fills one wave
    (>= 90% of the SMs, at most one program each), the cache capacity
    reaches LEAD_MIN_KEYS and the tiles load by descriptor."""
    lead = launch_decode.choose_lead
    big = launch_decode.LEAD_MIN_KEYS
    # the H200 decode benchmark shape: B=16 x Hkv=8 programs on 132 SMs
    assert lead(128, big, 132, True) == launch_decode.LEAD_PERMILLE > 0
    assert lead(128, 8 * big, 132, True) == launch_decode.LEAD_PERMILLE
    assert lead(128, big, 132, False) == 0      # rows gathered by pointer: one split
    assert lead(128, big - 1, 132, True) == 0   # short caches: one split
    assert lead(118, big, 132, True) == 0       # under 90% of the SMs: choose_num_splits splits evenly
    assert lead(132, big, 132, True) > 0 and lead(133, big, 132, True) == 0   # more than one wave
    assert 0 < launch_decode.LEAD_PERMILLE < 1000 and launch_decode.LEAD_SPLITS >= 2


def test_split_heuristic_rule():
    """choose_num_splits: no split once one split gives >= 90% of the SMs a
    program; else fill >= 2 programs per SM with whole waves, at least 256
    keys per split, at most 64 splits."""
    choose = launch_decode.choose_num_splits
    # the H200 decode benchmark shape: B=16 x Hkv=8 programs per split on 132
    # SMs; measured fastest unsplit at every cache length
    assert choose(128, 16384, 132) == 1 and choose(128, 131072, 132) == 1
    # just under the one-wave bar: split into whole waves of 2 per SM
    assert choose(100, 16384, 132) > 1
    # one sequence, 8 kv heads, long cache: 32 splits fill 256 of 264 slots
    assert choose(8, 32768, 132) == 32
    # enough programs already: no split
    assert choose(16 * 32, 16384, 132) == 1
    # a short cache cannot be split below 256 keys per split
    assert choose(8, 1024, 132) == 4
    assert choose(8, 100, 132) == 1
    # capped
    assert 0.95 * launch_decode.MAX_SPLITS <= choose(1, 10**7, 132) <= launch_decode.MAX_SPLITS
    for base in (1, 3, 8, 50, 128, 300, 1000):
        for cap in (16, 1000, 50000):
            s = choose(base, cap, 132)
            assert 1 <= s <= max(1, min(launch_decode.MAX_SPLITS, cap // launch_decode.MIN_KEYS_PER_SPLIT))


def test_split_heuristic_is_used(kernels, monkeypatch):
    """num_splits=0 on the kernels launches the heuristic's split count."""
    seen = []
    real = launch_decode.choose_num_splits

    def spy(*a, **k):
        seen.append(real(*a, **k))
        return seen[-1]

    monkeypatch.setattr(launch_decode, "choose_num_splits", spy)
    c = Case(4, 1, 1, 32, F16, (520,), n_new=1, splits=0)
    assert_case(c)
    # one program per split, 524 keys of capacity (at most 2 splits of >= 256 keys)
    n_sms = runtime.sm_count(torch.device(DEVICE))
    assert seen == [real(1, 524, n_sms)]
    if INTERPRETED:
        assert seen == [1]  # the interpreter counts as one SM: one program fills it


# ---------------------------------------------------------------------------
# code paths
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", [CONTIG_APPEND3, PAGED16, PAGED32_BNHD, MIXED_CONTIG, MIXED_PAGED,
                                  EVERY_VARIANT_PAGED], ids=lambda c: c.id)
def test_pointer_path(case, pointer_path):
    assert_case(case, input_scale=2.0 if case.softcap else 1.0)


@pytest.mark.parametrize("case", [PAGED16, MIXED_PAGED], ids=lambda c: c.id)
def test_64bit_page_offsets(case, pointer_path, monkeypatch):
    """Gathered rows of a cache too large for 32-bit offsets (made to look so)
    take the 64-bit page offsets."""
    seen = []
    monkeypatch.setattr(launch_decode, "_max_offset", lambda t: seen.append(t.shape) or 2 ** 31)
    # no launch plans: a plan recorded by another test of these shapes would
    # replay the 32-bit kernel without asking _max_offset
    monkeypatch.setenv("TILEATTN_DIRECT_LAUNCH", "0")
    assert_case(case)
    assert seen


@pytest.mark.parametrize("block_n,case", [
    (32, Case(8, 2, 1, 32, F16, (45, 16), n_new=2, page=16, splits=2)),     # a tile spans two pages
    (64, Case(8, 2, 1, 32, F16, (75, 16, 0), n_new=1, page=16, window=(20, -1))),  # four pages a tile
    (32, Case(4, 2, 2, 32, F32, (70, 33), n_new=1, page=32, window=(9, -1))),  # a tile is one page
    (32, Case(4, 2, 1, 32, F16, (100, 47), n_new=1, page=48, splits=2)),     # tiles straddle pages
    (64, Case(4, 2, 1, 32, F16, (100, 47), n_new=2, page=48, window=(30, -1))),
    (64, Case(4, 2, 1, 32, F16, (100, 64), n_new=1, splits=2)),
], ids=lambda x: x if isinstance(x, int) else x.id)
@pytest.mark.parametrize("loads", ["descriptors", "pointers"])
def test_other_key_tiles(block_n, case, loads, kernels, monkeypatch):
    """Key tiles other than the interpreter's 16 rows, with descriptors allowed
    and on the pointer path (a tile spanning pages is gathered row by row on
    both)."""
    if loads == "descriptors":
        monkeypatch.setattr(launch_decode, "POINTER_PAGE_SIZE", 0)
    else:
        monkeypatch.setattr(runtime, "FORCE_POINTER_PATH", True)
    monkeypatch.setattr(configs, "INTERPRETER_DECODE", configs.DecodeConfig(block_n, 4, 1))
    if not INTERPRETED:
        monkeypatch.setattr(configs, "DECODE_CONFIGS", (configs.DecodeConfig(block_n, 4, 2),))
        monkeypatch.setenv("TILEATTN_AUTOTUNE", "0")
    assert_case(case)


_LOOPS_CONTIG = [
    Case(4, 2, 1, 32, F16, (0, 5, 30, 33, 100), n_new=1),          # shorter than a tile: moved below row 0
    Case(8, 2, 1, 32, F16, (70, 45, 97), n_new=2, splits=3),        # ragged edges in the last split only
    Case(4, 2, 3, 32, F32, (60, 29), n_new=3, window=(20, -1), splits=2),  # left edge, a diagonal per row
    Case(4, 2, 2, 32, F16, (61, 7), n_new=2, causal=False, splits=2),       # no right bound: n_k alone
    Case(4, 2, 1, 32, F32, (90, 63), n_new=1, alibi="batch", softcap=1.5, splits=2),
]
_LOOPS_PAGED = [
    Case(8, 2, 1, 32, F16, (45, 16, 3), n_new=2, page=16, splits=2),
    Case(4, 2, 2, 32, F16, (100, 47), n_new=1, page=48, window=(30, -1)),
]


@pytest.mark.parametrize("case,loads", [(c, l) for c in _LOOPS_CONTIG for l in ("descriptors", "pointers")]
                         + [(c, "pointers") for c in _LOOPS_PAGED],
                         ids=lambda x: x if isinstance(x, str) else x.id)
@pytest.mark.parametrize("one_loop", [True, False], ids=["one-loop", "three-loops"])
def test_loop_structures(case, loads, one_loop, kernels, monkeypatch):
    """Both loop structures of the partial kernel on every load path where
    both are valid, whichever ``launch_decode.one_loop`` picks there: ONE_LOOP
    (every tile masked; by descriptor a split's ragged last tile is moved back
    to end at the split's end, below row 0 for a cache shorter than a tile)
    and the masked head / unmasked body / masked tail.  32-key tiles, so that
    the edges fall inside tiles.  (By descriptor on a paged cache only the
    three loops are valid: a moved tile could cross a page.)"""
    if loads == "pointers":
        monkeypatch.setattr(runtime, "FORCE_POINTER_PATH", True)
    monkeypatch.setattr(launch_decode, "one_loop", lambda descriptors, paged: one_loop)
    # no launch plans: a plan recorded by another test would replay without asking one_loop
    monkeypatch.setenv("TILEATTN_DIRECT_LAUNCH", "0")
    monkeypatch.setattr(configs, "INTERPRETER_DECODE", configs.DecodeConfig(32, 4, 1))
    if not INTERPRETED:
        monkeypatch.setattr(configs, "DECODE_CONFIGS", (configs.DecodeConfig(32, 4, 2),))
        monkeypatch.setenv("TILEATTN_AUTOTUNE", "0")
    assert_case(case)


def test_one_loop_rule():
    """ONE_LOOP where measured as no slower (docs/perf-notes.md, v9):
    contiguous caches by descriptor, paged caches by pointer."""
    assert launch_decode.one_loop(descriptors=True, paged=False)
    assert launch_decode.one_loop(descriptors=False, paged=True)
    assert not launch_decode.one_loop(descriptors=True, paged=True)    # an edge tile must be zeroed in registers
    assert not launch_decode.one_loop(descriptors=False, paged=False)  # masked loads cost up to 0.7 %


def test_unchecked_indices_same_result(path):
    c = Case(8, 2, 1, 32, F16, (23, 40), n_new=1, page=16, splits=2)
    x = make_inputs(c)
    out, lse = run(c, x, check_indices=False)
    x2 = make_inputs(c)
    out2, lse2 = run(c, x2)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    assert_cache_appended(x)


def test_unchecked_out_of_range_pages_read_the_last_page(kernels):
    """With check_indices=False, block-table entries outside [0, num_pages)
    (negative or too large) act as the last page, for the append and the
    attention alike: never an access outside the cache."""
    c = Case(8, 2, 1, 32, F16, (23, 40), n_new=1, page=16)
    x = make_inputs(c)
    num_pages = x.k_cache.shape[0]
    bad = x.block_table.clone()
    bad[0, 0], bad[1, 1] = -1, num_pages + 7        # both used by their sequences
    clamped = bad.clone()
    clamped[0, 0] = clamped[1, 1] = num_pages - 1
    out, lse = run(c, x, block_table=bad, check_indices=False)
    x2 = make_inputs(c)
    out2, lse2 = run(c, x2, block_table=clamped, check_indices=False)
    for got, want in ((out, out2), (lse, lse2), (x.k_cache, x2.k_cache), (x.v_cache, x2.v_cache)):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(ValueError, match=r"block_table\[0, 0\] = -1"):
        run(c, make_inputs(c), block_table=bad)


def test_one_page_cache(path):
    """A paged cache of a single page (the kernels see num_pages = 1)."""
    torch.manual_seed(11)
    q = torch.randn(1, 4, 1, 32, device=DEVICE).half()
    k_cache, v_cache = (torch.randn(1, 2, 16, 32, device=DEVICE).half() for _ in range(2))
    k_new, v_new = (torch.randn(1, 2, 1, 32, device=DEVICE).half() for _ in range(2))
    table = torch.zeros(1, 1, dtype=torch.int32, device=DEVICE)
    seqlens = torch.tensor([9], dtype=torch.int32, device=DEVICE)
    k_all = torch.cat([k_cache[:, :, :9], k_new], dim=2)
    v_all = torch.cat([v_cache[:, :, :9], v_new], dim=2)
    out = tileattn.attention_with_kvcache(q, k_cache, v_cache, seqlens, k_new=k_new, v_new=v_new,
                                          block_table=table)
    assert torch.equal(k_cache[:, :, :10], k_all) and torch.equal(v_cache[:, :, :10], v_all)
    k_rep, v_rep = k_all.repeat_interleave(2, dim=1), v_all.repeat_interleave(2, dim=1)
    want = standard_attention(q.double(), k_rep.double(), v_rep.double(), causal=True)
    low = standard_attention(q, k_rep, v_rep, causal=True)
    check_accuracy("one page", out, want, low, torch.float16)


def test_return_lse_false_returns_tensor(path):
    c = Case(4, 2, 1, 16, F32, (9,), n_new=1)
    x = make_inputs(c)
    out = tileattn.attention_with_kvcache(x.q, x.k_cache, x.v_cache, x.cache_seqlens, k_new=x.k_new,
                                          v_new=x.v_new)
    assert isinstance(out, torch.Tensor) and out.shape == x.q.shape


def test_empty_query_and_batch(path):
    q = torch.randn(2, 4, 0, 16, device=DEVICE)
    kc = torch.randn(2, 2, 8, 16, device=DEVICE)
    out, lse = tileattn.attention_with_kvcache(q, kc, kc.clone(), torch.tensor([3, 4], dtype=torch.int32,
                                                                                device=DEVICE), return_lse=True)
    assert out.shape == (2, 4, 0, 16) and lse.shape == (2, 4, 0)
    q = torch.randn(0, 4, 1, 16, device=DEVICE)
    kc = torch.randn(0, 2, 8, 16, device=DEVICE)
    out = tileattn.attention_with_kvcache(q, kc, kc.clone(), torch.zeros(0, dtype=torch.int32, device=DEVICE))
    assert out.shape == (0, 4, 1, 16)


@pytest.mark.skipif(HAS_CUDA, reason="float64 runs on CPU tensors only")
def test_float64_cpu_path():
    c = Case(4, 2, 2, 24, torch.float64, (30, 7), n_new=2, page=16, window=(12, -1), alibi="heads", softcap=4.0)
    x = make_inputs(c)
    out, lse = run(c, x)
    ref_out, ref_lse = reference(c, x, torch.float64)
    assert (out - ref_out).abs().max() <= 1e-10
    fin = torch.isfinite(ref_lse)
    assert (lse[fin].double() - ref_lse[fin]).abs().max() <= 1e-6  # the public lse is float32


def test_decode_step_loop(path):
    """Three decoding steps, each appending one token and advancing
    cache_seqlens, equal attention over the whole sequence at each step."""
    c = Case(8, 2, 1, 32, F32, (20, 5), page=16)
    x = make_inputs(c)  # 3 pages of 16 per sequence: room for the three tokens
    seq, table = x.cache_seqlens.clone(), x.block_table
    k_all, v_all = list(x.k_seq), list(x.v_seq)
    for step in range(3):
        q = torch.randn(c.b, c.hq, 1, c.d, device=DEVICE)
        kn, vn = (torch.randn(c.b, c.hkv, 1, c.d, device=DEVICE) for _ in range(2))
        out = tileattn.attention_with_kvcache(q, x.k_cache, x.v_cache, seq, k_new=kn, v_new=vn, block_table=table)
        for i in range(c.b):
            k_all[i] = torch.cat([k_all[i], kn[i]], dim=1)
            v_all[i] = torch.cat([v_all[i], vn[i]], dim=1)
            want = standard_attention(q[i:i + 1].double(), k_all[i][None].double(), v_all[i][None].double(),
                                      causal=True)
            low = standard_attention(q[i:i + 1], k_all[i][None], v_all[i][None], causal=True)
            check_accuracy(f"step {step} batch {i}", out[i:i + 1], want, low, c.dtype)
        seq += 1


# ---------------------------------------------------------------------------
# bad input: a clear error naming the argument, before any launch or write
# ---------------------------------------------------------------------------
def _t(*shape, dtype=torch.float16):
    return torch.randn(*shape, device=DEVICE).to(dtype)


def _i32(*vals):
    return torch.tensor(vals, dtype=torch.int32, device=DEVICE)


def _base(**over):
    """A valid call (B=2, Hq=4, Hkv=2, D=16; contiguous capacity 32), with overrides."""
    args = dict(q=_t(2, 4, 1, 16), k_cache=_t(2, 2, 32, 16), v_cache=_t(2, 2, 32, 16), cache_seqlens=_i32(3, 5))
    args.update(over)
    return args


def _paged(**over):
    """A valid paged call: 6 pages of 16, block_table (2, 3)."""
    args = dict(q=_t(2, 4, 1, 16), k_cache=_t(6, 2, 16, 16), v_cache=_t(6, 2, 16, 16), cache_seqlens=_i32(3, 20),
                block_table=torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32, device=DEVICE))
    args.update(over)
    return args


BAD = {
    "q-not-tensor": (lambda: _base(q=[1.0]), TypeError, "q must be a torch.Tensor"),
    "q-rank3": (lambda: _base(q=_t(2, 4, 16)), ValueError, "q must have 4 dimensions"),
    "k_cache-sparse": (lambda: _base(k_cache=_t(2, 2, 32, 16).to_sparse()), TypeError,
                       "k_cache must be a dense"),
    "seqlens-sparse": (lambda: _base(cache_seqlens=_i32(3, 5).to_sparse()), TypeError,
                       "cache_seqlens must be a dense"),
    "alibi-sparse": (lambda: _base(alibi_slopes=torch.ones(4, device=DEVICE).to_sparse()), TypeError,
                     "alibi_slopes must be a dense"),
    "k_cache-rank5": (lambda: _base(k_cache=_t(2, 2, 1, 32, 16)), ValueError, "k_cache must have 4 dimensions"),
    "kv-shape-mismatch": (lambda: _base(v_cache=_t(2, 2, 24, 16)), ValueError, "same shape"),
    "head_dim-mismatch": (lambda: _base(k_cache=_t(2, 2, 32, 8), v_cache=_t(2, 2, 32, 8)), ValueError, "head_dim"),
    "head_dim-257": (lambda: _base(q=_t(2, 4, 1, 257), k_cache=_t(2, 2, 4, 257), v_cache=_t(2, 2, 4, 257)),
                     ValueError, "1..256"),
    "hq-not-multiple": (lambda: _base(q=_t(2, 3, 1, 16)), ValueError, "multiple"),
    "dtype-mismatch": (lambda: _base(k_cache=_t(2, 2, 32, 16, dtype=torch.float32)), TypeError,
                       "k_cache dtype"),
    "int-dtype": (lambda: _base(q=_t(2, 4, 1, 16).to(torch.int32), k_cache=_t(2, 2, 32, 16).to(torch.int32),
                                v_cache=_t(2, 2, 32, 16).to(torch.int32)), TypeError, "not supported"),
    "batch-mismatch": (lambda: _base(k_cache=_t(3, 2, 32, 16), v_cache=_t(3, 2, 32, 16)), ValueError,
                       "batch size"),
    "seqlens-not-tensor": (lambda: _base(cache_seqlens=[3, 5]), TypeError, "cache_seqlens must be a torch.Tensor"),
    "seqlens-int64": (lambda: _base(cache_seqlens=_i32(3, 5).long()), TypeError, "cache_seqlens must be int32"),
    "seqlens-shape": (lambda: _base(cache_seqlens=_i32(3, 5, 1)), ValueError, "cache_seqlens must have shape"),
    "seqlens-2d": (lambda: _base(cache_seqlens=_i32(3, 5)[None]), ValueError, "cache_seqlens must have shape"),
    "seqlens-negative": (lambda: _base(cache_seqlens=_i32(3, -1)), ValueError, r"cache_seqlens\[1\] = -1"),
    "seqlens-over-capacity": (lambda: _base(cache_seqlens=_i32(33, 5)), ValueError,
                              r"cache_seqlens\[0\] = 33 exceeds the cache capacity of 32"),
    "cache-too-small-for-k_new": (lambda: _base(cache_seqlens=_i32(3, 31), k_new=_t(2, 2, 2, 16),
                                                v_new=_t(2, 2, 2, 16)), ValueError,
                                  r"too small for k_new: cache_seqlens\[1\] = 31 plus 2"),
    "k_new-longer-than-cache": (lambda: _base(k_new=_t(2, 2, 33, 16), v_new=_t(2, 2, 33, 16)), ValueError,
                                "too small for k_new"),
    "paged-too-small-for-k_new": (lambda: _paged(cache_seqlens=_i32(47, 3), k_new=_t(2, 2, 2, 16),
                                                 v_new=_t(2, 2, 2, 16)), ValueError, "capacity of 48"),
    "k_new-without-v_new": (lambda: _base(k_new=_t(2, 2, 1, 16)), ValueError, "k_new and v_new"),
    "k_new-heads": (lambda: _base(k_new=_t(2, 4, 1, 16), v_new=_t(2, 4, 1, 16)), ValueError, "k_new/v_new must"),
    "k_new-v_new-shape": (lambda: _base(k_new=_t(2, 2, 1, 16), v_new=_t(2, 2, 2, 16)), ValueError,
                          "k_new and v_new must have the same shape"),
    "k_new-dtype": (lambda: _base(k_new=_t(2, 2, 1, 16, dtype=torch.float32),
                                  v_new=_t(2, 2, 1, 16, dtype=torch.float32)), TypeError, "k_new dtype"),
    "page-size-24": (lambda: _paged(k_cache=_t(6, 2, 24, 16), v_cache=_t(6, 2, 24, 16)), ValueError,
                     "multiple of 16"),
    "page-size-8": (lambda: _paged(k_cache=_t(6, 2, 8, 16), v_cache=_t(6, 2, 8, 16)), ValueError,
                    "multiple of 16"),
    "block_table-int64": (lambda: _paged(block_table=torch.zeros(2, 3, dtype=torch.int64, device=DEVICE)),
                          TypeError, "block_table must be int32"),
    "block_table-batch": (lambda: _paged(block_table=torch.zeros(3, 3, dtype=torch.int32, device=DEVICE)),
                          ValueError, "block_table must have shape"),
    "block_table-1d": (lambda: _paged(block_table=torch.zeros(3, dtype=torch.int32, device=DEVICE)),
                       ValueError, "block_table must have shape"),
    "block_table-out-of-range": (lambda: _paged(block_table=torch.tensor([[0, 1, 2], [3, 6, 5]], dtype=torch.int32,
                                                                         device=DEVICE)),
                                 ValueError, r"block_table\[1, 1\] = 6 is out of range"),
    "block_table-negative": (lambda: _paged(block_table=torch.tensor([[-1, 1, 2], [3, 4, 5]], dtype=torch.int32,
                                                                     device=DEVICE)),
                             ValueError, r"block_table\[0, 0\] = -1 is out of range"),
    "block_table-bad-page-for-k_new": (lambda: _paged(cache_seqlens=_i32(16, 3), k_new=_t(2, 2, 1, 16),
                                                      v_new=_t(2, 2, 1, 16),
                                                      block_table=torch.tensor([[0, 9, 2], [3, 4, 5]],
                                                                               dtype=torch.int32, device=DEVICE)),
                                       ValueError, r"block_table\[0, 1\] = 9"),
    "q-not-tensor": (lambda: _base(q=[1.0]), TypeError, "q must be a torch.Tensor"),
    "causal-not-bool": (lambda: _base(causal=1), TypeError, "causal must be a bool"),
    "return_lse-not-bool": (lambda: _base(return_lse="yes"), TypeError, "return_lse must be a bool"),
    "scale-nan": (lambda: _base(scale=float("nan")), ValueError, "scale must be finite"),
    "scale-string": (lambda: _base(scale="0.1"), TypeError, "scale must be a real number"),
    "window-not-pair": (lambda: _base(window=(3,)), TypeError, "window must be None or a pair"),
    "window-float": (lambda: _base(window=(1.5, 0)), TypeError, "window left must be an int"),
    "window-below-minus-one": (lambda: _base(window=(-2, 0)), ValueError, "window left must be >= -1"),
    "softcap-negative": (lambda: _base(softcap=-1.0), ValueError, "softcap must be a finite number > 0"),
    "softcap-string": (lambda: _base(softcap="1"), TypeError, "softcap must be a positive real number"),
    "alibi-shape": (lambda: _base(alibi_slopes=torch.ones(2, device=DEVICE)), ValueError, "alibi_slopes must have"),
    "alibi-int": (lambda: _base(alibi_slopes=torch.ones(4, device=DEVICE, dtype=torch.int32)), TypeError,
                  "alibi_slopes must be a floating-point tensor"),
    "num_splits-negative": (lambda: _base(num_splits=-1), ValueError, "num_splits must be in"),
    "num_splits-huge": (lambda: _base(num_splits=1000), ValueError, "num_splits must be in"),
    "num_splits-float": (lambda: _base(num_splits=2.0), TypeError, "num_splits must be an int"),
    "num_splits-bool": (lambda: _base(num_splits=True), TypeError, "num_splits must be an int"),
    "requires-grad": (lambda: _base(q=_t(2, 4, 1, 16).requires_grad_()), ValueError, "forward-only"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_raises_before_launch(name, path, monkeypatch):
    make, exc, msg = BAD[name]

    no_launch = forbidden("a kernel was launched (or the cache written) for bad input")
    for mod, fn in ((launch_decode, "append_kv"), (launch_decode, "kvcache_attention"),
                    (reference_decode, "append_kv_"), (reference_decode, "kvcache_attention")):
        monkeypatch.setattr(mod, fn, no_launch)
    args = make()
    q, kc, vc, seq = args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), args.pop("cache_seqlens")
    with pytest.raises(exc, match=msg):
        tileattn.attention_with_kvcache(q, kc, vc, seq, **args)


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_raises_after_valid_calls_of_similar_shape(name, path, monkeypatch):
    """A repeated call skips validation when its key (decode._call_key) was
    validated before: a valid contiguous and a valid paged call first, then
    the bad one, which differs from one of them in a single argument, must
    still raise, and before any launch."""
    from tileattn import decode
    make, exc, msg = BAD[name]

    def stub(q, *a, **k):
        return torch.zeros_like(q), torch.zeros(q.shape[:3], dtype=torch.float32, device=q.device)

    for mod, fn in ((launch_decode, "kvcache_attention"), (reference_decode, "kvcache_attention")):
        monkeypatch.setattr(mod, fn, stub)
    monkeypatch.setattr(reference_decode, "append_kv_", lambda *a, **k: None)
    for good in (_base(), _paged(), _base(k_new=_t(2, 2, 1, 16), v_new=_t(2, 2, 1, 16))):
        q, kc, vc, seq = good.pop("q"), good.pop("k_cache"), good.pop("v_cache"), good.pop("cache_seqlens")
        tileattn.attention_with_kvcache(q, kc, vc, seq, **good)
        assert decode._call_key(q, kc, vc, seq, good.get("k_new"), good.get("v_new"), good.get("block_table"),
                                True, None, None, None, None, 0, False, True) in decode._VALIDATED

    no_launch = forbidden("a kernel was launched (or the cache written) for bad input")
    for mod, fn in ((launch_decode, "kvcache_attention"), (reference_decode, "append_kv_"),
                    (reference_decode, "kvcache_attention")):
        monkeypatch.setattr(mod, fn, no_launch)
    args = make()
    q, kc, vc, seq = args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), args.pop("cache_seqlens")
    with pytest.raises(exc, match=msg):
        tileattn.attention_with_kvcache(q, kc, vc, seq, **args)


def test_repeated_call_is_validated_once(path, monkeypatch):
    """The second call with the same shapes and arguments (new data) reuses
    the first's validation; a change of one argument validates again."""
    from tileattn import decode
    calls = []
    real = decode._validate
    monkeypatch.setattr(decode, "_validate", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(decode, "_VALIDATED", {})
    args = _base()
    q, kc, vc, seq = args["q"], args["k_cache"], args["v_cache"], args["cache_seqlens"]
    first = tileattn.attention_with_kvcache(q, kc, vc, seq, softcap=30.0)
    q2 = _t(2, 4, 1, 16)
    second = tileattn.attention_with_kvcache(q2, kc, vc, seq, softcap=30.0)
    assert len(calls) == 1
    assert not torch.equal(first, second)   # computed for the new query, not replayed
    tileattn.attention_with_kvcache(q2, kc, vc, seq, softcap=20.0)
    tileattn.attention_with_kvcache(q2, kc, vc, seq, softcap=30.0, causal=False)
    assert len(calls) == 3


def test_call_key_none_for_unhashable_or_foreign_arguments():
    from tileattn import decode
    args = _base()
    q, kc, vc, seq = args["q"], args["k_cache"], args["v_cache"], args["cache_seqlens"]
    common = (None, None, None, True)
    assert decode._call_key(q, kc, vc, seq, *common, [0.1], None, None, None, 0, False, True) is None
    assert decode._call_key([1.0], kc, vc, seq, *common, None, None, None, None, 0, False, True) is None
    assert decode._call_key(q, kc, vc, [3, 5], *common, None, None, None, None, 0, False, True) is None
    assert decode._call_key(q, kc, vc, seq, *common, None, (3,), None, None, 0, False, True) is None
    key = decode._call_key(q, kc, vc, seq, *common, None, (3, 0), None, None, 0, False, True)
    assert key is not None and hash(key) is not None
    # an int and a float of one value (or a bool and an int) key differently
    assert key != decode._call_key(q, kc, vc, seq, *common, None, (3.0, 0), None, None, 0, False, True)
    assert (decode._call_key(q, kc, vc, seq, *common, None, None, None, None, 1, False, True)
            != decode._call_key(q, kc, vc, seq, *common, None, None, None, None, True, False, True))


@pytest.mark.parametrize("form", ["softcap-zero", "alibi-fp16", "alibi-fp64"])
def test_unified_argument_rules(form, path):
    """The rules attention() follows hold here too: softcap=0 is no softcap
    (bitwise the result of softcap=None), and ALiBi slopes of any float
    dtype are cast to float32 (bitwise the result of float32 slopes)."""
    args = _base()
    q, kc, vc, seq = args["q"], args["k_cache"], args["v_cache"], args["cache_seqlens"]
    slopes = torch.rand(4, device=DEVICE)
    if form == "softcap-zero":
        got = tileattn.attention_with_kvcache(q, kc, vc, seq, softcap=0.0)
        want = tileattn.attention_with_kvcache(q, kc, vc, seq, softcap=None)
    else:
        dtype = torch.float16 if form == "alibi-fp16" else torch.float64
        low = slopes.to(dtype)
        got = tileattn.attention_with_kvcache(q, kc, vc, seq, alibi_slopes=low)
        want = tileattn.attention_with_kvcache(q, kc, vc, seq, alibi_slopes=low.float())
        assert not torch.equal(want, tileattn.attention_with_kvcache(q, kc, vc, seq)), "the slopes changed nothing"
    assert torch.isfinite(got).all() and torch.equal(got, want)


def test_mixed_devices():
    other = "cpu" if HAS_CUDA else "meta"
    args = _base()
    with pytest.raises(ValueError, match="cache_seqlens must be on the device of q"):
        tileattn.attention_with_kvcache(args["q"], args["k_cache"], args["v_cache"],
                                        torch.zeros(2, dtype=torch.int32, device=other))


def test_float64_rejected_on_kernels(kernels):
    x = torch.randn(1, 2, 1, 16, dtype=torch.float64, device=DEVICE)
    with pytest.raises(TypeError, match="float64 runs on CPU tensors"):
        tileattn.attention_with_kvcache(x, x, x, _i32(0))


# ---------------------------------------------------------------------------
# GPU only: realistic shapes in bf16, every config of the table
# ---------------------------------------------------------------------------
gpu = pytest.mark.skipif(not HAS_CUDA, reason="GPU-only case: needs a CUDA device")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("page", [0, 16, 256], ids=lambda p: f"page{p}" if p else "contig")
def test_gpu_decode_shapes(page):
    c = Case(32, 8, 1, 128, BF16, (4096, 1, 3000, 0, 2047, 5000), n_new=1, page=page, splits=0)
    assert_case(c)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", configs.DECODE_CONFIGS, ids=lambda c: c.name)
def test_gpu_every_config(cfg, monkeypatch):
    monkeypatch.setattr(configs, "DECODE_CONFIGS", (cfg,))
    monkeypatch.setenv("TILEATTN_AUTOTUNE", "0")
    cases = []
    if cfg.serves(paged=True):
        cases += [Case(32, 8, 2, 128, BF16, (1500, 700), n_new=2, page=256, splits=3, window=(900, -1)),
                  Case(32, 8, 1, 128, BF16, (1500, 701), n_new=1, page=16, splits=1, softcap=5.0)]
    if cfg.serves(paged=False):
        cases += [Case(16, 4, 1, 64, F16, (1000, 33), n_new=1, splits=2, softcap=5.0, alibi="heads")]
    assert cases
    for c in cases:
        assert_case(c)


def test_decode_autotune_rule(monkeypatch):
    """Decoding takes the table's first fitting config for the shapes its
    order was measured on (16-bit caches, <= 16 packed query rows) and
    autotunes the others; TILEATTN_DECODE_AUTOTUNE=1/0 forces either way,
    TILEATTN_AUTOTUNE=0 turns all timing off."""
    on = launch_decode.decode_autotune_enabled
    monkeypatch.delenv("TILEATTN_DECODE_AUTOTUNE", raising=False)
    monkeypatch.setenv("TILEATTN_AUTOTUNE", "1")
    assert not on(16, 2)
    assert on(32, 2) and on(64, 2) and on(16, 4)
    monkeypatch.setenv("TILEATTN_DECODE_AUTOTUNE", "1")
    assert on(16, 2) and on(64, 4)
    monkeypatch.setenv("TILEATTN_DECODE_AUTOTUNE", "0")
    assert not on(16, 2) and not on(64, 4)
    monkeypatch.setenv("TILEATTN_DECODE_AUTOTUNE", "1")
    monkeypatch.setenv("TILEATTN_AUTOTUNE", "0")
    assert not on(16, 2) and not on(64, 4)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("env", ["", "1"], ids=["default", "autotune-forced"])
def test_gpu_decode_config_choice(env, monkeypatch):
    """A 16-bit decoding step with <= 16 packed rows launches the first
    fitting config and times nothing, unless TILEATTN_DECODE_AUTOTUNE=1; a
    float32 step autotunes by default.  All exact."""
    monkeypatch.setenv("TILEATTN_AUTOTUNE", "1")
    monkeypatch.setenv("TILEATTN_DECODE_AUTOTUNE", env)
    # no launch plans: a plan another test recorded for these shapes would
    # replay its launches without choosing a config
    monkeypatch.setenv("TILEATTN_DIRECT_LAUNCH", "0")
    monkeypatch.setattr(tuning, "_CHOICES", {})
    firsts = []
    real = launch_decode._first_fitting
    monkeypatch.setattr(launch_decode, "_first_fitting", lambda *a: firsts.append(real(*a)) or firsts[-1])
    for c in (Case(32, 8, 1, 128, BF16, (1500, 700), n_new=1, page=16),
              Case(32, 8, 1, 128, BF16, (900, 1200), n_new=1)):
        assert_case(c)
    if env == "1":
        assert not firsts and len(tuning._CHOICES) == 2
    else:
        assert [f.name for f in firsts] == ["N128-w4-s5", "N128-w4-s3"] and not tuning._CHOICES
        assert_case(Case(8, 2, 1, 64, F32, (300, 41), n_new=1))
        assert len(firsts) == 2 and len(tuning._CHOICES) == 1


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("page,splits,alibi,append", [(0, 0, False, False), (0, 3, True, False),
                                                      (16, 0, False, False), (256, 2, False, False),
                                                      (0, 0, False, True), (16, 2, False, True)],
                         ids=["contig-auto", "contig-3splits-alibi", "page16-auto", "page256-2splits",
                              "contig-auto-append", "page16-2splits-append"])
def test_gpu_decode_plans_match_regular_launches(page, splits, alibi, append, monkeypatch):
    """From the second call of a shape on, a decoding step replays a launch
    plan (runtime.PLANS, keyed by the validated call): bitwise the result of
    regular launches, with fresh cache contents and lengths each step; with
    ``append`` the plan holds the append too, and the caches after each step
    are bitwise those of regular launches."""
    if not runtime._DIRECT_SUPPORTED:
        pytest.skip("direct launches are off on this Triton version (runtime.DIRECT_LAUNCH_VERSIONS)")
    monkeypatch.setattr(runtime, "POISON_OUTPUTS", True)
    b, hq, hkv, d, cap = 4, 8, 2, 128, 1024
    gen = torch.Generator().manual_seed(5)

    def step_inputs(i):
        q = torch.randn(b, hq, 1, d, generator=gen).to("cuda", BF16)
        k = torch.randn(b, hkv, cap, d, generator=gen).to("cuda", BF16)
        v = torch.randn(b, hkv, cap, d, generator=gen).to("cuda", BF16)
        seqlens = torch.randint(1, cap - 2, (b,), generator=gen, dtype=torch.int32).to("cuda")
        kw = {"num_splits": splits}
        if append:
            kw["k_new"] = torch.randn(b, hkv, 2, d, generator=gen).to("cuda", BF16)
            kw["v_new"] = torch.randn(b, hkv, 2, d, generator=gen).to("cuda", BF16)
        if alibi:
            kw["alibi_slopes"] = torch.rand(hq, generator=gen).to("cuda")
        if page:
            perm = torch.randperm(b * cap // page, generator=gen).to("cuda")
            per = cap // page
            k = k.view(b, hkv, per, page, d).permute(0, 2, 1, 3, 4).reshape(b * per, hkv, page, d)[perm.argsort()]
            v = v.view(b, hkv, per, page, d).permute(0, 2, 1, 3, 4).reshape(b * per, hkv, page, d)[perm.argsort()]
            kw["block_table"] = perm.view(b, per).to(torch.int32)
        return (q, k, v, seqlens), kw

    steps = [step_inputs(i) for i in range(4)]
    fresh = [(a[0], a[1].clone(), a[2].clone(), a[3]) for a, _ in steps]   # caches before any append
    monkeypatch.setenv("TILEATTN_DIRECT_LAUNCH", "0")
    want = [tileattn.attention_with_kvcache(*a, **kw, return_lse=True) for a, kw in steps]
    want_caches = [(a[1].clone(), a[2].clone()) for a, _ in steps]
    monkeypatch.setenv("TILEATTN_DIRECT_LAUNCH", "1")
    runtime.PLANS.clear()
    replayed = []
    for i, (a, kw) in enumerate(steps):
        a = fresh[i]
        planned = len(runtime.PLANS)
        out, lse = tileattn.attention_with_kvcache(*a, **kw, return_lse=True)
        replayed.append(planned > 0 and len(runtime.PLANS) == planned)
        assert torch.equal(out, want[i][0]) and torch.equal(lse, want[i][1]), f"step {i}"
        assert torch.equal(a[1], want_caches[i][0]) and torch.equal(a[2], want_caches[i][1]), f"step {i} cache"
    assert any(key[0] == "decode-call" for key in runtime.PLANS), "no plan was recorded"
    assert all(replayed[1:]), f"steps after the first recorded again: {replayed}"


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("page", [0, 16, 256], ids=lambda p: f"page{p}" if p else "contig")
def test_gpu_decode_step_in_cuda_graph(page):
    """With check_indices=False a decoding step (append, then attention)
    waits for nothing on the host, so it can be captured in a CUDA graph:
    replays on new inputs written into the captured buffers give bitwise what
    eager steps give, output and cache contents."""
    b, hq, hkv, d, cap = 4, 8, 2, 128, 1024
    gen = torch.Generator().manual_seed(13)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to("cuda", BF16)

    q, k_new, v_new = rnd(b, hq, 1, d), rnd(b, hkv, 1, d), rnd(b, hkv, 1, d)
    k_cache, v_cache = rnd(b, hkv, cap, d), rnd(b, hkv, cap, d)
    seqlens = torch.randint(1, cap - 8, (b,), generator=gen, dtype=torch.int32).to("cuda")
    kw = dict(k_new=k_new, v_new=v_new, check_indices=False)
    if page:
        per = cap // page
        perm = torch.randperm(b * per, generator=gen).to("cuda")
        k_cache = k_cache.view(b, hkv, per, page, d).permute(0, 2, 1, 3, 4).reshape(b * per, hkv, page, d)[perm.argsort()]
        v_cache = v_cache.view(b, hkv, per, page, d).permute(0, 2, 1, 3, 4).reshape(b * per, hkv, page, d)[perm.argsort()]
        kw["block_table"] = perm.view(b, per).to(torch.int32)

    # warm up on a side stream (autotuning, compiles, launch plans), as
    # torch.cuda.graphs asks; the repeated append writes the same slots
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            tileattn.attention_with_kvcache(q, k_cache, v_cache, seqlens, **kw)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tileattn.attention_with_kvcache(q, k_cache, v_cache, seqlens, **kw)

    for step in range(3):
        q.copy_(rnd(b, hq, 1, d))
        k_new.copy_(rnd(b, hkv, 1, d))
        v_new.copy_(rnd(b, hkv, 1, d))
        seqlens.add_(1)
        k_want, v_want = k_cache.clone(), v_cache.clone()
        want = tileattn.attention_with_kvcache(q, k_want, v_want, seqlens.clone(),
                                               **{**kw, "block_table": kw.get("block_table")})
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want), f"step {step}: replayed output differs from the eager step"
        assert torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want), f"step {step}: cache differs"


# ---------------------------------------------------------------------------
# the GPU benchmark script, checked end to end on the CPU (PyTorch path)
# ---------------------------------------------------------------------------
def test_decode_bench_script_on_cpu(tmp_path):
    import importlib.util
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "decode_bench.py"
    spec = importlib.util.spec_from_file_location("decode_bench", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rc = bench.main(["--out", str(tmp_path), "--device", "cpu", "--dtype", "fp16", "--batch", "2", "--heads", "4",
                     "--kv-heads", "2", "--head-dim", "16", "--cache-lens", "64", "96", "--page-sizes", "16", "32",
                     "--splits", "1", "3", "--sdpa", "flash", "--config-sweep-len", "0", "--copy-gib", "0.001"])
    assert rc == 0
    data = json.loads((tmp_path / "decode_bench.json").read_text())
    rows = data["rows"]
    assert {(r["layout"], r["provider"]) for r in rows if r["cache_len"] == 64} >= {
        ("contig", "tileattn"), ("contig", "tileattn-checked"), ("contig", "tileattn-splits"),
        ("page16", "tileattn"), ("page32", "tileattn")}
    assert [r["check"] for r in rows if r["provider"] == "tileattn" and r["cache_len"] == 64] == ["passed"] * 3
    assert all(r["status"] == "ok" for r in rows if r["provider"].startswith("tileattn"))
    assert (tmp_path / "decode_bench.csv").read_text().count("\n") == len(rows) + 1
    assert {s["layout"] for s in data["summary"]} == {"contig", "page16", "page32"}
