"""``tileattn.scaled_dot_product_attention`` against torch's function, and
``tileattn.patched_sdpa``.

The reference is torch's own SDPA in float64 (it defines the semantics: top-left
causal alignment, GQA by ``repeat_interleave``, broadcasting); the accuracy rule
(``tileattn.testing``) bounds tileattn's error by twice that of torch's SDPA in
the same precision.
"""
import contextlib
import dataclasses
import threading
import warnings
import zlib

import pytest
import torch
import torch.nn.functional as F

import tileattn
from tileattn import sdpa as tsdpa
from tileattn.sdpa import TileattnFallbackWarning
from tileattn.testing import check_accuracy

from conftest import DEVICE, SEED_OFFSET

TORCH_SDPA = tsdpa._torch_sdpa
DT = {torch.float32: "fp32", torch.float64: "fp64", torch.bfloat16: "bf16"}


@dataclasses.dataclass(frozen=True)
class Case:
    shape_q: tuple
    shape_kv: tuple
    causal: bool
    dtype: torch.dtype = torch.float32
    gqa: bool = False
    scale: float | None = None

    @property
    def id(self):
        q = "x".join(map(str, self.shape_q))
        kv = "x".join(map(str, self.shape_kv))
        return (f"q{q}-kv{kv}-{'causal' if self.causal else 'full'}-{DT[self.dtype]}"
                f"{'-gqa' if self.gqa else ''}{'' if self.scale is None else f'-s{self.scale}'}")


CASES = [
    Case((2, 3, 17, 16), (2, 3, 17, 16), False),
    Case((2, 3, 17, 16), (2, 3, 17, 16), True),
    Case((1, 2, 9, 32), (1, 2, 30, 32), True),          # Nq < Nk: top-left keeps the first Nq keys
    Case((1, 2, 30, 32), (1, 2, 9, 32), True),          # Nq > Nk: the last rows see every key
    Case((1, 2, 30, 32), (1, 2, 9, 32), False),
    Case((1, 2, 1, 24), (1, 2, 13, 24), True),          # one query: sees only key 0
    Case((2, 4, 20, 16), (2, 2, 33, 16), True, gqa=True),
    Case((2, 6, 33, 16), (2, 2, 20, 16), True, gqa=True),
    Case((1, 4, 15, 8), (1, 1, 15, 8), False),          # one k/v head broadcast without enable_gqa
    Case((2, 2, 19, 40), (2, 2, 19, 40), True, scale=0.3),
    Case((2, 19, 16), (2, 23, 16), True),               # 3-d: (N, L, E)
    Case((2, 3, 2, 11, 16), (2, 3, 2, 14, 16), True),   # 5-d: two batch dimensions
    Case((1, 2, 21, 64), (1, 2, 37, 64), True, torch.float64),
    Case((1, 2, 37, 64), (1, 2, 21, 64), True, torch.float64, scale=0.125),
    Case((1, 4, 18, 32), (1, 2, 25, 32), True, torch.bfloat16, gqa=True),
]


def _inputs(c: Case):
    torch.manual_seed(zlib.crc32(c.id.encode()) + SEED_OFFSET)
    q = torch.randn(c.shape_q, device=DEVICE).to(c.dtype).requires_grad_()
    k = torch.randn(c.shape_kv, device=DEVICE).to(c.dtype).requires_grad_()
    v = torch.randn(c.shape_kv, device=DEVICE).to(c.dtype).requires_grad_()
    do = torch.randn(c.shape_q, device=DEVICE).to(c.dtype)
    return q, k, v, do


def _fwd_bwd(fn, q, k, v, do, c: Case):
    out = fn(q, k, v, is_causal=c.causal, scale=c.scale, enable_gqa=c.gqa)
    grads = torch.autograd.grad((out * do.to(out.dtype)).sum(), (q, k, v))
    return (out,) + grads


def _check(c: Case):
    tsdpa.reset_fallback_warnings()
    q, k, v, do = _inputs(c)
    # float64 runs the PyTorch path (on a GPU the kernels take fp16/bf16/fp32)
    path = tileattn.use_backend("torch") if c.dtype == torch.float64 else contextlib.nullcontext()
    with warnings.catch_warnings(), path:
        warnings.simplefilter("error", TileattnFallbackWarning)  # every case here is accelerated
        mine = _fwd_bwd(tileattn.scaled_dot_product_attention, q, k, v, do, c)
    lowp = _fwd_bwd(TORCH_SDPA, q, k, v, do, c)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = _fwd_bwd(TORCH_SDPA, q64, k64, v64, do.double(), c)
    assert mine[0].shape == ref[0].shape and mine[0].dtype == c.dtype
    for name, got, r64, rlow in zip(("out", "dq", "dk", "dv"), mine, ref, lowp):
        check_accuracy(f"{c.id} {name}", got, r64, rlow, c.dtype)


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_matches_torch_sdpa(c):
    _check(c)


