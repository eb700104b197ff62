"""benchmarks/walk_trace.py: its reading of a persistent call's clock rows
(synthetic rows here; the rows themselves come from a Hopper GPU) and the
configs its variant names give."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import walk_trace  # noqa: E402
from tileattn.kernels.fwd_hopper import TRACE_SLOTS  # noqa: E402


def _row(sm: int, start_ns: int, steps_ns: list[int]) -> list[int]:
    """A program's row as the kernel writes it: SM, start, then each work's end."""
    row = [sm, start_ns]
    t = start_ns
    for s in steps_ns:
        t += s
        row.append(t)
    return row + [0] * (TRACE_SLOTS.value - len(row))


def test_summary_reads_ends_and_spread():
    # three programs: two of 4 units of 10 us, one slower SM (11 us a unit) that also runs a fifth unit
    rows = [_row(0, 1_000, [10_000] * 4), _row(1, 1_200, [10_000] * 4), _row(2, 1_000, [11_000] * 5)]
    s = walk_trace.summary(rows, whole=3)
    assert s["end_max"] == pytest.approx(55.0)                      # 5 x 11 us from the first start
    assert s["end_mean"] == pytest.approx((40.0 + 40.2 + 55.0) / 3)
    assert s["unit_mean"] == pytest.approx((10 + 10 + 11) / 3)
    assert s["unit_spread_pct"] == pytest.approx(10.0)
    assert s["sms"] == 3


def test_summary_skips_unwritten_entries():
    # a stream-K piece with no tiles writes its end equal to the previous one; entries never written stay 0
    rows = [_row(0, 0, [5_000, 5_000, 0, 2_000]), _row(1, 0, [5_000, 5_000, 3_000])]
    s = walk_trace.summary(rows, whole=2)
    assert s["end_max"] == pytest.approx(13.0)
    assert s["end_mean"] == pytest.approx(12.5)


@pytest.mark.parametrize("name,want", [
    ("pers-rt", "hopper-M64x2-N128-s2-ov-pers-rt"),
    ("pers-rt-sk", "hopper-M64x2-N128-s2-ov-pers-rt-sk"),
    ("pers-rt-s4", "hopper-M64x2-N128-s4-ov-pers-rt"),
    ("pers-rt-sk-s5", "hopper-M64x2-N128-s5-ov-pers-rt-sk"),
    ("pers-rt-nc", "hopper-M64x3-N128-s2-ov-pers-rt-ep"),
    ("pers-rt-nc-rem", "hopper-M64x3-N128-s2-ov-pers-rt-ep"),
])
def test_variant_names(name, want):
    assert walk_trace.variant(64, name).name == want


@pytest.mark.parametrize("name,want", [("pers-rt", {}), ("pers-rt-sinks", {"remainder": False}),
                                       ("pers-rt-nc-rem", {"remainder": True})])
def test_call_kwargs(name, want):
    """The variant's name asks for sinks (one logit a head) and the remainder."""
    got = walk_trace.call_kwargs(name, heads=4, device="cpu")
    assert {k: v for k, v in got.items() if k != "sinks"} == want
    assert ("sinks" in got) == bool(want) and (not want or got["sinks"].shape == (4,))
