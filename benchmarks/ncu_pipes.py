"""Where a kernel's time goes, beside a peer's: Nsight Compute's issue-slot
use, the busiest pipes and the largest stall reasons for every kernel of one
attention call, per provider (``tileattn bench``'s: tileattn, sdpa-cudnn,
fa4 when installed, ...), FA2 protocol shape (16k tokens, hidden 2048),
bf16.  Needs a GPU and ``ncu``; the clocks are left as they are
(``--clock-control none``).

    python benchmarks/ncu_pipes.py --mode fwd --head-dim 64 --causal --seqlen 2048 --providers tileattn sdpa-cudnn
    python benchmarks/ncu_pipes.py --mode bwd --head-dim 128 --causal --seqlen 4096 --providers tileattn fa4
    python benchmarks/ncu_pipes.py --head-dim 64 --causal --seqlen 16384 --providers tileattn \
        --hopper-fwd warpgroups=3,maxnreg=128,early_p=1,row_tree=1,pingpong=0   # a forced forward config beside

Each provider runs in a child process under ``ncu``: two warm-up calls,
then one call inside an NVTX range (``ncu_pipes``) that ncu profiles, every
kernel in it (``--mode bwd``: the backward of a graph built before the
range).  The raw CSV of each provider is kept in ``--out``; the table gives,
per kernel: its duration, the share of issue slots used, the three busiest
pipes (% of their peak) and the four largest stall reasons (warp cycles an
issued instruction; ``perf-notes`` v59 asked which of "no instruction",
"barrier", "math pipe throttle" or "wait" bounds the softmax warpgroups).
"""
from __future__ import annotations

import argparse
import csv
import io
import re
import subprocess
import sys
from pathlib import Path

RANGE = "ncu_pipes"
SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "WarpStateStats", "SchedulerStats", "InstructionStats")
_STALL = re.compile(r"^smsp__average_warps?_issue_stalled_(\w+?)_per_issue_active\.ratio$")
_PIPE = re.compile(r"^sm__pipe_(\w+?)_cycles_active\.avg\.pct_of_peak_sustained_active$")
_PIPE_INST = re.compile(r"^sm__inst_executed_pipe_(\w+?)\.avg\.pct_of_peak_sustained_active$")
# (metric, factor to a percentage), the first the CSV has
_ISSUE = (("smsp__issue_active.avg.pct_of_peak_sustained_active", 1.0),
          ("smsp__issue_active.avg.per_cycle_active", 100.0), ("sm__issue_active.avg.pct_of_peak_sustained_active", 1.0))
_TIME = ("gpu__time_duration.sum",)


def _number(cell: str) -> float | None:
    try:
        return float(cell.replace(",", ""))
    except ValueError:
        return None


def parse_raw_csv(text: str) -> list[dict]:
    """Rows of ``ncu --csv --page raw`` (a header of metric names, maybe a
    row of units, one row a profiled kernel) as {"kernel", "time_ns",
    "issue_pct", "pipes": {name: %}, "stalls": {reason: cycles}}; lines
    before the header (ncu's and the program's own output) are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if '"Kernel Name"' in line), None)
    if start is None:
        raise ValueError("no ncu raw CSV header (a \"Kernel Name\" column) in the text")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    head = rows[0]
    name_col = head.index("Kernel Name")
    out = []
    for row in rows[1:]:
        if len(row) != len(head) or not row[name_col] or all(_number(c) is None for c in row[name_col + 1:]):
            continue   # the units row, or a truncated line
        cells = dict(zip(head, row))
        pipes, inst, stalls = {}, {}, {}
        for metric, cell in cells.items():
            value = _number(cell)
            if value is None:
                continue
            for pattern, into in ((_STALL, stalls), (_PIPE, pipes), (_PIPE_INST, inst)):
                m = pattern.match(metric)
                if m:
                    into[m.group(1)] = value
                    break
        for name, value in inst.items():   # a pipe's cycles-active share where ncu has one, else its issue share
            pipes.setdefault(name, value)
        issue = next((_number(cells[m]) * f for m, f in _ISSUE if m in cells and _number(cells[m]) is not None), None)
        time = next((_number(cells[m]) for m in _TIME if m in cells), None)
        out.append({"kernel": row[name_col], "time_ns": time, "issue_pct": issue, "pipes": pipes, "stalls": stalls})
    return out


def format_rows(provider: str, rows: list[dict], pipes: int = 3, stalls: int = 4) -> str:
    """One line a kernel: provider, kernel name (cut), µs, issue %, the busiest
    pipes and the largest stall reasons."""
    lines = []
    for r in rows:
        top_p = sorted(r["pipes"].items(), key=lambda kv: -kv[1])[:pipes]
        top_s = sorted((kv for kv in r["stalls"].items() if kv[0] != "selected"), key=lambda kv: -kv[1])[:stalls]
        us = "-" if r["time_ns"] is None else f"{r['time_ns'] / 1e3:.1f} us"
        issue = "-" if r["issue_pct"] is None else f"{r['issue_pct']:.0f} %"
        lines.append(f"{provider:12s} {r['kernel'][:48]:48s} {us:>11s}  issue {issue:>5s}  pipes "
                     + ", ".join(f"{k} {v:.0f} %" for k, v in top_p)
                     + "  stalls " + ", ".join(f"{k} {v:.2f}" for k, v in top_s))
    return "\n".join(lines)


def hopper_fwd_config(spec: str):
    """A ``HopperFwdConfig`` from "field=value,..." (ints; booleans as 0 / 1,
    true / false): ``--hopper-fwd``'s forced forward config."""
    import dataclasses

    from tileattn.configs import HopperFwdConfig
    fields = {f.name: f for f in dataclasses.fields(HopperFwdConfig)}
    kwargs = {}
    for item in filter(None, spec.split(",")):
        name, sep, value = item.partition("=")
        if not sep or name not in fields or name == "source":
            raise ValueError(f"--hopper-fwd: {item!r} is not field=value of HopperFwdConfig "
                             f"({', '.join(n for n in fields if n != 'source')})")
        low = value.strip().lower()
        kwargs[name] = low in ("1", "true") if low in ("0", "1", "true", "false") and fields[name].type in (
            "bool", bool) else int(value)
    return HopperFwdConfig(**kwargs)


