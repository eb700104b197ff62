"""CLI subcommands of the IO cost model: ``io``, ``roofline``, ``report``, ``calibrate``.

``tileattn.cli`` calls :func:`register` on its subparsers; this module can
also be run on its own: ``python -m tileattn.cost.commands io --hw ...``.
Exit codes: 0 ok, 2 bad arguments or unknown hardware, 3 no GPU (calibrate).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import warnings
from pathlib import Path

from . import hardware as _hw, sparse
from .io import AttentionShape, DTYPE_BYTES, FUSION_LEVELS
from .format import header_lines, summary_rows
from .roofline import Comparison, compare

EXIT_OK, EXIT_BAD_ARGS, EXIT_NO_GPU = 0, 2, 3


class _Fmt(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Examples kept as written; defaults shown, except None (the help says what then)."""

    def _get_help_string(self, action):
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


DEFAULT_HW = "nvidia-h200"
# API argument -> CLI flag, for messages the model raises on the commands' behalf
_FLAGS = {"hw_file": "--hw-file", "hw": "--hw", "batch": "--batch", "heads": "--heads", "kv_heads": "--kv-heads",
          "seqlen_q": "--seqlen", "seqlen_k": "--seqlen-k", "head_dim": "--head-dim", "head_dim_v": "--head-dim-v",
          "measured": "--measured", "repeats": "--repeats", "size_mb": "--size-mb", "matmul_n": "--matmul-n"}
_FLAG_RE = re.compile(r"(?<![\w.-])(" + "|".join(sorted(_FLAGS, key=len, reverse=True)) + r")=")


def flag_message(msg: str) -> str:
    """A model error message with its Python argument names (``seqlen_q=0``)
    replaced by the flags the user typed (``--seqlen=0``)."""
    return _FLAG_RE.sub(lambda m: _FLAGS[m.group(1)] + "=", msg)


def _add_shape_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("hardware")
    g.add_argument("--hw", default=None,
                   help=f"hardware name: {', '.join(sorted(_hw.CATALOGUE))}, or an entry of the user folder "
                        f"({_hw.USER_DIR_HELP}); with --hw-file, the file's entry to use (needed only if it holds "
                        f"several) (default: {DEFAULT_HW}, or the only entry of --hw-file)")
    g.add_argument("--hw-file", default=None,
                   help="TOML or JSON file describing the hardware (one entry, or several: then --hw picks)")
    g.add_argument("--basis", choices=("datasheet", "measured"), default="datasheet",
                   help="which peak/bandwidth figures to use (measured falls back to datasheet)")
    s = p.add_argument_group("shape")
    s.add_argument("--batch", type=int, default=8, help="batch size B")
    s.add_argument("--heads", type=int, default=32, help="query heads")
    s.add_argument("--kv-heads", type=int, default=None, help="key/value heads (GQA); default = --heads")
    s.add_argument("--seqlen", type=int, default=4096, help="query length N (and key length unless --seqlen-k)")
    s.add_argument("--seqlen-k", type=int, default=None, help="key length")
    s.add_argument("--head-dim", type=int, default=128, help="head dim of q and k")
    s.add_argument("--head-dim-v", type=int, default=None, help="head dim of v (and the output); default = --head-dim")
    s.add_argument("--causal", action="store_true",
                   help="causal mask, bottom-right aligned (query i sees key j <= i + Nk - Nq)")
    s.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="bf16", help="element type of q, k, v and o")
    s.add_argument("--fusion", choices=FUSION_LEVELS, default="eager",
                   help="standard attention: textbook passes or PyTorch eager as the reference runs it")
    s.add_argument("--no-l2", action="store_true",
                   help="count every tile load of the tiled kernels as an HBM read (no L2 reuse)")


def _err(msg: str) -> int:
    print(f"tileattn: error: {msg}", file=sys.stderr)
    return EXIT_BAD_ARGS


def _warn(msg: str) -> None:
    print(f"tileattn: warning: {msg}", file=sys.stderr)


