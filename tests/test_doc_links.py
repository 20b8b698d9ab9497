"""Links into a heading of our own Markdown (`results.md#h8-the-decision`) land on a heading.

A renamed heading silently breaks every link to it (GitHub just opens the top of the page), and
results.md is linked from the README by its long section titles.
"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]*)#([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(md: Path) -> set[str]:
    found, fenced = set(), False
    for line in md.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            found.add(slug(line.lstrip("#")))
    return found


def doc_links():
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for m in LINK.finditer(md.read_text(encoding="utf-8")):
            target = (md.parent / m.group(1)).resolve() if m.group(1) else md
            if target.suffix == ".md" and target.is_file():
                yield md.relative_to(ROOT), target, m.group(2)


def test_every_heading_link_in_our_docs_lands_on_a_heading():
    links = list(doc_links())
    assert len(links) >= 20          # the README and results.md link by section; a parse that finds none proves nothing
    broken = [f"{src}: {target.relative_to(ROOT)}#{anchor}" for src, target, anchor in links
              if anchor not in headings(target)]
    assert not broken, "links to headings that do not exist:\n" + "\n".join(broken)


def test_the_slug_is_githubs():
    assert slug(" H8, the decision") == "h8-the-decision"
    assert slug("Span level (different tokenizers; the default)") == "span-level-different-tokenizers-the-default"
    assert slug("H4, run 2026-12-01 23:24 – 2026-12-02 00:29 UTC") == "h4-run-2026-12-01-2324--2026-12-02-0029-utc"
