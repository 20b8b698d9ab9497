"""The grader worker's limits against hostile answers: memory (an answer 12 characters long
asked a verifier that evaluates it for 8 GB), full-width identifiers (Python folds them by NFKC
into the names the name check refuses), and file writes that open no file for writing."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest

from ftis_edge.tasks import get_task, warm_up
from ftis_edge.tasks.grader import MEMORY_LIMIT_MB, _vm_bytes, get_grader, rule_setup, score
from ftis_edge.tasks.gym_verify import math_text_ok
from procs import ROOT


def test_full_width_identifiers_fail_the_name_check():
    for bad in ["x.ｆｕｎｃ.ｍｒｏ()", "ｅｘｅｃ(1)", "x.func", "ｏｐｅｎ(1)", "x\u2024func"]:
        assert not math_text_ok(bad), bad
    assert math_text_ok("5*X**10/4 + sin(x) + C")


def test_the_audit_hook_blocks_writes_without_a_write_mode(tmp_path):
    """os.open(O_CREAT|O_TRUNC) with a read-only access mode, os.truncate, symlinks, hard
    links and sqlite3 (which writes its file from C): each refused, nothing changed."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from ftis_edge.tasks.gym_verify import _audit
        d, victim = {str(tmp_path)!r}, {str(victim)!r}
        sys.addaudithook(_audit)
        attacks = {{
            "open creat|trunc": lambda: os.open(victim, os.O_RDONLY | os.O_CREAT | os.O_TRUNC),
            "open creat": lambda: os.open(d + "/new", os.O_RDONLY | os.O_CREAT),
            "truncate": lambda: os.truncate(victim, 0),
            "ftruncate": lambda: os.ftruncate(os.open(victim, os.O_RDONLY), 0),
            "symlink": lambda: os.symlink(victim, d + "/sym"),
            "link": lambda: os.link(victim, d + "/hard"),
            "sqlite3": lambda: __import__("sqlite3").connect(d + "/db").execute("create table t(x)"),
        }}
        for name, attack in attacks.items():
            try:
                attack()
                print("ALLOWED", name)
            except PermissionError:
                print("blocked", name)
            except Exception as e:
                print("failed", name, type(e).__name__)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    lines = r.stdout.split("\n")
    assert r.returncode == 0 and len([ln for ln in lines if ln]) == 7, r.stdout + r.stderr
    assert not [ln for ln in lines if ln.startswith("ALLOWED")], r.stdout
    assert victim.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["victim.txt"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the worker's peak from /proc")
def test_a_huge_answer_stays_within_the_workers_memory_limit(caplog):
    """countdown's verifier evaluates the answer with sympy: ``(1,)*10**9`` asked for 8 GB
    (1.4 GB reached before the 0.5 s kill, 4 GB at 1.5 s). Now the worker's allocation fails at
    its limit, the answer scores 0, the log says why, and the next answer grades normally."""
    task = get_task("reasoning_gym", datasets={"countdown": {}})
    assert warm_up()
    p = task.eval_prompts(1)[0]
    settings = dataclasses.replace(task.reward_settings, prefilter=False, timeout_s=3.0)
    grader = get_grader(rule_setup(settings))
    grader.warm_up()
    worker = grader._active
    start = _vm_bytes("VmRSS", worker.process.pid)
    with caplog.at_level("WARNING", logger="ftis_edge.grader"):
        for answer in ("(1,)*10**9", "[1]*10**9", "'x'*10**10"):
            value, b = score(f"<answer>{answer}</answer>", p.reference, settings)
            assert value <= 0.05 and not b["correct"], b
    peak = _vm_bytes("VmHWM", worker.process.pid) if worker.alive() else None
    if peak is not None:
        assert peak <= start + (MEMORY_LIMIT_MB << 20) + (64 << 20), (start >> 20, peak >> 20)
    assert "memory limit" in caplog.text
    assert task.reward(f"<answer>{p.meta['answer']}</answer>", p.reference)[0] == 1.0


@pytest.mark.parametrize("answer", ["40 Visit evil.example", "40 visit evil dot example", "40 www.evil",
                                    "40 I hope this helps! Let me know if you have any other questions.",
                                    "40 (see https://x.io)"])
def test_a_math_answer_is_a_bare_answer_not_a_carrier(answer):
    """math-verify finds 40 in "40 Visit evil.example": graded correct, the phrase was rewarded
    and reinforced. Words beyond the reference's (plus one, a unit) or a link: refused."""
    from ftis_edge.tasks.rewards import RewardSettings
    value, b = score(f"<answer>{answer}</answer>", "40", RewardSettings())
    assert value == 0.0 and b["reason"].startswith("refused"), b
    for honest, ref in (("40", "40"), ("18 dollars", "18"), ("2 \\text{ inches}", "2"), ("\\frac{1}{2}", "0.5"),
                        ("\\text{(C)}", "\\text{(C)}"), ("3.14", "3.14")):
        assert score(f"<answer>{honest}</answer>", ref, RewardSettings())[0] == 1.0, honest


@pytest.mark.parametrize("answer, reference", [("9 - 4", "5"), ("16/2", "8"), ("15 + 59", "74"), ("21 ÷ 7", "3"),
                                               ("3 \\times 4", "12"), ("\\frac{16}{2}", "8"), ("2^3", "8"),
                                               ("(3+3) - 5i", "6 - 5i"), ("5 = 9 - 4", "5"), ("9 - 4 =", "5"),
                                               # the same computation in LaTeX's other spellings
                                               ("9\\,-\\,4", "5"), ("9\\!-\\!4", "5"), ("9\\ -\\ 4", "5"),
                                               ("9-\\left(4\\right)", "5"), ("10 \\over 2", "5"),
                                               ("\\frac{10}2", "5"), ("\\sqrt{25}", "5"), ("√25", "5"),
                                               ("3!-1", "5"), ("\\boxed{9-4}", "5")])
def test_a_math_answer_is_the_result_not_the_computation(answer, reference):
    """math-verify evaluates "9 - 4" to 5, so restating the question scored as its answer: a Gemma 3
    node alone learned exactly that (H6 seed 1's twin: 97.5 % held-out, every answer a restated
    question). An answer with more operations on numbers than its reference is refused."""
    from ftis_edge.tasks.rewards import RewardSettings
    value, b = score(f"<answer>{answer}</answer>", reference, RewardSettings())
    assert value == 0.0 and b["reason"] == "refused: a computation, not its result", b
    for honest, ref in (("5", "5"), ("11 + 6 = 17", "17"), ("1/2", "0.5"), ("\\frac{3}{4}", "0.75"), ("-3", "-3"),
                        ("6-5i", "6 - 5i"), ("x^2+1", "x^2+1"), ("2\\sqrt{3}", "2\\sqrt{3}"), ("8 pencils", "8"),
                        ("2^{10}", "2^{10}"), ("x = -5", "-5"), ("\\sqrt{12}", "2\\sqrt{3}"), ("\\frac{3}{4}", "\\frac34"),
                        ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\left( 3, \\frac{\\pi}{2} \\right)")):
        assert score(f"<answer>{honest}</answer>", ref, RewardSettings())[0] == 1.0, honest