KERNEL_CASES = [
    Case((1, 2, 9, 16), (1, 2, 21, 16), True),
    Case((1, 4, 21, 16), (1, 2, 9, 16), True, gqa=True),
]


@pytest.mark.parametrize("c", KERNEL_CASES, ids=lambda c: c.id)
def test_matches_torch_sdpa_on_kernels(c, kernels):
    _check(c)


def test_top_left_rows_of_a_long_query_see_key_zero():
    """Nq > Nk: under top-left alignment query 0 sees exactly key 0 (its output is v[0]);
    bottom-right alignment would leave it empty."""
    q, k, v = (torch.randn(1, 1, n, 8, dtype=torch.float64) for n in (6, 2, 2))
    out = tileattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out[0, 0, 0], v[0, 0, 0])
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v, is_causal=True))


# ---------------------------------------------------------------------------
# fallback: correct, warned once
# ---------------------------------------------------------------------------
def _qkv(hq=2, hkv=2, nq=12, nk=12, d=16, dv=None, dtype=torch.float32):
    q = torch.randn(2, hq, nq, d, dtype=dtype)
    k = torch.randn(2, hkv, nk, d, dtype=dtype)
    v = torch.randn(2, hkv, nk, dv or d, dtype=dtype)
    return q, k, v


FALLBACKS = {
    "bool-mask": lambda q, k, v: dict(attn_mask=torch.rand(q.shape[-2], k.shape[-2]) > 0.3),
    "float-mask": lambda q, k, v: dict(attn_mask=torch.randn(q.shape[-2], k.shape[-2])),
}


@pytest.mark.parametrize("kind", sorted(FALLBACKS))
def test_fallback_warns_once_and_matches_torch(kind):
    tsdpa.reset_fallback_warnings()
    q, k, v = _qkv()
    kwargs = FALLBACKS[kind](q, k, v)
    with pytest.warns(TileattnFallbackWarning, match="attn_mask"):
        out = tileattn.scaled_dot_product_attention(q, k, v, **kwargs)
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v, **kwargs), rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TileattnFallbackWarning)
        tileattn.scaled_dot_product_attention(q, k, v, **kwargs)  # no second warning


def test_fallback_dropout_is_torchs():
    tsdpa.reset_fallback_warnings()
    q, k, v = _qkv()
    torch.manual_seed(5)
    with pytest.warns(TileattnFallbackWarning, match="dropout"):
        out = tileattn.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)
    torch.manual_seed(5)
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v, dropout_p=0.3, is_causal=True), rtol=0, atol=0)


def test_value_head_dim_accelerated():
    """A value head dim different from the query/key one runs tileattn (no fallback warning)."""
    tsdpa.reset_fallback_warnings()
    q, k, v = _qkv(dv=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TileattnFallbackWarning)
        out = tileattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v, is_causal=True))


def test_fallback_gqa_key_and_value_head_counts_differ():
    """enable_gqa with key and value heads that differ but each divide the query
    heads: torch repeats each on its own; the drop-in runs torch's function."""
    tsdpa.reset_fallback_warnings()
    q, k, _ = _qkv(hq=4, hkv=2)
    v = torch.randn(2, 1, 12, 16)
    with pytest.warns(TileattnFallbackWarning, match="head counts"):
        out = tileattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    ref = TORCH_SDPA(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(4, dim=1), is_causal=True)
    torch.testing.assert_close(out, ref)


def test_fallback_empty_keys():
    tsdpa.reset_fallback_warnings()
    q, k, v = _qkv(nk=0)
    with pytest.warns(TileattnFallbackWarning, match="empty"):
        out = tileattn.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, TORCH_SDPA(q, k, v))


