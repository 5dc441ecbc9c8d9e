"""The README is a short user's guide whose links resolve and whose two commands exist.

Checks every relative link (and its ``#anchor``) in README.md and docs/*.md, the README's length,
and that the two commands it opens with are targets of the Makefile that ``.ci/run`` calls.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "recipe" / "README.md"]
README_MAX_LINES = 200

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    body = FENCE.sub("", page.read_text())
    return {_anchor(line.lstrip("#")) for line in body.splitlines() if line.startswith("#")}


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Relative links of ``page`` whose file or ``#anchor`` does not exist."""
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{page.relative_to(root)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return broken


def test_readme_is_a_short_guide():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    assert max(len(line) for line in lines) <= 200, "a README line over 200 characters"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## A section\n")
    page.write_text("# Page\n[ok](other.md#a-section) [missing](nowhere.md) [bad anchor](other.md#nope)\n")
    assert broken_links(page, root=tmp_path) == [
        "page.md: nowhere.md (no such file)",
        "page.md: other.md#nope (no such heading)",
    ]


def test_readme_opens_with_the_makefile_targets_ci_runs():
    first_block = FENCE.search(README.read_text()).group(0)
    commands = re.findall(r"^make (\S+)", first_block, re.M)
    assert commands == ["run", "test"]
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    assert set(commands) <= targets
    assert "make test" in (ROOT / ".ci" / "run").read_text()
