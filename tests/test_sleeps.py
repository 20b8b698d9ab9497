"""Tests wait for the event they mean (``procs.wait_for``), not for a fixed time: a fixed sleep is
slow on a fast machine and flaky on a busy one. A constant sleep of >= 0.25 s (``time.sleep``,
``asyncio.sleep``, a Textual ``pilot.pause``) is allowed only where nothing can be observed (a
silence, an idle relay, a timer that must run out) and then carries its reason on the same line.

    python tests/test_sleeps.py [DIR]     # count them, with their total: the number issue 47.5 quotes
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
FOLDERS = (TESTS, TESTS.parent / "tests_tools")     # the product's tests and the tools' tests
LONG_S = 0.25
MOST = 10
PENDING: set[str] = set()      # files being rewritten elsewhere (none now: relay/queued.py landed)


def constant_sleeps(folder: Path = TESTS) -> list[tuple[str, int, float, str]]:
    """Every call ``sleep(C)`` / ``x.sleep(C)`` / ``x.pause(C)`` with a literal C >= LONG_S under
    ``folder`` (its own files: tests/data holds scripts that make fixtures, not tests): (file,
    line, seconds, source line). Sleeps inside a child's code string do not count (the test does
    not wait on them; it waits on the child)."""
    found = []
    for path in sorted(folder.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            seconds = node.args[0].value
            if name in ("sleep", "pause") and isinstance(seconds, (int, float)) and seconds >= LONG_S:
                found.append((str(path.relative_to(folder)), node.lineno, float(seconds), lines[node.lineno - 1]))
    return sorted(found)


def test_few_long_sleeps_left_and_each_says_why():
    left = [s for folder in FOLDERS for s in constant_sleeps(folder) if s[0] not in PENDING]
    assert len(left) <= MOST, "\n".join(f"{f}:{n}: {src.strip()}" for f, n, _, src in left)
    silent = [f"{f}:{n}: {src.strip()}" for f, n, _, src in left if "#" not in src]
    assert not silent, "a long sleep needs its reason on its line (or wait_for the event):\n" + "\n".join(silent)


def test_the_counter_sees_sleeps_and_pauses_not_child_code(tmp_path):
    (tmp_path / "t.py").write_text(
        "import time\nasync def f(pilot):\n    await pilot.pause(0.5)\n    await pilot.pause()\n"
        "time.sleep(1.0)  # a silence\ntime.sleep(0.1)\nsrc = 'time.sleep(60)'\n")
    assert [(n, s) for _, n, s, _ in constant_sleeps(tmp_path)] == [(3, 0.5), (5, 1.0)]


if __name__ == "__main__":
    folder = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else TESTS
    sleeps = constant_sleeps(folder)
    for f, n, s, src in sleeps:
        print(f"{s:5.2f} s  {f}:{n}: {src.strip()}")
    print(f"{len(sleeps)} constant sleeps >= {LONG_S} s in {folder}, {sum(s for _, _, s, _ in sleeps):.1f} s in all")
