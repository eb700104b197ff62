"""``tileattn bench``: tileattn beside torch SDPA (flash, cuDNN and efficient
backends forced), FlexAttention (compiled), FlashAttention-4 (fa4, when
flash-attn-4 is installed) and standard attention, in one process, on the
FlashAttention-2 protocol by default: bf16, 16k tokens in total
(batch = 16384 / N), hidden 2048 (heads = 2048 / d), d in {64, 128},
N in {512, 1k, 2k, 4k, 8k, 16k}, causal and not, fwd, bwd and fwd+bwd.

At each point the providers are timed in --rounds rounds (default 3), every
provider once per round, rotated (odd rounds reversed); a provider's time is
its median over the rounds (each round: a triton.testing.do_bench median,
warm-up included), so clock drift during a point does not favour one
provider.  The table gives TFLOP/s, tileattn's ratio to every other provider
and every provider's ratio to the --baseline (default sdpa-cudnn; when it
cannot run here, the first SDPA backend that can, with a note).  TFLOP/s use
tileattn.cost.io.attention_flops; achieved GB/s use the IO model's bytes
(tiled model for tileattn, sdpa-*, flex and fa4; eager standard model
for standard).  Every provider's output (and gradients, for modes with a
backward) is checked against float32 standard attention and against tileattn
on the first N of each configuration; a provider above the tolerance is
marked "wrong".  Providers that are missing, fail or run out of memory are
reported as such.  Rows are appended to OUT/bench.csv and OUT/bench.jsonl
as each point finishes (a run stopped part-way keeps the points it timed),
with the GPU, driver, torch/triton versions and git commit.

Exit codes: 0 ok, 1 tileattn failed its correctness check, 2 bad arguments,
3 a GPU was asked for (or the full protocol run) on a machine without one."""
from __future__ import annotations

import argparse
import collections
import json
import math
import sys
from pathlib import Path

import torch

from . import providers as _providers
from . import runner
from .results import METADATA_FIELDS, collect_metadata, write_results

EXAMPLES = """examples:
  tileattn bench                                   # the full FA2 protocol on this GPU
  tileattn bench --head-dims 128 --seqlens 1k 4k 16k --modes fwd --causal yes
  tileattn bench --providers tileattn sdpa-flash --plot --out results/h200
  tileattn bench --kv-heads 4 --dtype fp16         # GQA: 4 k/v heads per layer
  tileattn bench --batch 2 --heads 8 --seqlens 32k # any shape
  tileattn bench --quick --device cpu --json       # a tiny smoke test, no GPU needed
  tileattn bench --plot-from bench-results/bench.jsonl --out figures/"""

DEFAULT_BASELINE = "sdpa-cudnn"
SDPA_PROVIDERS = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient")

QUICK = {"cuda": dict(head_dims=(64,), seqlens=(256, 512), tokens=2048, hidden=256),
         "cpu": dict(head_dims=(32,), seqlens=(64, 128), tokens=256, hidden=64)}


