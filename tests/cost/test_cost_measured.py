"""IO cost model against measurement: the validation logic, and the model
against the bytes measured on an H200 (Nsight Compute), kernel list by
kernel list, with the table in docs/io-model.md."""
from pathlib import Path

import pytest

from tileattn.cost import standard_traffic, validation


# ---- against measurement -------------------------------------------------------
def test_validation_logic_on_synthetic_record():
    row = {"shape_name": "tiny", "batch": 2, "heads": 4, "kv_heads": 4, "seqlen_q": 1024, "seqlen_k": 1024,
           "head_dim": 64, "causal": False, "dtype": "bf16", "impl": "standard", "mode": "fwd",
           "measured_read_bytes": 0, "measured_write_bytes": 0}
    pred = validation.predict_row(row, "nvidia-h200")
    row["measured_read_bytes"], row["measured_write_bytes"] = 0.6 * pred, 0.5 * pred
    chk = validation.check_row(row, "nvidia-h200")
    assert chk.ok and chk.ratio == pytest.approx(1.1)
    row["measured_write_bytes"] = pred
    assert not validation.check_row(row, "nvidia-h200").ok
    row["impl"] = "tiled"
    row["mode"] = "fwdbwd"
    row["configs"] = {"fwd": "M128-N64-w4-s3", "dkdv": "M64-N64-w4-s3"}
    assert validation.predict_row(row, "nvidia-h200") > 0
    assert validation.row_label(row) == "tiny-tiled-fwdbwd"


def test_measured_total_or_read_plus_write():
    row = {"batch": 1, "heads": 1, "seqlen_q": 128, "head_dim": 64, "impl": "tiled", "mode": "fwd"}
    with pytest.raises(KeyError, match="measured"):
        validation.measured_bytes(row)
    row["measured_total_bytes"] = 5e6
    assert validation.measured_bytes(row) == 5e6
    row["measured_read_bytes"], row["measured_write_bytes"] = 3e6, 1e6
    assert validation.measured_bytes(row) == 4e6  # the exact counts win over a rounded total
    assert validation.check_row(row, "nvidia-h200").measured == 4e6


_HW, _ROWS = validation.load_rows()


def test_measured_file_has_all_rows():
    assert _HW == "nvidia-h200"
    assert len(_ROWS) == 32
    assert sum("measured_total_bytes" in r for r in _ROWS) == 24
    assert sum("measured_read_bytes" in r and "measured_write_bytes" in r for r in _ROWS) == 8


@pytest.mark.parametrize("row", _ROWS, ids=[validation.row_label(r) for r in _ROWS])
def test_model_within_20_percent_of_measured_h200(row):
    chk = validation.check_row(row, _HW)
    assert chk.ok, f"{chk.label}: measured {chk.measured / 1e9:.3f} GB, model {chk.predicted / 1e9:.3f} GB"
    # the model is counted pass by pass, not fitted: every row is in fact within 5%
    assert abs(chk.ratio - 1) < 0.05, f"{chk.label}: ratio {chk.ratio:.3f}"


_RUN2 = Path(__file__).parents[2] / "docs" / "results" / "h200" / "bytes" / "measured_h200_run2.json"
_NAMED = [r for r in validation.load_rows(_RUN2)[1] if r.get("kernel_names") and r["impl"] == "standard"]


@pytest.mark.parametrize("row", _NAMED, ids=[validation.row_label(r) for r in _NAMED])
def test_measured_kernel_lists_match_standard_passes(row):
    # each modelled N^2 pass is one launch in the Nsight Compute list: cuBLAS matmuls,
    # softmax row kernels, and elementwise kernels (masked_fill, scale, dP * P) that aten
    # splits into ceil(bytes / 2^31) launches for 32-bit indexing
    names = row["kernel_names"]
    s = validation.row_shape(row)
    t = standard_traffic(s, fusion="eager", backward=row["mode"] == "fwdbwd")
    sb = s.score_elements * s.elem_bytes
    splits = -(-sb // 2 ** 31)
    count = lambda kind: sum(p.kernel == kind for p in t.passes)  # noqa: E731
    assert sum(n.startswith("nvjet") for n in names) == count("matmul")
    assert sum("SoftMax" in n for n in names) == count("softmax")
    assert sum("masked_fill" in n or "MulFunctor" in n for n in names) == splits * count("elementwise")


def test_docs_table_matches_measurements():
    doc = (Path(__file__).parents[2] / "docs" / "io-model.md").read_text()
    assert validation.markdown_table() in doc


# ---- docs/io-model.md against the tool ---------------------------------------------
_DOC = Path(__file__).parents[2] / "docs" / "io-model.md"
_CALIBRATED = Path(__file__).parents[2] / "docs" / "results" / "h200" / "calibrate" / "calibrated_h200.json"


def test_docs_default_configs_are_the_tools():
    """The H200 configs table in docs/io-model.md is what default_configs (and the
    header of `tileattn io --hw nvidia-h200`) gives at d = 64 and 128."""
    import re

    from tileattn.cost import default_configs, get_hardware
    doc = _DOC.read_text()
    smem = get_hardware("nvidia-h200").get_int("smem_per_block")
    for d in (64, 128):
        cfg = default_configs(d, 2, smem)
        row = re.search(rf"^\| {d} \| `([^`]+)` \| `([^`]+)` \| `([^`]+)` \|$", doc, re.M)
        assert row, f"no d = {d} row in the configs table of docs/io-model.md"
        assert row.groups() == (cfg.fwd.name, cfg.dkdv.name, cfg.dq.name)


def test_docs_no_l2_bytes_are_the_tools():
    """'Without L2 the GPT-2 medium forward + backward would move X GB' is
    `tileattn io --hw nvidia-h200 --batch 64 --heads 16 --seqlen 1024 --head-dim 64 --no-l2`."""
    from tileattn.cost import AttentionShape, compare
    doc = " ".join(_DOC.read_text().split())
    c = compare(AttentionShape(64, 16, 1024, 64), "nvidia-h200", l2_reuse=False)
    assert f"Without L2 the GPT-2 medium forward + backward would move {c.tiled.bytes() / 1e9:.1f} GB" in doc
    big = compare(AttentionShape(1, 16, 16384, 128), "nvidia-h200", l2_reuse=False)
    assert f"the no-L2 count at N = 16384 would be {big.tiled.bytes('fwd') / 1e9:.1f} GB" in doc


def test_catalogue_h200_measured_is_the_calibration_rounded():
    """The catalogue's measured H200 figures are the calibrated file's, rounded
    (4.2138 TB/s -> 4.21, 788.94 TFLOP/s -> 789), and the doc cites the same."""
    from tileattn.cost import CATALOGUE, load_hardware_file
    cal = load_hardware_file(_CALIBRATED)
    h200 = CATALOGUE["nvidia-h200"]
    assert h200.bandwidth("measured") == pytest.approx(round(cal.bandwidth("measured") / 1e10) * 1e10)
    assert h200.peak("bf16", "measured") == pytest.approx(round(cal.peak("bf16", "measured") / 1e12) * 1e12)
    assert "calibrated_h200.json" in h200.measured["hbm_bandwidth"].source
    doc = " ".join(_DOC.read_text().split())
    assert f"**{h200.bandwidth('measured') / 1e12:.2f} TB/s**" in doc
    assert f"**{h200.peak('bf16', 'measured') / 1e12:.0f} TFLOP/s**" in doc