# ---------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------
BAD = {
    "query-not-tensor": (lambda q, k, v: ((q.tolist(), k, v), {}), TypeError, "query"),
    "dtype-mismatch": (lambda q, k, v: ((q, k.double(), v), {}), TypeError, "dtype"),
    "head-dim-mismatch": (lambda q, k, v: ((q, k[..., :8], v), {}), ValueError, "head dim"),
    "kv-length-mismatch": (lambda q, k, v: ((q, k, v[:, :, :5]), {}), ValueError, "sequence length"),
    "dropout-range": (lambda q, k, v: ((q, k, v), {"dropout_p": 1.5}), ValueError, "dropout_p"),
    "is-causal-int": (lambda q, k, v: ((q, k, v), {"is_causal": 1}), TypeError, "is_causal"),
    "scale-str": (lambda q, k, v: ((q, k, v), {"scale": "0.1"}), TypeError, "scale"),
    "scale-nan": (lambda q, k, v: ((q, k, v), {"scale": float("nan")}), ValueError, "scale"),
    "gqa-heads": (lambda q, k, v: ((q[:, :3], k, v), {"enable_gqa": True}), ValueError, "enable_gqa"),
    "gqa-value-heads": (lambda q, k, v: ((q, k, v[:, :1].expand(-1, 3, -1, -1)), {"enable_gqa": True}), ValueError,
                        "value 3"),
    "mask-type": (lambda q, k, v: ((q, k, v), {"attn_mask": [[True]]}), TypeError, "attn_mask"),
    "int-dtype": (lambda q, k, v: ((q.int(), k.int(), v.int()), {}), TypeError, "floating-point"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_arguments(name):
    make, exc, match = BAD[name]
    q, k, v = _qkv(hq=4)
    args, kwargs = make(q, k, v)
    with pytest.raises(exc, match=match):
        tileattn.scaled_dot_product_attention(*args, **kwargs)


def test_signature_like_torch():
    q, k, v = _qkv()
    mask = torch.ones(12, 12, dtype=torch.bool)
    # attn_mask, dropout_p, is_causal positional; scale and enable_gqa keyword-only, as in torch
    torch.testing.assert_close(tileattn.scaled_dot_product_attention(q, k, v, None, 0.0, True),
                               TORCH_SDPA(q, k, v, None, 0.0, True))
    with pytest.raises(TypeError):
        tileattn.scaled_dot_product_attention(q, k, v, mask, 0.0, False, 0.5)


# ---------------------------------------------------------------------------
# patched_sdpa
# ---------------------------------------------------------------------------
def test_patched_sdpa_routes_and_restores(monkeypatch):
    calls = []
    real_attention = tsdpa.api.attention
    monkeypatch.setattr(tsdpa.api, "attention", lambda *a, **kw: calls.append(1) or real_attention(*a, **kw))
    original = F.scaled_dot_product_attention
    q, k, v = _qkv()
    with tileattn.patched_sdpa() as fn:
        assert F.scaled_dot_product_attention is fn is tileattn.scaled_dot_product_attention
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # torch's own modules that look the function up at call time are routed too
        # (training mode: the inference fast path of MultiheadAttention is a fused kernel)
        mha = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        x = torch.randn(2, 5, 16)
        routed, _ = mha(x, x, x, need_weights=False)
    assert F.scaled_dot_product_attention is original
    assert len(calls) == 2
    torch.testing.assert_close(out, original(q, k, v, is_causal=True))
    torch.testing.assert_close(routed, mha(x, x, x, need_weights=False)[0])


def test_patched_sdpa_restores_on_exception_and_nests():
    original = F.scaled_dot_product_attention
    with pytest.raises(RuntimeError, match="boom"):
        with tileattn.patched_sdpa():
            with tileattn.patched_sdpa():
                assert F.scaled_dot_product_attention is tileattn.scaled_dot_product_attention
            assert F.scaled_dot_product_attention is tileattn.scaled_dot_product_attention  # outer still open
            raise RuntimeError("boom")
    assert F.scaled_dot_product_attention is original


def test_patched_sdpa_threads():
    """Blocks opened and closed by several threads, overlapping in any order,
    leave torch's function in place after the last one exits."""
    original = F.scaled_dot_product_attention
    barrier = threading.Barrier(4)
    seen = []

    def worker():
        with tileattn.patched_sdpa():
            barrier.wait()
            seen.append(F.scaled_dot_product_attention is tileattn.scaled_dot_product_attention)
            barrier.wait()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [True] * 4
    assert F.scaled_dot_product_attention is original


def test_compile_fullgraph_through_patch():
    """torch.compile(fullgraph=True) traces a function calling F.scaled_dot_product_attention
    inside patched_sdpa (top-left causal with Nq > Nk: two tileattn calls), forward and backward."""
    torch.manual_seed(3 + SEED_OFFSET)
    q = torch.randn(1, 2, 24, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 2, 10, 16, device=DEVICE, requires_grad=True)
    v = torch.randn(1, 2, 10, 16, device=DEVICE, requires_grad=True)

    def layer(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum()

    torch._dynamo.reset()
    with tileattn.patched_sdpa():
        explained = torch._dynamo.explain(layer)(q, k, v)
        torch._dynamo.reset()
        loss = torch.compile(layer, fullgraph=True)(q, k, v)
    assert explained.graph_break_count == 0
    code = "".join(g.code for g in explained.graphs)
    assert code.count("tileattn.attention_fwd") == 2 and "scaled_dot_product" not in code
    grads = torch.autograd.grad(loss, (q, k, v))
    ref_loss = layer(q, k, v)  # unpatched: torch's SDPA
    ref_grads = torch.autograd.grad(ref_loss, (q, k, v))
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