def _seqlen(text: str) -> int:
    """An integer, optionally with a k suffix (1k = 1024)."""
    t = text.strip().lower()
    try:
        return int(float(t[:-1]) * 1024) if t.endswith("k") else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid length {text!r} (an integer, or with k: 512, 1k, 16k)") from None


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="benchmark tileattn against SDPA backends, FlexAttention and standard attention",
                       description=__doc__ + "\n\n" + EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("sweep")
    g.add_argument("--head-dims", type=int, nargs="+", default=None, metavar="D", help="default: 64 128")
    g.add_argument("--seqlens", type=_seqlen, nargs="+", default=None, metavar="N",
                   help="sequence lengths (k suffix allowed); default: 512 1k 2k 4k 8k 16k")
    g.add_argument("--modes", nargs="+", default=None, metavar="MODE",
                   help=f"any of {', '.join(runner.MODES)}; default: all three")
    g.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    g.add_argument("--providers", nargs="+", default=None, metavar="NAME",
                   help=f"default: {' '.join(_providers.DEFAULT_PROVIDERS)}")
    g.add_argument("--dtype", choices=sorted(runner.DTYPES), default=None, help="default: bf16 (fp32 on the CPU)")
    g.add_argument("--quick", action="store_true", help="a tiny sweep (smoke test; runs on the CPU in seconds)")
    s = p.add_argument_group("shape (FA2 protocol: batch = tokens / N, heads = hidden / d)")
    s.add_argument("--tokens", type=int, default=None, help=f"tokens per batch; default {runner.FA2_TOKENS}")
    s.add_argument("--hidden", type=int, default=None, help=f"model width; default {runner.FA2_HIDDEN}")
    s.add_argument("--kv-heads", type=int, default=None, help="k/v heads (GQA); default: as many as query heads")
    s.add_argument("--batch", type=int, default=None, help="fixed batch (overrides --tokens)")
    s.add_argument("--heads", type=int, default=None, help="fixed query heads (overrides --hidden)")
    m = p.add_argument_group("measurement")
    m.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    m.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms (default 25)")
    m.add_argument("--rep", type=int, default=100, help="do_bench measurement, ms (default 100)")
    m.add_argument("--repeats", type=int, default=3, help="timing repeats without CUDA (default 3)")
    m.add_argument("--rounds", type=int, default=3,
                   help="timing rounds per point, every provider once per round, rotated, odd rounds reversed; "
                        "the time is the median over rounds (default 3)")
    m.add_argument("--baseline", default=None, metavar="NAME",
                   help=f"provider the table's ratio rows divide by (default {DEFAULT_BASELINE}; if it cannot "
                        f"run here, the first SDPA backend that can)")
    m.add_argument("--tolerance", type=float, default=None,
                   help="relative error that marks a provider wrong (default 2e-2 bf16/fp16, 1e-3 fp32)")
    o = p.add_argument_group("output")
    o.add_argument("--out", default="bench-results", metavar="DIR", help="results folder (default bench-results/)")
    o.add_argument("--plot", action="store_true", help="draw tflops.png, speedup.png, memory.png into --out")
    o.add_argument("--plot-from", default=None, metavar="FILE",
                   help="only draw the plots from an existing bench.jsonl / bench.csv (its last run)")
    o.add_argument("--json", action="store_true", help="print a JSON summary on stdout (table and progress on stderr)")
    o.add_argument("--list-providers", action="store_true", help="list providers and whether they run here")
    p.set_defaults(func=run)
    return p


def _err(msg: str) -> int:
    print(f"tileattn bench: error: {msg}", file=sys.stderr)
    return 2


def _device(args) -> torch.device | None:
    if args.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        return None
    return torch.device(args.device)


def build_config(args, device: torch.device) -> runner.BenchConfig:
    quick = QUICK[device.type if device.type in QUICK else "cpu"] if args.quick else {}
    pick = lambda value, key, default: value if value is not None else quick.get(key, default)  # noqa: E731
    return runner.BenchConfig(
        head_dims=tuple(pick(args.head_dims, "head_dims", runner.FA2_HEAD_DIMS)),
        seqlens=tuple(pick(args.seqlens, "seqlens", runner.FA2_SEQLENS)),
        modes=tuple(args.modes or runner.MODES),
        causal={"both": (False, True), "yes": (True,), "no": (False,)}[args.causal],
        providers=tuple(args.providers or _providers.DEFAULT_PROVIDERS),
        dtype=args.dtype or ("bf16" if device.type == "cuda" else "fp32"),
        tokens=pick(args.tokens, "tokens", runner.FA2_TOKENS),
        hidden=pick(args.hidden, "hidden", runner.FA2_HIDDEN),
        kv_heads=args.kv_heads, batch=args.batch, heads=args.heads, device=str(device),
        warmup_ms=args.warmup, rep_ms=args.rep, cpu_repeats=args.repeats, rounds=args.rounds,
        tolerance=args.tolerance)


def resolve_baseline(requested, providers: tuple, device: torch.device) -> tuple[str | None, str]:
    """(baseline provider or None, a note saying why it is not the one asked
    for, or ""): ``requested`` (None = the default, sdpa-cudnn) when it is in
    the run and can run on ``device``, else the first SDPA backend that is and
    can.  An explicit name that is unknown or not among ``providers`` raises
    ValueError naming --baseline."""
    if requested is not None:
        if requested not in _providers.PROVIDERS:
            raise ValueError(f"--baseline: unknown provider {requested!r} (known: {', '.join(_providers.PROVIDERS)})")
        if requested not in providers:
            raise ValueError(f"--baseline: {requested!r} is not among the providers run ({', '.join(providers)})")
    want = requested or DEFAULT_BASELINE
    if want in providers:
        why = _providers.available_reason(want, device)
        if why is None:
            return want, ""
    else:
        why = "not among --providers"
    for name in SDPA_PROVIDERS:
        if name != want and name in providers and _providers.available_reason(name, device) is None:
            return name, f"baseline {name}: {want} cannot be the baseline here ({why})"
    return None, f"no baseline: {want} cannot run here ({why}) and no other SDPA backend can"


