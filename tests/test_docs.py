"""The docs hold together: every link between README.md, docs/ and the results pages reaches a file and, where it
names one, a heading; README.md stays a front door."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *(REPO / n for n in ("RESULTS.md", "BENCHMARKS.md", "MEMORY.md")),
]
LINK = re.compile(r"(?<!!)\[[^\]]+\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation but hyphens and underscores dropped, spaces as
    hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text(encoding="utf-8"))  # no headings inside code blocks
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def test_every_link_reaches_its_page_and_heading():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):  # http(s), mailto: not followed
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.is_file():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_readme_is_a_front_door():
    """What it is, the two commands, what a run prints, the commands, where to read on: the depth lives in docs/."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 250
    headings = [line for line in readme.splitlines() if line.startswith("## ")]
    assert headings == ["## Fresh machine: two commands", "## What a run prints", "## Command line", "## Read on"]
    linked = {target.partition("#")[0] for target in LINK.findall(readme)}
    assert {f"docs/{page.name}" for page in (REPO / "docs").glob("*.md")} <= linked  # every page is reachable
