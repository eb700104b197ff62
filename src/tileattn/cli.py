"""The ``tileattn`` command (also ``python -m tileattn``).

Subcommands: ``demo`` (standard vs tileattn on this machine), ``bench``
(side-by-side benchmark against PyTorch's attention backends), ``io``,
``roofline``, ``report`` and ``calibrate`` (the IO cost model, see
``tileattn.cost``), ``check`` (correctness of every path on this machine).  Exit codes: 0 ok, 1 a check failed, 2 bad arguments,
3 the machine lacks what was asked for (e.g. a GPU).
"""
from __future__ import annotations

import argparse
import sys

from . import __version__


def build_parser() -> argparse.ArgumentParser:
    from . import check, demo
    from .bench import cli as bench_cli
    from .cost import commands

    parser = argparse.ArgumentParser(
        prog="tileattn", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Exact, IO-aware attention for PyTorch: demo, benchmark, correctness check, IO model, "
                    "roofline, report.",
        epilog="examples:\n  tileattn demo\n  tileattn check\n  tileattn bench --head-dims 128 --seqlens 2k 16k\n  tileattn io --hw nvidia-a100-80gb-sxm4 --batch 8 --heads 32 "
               "--seqlen 16384 --head-dim 128\n  tileattn report --hw nvidia-h200 -o report.html")
    parser.add_argument("--version", action="version", version=f"tileattn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo.add_parser(sub)
    bench_cli.add_parser(sub)
    commands.register(sub)
    check.add_parser(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
