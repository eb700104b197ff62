"""benchmarks/ncu_pipes.py: its reading of Nsight Compute's raw CSV and the
command it runs, with a stand-in for ``ncu`` that prints a canned CSV (the
real one needs a GPU)."""
from __future__ import annotations

import re
import stat
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import ncu_pipes  # noqa: E402

HEADER = ['"ID"', '"Process Name"', '"Kernel Name"', '"gpu__time_duration.sum"',
          '"smsp__issue_active.avg.per_cycle_active"',
          '"sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"',
          '"sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"',
          '"sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active"',
          '"sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"',
          '"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"',
          '"smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio"',
          '"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"',
          '"smsp__average_warps_issue_stalled_selected_per_issue_active.ratio"',
          '"smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio"']
UNITS = ['""', '""', '""', '"nsecond"', '"inst/cycle"', '"%"', '"%"', '"%"', '"%"', '""', '""', '""', '""', '""']
ROWS = [['"0"', '"python"', '"_attn_fwd_hopper_kernel"', '"537,512"', '"0.61"', '"52.5"', '"48.0"', '"30.0"',
         '"35.5"', '"0.40"', '"0.12"', '"0.95"', '"1.00"', '"0.70"'],
        ['"1"', '"python"', '"_bwd_preprocess"', '"12,000"', '"0.10"', '"0"', '"0"', '"1.0"', '"n/a"', '"0.01"',
         '"0.02"', '"0.30"', '"1.00"', '"0.00"']]


def _csv(preamble: str = "==PROF== Connected to process 1\n") -> str:
    return preamble + "\n".join(",".join(r) for r in [HEADER, UNITS] + ROWS) + "\n"


def test_raw_csv_rows_become_pipes_stalls_and_issue():
    rows = ncu_pipes.parse_raw_csv(_csv())
    assert [r["kernel"] for r in rows] == ["_attn_fwd_hopper_kernel", "_bwd_preprocess"]
    fwd = rows[0]
    assert fwd["time_ns"] == 537512.0
    assert fwd["issue_pct"] == pytest.approx(61.0)
    # a pipe's cycles-active share wins over its issue share; a pipe with only the latter keeps that
    assert fwd["pipes"] == {"tensor_op_gmma": 52.5, "fma": 35.5, "xu": 48.0}
    assert fwd["stalls"] == {"barrier": 0.40, "no_instruction": 0.12, "wait": 0.95, "selected": 1.00,
                             "math_pipe_throttle": 0.70}
    assert rows[1]["pipes"]["fma"] == 1.0   # "n/a" cycles share: the issue share stands


def test_table_orders_pipes_and_stalls_and_leaves_out_selected():
    line = ncu_pipes.format_rows("tileattn", ncu_pipes.parse_raw_csv(_csv())).splitlines()[0]
    assert "537.5 us" in line and re.search(r"issue +61 %", line)
    assert line.index("tensor_op_gmma 52 %") < line.index("xu 48 %") < line.index("fma 36 %")
    assert line.index("wait 0.95") < line.index("math_pipe_throttle 0.70") < line.index("barrier 0.40")
    assert "selected" not in line


def test_text_without_a_header_is_an_error():
    with pytest.raises(ValueError, match="Kernel Name"):
        ncu_pipes.parse_raw_csv("==ERROR== the application returned an error code (1)\n")


def _fake_ncu(tmp_path: Path, body: str) -> Path:
    tool = tmp_path / "ncu"
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return tool


def test_each_provider_runs_under_ncu_and_keeps_its_csv(tmp_path, capsys):
    (tmp_path / "canned.csv").write_text(_csv())
    args_file = tmp_path / "args.txt"
    tool = _fake_ncu(tmp_path, f'echo "$@" >> {args_file}\ncat {tmp_path / "canned.csv"}\n')
    out = tmp_path / "out"
    rc = ncu_pipes.main(["--mode", "bwd", "--head-dim", "64", "--seqlen", "2048", "--causal", "--providers",
                         "tileattn", "sdpa-cudnn", "--out", str(out), "--ncu", str(tool)])
    assert rc == 0
    calls = args_file.read_text().splitlines()
    assert len(calls) == 2
    assert "--clock-control none" in calls[0] and f"--nvtx-include {ncu_pipes.RANGE}/" in calls[0]
    assert "--child tileattn --mode bwd --head-dim 64 --seqlen 2048 --causal" in calls[0]
    assert "--child sdpa-cudnn" in calls[1]
    assert sorted(p.name for p in out.iterdir()) == ["sdpa-cudnn-bwd-d64-causal-2048.csv",
                                                      "tileattn-bwd-d64-causal-2048.csv"]
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 4 and printed[0].startswith("tileattn") and printed[2].startswith("sdpa-cudnn")


def test_a_failed_profile_is_reported_and_the_exit_code_says_so(tmp_path, capsys):
    tool = _fake_ncu(tmp_path, 'echo "==ERROR== no kernels were profiled" >&2\nexit 1\n')
    rc = ncu_pipes.main(["--providers", "tileattn", "--out", str(tmp_path / "out"), "--ncu", str(tool)])
    assert rc == 1
    assert "no ncu raw CSV header" in capsys.readouterr().out
    assert "no kernels were profiled" in (tmp_path / "out" / "tileattn-fwd-d128-full-4096.csv").read_text()


def test_a_forced_forward_config_from_its_fields():
    cfg = ncu_pipes.hopper_fwd_config("warpgroups=3,maxnreg=128,early_p=1,row_tree=true,pingpong=0")
    assert (cfg.warpgroups, cfg.maxnreg, cfg.early_p, cfg.row_tree, cfg.pingpong) == (3, 128, True, True, False)
    assert ncu_pipes.hopper_fwd_config("") == ncu_pipes.hopper_fwd_config("block_n=128")   # the defaults
    for bad in ("warp_groups=3", "warpgroups", "source=x"):
        with pytest.raises(ValueError, match="--hopper-fwd"):
            ncu_pipes.hopper_fwd_config(bad)


def test_the_forced_config_runs_as_one_more_provider(tmp_path):
    (tmp_path / "canned.csv").write_text(_csv())
    args_file = tmp_path / "args.txt"
    tool = _fake_ncu(tmp_path, f'echo "$@" >> {args_file}\ncat {tmp_path / "canned.csv"}\n')
    rc = ncu_pipes.main(["--head-dim", "64", "--causal", "--providers", "tileattn", "--hopper-fwd", "warpgroups=3",
                         "--out", str(tmp_path / "out"), "--ncu", str(tool)])
    calls = args_file.read_text().splitlines()
    assert rc == 0 and len(calls) == 2
    assert "--hopper-fwd" not in calls[0]
    assert "--child hopper-cfg" in calls[1] and calls[1].endswith("--hopper-fwd warpgroups=3")


@pytest.mark.parametrize("argv", [["--mode", "bwd", "--hopper-fwd", "warpgroups=3"], ["--hopper-fwd", "nope=1"]],
                         ids=["backward-mode", "unknown-field"])
def test_a_forced_config_that_cannot_run_is_refused_before_ncu(argv, tmp_path):
    with pytest.raises(SystemExit) as e:
        ncu_pipes.main(argv + ["--out", str(tmp_path / "out"), "--ncu", str(tmp_path / "no-such-ncu")])
    assert e.value.code == 2