class _Progress:
    """rich progress bar on stderr, or plain lines when rich is missing."""

    def __init__(self, total: int):
        self.total, self.done, self._bar = total, 0, None
        try:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=Console(stderr=True), transient=False)
            self._task = self._bar.add_task("bench", total=total)
        except ImportError:
            pass

    def __enter__(self):
        if self._bar:
            self._bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self._bar:
            self._bar.__exit__(*exc)

    def step(self, desc: str) -> None:
        if self._bar:
            self._bar.update(self._task, description=desc)
        else:  # rows finish a point at a time, after its timing rounds
            print(f"[{self.done}/{self.total} done] {desc}", file=sys.stderr, flush=True)

    def row(self, row) -> None:
        self.done += 1
        if self._bar:
            self._bar.advance(self._task)


def _cell(r) -> str:
    if r["status"] == "ok":
        t = r["tflops"]
        return f"{t:.1f}" if t >= 10 else f"{t:.3g}"
    return {"oom": "OOM"}.get(r["status"], r["status"].split(":")[0].upper())


def _ratio(a, b) -> str:
    if a and b and a.get("status") == "ok" and b.get("status") == "ok":
        return f"{a['tflops'] / b['tflops']:.2f}x"
    return "-"


def _ran(at, name, ns) -> bool:
    return any(at.get((name, n), {}).get("status") == "ok" for n in ns)


