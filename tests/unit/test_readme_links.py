"""The links of README.md, CHANGELOG.md and the documentation site (docs/, mkdocs.yml's nav) hold:
every relative link names a file of the checkout, every ``#anchor`` names a heading of its target as
the target's renderer slugs it (GitHub for README and CHANGELOG, MkDocs for docs/), and mkdocs.yml's
nav lists every page of docs/ once and nothing else.  ``mkdocs build --strict``
(tests/unit/test_docs_site.py) checks docs/ again, as the site renders it."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "docs"
PAGES = sorted(SITE.rglob("*.md"))
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *PAGES]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _headings(text: str) -> list[str]:
    """The headings of a Markdown file, fenced code skipped."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = re.match(r"#{1,6} (.+)$", line)
        if heading and not fenced:
            out.append(heading.group(1))
    return out


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower-cased, punctuation but ``-`` and
    ``_`` dropped, spaces as ``-``, a repeated one suffixed ``-1``, ``-2``...; fenced code skipped."""
    return _unique((re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in _headings(text)), "-")


def mkdocs_anchors(text: str) -> set[str]:
    """The anchors MkDocs (Python-Markdown's toc ``slugify``) gives the headings: code spans unwrapped,
    ASCII only, punctuation but ``-`` and ``_`` dropped, runs of spaces and ``-`` as one ``-``; a
    repeated one suffixed ``_1``, ``_2``..."""
    def slug(heading: str) -> str:
        value = unicodedata.normalize("NFKD", re.sub(r"`([^`]*)`", r"\1", heading)).encode("ascii", "ignore").decode()
        return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", value).strip().lower())

    return _unique((slug(heading) for heading in _headings(text)), "_")


def _unique(slugs, sep: str) -> set[str]:
    """The anchors of `slugs` in order, a repeated one suffixed `sep` 1, `sep` 2, ..."""
    anchors: set[str] = set()
    for slug in slugs:
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}{sep}{n}"
        anchors.add(anchor)
    return anchors


def _anchors(doc: Path) -> set[str]:
    text = doc.read_text()
    return mkdocs_anchors(text) if SITE in doc.parents else github_anchors(text)


def test_github_anchors_of_a_hand_written_case():
    text = "# A: `b` (c.py)\n```\n# not a heading\n```\n## Twice\n### Twice\n"
    assert github_anchors(text) == {"a-b-cpy", "twice", "twice-1"}


def test_mkdocs_anchors_of_a_hand_written_case():
    text = "# A: `b` (c.py)\n```\n# not a heading\n```\n## Twice\n### Twice\n## `bench --loop-pass`\n"
    assert mkdocs_anchors(text) == {"a-b-cpy", "twice", "twice_1", "bench-loop-pass"}


def test_every_anchor_and_relative_link_resolves():
    wrong = []
    for doc in DOCS:
        text = doc.read_text()
        for target in LINK.findall(text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                wrong.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                wrong.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not wrong, wrong
    assert len(LINK.findall((ROOT / "README.md").read_text())) > 30  # the documentation list is read


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for v in node.values() for p in _nav_pages(v)]
    return []


def test_the_nav_lists_every_page_once():
    nav = _nav_pages(_mkdocs_config()["nav"])
    assert len(nav) == len(set(nav)), "a page is twice in mkdocs.yml's nav"
    assert sorted(nav) == sorted(str(p.relative_to(SITE)) for p in PAGES)


def test_readme_links_into_the_site():
    """README is the front page: it links the site's home page and every section of the nav."""
    readme = (ROOT / "README.md").read_text()
    linked = {t.partition("#")[0] for t in LINK.findall(readme)}
    missing = [p for p in _nav_pages(_mkdocs_config()["nav"]) if f"docs/{p}" not in linked]
    assert not missing, f"README does not link {missing}"


def _mkdocs_config() -> dict:
    """mkdocs.yml without its Python tags (none today; plain YAML)."""
    import yaml

    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())
