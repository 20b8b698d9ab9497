"""The README is the front door: short, its test command is what CI runs, every link it makes
resolves (the facts it left behind live in the docs it links)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_stays_a_front_door():
    assert len(README.encode()) <= 10_240, "README.md over 10 KB: move the detail into docs/ and link it"


def test_ci_runs_exactly_the_readmes_test_command_then_the_slow_tier():
    command = next(line for line in README.splitlines() if line.startswith("./install.sh --dev && "))
    steps = [s.strip() for s in command.split("&&")]
    ci = [line.removeprefix("time ").strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert steps == [line for line in ci if line in steps], (steps, ci)
    # the README's command: every test (real-model ones too) but the long end-to-end runs ...
    assert steps[-1] == '.venv/bin/python -m pytest -m "not slow" --durations=25', steps[-1]
    # ... which CI runs right after it, so that CI runs every test
    pytest_lines = [line for line in ci if " -m pytest " in line]
    assert pytest_lines == [steps[-1], ".venv/bin/python -m pytest -m slow --durations=10"], pytest_lines
    assert "slow:" in (ROOT / "pyproject.toml").read_text()          # a registered marker, not a typo


def test_every_local_link_in_the_readme_and_docs_resolves():
    broken = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert not broken, broken
