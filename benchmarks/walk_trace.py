"""Where a persistent Hopper forward's programs spend their time: each
program's SM, start and the end of each work item, read from the global timer
inside the kernel (``launch.hopper.attn_fwd(trace=)``, ``kernels/fwd_hopper._mark``;
a build without the trace has no such code).  Needs a Hopper GPU.

    python benchmarks/walk_trace.py --head-dim 64 --seqlens 2048 8192 --variants pers-rt pers-rt-sk

Per call (FA2 protocol: 16k tokens a batch, hidden 2048, bf16) and variant
(the table's config made persistent, with ``-sk``: and the stream-K tail;
``-nc``: the non-causal table's; ``-sinks`` / ``-rem``: with sinks / and the
output's remainder; see :func:`variant`),
rounds interleaved: the programs' mean and latest end (µs from the first
start; the mean is the busy time a perfect balance would end at), and the
whole units' mean time and its spread over programs (slowest program's mean
over the fastest's: how much a static assignment loses to the SMs' own
speeds).  A program's first ``kernels/fwd_hopper.TRACE_SLOTS`` - 2 works
are recorded (its end is then the last of those).  ``--json FILE`` keeps
every round's raw rows.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def variant(head_dim: int, name: str):
    """The table's config made persistent; in the name ``-sk``: with the
    stream-K tail, ``-s<n>``: n ring stages, ``-nc``: the non-causal
    table's config (``configs.HOPPER_FWD_NONCAUSAL``, d = 64: three softmax
    warpgroups) where it has one."""
    from tileattn.configs import HOPPER_FWD
    from tileattn.launch.hopper import config_for
    base = config_for(head_dim) if "-nc" in name else HOPPER_FWD[(head_dim, head_dim)]
    stages = re.search(r"-s(\d+)\b", name)
    return dataclasses.replace(base, persistent=True, stream_k="-sk" in name,
                               num_stages=int(stages.group(1)) if stages else base.num_stages)


def call_kwargs(name: str, heads: int, device="cuda") -> dict:
    """The call's extras by the variant's name: ``-sinks`` attention sinks,
    ``-rem`` sinks and the output's rounding remainder (a forward whose
    sinks will be differentiated)."""
    import torch
    if "-rem" not in name and "-sinks" not in name:
        return {}
    return dict(sinks=torch.linspace(-2.0, 2.0, heads, device=device), remainder="-rem" in name)


def summary(rows: list[list[int]], whole: int) -> dict:
    """Ends and whole-unit times (µs) from one call's rows: entry 0 the SM,
    1 the start, 2 + w the end of work w (0 where the program had none)."""
    t0 = min(r[1] for r in rows)
    ends, rates = [], []
    for r in rows:
        marks = [r[1]] + [x for x in r[2:] if x > 0]
        ends.append((marks[-1] - t0) / 1e3)
        steps = [(b - a) / 1e3 for a, b in zip(marks, marks[1:])][:whole]
        rates.append(statistics.mean(steps))
    return {"end_mean": statistics.mean(ends), "end_max": max(ends), "unit_mean": statistics.mean(rates),
            "unit_spread_pct": 100 * (max(rates) / min(rates) - 1), "sms": len({r[0] for r in rows})}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--variants", nargs="+", default=["pers-rt", "pers-rt-sk"])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    import torch
    from tileattn.kernels.fwd_hopper import TRACE_SLOTS
    from tileattn.launch import hopper
    raw = {}
    for d in args.head_dim:
        for n in args.seqlens:
            h, b = 2048 // d, max(1, 16384 // n)
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            cfgs = {name: variant(d, name) for name in args.variants}
            extra = {name: call_kwargs(name, h) for name in args.variants}
            traces, whole = {}, {}   # a config's clock rows; its whole units a program (stream-K pieces not counted)
            for name, cfg in cfgs.items():   # compile and warm
                units, programs, tail = hopper._walk(q, k, args.causal, cfg)
                traces[name] = torch.zeros(programs, TRACE_SLOTS.value, dtype=torch.int64, device="cuda")
                hopper.attn_fwd(q, k, v, args.causal, d ** -0.5, config=cfg, trace=traces[name], **extra[name])
                whole[name] = (tail[0] if tail else units) // programs
            for r in range(args.rounds):
                for name, cfg in cfgs.items():
                    trace = traces[name]
                    trace.zero_()
                    hopper.attn_fwd(q, k, v, args.causal, d ** -0.5, config=cfg, trace=trace, **extra[name])
                    torch.cuda.synchronize()
                    rows = trace.tolist()
                    raw.setdefault(f"d{d}-N{n}-{name}", []).append(rows)
                    s = summary(rows, max(1, whole[name] - 1))
                    print(f"d={d} N={n} {'causal' if args.causal else 'full'} {name:12s} round {r}: "
                          f"end mean {s['end_mean']:8.1f} max {s['end_max']:8.1f} us  "
                          f"unit {s['unit_mean']:7.2f} us, spread {s['unit_spread_pct']:.1f} %  "
                          f"({s['sms']} SMs)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(raw))


if __name__ == "__main__":
    main()