def tables(rows: list[dict], baseline: str | None = DEFAULT_BASELINE) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, body) per configuration: provider x N in TFLOP/s, then
    ``tileattn / <peer>`` for every peer, then ``<provider> / <baseline>`` for
    every other provider (speed ratios: > 1 is faster than the divisor), each
    row only where both ran at some N."""
    out = []
    configs = list(dict.fromkeys((r["head_dim"], r["causal"], r["mode"]) for r in rows))
    for d, causal, mode in configs:
        sel = [r for r in rows if (r["head_dim"], r["causal"], r["mode"]) == (d, causal, mode)]
        ns = sorted({r["seqlen_q"] for r in sel})
        provs = list(dict.fromkeys(r["provider"] for r in sel))
        at = {(r["provider"], r["seqlen_q"]): r for r in sel}
        r0 = sel[0]
        title = (f"d={d} {'causal' if causal else 'non-causal'} {mode}: TFLOP/s "
                 f"({r0['dtype']}, batch x heads = {r0['batch']}x{r0['heads']} at N={r0['seqlen_q']}"
                 f"{', kv heads ' + str(r0['kv_heads']) if r0['kv_heads'] != r0['heads'] else ''})")
        body = [[p] + [_cell(at[(p, n)]) if (p, n) in at else "" for n in ns] for p in provs]
        pairs = [("tileattn", other) for other in provs if other != "tileattn"]
        if baseline is not None:
            pairs += [(p, baseline) for p in provs if p not in (baseline, "tileattn")]
        for a, b in pairs:
            if a in provs and b in provs and _ran(at, a, ns) and _ran(at, b, ns):
                body.append([f"{a} / {b}"] + [_ratio(at.get((a, n)), at.get((b, n))) for n in ns])
        out.append((title, ["provider"] + [f"N={n}" for n in ns], body))
    return out


def print_tables(rows: list[dict], meta: dict, file, baseline: str | None = DEFAULT_BASELINE,
                 baseline_note: str = "") -> None:
    head = (f"{meta.get('gpu')} | driver {meta.get('driver')} | torch {meta.get('torch')} | "
            f"triton {meta.get('triton')} | commit {meta.get('git_commit')}")
    rounds = sorted({r["rounds"] for r in rows if r.get("rounds")})
    notes = [runner.BYTES_MODEL_NOTE + " (in the CSV/JSON, with ms, each round's ms and peak memory).",
             "Cells: TFLOP/s, the median over " + ("/".join(map(str, rounds)) if rounds else "the") +
             " timing rounds (providers interleaved, rotated, odd rounds reversed); OOM = out of memory; "
             "UNAVAILABLE / FAILED / WRONG: see the status column.",
             "Ratios: TFLOP/s of the left provider over the right one's (> 1: the left is faster)."]
    if baseline_note:
        notes.insert(0, baseline_note)
    try:
        from rich.console import Console
        from rich.table import Table
        console = Console(file=file)
        console.print(head)
        for title, header, body in tables(rows, baseline):
            t = Table(title=title, title_justify="left")
            for i, col in enumerate(header):
                t.add_column(col, justify="left" if i == 0 else "right")
            for line in body:
                t.add_row(*line)
            console.print(t)
        for n in notes:
            console.print(n, style="dim")
    except ImportError:
        print(head, file=file)
        for title, header, body in tables(rows, baseline):
            print("\n" + title, file=file)
            for line in [header] + body:
                print("  " + line[0].ljust(24) + " ".join(c.rjust(10) for c in line[1:]), file=file)
        for n in notes:
            print(n, file=file)


def _problems(rows: list[dict]) -> list[str]:
    seen = {}
    for r in rows:
        if r["status"] not in ("ok", "oom"):
            seen.setdefault((r["provider"], r["status"]), r)
    return [f"{p}: {s}" for p, s in seen]


def _finite(x):
    return None if isinstance(x, float) and not math.isfinite(x) else x


def run(args) -> int:
    if args.list_providers:
        device = _device(args) or torch.device("cpu")
        states = {name: p.unavailable_reason(device) for name, p in _providers.PROVIDERS.items()}
        states = {name: "ok" if why is None else f"unavailable: {why}" for name, why in states.items()}
        width = max(34, *(len(s) for s in states.values()))
        for name, p in _providers.PROVIDERS.items():
            print(f"{name:16} {states[name]:{width}} {p.description}")
        return 0
    if args.plot_from:
        if not Path(args.plot_from).is_file():
            return _err(f"--plot-from: no such file {args.plot_from!r}")
        from .plots import plot_results
        try:
            paths = plot_results(args.plot_from, args.out)
        except ValueError as e:
            return _err(f"--plot-from: {e}")
        for path in paths:
            print(f"wrote {path}")
        return 0
    device = _device(args)
    if device is None:
        print("tileattn bench: error: --device cuda asked for, but no CUDA device is visible; "
              "use --quick --device cpu for a CPU smoke test", file=sys.stderr)
        return 3
    if device.type != "cuda" and not args.quick and args.seqlens is None:
        print("tileattn bench: error: the full FA2 protocol (16k tokens, hidden 2048) needs a GPU and none is "
              "visible; run `tileattn bench --quick` for a CPU smoke test, or give --seqlens to run chosen "
              "shapes on the CPU", file=sys.stderr)
        return 3
    cfg = build_config(args, device)
    try:
        cfg.validate()
        baseline, baseline_note = resolve_baseline(args.baseline, cfg.providers, device)
    except ValueError as e:
        return _err(str(e))

    meta = collect_metadata(device)
    out_stream = sys.stderr if args.json else sys.stdout
    files = {}

    def keep(row):   # each row appended as it finishes: a run cut short keeps the points it timed
        prog.row(row)
        files.update(write_results([row], args.out))

    with _Progress(cfg.total_steps()) as prog:
        rows = runner.run_sweep(cfg, metadata=meta, on_step=prog.step, on_row=keep)
    if not rows:
        files = write_results(rows, args.out)
    dicts = [r.as_dict() for r in rows]
    print_tables(dicts, meta, out_stream, baseline, baseline_note)
    for line in _problems(dicts):
        print(f"  note: {line}", file=out_stream)
    plots = []
    if args.plot:
        from .plots import plot_results
        plots = [str(p) for p in plot_results(dicts, args.out, baseline=baseline if args.baseline else None)]
    print(f"results appended to {files['csv']} and {files['jsonl']}"
          + (f"; plots: {', '.join(plots)}" if plots else ""), file=out_stream)
    if args.json:
        summary = {
            "meta": meta, "device": str(device), "bytes_model": runner.BYTES_MODEL_NOTE,
            "config": {k: v for k, v in vars(cfg).items()}, "files": files, "plots": plots,
            "baseline": baseline, "baseline_note": baseline_note,
            "status_counts": dict(collections.Counter(r["status"].split(":")[0] for r in dicts)),
            "rows": [{k: _finite(v) for k, v in r.items() if k not in METADATA_FIELDS} for r in dicts],
        }
        print(json.dumps(summary, indent=1, default=str))
    tile_wrong = any(r["provider"] == "tileattn" and r["status"].startswith("wrong") for r in dicts)
    return 1 if tile_wrong else 0
