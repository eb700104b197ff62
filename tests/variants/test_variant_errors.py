"""Bad input to ``attention`` (windows, softcap, ALiBi slopes, block layouts)
and to ``attention_varlen`` (tensors, cu_seqlens, lengths, heads) raises the
documented error before any launch."""
import pytest
import torch

import tileattn
from tileattn import cpu, launch
from tileattn.testing import cu_seqlens, forbidden

from conftest import DEVICE

F16, F32 = torch.float16, torch.float32


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


@pytest.fixture
def no_launch(monkeypatch):
    for mod, name in ((launch, "attn_fwd"), (launch, "attn_bwd"), (cpu, "attention_fwd"),
                      (cpu, "tiled_attention_varlen")):
        monkeypatch.setattr(mod, name, forbidden())


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_variant_input(name, path, no_launch):
    make, kwargs, exc, msg = BAD[name]
    with pytest.raises(exc, match=msg):
        tileattn.attention(*make(), **kwargs)


def _packed_args(lens_q=(3, 5), lens_k=None, hq=2, hkv=2):
    lens_k = lens_q if lens_k is None else lens_k
    return [_t(sum(lens_q), hq, 8), _t(sum(lens_k), hkv, 8), _t(sum(lens_k), hkv, 8), cu_seqlens(lens_q),
            cu_seqlens(lens_k), max(lens_q), max(lens_k)]


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
    "cu-lengths-differ": (_with(4, lambda a: cu_seqlens((3, 4, 1))), {}, ValueError, "same length"),
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
    cu = cu_seqlens((3, 5))
    tileattn.attention_varlen(q, q, q, cu, cu, 5, 5)
    tileattn.attention_varlen(q, q, q, cu, cu, 5, 5)
    cu[1] = 9
    with pytest.raises(ValueError, match="cu_seqlens_q must be non-decreasing"):
        tileattn.attention_varlen(q, q, q, cu, cu, 5, 5)