def _hardware(args) -> _hw.Hardware:
    """--hw / --hw-file as a Hardware: the file's entry (named by --hw if it
    holds several), else --hw, else the default.  User files that fail to
    load are reported as one-line warnings (an unknown --hw's error lists
    them itself)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", _hw.HardwareFileWarning)
        hw = _hw.get_hardware(args.hw or (None if args.hw_file else DEFAULT_HW), args.hw_file)
    for msg in dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, _hw.HardwareFileWarning)):
        _warn(msg)
    return hw


def _setup(args) -> tuple[Comparison | None, int]:
    try:
        hw = _hardware(args)
        shape = AttentionShape(batch=args.batch, heads=args.heads, seqlen_q=args.seqlen, head_dim=args.head_dim,
                               seqlen_k=args.seqlen_k, kv_heads=args.kv_heads, causal=args.causal,
                               dtype=args.dtype, head_dim_v=args.head_dim_v)
        comp = compare(shape, hw, fusion=args.fusion, basis=args.basis, l2_reuse=not args.no_l2)
    except ValueError as exc:
        return None, _err(flag_message(str(exc)))
    return comp, EXIT_OK


def _print_table(title_lines, rows) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text
        for line in title_lines:
            print(line)
        w = max(len(r[0]) for r in rows)
        print(f"{'':<{w}}  {'standard':>14}  {'tiled':>14}  {'std/tiled':>9}")
        for r in rows:
            print(f"{r[0]:<{w}}  {r[1]:>14}  {r[2]:>14}  {r[3]:>9}")
        return
    console = Console()
    for line in title_lines:
        console.print(line, highlight=False, soft_wrap=True)
    t = Table(show_header=True, header_style="bold")
    t.add_column("quantity")
    t.add_column("standard", justify="right")
    t.add_column("tiled", justify="right")
    t.add_column("std / tiled", justify="right")
    for r in rows:
        t.add_row(*r)
    console.print(t)


# ---------------------------------------------------------------------------
# handlers
# ---------------------------------------------------------------------------
def cmd_io(args) -> int:
    comp, rc = _setup(args)
    if comp is None:
        return rc
    if args.json:
        d = comp.as_dict()
        d["summary"] = [dict(zip(("quantity", "standard", "tiled", "ratio"), r)) for r in summary_rows(comp)]
        if args.density is not None:
            d["block_sparse"] = sparse.sparse_summary(comp, args.density)
        print(json.dumps(d, indent=2, default=str))
    else:
        _print_table(header_lines(comp), summary_rows(comp))
        if args.density is not None:
            sparse.print_sparse_summary(comp, args.density)
    return EXIT_OK


def load_measured(path) -> list[dict]:
    """Rows of a ``benchmarks/measure_bytes.py`` results file (a list, or ``{"rows": [...]}``)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"measured={str(path)!r}: cannot read results: {exc}") from None
    rows = data.get("rows", []) if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise ValueError(f"measured={str(path)!r}: expected a list of rows or an object with 'rows'")
    return rows


def measured_points(rows, shape: AttentionShape) -> list[dict]:
    """Measured rows of ``shape`` as roofline points (model FLOPs over measured bytes and time)."""
    from .validation import measured_bytes, model_flops, row_shape
    pts = []
    for r in rows:
        try:
            s = row_shape(r)
        except (KeyError, TypeError, ValueError):
            continue
        if (s.batch, s.heads, s.kv_heads, s.seqlen_q, s.seqlen_k, s.head_dim, s.head_dim_v, s.causal) != (
                shape.batch, shape.heads, shape.kv_heads, shape.seqlen_q, shape.seqlen_k, shape.head_dim,
                shape.head_dim_v, shape.causal):
            continue
        try:
            byt = measured_bytes(r)
        except (KeyError, TypeError, ValueError):
            continue
        t = r.get("time_ms")
        pts.append({"impl": r.get("impl"), "mode": r.get("mode"), "bytes": byt,
                    "time_s": t / 1e3 if t else None, "flops": model_flops(r)})
    return pts


