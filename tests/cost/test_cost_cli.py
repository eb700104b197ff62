"""CLI of the cost model and the HTML report (rendered in headless Chromium),
and the commands on user input: --hw-file alone selects its entry, bad
outputs and bad hardware files are one-line errors (exit 2) naming the flag,
broken files of the user hardware folder are named, and --help documents
every shape flag."""
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tileattn.cost import commands

SHAPE = ["--batch", "2", "--heads", "4", "--seqlen", "1024", "--head-dim", "64"]


def test_io_table(capsys):
    assert commands.main(["io", "--hw", "nvidia-a100-80gb-sxm4", *SHAPE, "--causal"]) == 0
    out = capsys.readouterr().out
    assert "HBM bytes fwd" in out and "ridge" in out


def test_io_json_seed_example(capsys):
    argv = ["io", "--hw", "nvidia-a100-80gb-sxm4", "--batch", "8", "--heads", "32", "--seqlen", "16384",
            "--head-dim", "128", "--dtype", "bf16", "--json"]
    assert commands.main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["standard"]["memory"]["peak_extra_bytes"] == 256 * 2 ** 30
    assert d["standard"]["prediction"]["fwd"]["bound"] == "memory"


def test_io_head_dim_v(capsys):
    """--head-dim-v: V's (and the output's) head dim, in the shape and the header."""
    argv = ["io", "--hw", "nvidia-h200", *SHAPE[:-1], "192", "--head-dim-v", "128"]
    assert commands.main(argv + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["shape"]["head_dim"], d["shape"]["head_dim_v"]) == (192, 128)
    assert commands.main(argv) == 0
    assert "d=192 dv=128" in capsys.readouterr().out
    assert commands.main(["io", "--hw", "nvidia-h200", *SHAPE, "--head-dim-v", "513"]) == 2
    assert "--head-dim-v=513 exceeds 512" in capsys.readouterr().err


def test_io_head_dim_512(capsys):
    """d = 512 (the largest the kernels take) on the H200 and the RTX 4090; 513 is a usage error."""
    for hw in ("nvidia-h200", "nvidia-rtx-4090"):
        assert commands.main(["io", "--hw", hw, *SHAPE[:-1], "512", "--causal", "--json"]) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["shape"]["head_dim"] == 512
        assert d["tiled"]["prediction"]["fwd"]["bytes"] > 0
    assert commands.main(["io", "--hw", "nvidia-h200", *SHAPE[:-1], "513"]) == 2
    assert "--head-dim=513 exceeds 512" in capsys.readouterr().err


def test_unknown_hardware_exit_2(capsys):
    assert commands.main(["io", "--hw", "gpu-9000", *SHAPE]) == 2
    err = capsys.readouterr().err
    assert "gpu-9000" in err and "nvidia-h200" in err and "Traceback" not in err


def test_bad_size_exit_2(capsys):
    assert commands.main(["io", "--hw", "nvidia-h200", "--batch", "-3"]) == 2
    assert "batch" in capsys.readouterr().err


def test_bad_dtype_is_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        commands.main(["io", "--dtype", "fp64"])
    assert exc.value.code == 2
    assert "bf16" in capsys.readouterr().err


def test_help_has_example(capsys):
    for cmd in ("io", "roofline", "report", "calibrate"):
        with pytest.raises(SystemExit):
            commands.main([cmd, "--help"])
        assert "example" in capsys.readouterr().out


