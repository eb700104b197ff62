"""README.md's Layout section names every module under src/tileattn and every
Python file under benchmarks/, tests/ and examples/, file for file, and names
no file that is not there."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "tileattn"


def _layout_lines() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.split("## Layout", 1)[1].split("```", 2)[1].splitlines()


def _entries() -> dict[str, str]:
    """Entry name ("api.py", "launch/") -> its text, from the Layout block."""
    lines = _layout_lines()
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


def _top_entries() -> dict[str, str]:
    """Top-level entry ("benchmarks/", "tests/") -> its text, continuation lines joined."""
    entries, name = {}, None
    for line in _layout_lines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            name, _, rest = line.partition(" ")
            entries[name] = rest.strip()
        elif name is not None:
            entries[name] += " " + line.strip()
    return entries


ENTRIES = _entries()
TOP = _top_entries()
FOLDERS = ("benchmarks", "tests", "examples")


def _named_files(text: str) -> set[str]:
    """The .py files an entry names, as paths relative to its folder: a name
    inside "sub/ (a.py, b.py)" is sub/a.py, any other is at the top."""
    named = set()
    for sub, inner in re.findall(r"(\w+)/ \(([^)]*)\)", text):
        named |= {f"{sub}/{f}" for f in re.findall(r"(?<![\w./])(\w+\.py)\b", inner)}
    outside = re.sub(r"\w+/ \([^)]*\)", " ", text)
    outside = re.sub(r"\([^)]*\)", " ", outside)       # remarks in parentheses name no file
    named |= set(re.findall(r"(?<![\w./])(\w+\.py)\b", outside))
    return named


@pytest.mark.parametrize("folder", FOLDERS)
def test_folder_listed_file_for_file(folder):
    assert f"{folder}/" in TOP, f"README Layout has no {folder}/ entry"
    on_disk = {p.relative_to(ROOT / folder).as_posix() for p in (ROOT / folder).rglob("*.py")
               if "__pycache__" not in p.parts}
    named = _named_files(TOP[f"{folder}/"])
    assert not on_disk - named, f"README Layout does not name: {sorted(on_disk - named)}"
    assert not named - on_disk, f"README Layout names files that do not exist: {sorted(named - on_disk)}"


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
