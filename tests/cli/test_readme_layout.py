"""README.md's Layout section names every module under src/tileattn, file for
file, and names no file that is not there."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "tileattn"


def _entries() -> dict[str, str]:
    """Entry name ("api.py", "launch/") -> its text, from the Layout block."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    lines = block.splitlines()
    start = lines.index("src/tileattn/")
    entries, name = {}, None
    for line in lines[start + 1:]:
        if not line.startswith(" "):
            break                               # docs/, benchmarks/: outside the package
        if re.match(r"  \S", line):
            name, _, rest = line.strip().partition(" ")
            entries[name] = rest
        else:
            entries[name] += " " + line.strip()
    return entries


ENTRIES = _entries()


def test_layout_block_found():
    assert {"api.py", "launch/", "cost/"} <= set(ENTRIES)


def test_every_module_is_named():
    missing = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if len(rel.parts) == 1:
            if rel.name not in ENTRIES:
                missing.append(str(rel))
        elif len(rel.parts) == 2:
            folder = rel.parts[0] + "/"
            if folder not in ENTRIES or (rel.name != "__init__.py"
                                         and not re.search(rf"(?<![\w.]){re.escape(rel.name)}", ENTRIES[folder])):
                missing.append(str(rel))
        else:
            missing.append(str(rel))            # deeper folders: the layout does not describe them
    assert not missing, f"README Layout does not name: {missing}"


def test_every_named_file_exists():
    stale = [name for name in ENTRIES if not (PKG / name.rstrip("/")).exists()]
    for name, text in ENTRIES.items():
        if name.endswith("/"):
            stale += [f"{name}{f}" for f in re.findall(r"(?<![\w./])(\w+\.py)\b", text) if not (PKG / name / f).exists()]
    assert not stale, f"README Layout names files that do not exist: {stale}"
