"""The decoding tests' cases (tests/decode): a ``Case`` of
``attention_with_kvcache``, the inputs it stands for (a contiguous or paged
cache whose logical contents the test knows, built with
``shuffled_block_table`` and ``write_tokens`` below), the
reference, and ``assert_case`` under the accuracy rule.

The reference gathers each batch element's logical sequence (the cache
contents before the call, plus k_new) and runs ``standard_attention`` on it
with the masks and biases written out explicitly.  Cache slots that hold no
valid entry are NaN, so a kernel that reads one shows it.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import zlib
from typing import Optional

import torch

from .reference import standard_attention
from .testing import DEVICE, DT_NAME as DT, SEED_OFFSET, check_accuracy, variant_id_parts


def shuffled_block_table(used: list, max_blocks: int, num_pages: int, unused: int) -> torch.Tensor:
    """(B, max_blocks) int32 on the CPU: batch element i owns ``used[i]``
    pages drawn from a shuffle of ``num_pages``; the entries it does not use
    hold ``unused`` (out of range on purpose: never read)."""
    perm = torch.randperm(num_pages).tolist()
    table = torch.full((len(used), max_blocks), unused, dtype=torch.int32)
    for i, u in enumerate(used):
        table[i, :u] = torch.tensor([perm.pop() for _ in range(u)], dtype=torch.int32)
    return table


def write_tokens(cache, block_table, b, start, data) -> None:
    """Write ``data`` (H, n, D) at logical positions start.. of batch element
    ``b`` of a contiguous (block_table None) or paged cache."""
    n = data.shape[1]
    if block_table is None:
        cache[b, :, start:start + n] = data
        return
    page = cache.shape[2]
    for t in range(n):
        pos = start + t
        cache[int(block_table[b, pos // page]), :, pos % page] = data[:, t]


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
    c.dtype: standard attention's own low-precision error); V may be of
    its own width (``x.v_seq``'s)."""
    scale = 1.0 / math.sqrt(c.d)
    outs, lses = [], []
    for i in range(len(c.seqlens)):
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
    import tileattn

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