def test_calibrate_without_gpu_exit_3(tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the no-GPU path is not reachable")
    assert commands.main(["calibrate", "-o", str(tmp_path / "x.json")]) == 3
    assert "no GPU" in capsys.readouterr().err


def test_roofline_png_with_measured_overlay(tmp_path):
    meas = tmp_path / "m.json"
    meas.write_text(json.dumps({"rows": [{"batch": 2, "heads": 4, "seqlen_q": 1024, "head_dim": 64,
                                           "impl": "tiled", "mode": "fwd", "measured_read_bytes": 3e7,
                                           "measured_write_bytes": 1e7, "time_ms": 0.05}]}))
    out = tmp_path / "r.png"
    assert commands.main(["roofline", "--hw", "nvidia-h200", *SHAPE, "-o", str(out), "--measured", str(meas)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_module_entry_point(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(Path(commands.__file__).parents[2]))
    p = subprocess.run([os.sys.executable, "-m", "tileattn.cost.commands", "io", "--hw", "nvidia-h200", *SHAPE,
                        "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["hardware"] == "nvidia-h200"


SECTION_IDS = ("problem", "identity", "bytes", "tiling", "roofline", "scaling", "limits")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert commands.main(["report", "--hw", "nvidia-h200", "--batch", "8", "--heads", "32", "--seqlen", "16384",
                "--head-dim", "128", "-o", str(out)]) == 0
    return out


def test_report_content(report):
    text = report.read_text()
    for sid in SECTION_IDS:
        assert f'id="{sid}"' in text
    assert "data:image/png;base64," in text and "http://" not in text and "https://" not in text
    assert "256 GiB" in text  # computed for this shape, not pasted
    pos = [text.index(f'id="{sid}"') for sid in SECTION_IDS]
    assert pos == sorted(pos)


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("TILEATTN_SKIP_BROWSER") == "1":
        pytest.skip("TILEATTN_SKIP_BROWSER=1 and no Chromium installed")
    pytest.fail("headless Chromium is needed to check the report renders: apt-get install -y chromium "
                "(or set TILEATTN_SKIP_BROWSER=1 to skip)")


def _chrome_args(exe, user_dir):
    return [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={user_dir}"]


def test_report_renders_in_headless_chromium(report, tmp_path):
    exe = _chromium()
    shot = tmp_path / "shot.png"
    with tempfile.TemporaryDirectory() as ud:
        subprocess.run(_chrome_args(exe, ud) + [f"--screenshot={shot}", "--window-size=1200,4000",
                                               report.resolve().as_uri()], capture_output=True, timeout=120)
    assert shot.is_file() and shot.stat().st_size > 50_000, "Chromium produced no (or a blank) screenshot"
    with tempfile.TemporaryDirectory() as ud:
        dom = subprocess.run(_chrome_args(exe, ud) + ["--dump-dom", report.resolve().as_uri()],
                             capture_output=True, text=True, timeout=120).stdout
    for sid in SECTION_IDS:
        assert f'id="{sid}"' in dom


def test_calibrated_h200_entry_loads_as_measured():
    """The entry `tileattn calibrate` wrote on the H200 (docs/results/h200/calibrate)
    loads as user hardware, with measured copy bandwidth and bf16 rate."""
    from pathlib import Path

    from tileattn.cost.hardware import load_hardware_file
    path = Path(__file__).resolve().parents[2] / "docs" / "results" / "h200" / "calibrate" / "calibrated_h200.json"
    hw = load_hardware_file(path)
    assert hw.name == "nvidia-h200-calibrated" and hw.has_measured()
    assert 3.5e12 < hw.bandwidth("measured") < 4.8e12      # datasheet: 4.8 TB/s
    assert 6e14 < hw.peak("bf16", "measured") < 9.9e14     # datasheet dense bf16: 989 TFLOP/s
    assert hw.ridge_point("bf16", "measured") == pytest.approx(hw.peak("bf16", "measured") / hw.bandwidth("measured"))


# ---- user input: --hw-file, outputs, hardware files, flags, the user folder, --help ----
CALIBRATED = Path(__file__).resolve().parents[2] / "docs" / "results" / "h200" / "calibrate" / "calibrated_h200.json"


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tileattn: error: "), err
    return lines[0]


def _entry(name, bw=1e12, peak=1e14):
    return {"name": name, "hbm_bandwidth": bw, "peak_flops": {"bf16": peak}}


# ---- 1. --hw-file selects the file's entry -------------------------------------
def test_hw_file_alone_selects_its_entry(capsys):
    """The command of docs/io-model.md: the calibrated file's entry, not --hw's default."""
    argv = ["io", "--hw-file", str(CALIBRATED), "--basis", "measured", *SHAPE, "--json"]
    assert commands.main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["hardware"] == "nvidia-h200-calibrated" and d["basis"] == "measured"


@pytest.mark.parametrize("cmd,out", [("roofline", "r.png"), ("report", "r.html")])
def test_hw_file_alone_for_drawings(cmd, out, tmp_path, capsys):
    path = tmp_path / out
    assert commands.main([cmd, "--hw-file", str(CALIBRATED), *SHAPE, "-o", str(path)]) == 0
    assert path.stat().st_size > 1000


def test_hw_file_of_several_entries(tmp_path, capsys):
    multi = tmp_path / "multi.json"
    multi.write_text(json.dumps([_entry("gpu-a"), _entry("gpu-b", bw=2e12)]))
    assert commands.main(["io", "--hw-file", str(multi), *SHAPE]) == 2
    line = _one_line_error(capsys)
    assert "gpu-a, gpu-b" in line and "--hw" in line
    assert commands.main(["io", "--hw-file", str(multi), "--hw", "gpu-c", *SHAPE]) == 2
    line = _one_line_error(capsys)
    assert "gpu-c" in line and "gpu-a, gpu-b" in line
    assert commands.main(["io", "--hw-file", str(multi), "--hw", "gpu-b", *SHAPE, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hardware"] == "gpu-b"


def test_hw_file_toml_array_of_tables(tmp_path):
    from tileattn.cost import get_hardware, load_hardware_entries
    from tileattn.cost.hardware import UnknownHardwareError
    toml = tmp_path / "two.toml"
    toml.write_text('[[hardware]]\nname = "x"\nhbm_bandwidth = 1e12\npeak_flops = { bf16 = 1e14 }\n'
                    '[[hardware]]\nname = "y"\nhbm_bandwidth = 3e12\npeak_flops = { bf16 = 1e14 }\n')
    assert list(load_hardware_entries(toml)) == ["x", "y"]
    assert get_hardware("y", hw_file=toml).bandwidth() == 3e12
    with pytest.raises(UnknownHardwareError, match="x, y"):
        get_hardware(hw_file=toml)


@pytest.mark.parametrize("in_user_dir", [True, False], ids=["user-folder", "elsewhere"])
def test_calibrate_advice_names_what_works(in_user_dir, tmp_path, monkeypatch):
    """--hw NAME finds a calibrated file only in the user folder; --hw-file works anywhere."""
    monkeypatch.setenv("TILEATTN_HARDWARE_DIR", str(tmp_path / "hw"))
    path = (tmp_path / "hw" if in_user_dir else tmp_path / "elsewhere") / "gpu-x.json"
    advice = commands.calibrate_advice(path, "gpu-x")
    assert f"--hw-file {path}" in advice
    if in_user_dir:
        assert advice.startswith("use --hw gpu-x")
    else:
        assert advice.startswith(f"use --hw-file {path}")


# ---- 2. user errors are one-line errors ------------------------------------------
def test_report_into_missing_folder(tmp_path, capsys):
    assert commands.main(["report", *SHAPE, "-o", str(tmp_path / "no" / "such" / "r.html")]) == 2
    assert "--output" in _one_line_error(capsys)


def test_report_onto_a_folder(tmp_path, capsys):
    assert commands.main(["report", *SHAPE, "-o", str(tmp_path)]) == 2
    assert "is a directory" in _one_line_error(capsys)


def test_roofline_unsupported_format(tmp_path, capsys):
    out = tmp_path / "r.txt"
    assert commands.main(["roofline", *SHAPE, "-o", str(out)]) == 2
    line = _one_line_error(capsys)
    assert ".txt" in line and ".png" in line
    assert not out.exists()


@pytest.mark.parametrize("text,field", [
    ('{"name": "z", "hbm_bandwidth": 0, "peak_flops": {"bf16": 1e14}}', "hbm_bandwidth"),
    ('{"name": "z", "hbm_bandwidth": 1e12, "peak_flops": {"bf16": 0}}', "peak_flops.bf16"),
    ('{"name": "z", "hbm_bandwidth": Infinity, "peak_flops": {"bf16": 1e14}}', "hbm_bandwidth"),
    ('{"name": "z", "hbm_bandwidth": NaN, "peak_flops": {"bf16": 1e14}}', "hbm_bandwidth"),
    ('{"name": "z", "hbm_bandwidth": 1e12, "peak_flops": {"bf16": {"value": -1e14}}}', "peak_flops.bf16"),
    ('{"name": "z", "hbm_bandwidth": 1e12, "peak_flops": {"bf16": 1e14}, "measured": {"hbm_bandwidth": 0}}',
     "measured.hbm_bandwidth"),
], ids=["zero-bandwidth", "zero-peak", "infinity", "nan", "negative-peak", "zero-measured"])
def test_hardware_values_finite_and_positive(text, field, tmp_path, capsys):
    from tileattn.cost import load_hardware_file
    f = tmp_path / "z.json"
    f.write_text(text)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        load_hardware_file(f)
    assert commands.main(["io", "--hw-file", str(f), *SHAPE]) == 2
    line = _one_line_error(capsys)
    assert field in line and "--hw-file" in line


def test_toml_inf_rejected(tmp_path):
    from tileattn.cost import load_hardware_file
    f = tmp_path / "inf.toml"
    f.write_text('name = "t"\nhbm_bandwidth = inf\n[peak_flops]\nbf16 = 1e14\n')
    with pytest.raises(ValueError, match="finite"):
        load_hardware_file(f)


def test_zero_rates_built_in_python_are_value_errors():
    """A Hardware made by hand with a zero rate: ValueError, not ZeroDivisionError in the roofline."""
    import dataclasses

    from tileattn.cost import AttentionShape, Value, compare, get_hardware
    h200 = get_hardware("nvidia-h200")
    no_bw = dataclasses.replace(h200, hbm_bandwidth=Value(0.0, "B/s", "test"), measured={})
    with pytest.raises(ValueError, match="hbm_bandwidth"):
        compare(AttentionShape(1, 2, 256, 64), no_bw)
    no_peak = dataclasses.replace(h200, peak_flops={"bf16": Value(0.0, "FLOP/s", "test")}, measured={})
    with pytest.raises(ValueError, match="bf16 peak"):
        compare(AttentionShape(1, 2, 256, 64), no_peak)
    with pytest.raises(ValueError, match="finite"):
        Value(float("inf"), "B/s", "test")


# ---- 9. messages name the flags --------------------------------------------------
@pytest.mark.parametrize("args,msg", [
    (["--seqlen", "0"], "--seqlen=0 must be >= 1"),
    (["--seqlen-k", "0"], "--seqlen-k=0 must be >= 1"),
    (["--batch", "0"], "--batch=0 must be >= 1"),
    (["--heads", "0"], "--heads=0 must be >= 1"),
    (["--kv-heads", "3"], "--kv-heads=3 must divide --heads=32"),
    (["--head-dim", "0"], "--head-dim=0 must be >= 1"),
    (["--head-dim-v", "600"], "--head-dim-v=600 exceeds 512"),
], ids=["seqlen", "seqlen-k", "batch", "heads", "kv-heads", "head-dim", "head-dim-v"])
def test_errors_name_the_flag(args, msg, capsys):
    assert commands.main(["io", *args]) == 2
    line = _one_line_error(capsys)
    assert msg in line
    assert "seqlen_q" not in line and "head_dim" not in line and "kv_heads" not in line


# ---- 10. the user hardware folder ------------------------------------------------
@pytest.fixture
def broken_user_dir(tmp_path, monkeypatch):
    d = tmp_path / "hw"
    d.mkdir()
    (d / "neg.json").write_text(json.dumps(_entry("neg", bw=-1e12)))
    (d / "good.json").write_text(json.dumps(_entry("good")))
    monkeypatch.setenv("TILEATTN_HARDWARE_DIR", str(d))
    return d


def test_unknown_hardware_names_the_skipped_file(broken_user_dir, capsys):
    assert commands.main(["io", "--hw", "neg", *SHAPE]) == 2
    line = _one_line_error(capsys)
    assert "unknown hardware 'neg'" in line and str(broken_user_dir / "neg.json") in line
    assert "hbm_bandwidth" in line and "good" in line


def test_broken_user_file_warns(broken_user_dir, capsys):
    from tileattn.cost.hardware import HardwareFileWarning, get_hardware, skipped_user_files
    assert commands.main(["io", "--hw", "good", *SHAPE]) == 0
    err = capsys.readouterr().err
    assert f"tileattn: warning: skipped hardware file {broken_user_dir / 'neg.json'}" in err
    assert "Traceback" not in err
    with pytest.warns(HardwareFileWarning, match="neg.json"):
        get_hardware("nvidia-h200")
    assert list(skipped_user_files()) == [str(broken_user_dir / "neg.json")]


def test_user_folder_from_xdg_config_home(tmp_path, monkeypatch):
    from tileattn.cost import user_hardware_dir
    monkeypatch.delenv("TILEATTN_HARDWARE_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert user_hardware_dir() == tmp_path / "tileattn" / "hardware"


# ---- 10, 11. --help ----------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["io", "roofline", "report"])
def test_help_documents_flags_and_folder(cmd, capsys):
    with pytest.raises(SystemExit):
        commands.main([cmd, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "TILEATTN_HARDWARE_DIR" in text and "XDG_CONFIG_HOME" in text
    assert "batch size B (default: 8)" in text
    assert "(default: bf16)" in text and "element type" in text
    assert "--causal causal mask" in text
