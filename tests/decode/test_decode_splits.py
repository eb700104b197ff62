"""Split-KV decoding: every split count agrees with one split (empty splits and
a combine in several chunks included), the leading split, the combine kernel
against float64, and the rules that choose the split count and the leading
split (``choose_num_splits``, ``choose_lead``), on the kernels and the
PyTorch path, under the accuracy rule.
"""
from __future__ import annotations

import pytest
import torch

from tileattn.launch import decode as launch_decode, runtime
from tileattn.testing import FLOOR, check_accuracy
from tileattn.testing_decode import Case, assert_cache_appended, assert_case, make_inputs, reference, run

from conftest import DEVICE, INTERPRETED

pytestmark = pytest.mark.usefixtures("decode_bf16_upcast")   # tests/conftest.py

F16, F32 = torch.float16, torch.float32


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


# (B, Hq, Nq, channels, splits): channels past 128 merge in blocks of 128 (200: a partial last block; 512: the
# absorbed layout's V); 1030 rows keep 4 rows a program (the last program 2)
COMBINE_CASES = [(2, 3, 2, 40, s) for s in (2, 5, 16, 40, 256)] + [
    (2, 3, 2, 200, 5), (2, 3, 2, 200, 40), (1, 3, 2, 512, 40), (5, 103, 2, 64, 17)]


@pytest.mark.parametrize("b,hq,n_q,d,splits", COMBINE_CASES,
                         ids=[f"{b}x{h}x{n}-d{d}-{s}splits" for b, h, n, d, s in COMBINE_CASES])
def test_combine_kernel(b, hq, n_q, d, splits, kernels):
    """The combine merges partials exactly (float64 logsumexp weights), also
    across chunks of 16 splits whose later chunk holds the largest lse, with
    empty splits (lse -inf) anywhere and a row whose splits are all empty
    (output 0, lse -inf), over every channel block and row block."""
    o_part = torch.randn(b, hq, n_q, splits, d, device=DEVICE)
    l_part = torch.randn(b, hq, n_q, splits, device=DEVICE) * 4
    l_part[0, 0, 0, -1] = 30.0                       # the largest lse in the last chunk
    l_part[0, 1, 1, ::3] = float("-inf")             # empty splits among full ones
    l_part[-1, 2, 0, :] = float("-inf")              # a row that saw no key
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
    assert torch.all(out[-1, 2, 0] == 0)
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
