"""Every link in README.md and docs/*.md to a file under docs/ or benchmarks/
resolves (relative to the linking file, as GitHub renders it)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target); the target ends at whitespace or ')'
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CHECKED = ("docs", "benchmarks")


def local_links(page: Path):
    """(line number, target, resolved path) of the links into docs/ or benchmarks/."""
    fenced = False
    for lineno, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced:
            continue  # code, not links
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            path = (page.parent / target.split("#")[0]).resolve()
            try:
                rel = path.relative_to(ROOT)
            except ValueError:
                continue
            if rel.parts and rel.parts[0] in CHECKED:
                yield lineno, target, path


def test_the_pages_have_links():
    """The scan finds links at all (a broken pattern would pass every page)."""
    assert sum(1 for page in PAGES for _ in local_links(page)) > 10


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page):
    broken = [f"{page.relative_to(ROOT)}:{n}: {target}" for n, target, path in local_links(page) if not path.exists()]
    assert not broken, "links to missing files:\n" + "\n".join(broken)


def test_a_missing_target_is_caught(tmp_path, monkeypatch):
    page = ROOT / "docs" / "_probe_for_link_test.md"
    monkeypatch.setattr(Path, "read_text", lambda self, **k: "see [x](results/no-such-folder/a.csv)")
    (n, target, path), = local_links(page)
    assert target == "results/no-such-folder/a.csv" and not path.exists()