def _measured_for(args, comp: Comparison) -> list:
    """The --measured file's points for this shape ([] without the option);
    ValueError for a file that cannot be read."""
    if not args.measured:
        return []
    return measured_points(load_measured(args.measured), comp.shape)


def check_output(path, what: str, formats: tuple[str, ...] | None = None) -> str | None:
    """Why ``-o path`` cannot be written (None if it can): its folder must
    exist, the path must not be a folder, and with ``formats`` its suffix must
    be one of them."""
    p = Path(path)
    if p.is_dir():
        return f"--output {path}: is a directory; name a file, e.g. {p / what}"
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        return f"--output {path}: no such directory {str(parent)!r}"
    if formats is not None and p.suffix.lower().lstrip(".") not in formats:
        return (f"--output {path}: cannot write {p.suffix or 'a file without a suffix'}; "
                f"use one of {', '.join('.' + f for f in formats)}")
    return None


def _plot_formats() -> tuple[str, ...]:
    """The file suffixes matplotlib can save (ImportError without matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    return tuple(sorted(Figure().canvas.get_supported_filetypes()))


def _draw(args, draw, what: str, note_unmatched: bool, formats=None) -> int:
    """Model the shape, read --measured and write args.output with
    ``draw(comparison, output, measured)``; ``formats()`` gives the suffixes
    the output may have (None: any)."""
    try:
        bad = check_output(args.output, "roofline.png" if formats else "report.html",
                           formats() if formats else None)
    except ImportError:
        return _err(f"{what} needs matplotlib: pip install 'tileattn[cli]'")
    if bad:
        return _err(bad)
    comp, rc = _setup(args)
    if comp is None:
        return rc
    try:
        measured = _measured_for(args, comp)
    except ValueError as exc:
        return _err(flag_message(str(exc)))
    if note_unmatched and args.measured and not measured:
        print(f"note: no row of {args.measured} matches this shape; plotting the model only", file=sys.stderr)
    try:
        draw(comp, args.output, measured)
    except ImportError:
        return _err(f"{what} needs matplotlib: pip install 'tileattn[cli]'")
    except OSError as exc:
        return _err(f"--output {args.output}: cannot write: {exc.strerror or exc}")
    print(f"wrote {args.output}")
    return EXIT_OK


def _plot_roofline(comp, output, measured):
    from .roofline import plot_roofline
    plot_roofline(comp, output, measured=measured)


def _write_report(comp, output, measured):
    from .report import write_report
    write_report(comp, output, measured=measured)


def cmd_roofline(args) -> int:
    return _draw(args, _plot_roofline, "the roofline plot", note_unmatched=True, formats=_plot_formats)


def cmd_report(args) -> int:
    return _draw(args, _write_report, "the report", note_unmatched=False)


def cmd_calibrate(args) -> int:
    from .calibrate import calibrate, NoGPUError
    try:
        path, hw = calibrate(name=args.name, output=args.output, repeats=args.repeats, size_mb=args.size_mb,
                             matmul_n=args.matmul_n)
    except NoGPUError as exc:
        print(f"tileattn: {exc}", file=sys.stderr)
        return EXIT_NO_GPU
    except ValueError as exc:
        return _err(flag_message(str(exc)))
    except OSError as exc:
        return _err(f"--output {args.output}: cannot write: {exc.strerror or exc}")
    bw = hw.measured["hbm_bandwidth"].value
    pk = hw.measured["peak_flops.bf16"].value
    print(f"{hw.display_name}: copy bandwidth {bw / 1e12:.3g} TB/s, bf16 matmul {pk / 1e12:.4g} TFLOP/s")
    print(f"wrote {path} ({calibrate_advice(path, hw.name)})")
    return EXIT_OK


def calibrate_advice(path, name: str) -> str:
    """How to use a file ``tileattn calibrate`` wrote: ``--hw name`` finds it
    only in the user folder; ``--hw-file`` works anywhere (its only entry)."""
    try:
        in_user_dir = Path(path).resolve().parent == _hw.user_hardware_dir().resolve()
    except OSError:
        in_user_dir = False
    if in_user_dir:
        return f"use --hw {name}, or --hw-file {path}"
    return f"use --hw-file {path}; --hw {name} works once the file is in {_hw.user_hardware_dir()}"


# ---------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------
def _add_drawing_args(p, output: str, output_help: str, func) -> None:
    _add_shape_args(p)
    p.add_argument("-o", "--output", default=output, help=output_help)
    p.add_argument("--measured", default=None, help="results JSON of benchmarks/measure_bytes.py to overlay")
    p.set_defaults(func=func)


def register(subparsers) -> None:
    """Add ``io``, ``roofline``, ``report`` and ``calibrate`` to an argparse subparsers object."""
    p = subparsers.add_parser(
        "io", formatter_class=_Fmt,
        help="FLOPs, HBM bytes, intensity, bound, predicted time: standard vs tiled",
        description="Model one attention layer on a GPU: FLOPs, HBM bytes (standard vs tiled, forward and "
                    "backward), arithmetic intensity, ridge point, bound, roofline time and memory.",
        epilog="example:\n  tileattn io --hw nvidia-a100-80gb-sxm4 --batch 8 --heads 32 --seqlen 16384 "
               "--head-dim 128 --dtype bf16\n  tileattn io --hw nvidia-h200 --seqlen 8192 --causal --json")
    _add_shape_args(p)
    p.add_argument("--json", action="store_true", help="print everything as JSON")
    p.add_argument("--density", type=sparse.density_arg, default=None,
                   help="also model block-sparse kernels whose layout has this fraction of blocks on, in (0, 1]")
    p.set_defaults(func=cmd_io)

    p = subparsers.add_parser(
        "roofline", formatter_class=_Fmt, help="plot both implementations on the hardware's roofline (PNG)",
        description="Log-log roofline of the chosen hardware with standard and tiled attention (forward and "
                    "forward+backward), and measured points from a benchmark results file.",
        epilog="example:\n  tileattn roofline --hw nvidia-h200 --batch 64 --heads 16 --seqlen 1024 --head-dim 64 "
               "-o roofline.png\n  tileattn roofline --hw nvidia-h200 ... --measured "
               "src/tileattn/cost/data/measured_h200.json")
    _add_drawing_args(p, "roofline.png", "PNG to write", cmd_roofline)

    p = subparsers.add_parser(
        "report", formatter_class=_Fmt, help="self-contained HTML report for one hardware and shape",
        description="One HTML page (plots embedded): why attention is bandwidth-bound, the exact rescaling "
                    "identity, the bytes of both implementations, tile shapes, roofline, scaling and limits. "
                    "Every number is computed for the given hardware and shape.",
        epilog="example:\n  tileattn report --hw nvidia-h200 --batch 8 --heads 32 --seqlen 16384 --head-dim 128 "
               "-o report.html")
    _add_drawing_args(p, "report.html", "HTML file to write", cmd_report)

    p = subparsers.add_parser(
        "calibrate", formatter_class=_Fmt, help="measure this GPU's copy bandwidth and bf16 matmul rate",
        description="Time a device-to-device copy and a bf16 matmul (CUDA events, warm-up, median of repeats) "
                    "and store them as a 'measured' hardware entry that --hw / --hw-file can load. "
                    "Needs a CUDA GPU (exit code 3 without one).",
        epilog="example:\n  tileattn calibrate --name my-h200\n  tileattn io --hw my-h200 --basis measured")
    p.add_argument("--name", default=None, help="entry name (default: derived from the device name)")
    p.add_argument("-o", "--output", default=None,
                   help=f"JSON file to write (default: <name>.json in the user folder, {_hw.USER_DIR_HELP})")
    p.add_argument("--repeats", type=int, default=20, help="timed runs of each measurement (the median is kept)")
    p.add_argument("--size-mb", type=int, default=1024, help="bytes copied per timing, in MiB")
    p.add_argument("--matmul-n", type=int, default=8192, help="square bf16 matmul size")
    p.set_defaults(func=cmd_calibrate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tileattn.cost.commands",
                                     description="tileattn IO cost model commands")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
