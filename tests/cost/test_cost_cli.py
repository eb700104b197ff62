"""CLI of the cost model and the HTML report (rendered in headless Chromium)."""
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
    assert "head_dim_v" in capsys.readouterr().err


def test_io_head_dim_512(capsys):
    """d = 512 (the largest the kernels take) on the H200 and the RTX 4090; 513 is a usage error."""
    for hw in ("nvidia-h200", "nvidia-rtx-4090"):
        assert commands.main(["io", "--hw", hw, *SHAPE[:-1], "512", "--causal", "--json"]) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["shape"]["head_dim"] == 512
        assert d["tiled"]["prediction"]["fwd"]["bytes"] > 0
    assert commands.main(["io", "--hw", "nvidia-h200", *SHAPE[:-1], "513"]) == 2
    assert "head_dim=513 exceeds 512" in capsys.readouterr().err


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
