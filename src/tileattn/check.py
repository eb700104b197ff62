"""``tileattn check``: is every path of tileattn correct on this machine?

Each check runs one function of the library on fresh random inputs and holds
its outputs (and gradients, where it has a backward) to the accuracy rule of
``tileattn.testing``: the error against float64 standard attention must be
at most twice that of standard attention in the same precision, plus a tiny
floor.  Paths:

* ``kernels``: the Triton kernels -- compiled on a CUDA GPU; without one they
  run under the Triton interpreter (``TRITON_INTERPRET=1``) on small shapes.
* ``torch``: the pure-PyTorch tiled path (what CPU tensors run).

Functions: ``attention`` (plain, causal with Nq != Nk, GQA), its variants
(sliding window, softcap, ALiBi, block-sparse layouts), a V head dim below
the Q/K one (DeepSeek's 192 / 128), head dim 512 (float32 where its tiles
fit the GPU's shared memory, else skipped with the reason; also as V's head
dim beside Q/K's 128), ``attention_varlen`` (also with a V head dim of its
own, and with sinks), ``attention_with_kvcache`` (also with a V head dim of
its own, with sinks over three splits, and the absorbed MLA layout: D = 576,
one kv head, ``v_cache = k_cache[..., :512]``),
``scaled_dot_product_attention`` (against torch's SDPA), attention sinks
(gradients of the sinks included; also with a V head dim of its own) and, when transformers is installed, a
tiny Llama, a tiny gpt-oss (sinks, sliding windows), a tiny DeepSeek-V3 (a V
head dim below the Q/K one) and a tiny Gemma 2 (head dim 256, softcap,
sliding windows) and a tiny Gemma 4 (head dim 256 sliding, 512 global) with
``attn_implementation="tileattn"``.  The entries and
their shapes: ``tileattn.check_cases``.

The kernels run the first config of their tables that fits
(``TILEATTN_AUTOTUNE=0``): a check is about correctness, and timing every
candidate config of every shape it visits (head dims up to 576, three
dtypes) would take minutes on a GPU.  ``--autotune`` times them as a
default call does; the test suite forces every config of every table.

Without a terminal (a log, CI) each check writes one line to stderr as it
ends, so a long run shows where it is.

Exit codes: 0 every check passed, 1 a check failed, 2 bad arguments,
3 ``--device cuda`` without a GPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
import traceback
import zlib

import torch

from .check_cases import CHECKS, PATHS, Check, Skip

EXAMPLES = """examples:
  tileattn check                      # every path this machine has
  tileattn check --paths torch        # only the PyTorch tiled path
  tileattn check --json > check.json  # machine-readable; exit code 0 / 1
  tileattn check --seed 7             # other random inputs
  tileattn check --autotune           # the configs a default call would time and pick"""

_DT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


@dataclasses.dataclass
class Result:
    check: str
    path: str
    dtype: str
    shape: str
    status: str          # "pass" | "fail" | "skip"
    error: float | None = None
    allowed: float | None = None
    seconds: float = 0.0
    detail: str = ""
    seed: int | None = None   # this check's inputs (check_seed), so that --only reproduces them


# ---------------------------------------------------------------------------
# the rule over several tensors
# ---------------------------------------------------------------------------
def _judge(pairs, dtype) -> tuple[bool, float, float, str]:
    """pairs: (name, got, ref64, lowp).  The worst tensor by error / allowed."""
    from .testing import FLOOR, max_error
    worst = None
    for name, got, ref, low in pairs:
        err = max_error(got, ref)
        base = max_error(low, ref)
        if base == float("inf"):
            base = 0.0
        allowed = 2.0 * base + FLOOR[dtype]
        ratio = err / allowed if allowed > 0 else float("inf")
        if worst is None or ratio > worst[0]:
            worst = (ratio, err, allowed, name)
    ratio, err, allowed, name = worst
    return ratio <= 1.0, err, allowed, name


# ---------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------
def _kernels_usable(device: torch.device) -> tuple[bool, str]:
    if device.type == "cuda":
        return True, "compiled for " + torch.cuda.get_device_name(device)
    from ._env import interpreter_active
    if not interpreter_active():
        if "triton" in sys.modules:  # Triton reads the variable when it is imported
            return False, ("Triton was loaded without TRITON_INTERPRET=1, so its interpreter is off "
                           "(run `TRITON_INTERPRET=1 tileattn check`)")
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton  # noqa: F401
    except ImportError:
        return False, "Triton is not installed"
    return True, "Triton interpreter (no GPU): small shapes, fp32"


