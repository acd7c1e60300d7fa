"""README's links hold: every ``(#anchor)`` names one of its headings as GitHub slugs it, and every
relative link names a file of the checkout (the contents list at the top, the links between sections
and to docs/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower-cased, punctuation but ``-`` and
    ``_`` dropped, spaces as ``-``, a repeated one suffixed ``-1``, ``-2``...; fenced code skipped."""
    anchors: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = re.match(r"#{1,6} (.+)$", line)
        if fenced or not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def test_github_anchors_of_a_hand_written_case():
    text = "# A: `b` (c.py)\n```\n# not a heading\n```\n## Twice\n### Twice\n"
    assert github_anchors(text) == {"a-b-cpy", "twice", "twice-1"}


def test_every_in_page_anchor_and_relative_link_resolves():
    wrong = []
    for doc in DOCS:
        text = doc.read_text()
        anchors = github_anchors(text)
        for target in LINK.findall(text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            if path and not (doc.parent / path).exists():
                wrong.append(f"{doc.name}: {target} (no such file)")
            elif not path and anchor not in anchors:
                wrong.append(f"{doc.name}: #{anchor} (no such heading)")
    assert not wrong, wrong
    assert len(LINK.findall((ROOT / "README.md").read_text())) > 30  # the contents list is read
