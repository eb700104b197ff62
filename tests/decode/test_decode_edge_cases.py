"""``attention_with_kvcache`` beyond the case tables: unchecked block-table
indices (``check_indices=False``: the same result; out-of-range pages read
the last page), a paged cache of one page, ``return_lse=False``, an empty
query and an empty batch, float64 on the CPU, and a loop of decoding steps
that each append a token.
"""
from __future__ import annotations

import pytest
import torch

import tileattn
from tileattn.reference import standard_attention
from tileattn.testing import check_accuracy
from tileattn.testing_decode import Case, assert_cache_appended, make_inputs, reference, run

from conftest import DEVICE, HAS_CUDA

pytestmark = pytest.mark.usefixtures("decode_bf16_upcast")   # tests/conftest.py

F16, F32 = torch.float16, torch.float32


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


def test_strided_cache_seqlens(path):
    """cache_seqlens as a strided view (a column of a position table): the
    append lands at each batch element's own length and the result is the
    dense tensor's, not the other column's values."""
    torch.manual_seed(12)
    q = torch.randn(2, 2, 1, 8, device=DEVICE)
    k_new, v_new = (torch.randn(2, 1, 1, 8, device=DEVICE) for _ in range(2))
    caches = [tuple(torch.randn(2, 1, 32, 8, device=DEVICE) for _ in range(2)) for _ in range(2)]
    caches[1] = tuple(c.clone() for c in caches[0])
    positions = torch.tensor([[20, 30], [5, 30]], dtype=torch.int32, device=DEVICE)
    strided = positions[:, 0]
    assert not strided.is_contiguous()
    outs = [tileattn.attention_with_kvcache(q, kc, vc, seqlens, k_new=k_new, v_new=v_new)
            for (kc, vc), seqlens in zip(caches, (strided, strided.contiguous()))]
    assert torch.equal(outs[0], outs[1])
    for kc, vc in caches:
        assert torch.equal(kc[0, :, 20], k_new[0, :, 0]) and torch.equal(kc[1, :, 5], k_new[1, :, 0])
        assert torch.equal(vc[0, :, 20], v_new[0, :, 0]) and torch.equal(vc[1, :, 5], v_new[1, :, 0])


def test_cache_of_no_rows(path):
    """A cache of capacity 0: every row sees no key (output 0, lse -inf; with
    sinks lse = the sink), on the kernels as on the PyTorch path."""
    q = torch.randn(2, 4, 1, 16, device=DEVICE)
    cache = torch.zeros(2, 2, 0, 16, device=DEVICE)
    seqlens = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    out, lse = tileattn.attention_with_kvcache(q, cache, cache.clone(), seqlens, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    sinks = torch.linspace(-1.0, 1.0, 4, device=DEVICE)
    out, lse = tileattn.attention_with_kvcache(q, cache, cache.clone(), seqlens, sinks=sinks, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(lse, sinks[None, :, None].expand(2, 4, 1))


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