def plan(device: torch.device, paths) -> tuple[list, dict]:
    """(check, path, dtype) triples to run, and a note per path."""
    notes = {}
    dtypes = {}
    if "kernels" in paths:
        ok, note = _kernels_usable(device)
        notes["kernels"] = note
        if ok:
            dtypes["kernels"] = ((torch.float16, torch.bfloat16, torch.float32) if device.type == "cuda"
                                 else (torch.float32,))
    if "torch" in paths:
        notes["torch"] = "pure-PyTorch tiled path on " + str(device)
        dtypes["torch"] = (torch.float32, torch.float64) if device.type == "cpu" else (torch.float32,)
    runs = []
    for check in CHECKS:
        if check.paths == ("auto",):
            runs.append((check, "auto", torch.float32))
            continue
        for path in paths:
            if path not in dtypes:
                runs.append((check, path, None))  # reported as skipped
                continue
            if path == "kernels" and device.type != "cuda" and not check.interpreter:
                runs.append((check, path, None))
                continue
            for dt in dtypes[path]:
                runs.append((check, path, dt))
    return runs, notes


def check_seed(seed: int, check: Check) -> int:
    """The generator seed of one check's inputs: ``--seed`` plus a number of
    the check's name, the same on every path and whatever ``--only`` leaves
    in the run (so a failure of a full run reproduces alone)."""
    return seed + zlib.crc32(check.name.encode()) % 100_003


def run_one(check: Check, path: str, dtype, device, seed: int, notes) -> Result:
    """One check on one path and dtype; ``seed`` is ``--seed`` (see :func:`check_seed`)."""
    from .dispatch import use_backend
    seed = check_seed(seed, check)
    if dtype is None:
        why = notes.get(path, "")
        if path == "kernels" and device.type != "cuda" and not check.interpreter and "interpreter" in why:
            why = "too large for the Triton interpreter; runs on a GPU"
        return Result(check.name, path, "-", "-", "skip", detail=why, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    backend = {"kernels": "triton", "torch": "torch", "auto": "auto"}[path]
    if path == "auto":  # the path this device's tensors take by default
        from .dispatch import uses_triton
        path = "kernels" if uses_triton(torch.empty(0, device=device)) else "torch"
    t0 = time.perf_counter()
    try:
        with use_backend(backend):
            shape, pairs = check.run(dtype, device, gen)
        ok, err, allowed, worst = _judge(pairs, dtype)
        status, detail = ("pass" if ok else "fail"), ("" if ok else f"worst: {worst}")
    except Skip as exc:
        return Result(check.name, path, _DT[dtype], "-", "skip", detail=str(exc), seed=seed)
    except Exception as exc:  # a crash is a failed check, with its reason
        shape, err, allowed, status = "-", None, None, "fail"
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        if os.environ.get("TILEATTN_CHECK_TRACEBACK"):
            traceback.print_exc()
    return Result(check.name, path, _DT[dtype], shape, status, err, allowed, time.perf_counter() - t0, detail, seed)


def run(args) -> int:
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif args.device == "cuda" and not torch.cuda.is_available():
        print("tileattn: error: --device cuda asked for, but no CUDA device is visible. Without a GPU, "
              "`tileattn check --device cpu` checks the PyTorch tiled path and the Triton kernels under "
              "the interpreter.", file=sys.stderr)
        return 3
    else:
        device = torch.device(args.device)
    paths = tuple(dict.fromkeys(args.paths or PATHS))
    runs, notes = plan(device, paths)
    if args.only:
        runs = [r for r in runs if any(s in r[0].name for s in args.only)]
        if not runs:
            print(f"tileattn: error: --only {' '.join(args.only)} matches no check; checks: "
                  f"{', '.join(dict.fromkeys(c.name for c in CHECKS))}", file=sys.stderr)
            return 2
    saved = os.environ.get("TILEATTN_AUTOTUNE")
    if not args.autotune:
        os.environ["TILEATTN_AUTOTUNE"] = "0"
    try:
        results = _execute(runs, device, args.seed, notes, progress=not args.json and sys.stdout.isatty())
    finally:
        if saved is None:
            os.environ.pop("TILEATTN_AUTOTUNE", None)
        else:
            os.environ["TILEATTN_AUTOTUNE"] = saved
    failed = sum(r.status == "fail" for r in results)
    summary = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "paths": notes, "seed": args.seed, "passed": sum(r.status == "pass" for r in results),
               "failed": failed, "skipped": sum(r.status == "skip" for r in results),
               "autotune": bool(args.autotune), "torch": torch.__version__}
    if args.json:
        print(json.dumps({"summary": summary, "checks": [dataclasses.asdict(r) for r in results]}, indent=1))
    else:
        _print(results, summary)
    return 1 if failed or not summary["passed"] else 0


