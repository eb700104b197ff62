"""``tileattn.attention_with_kvcache`` against a float64 reference under the
accuracy rule, on the Triton kernels and on the PyTorch path, over the case
tables: contiguous and paged caches (shuffled block tables), lengths that
differ per batch element (including 0), with and without appended tokens,
GQA/MQA, the (B, N, H, D) layout and K and V caches of different strides,
sliding windows, softcap, ALiBi; the explicit-mask reference itself.  Then
the kernels' code paths on those cases: the pointer path, 64-bit page
offsets, key tiles other than the interpreter's, and both loop structures of
the partial kernel.

The cases, their inputs and the reference are ``tileattn.testing_decode``.
"""
from __future__ import annotations

import pytest
import torch

from tileattn import configs
from tileattn.launch import decode as launch_decode, runtime
from tileattn.reference import standard_attention
from tileattn.testing_decode import Case, _textbook, alibi_bias, assert_case, hidden_mask

from conftest import DEVICE, INTERPRETED

pytestmark = pytest.mark.usefixtures("decode_bf16_upcast")   # tests/conftest.py


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
def test_loop_structures(case, loads, one_loop, kernels, decode_loops):
    """Both loop structures of the partial kernel on every load path where
    both are valid, whichever ``launch_decode.one_loop`` picks there: ONE_LOOP
    (every tile masked; by descriptor a split's ragged last tile is moved back
    to end at the split's end, below row 0 for a cache shorter than a tile)
    and the masked head / unmasked body / masked tail.  32-key tiles, so that
    the edges fall inside tiles.  (By descriptor on a paged cache only the
    three loops are valid: a moved tile could cross a page.)"""
    decode_loops(one_loop, loads, "DECODE_CONFIGS")
    assert_case(case)


def test_one_loop_rule():
    """ONE_LOOP where measured as no slower (docs/perf-notes.md, v9):
    contiguous caches by descriptor, paged caches by pointer."""
    assert launch_decode.one_loop(descriptors=True, paged=False)
    assert launch_decode.one_loop(descriptors=False, paged=True)
    assert not launch_decode.one_loop(descriptors=True, paged=True)    # an edge tile must be zeroed in registers
    assert not launch_decode.one_loop(descriptors=False, paged=False)  # masked loads cost up to 0.7 %
