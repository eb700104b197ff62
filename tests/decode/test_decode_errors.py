"""Bad input to ``attention_with_kvcache``: a clear error naming the argument,
before any launch or cache write, also after valid calls of a similar shape
(whose validation a repeated call reuses); the validation cache and its call
key; the argument rules shared with ``attention`` (softcap=0, ALiBi slopes of
any float dtype); mixed devices; float64 on the kernels.
"""
from __future__ import annotations

import pytest
import torch

import tileattn
from tileattn import reference_decode
from tileattn.launch import decode as launch_decode
from tileattn.testing import forbidden

from conftest import DEVICE, HAS_CUDA


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


def _same_cache(**over):
    """A call whose v_cache is k_cache itself (each key its own value)."""
    cache = _t(2, 2, 32, 16)
    return _base(k_cache=cache, v_cache=cache, **over)


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
    # one cache as keys and values (v_cache is k_cache): two different new tensors would write the same rows
    "same-cache-two-new": (lambda: _same_cache(k_new=_t(2, 2, 1, 16), v_new=_t(2, 2, 1, 16)), ValueError,
                           "v_new must be k_new itself"),
    # the sinks too (after a valid append's arguments: nothing may be written)
    "sinks-requires-grad": (lambda: _base(k_new=_t(2, 2, 1, 16), v_new=_t(2, 2, 1, 16),
                                          sinks=torch.zeros(4, device=DEVICE, requires_grad=True)),
                            ValueError, "sinks requires grad, but attention_with_kvcache is forward-only"),
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
