"""The README is the front door: short, its test command is what CI runs, every link it makes
resolves, to a heading where it names one (the facts it left behind live in the docs it links)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_stays_a_front_door():
    assert len(README.encode()) <= 10_240, "README.md over 10 KB: move the detail into docs/ and link it"


def test_ci_runs_exactly_the_readmes_test_command_then_the_slow_tier_on_two_workers():
    command = next(line for line in README.splitlines() if line.startswith("./install.sh --dev && "))
    steps = [s.strip() for s in command.split("&&")]
    ci = [line.removeprefix("time ").strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert steps == [line for line in ci if line in steps], (steps, ci)
    # the README's command: every test (real-model ones too) but those marked slow ...
    assert steps[-1] == '.venv/bin/python -m pytest -m "not slow" --durations=25', steps[-1]
    # ... then the slow tier, so that CI runs every test; both run whatever the other's result
    pytest_lines = [line for line in ci if " -m pytest " in line]
    assert pytest_lines == [steps[-1], ".venv/bin/python -m pytest -m slow -n 2 --dist loadfile --durations=10"]
    set_e_off = next(i for i, line in enumerate(ci) if line.startswith("set +e"))
    assert set_e_off < ci.index(steps[-1]), "a failing command must not skip the slow tier"
    assert ci[-1] == '[ "$fast_rc" -eq 0 ] && [ "$slow_rc" -eq 0 ]', "CI fails when either tier fails"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "pytest-xdist" in pyproject                               # the workers come with --dev
    assert "slow:" in pyproject                                      # a registered marker, not a typo


LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)]*))?\)")       # [text](path#anchor): path, anchor


def local_links(docs):
    """(doc, path, anchor) of every link in DOCS that stays in the repository."""
    for doc in docs:
        for path, anchor in LINK.findall(doc.read_text(encoding="utf-8")):
            if "://" not in path and not path.startswith("mailto:"):
                yield doc, path, anchor


def test_every_local_link_in_the_readme_and_docs_resolves():
    broken = [f"{doc.relative_to(ROOT)} -> {path}"
              for doc, path, _ in local_links([ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
              if path and not (doc.parent / path).exists()]
    assert not broken, broken


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


def test_every_heading_link_in_our_docs_lands_on_a_heading():
    """A renamed heading silently breaks every link to it (GitHub just opens the top of the page),
    and results.md is linked from the README by its long section titles."""
    links = [(doc, (doc.parent / path).resolve() if path else doc, anchor)
             for doc, path, anchor in local_links([ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])
             if anchor]
    links = [(doc, target, anchor) for doc, target, anchor in links if target.suffix == ".md" and target.is_file()]
    assert len(links) >= 20          # the README and results.md link by section; a parse that finds none proves nothing
    known = {target: headings(target) for _, target, _ in links}      # results.md is read once, not per link
    broken = [f"{doc.relative_to(ROOT)}: {target.relative_to(ROOT)}#{anchor}" for doc, target, anchor in links
              if anchor not in known[target]]
    assert not broken, "links to headings that do not exist:\n" + "\n".join(broken)


def test_the_slug_is_githubs():
    assert slug(" H8, the decision") == "h8-the-decision"
    assert slug("Span level (different tokenizers; the default)") == "span-level-different-tokenizers-the-default"
    assert slug("H4, run 2026-12-01 23:24 – 2026-12-02 00:29 UTC") == "h4-run-2026-12-01-2324--2026-12-02-0029-utc"