def child(args) -> None:
    """The profiled process: two warm-up calls, then one inside the NVTX range."""
    import torch

    if args.child == "hopper-cfg":   # the forward with --hopper-fwd's config, through the launcher
        from tileattn import launch
        cfg = hopper_fwd_config(args.hopper_fwd)
        fn = lambda q, k, v, causal: launch.attn_fwd(q, k, v, causal, q.shape[-1] ** -0.5, config=cfg)[0]  # noqa: E731
    else:
        from tileattn.bench.providers import get_provider
        fn = get_provider(args.child).fn
    b, h, n, d = 16384 // args.seqlen, 2048 // args.head_dim, args.seqlen, args.head_dim
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    if args.mode == "bwd":
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves, args.causal)
        step = lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)  # noqa: E731
    else:
        step = lambda: fn(q, k, v, args.causal)  # noqa: E731
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(RANGE)
    step()
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--providers", nargs="+", default=["tileattn", "sdpa-cudnn"])
    ap.add_argument("--out", default="ncu-pipes", help="folder for each provider's raw CSV")
    ap.add_argument("--hopper-fwd", default=None, metavar="FIELD=VALUE,...",
                    help="also profile the Hopper forward with this forced HopperFwdConfig (provider hopper-cfg)")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        child(args)
        return 0
    providers = list(args.providers)
    if args.hopper_fwd is not None:
        if args.mode != "fwd":
            ap.error("--hopper-fwd: a forward config, with --mode fwd")
        try:
            hopper_fwd_config(args.hopper_fwd)
        except (ValueError, TypeError) as e:
            ap.error(str(e))
        providers.append("hopper-cfg")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = False
    for provider in providers:
        cmd = [args.ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", f"{RANGE}/", "--csv", "--page", "raw",
               *[x for s in SECTIONS for x in ("--section", s)],
               sys.executable, str(Path(__file__).resolve()), "--child", provider, "--mode", args.mode,
               "--head-dim", str(args.head_dim), "--seqlen", str(args.seqlen)] + (["--causal"] if args.causal else []) \
            + (["--hopper-fwd", args.hopper_fwd] if provider == "hopper-cfg" else [])
        res = subprocess.run(cmd, capture_output=True, text=True)
        name = f"{provider}-{args.mode}-d{args.head_dim}-{'causal' if args.causal else 'full'}-{args.seqlen}"
        (out_dir / f"{name}.csv").write_text(res.stdout + ("\n# stderr\n" + res.stderr if res.stderr else ""))
        try:
            rows = parse_raw_csv(res.stdout)
        except ValueError as e:
            print(f"{provider}: {e} (ncu exit {res.returncode}; {out_dir / name}.csv)\n{res.stderr[-800:]}")
            failed = True
            continue
        print(format_rows(provider, rows), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