def _execute(runs, device, seed, notes, progress: bool) -> list[Result]:
    try:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    except ImportError:
        progress = False
    if not progress:  # a log, not a terminal: one line to stderr as each check ends
        results = []
        for i, (c, p, dt) in enumerate(runs):
            r = run_one(c, p, dt, device, seed, notes)
            results.append(r)
            print(f"[{i + 1}/{len(runs)}] {r.status} {r.check} [{r.path} {r.dtype}] {r.seconds:.1f}s",
                  file=sys.stderr, flush=True)
        return results
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task("checking", total=len(runs))
        for c, p, dt in runs:
            bar.update(task, description=f"{c.name} [{p}{'' if dt is None else ' ' + _DT[dt]}]")
            results.append(run_one(c, p, dt, device, seed, notes))
            bar.advance(task)
    return results


def _fmt(x):
    return "-" if x is None else f"{x:.2e}"


def _print(results: list[Result], summary: dict) -> None:
    lines = [f"tileattn check on {summary['device']} (torch {summary['torch']}, seed {summary['seed']})"]
    lines += [f"  {path}: {note}" for path, note in summary["paths"].items()]
    verdict = (f"{summary['passed']} passed, {summary['failed']} failed, {summary['skipped']} skipped")
    try:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table
    except ImportError:
        for line in lines:
            print(line)
        for r in results:
            print(f"{r.status.upper():5} {r.check:30} {r.path:8} {r.dtype:5} {r.shape:40} err {_fmt(r.error)} "
                  f"<= {_fmt(r.allowed)} {r.detail}")
        print(verdict)
        return
    # a pipe or a file: wide enough that no cell wraps (a terminal keeps its own width)
    console = Console() if sys.stdout.isatty() else Console(width=max(160, shutil.get_terminal_size().columns))
    for line in lines:
        console.print(line, highlight=False)
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for col, just in (("result", "left"), ("check", "left"), ("path", "left"), ("dtype", "left"),
                      ("shape", "left"), ("error", "right"), ("allowed", "right"), ("time", "right")):
        table.add_column(col, justify=just, no_wrap=col != "shape")
    style = {"pass": "[green]PASS[/]", "fail": "[bold red]FAIL[/]", "skip": "[yellow]skip[/]"}
    notes = []
    for r in results:
        table.add_row(style[r.status], r.check, r.path, r.dtype, r.shape, _fmt(r.error), _fmt(r.allowed),
                      f"{r.seconds:.1f}s" if r.status != "skip" else "")
        if r.detail:
            notes.append(f"{style[r.status]} {escape(f'{r.check} [{r.path} {r.dtype}]: {r.detail}')}")
    console.print(table)
    for note in dict.fromkeys(notes):
        console.print(note, highlight=False)
    console.print(("[bold red]" if summary["failed"] else "[green]") + verdict + "[/]")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("check", help="correctness of every path on this machine (pass/fail table)",
                       description=__doc__ + "\n" + EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--paths", nargs="+", choices=PATHS, default=None,
                   help="default: both; the transformers entries run the path a model would take "
                        "(the kernels on a GPU), whatever this says")
    p.add_argument("--only", nargs="+", default=None, metavar="NAME",
                   help="run the checks whose name contains one of these (e.g. varlen kvcache)")
    p.add_argument("--seed", type=int, default=0,
                   help="random inputs (default 0); each check draws from this plus a number of its name, so "
                        "--only reproduces a longer run's inputs (the JSON names each check's seed)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--autotune", action="store_true",
                   help="time the kernels' candidate configs as a default call does (default: the first that "
                        "fits each table, TILEATTN_AUTOTUNE=0; far faster on a GPU)")
    p.set_defaults(func=run)
    return p
