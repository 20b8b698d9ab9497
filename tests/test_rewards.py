"""The reward: format rule, math-verify equivalences, and the time budget against hostile answers."""
from __future__ import annotations

import threading
import time

import pytest

from ftis_edge.tasks import get_task
from ftis_edge.tasks.grader import get_grader, score, score_many, warm_up
from ftis_edge.tasks.rewards import RewardSettings, check_format, prefilter

BINARY = RewardSettings()


@pytest.fixture(autouse=True)
def grader_ready():
    """Each test starts with a ready worker and a ready spare (earlier tests kill workers)."""
    assert warm_up(), "the grader worker did not start"


def reward(text, ref, settings=BINARY):
    return score(text, ref, settings)


@pytest.mark.parametrize("answer, reference", [
    ("1,080", "1080"),
    ("1080", "1080"),
    ("-3", "-3"),
    ("0.5", "1/2"),
    ("1/2", "0.5"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\frac{1}{2}", "0.5"),
    ("$18", "18"),
    ("\\$18.00", "18"),
    ("18 dollars", "18"),
    ("x = 5", "5"),
    ("6 - 5i", "6 - 5i"),
    ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\$32,\\!348", "\\$32,\\!348"),
    ("7/6", "7/6"),
])
def test_equivalent_answers_score_one(answer, reference):
    value, b = reward(f"<think>work</think> <answer>{answer}</answer>", reference)
    assert (value, b["correct"], b["format_ok"], b["timed_out"]) == (1.0, True, True, False), b
    assert b["answer"] == answer


@pytest.mark.parametrize("answer, reference", [
    ("1081", "1080"), ("3", "-3"), ("0.51", "1/2"), ("\\frac{1}{3}", "\\frac{1}{2}"), ("2", "2k+2"),
])
def test_wrong_answers_score_zero(answer, reference):
    value, b = reward(f"<answer>{answer}</answer>", reference)
    assert value == 0.0 and not b["correct"] and b["format_ok"] and b["reason"] == "wrong answer"


@pytest.mark.parametrize("text, reason", [
    ("The answer is 5.", "no <answer> tag"),
    ("5 <answer></answer>", "empty <answer></answer>"),
    ("<answer>5</answer> <answer>5</answer>", "expected one <answer>…</answer>, found 2 open / 2 close"),
    ("</answer>5<answer>", "</answer> comes before <answer>"),
    ("<answer>5", "expected one <answer>…</answer>, found 1 open / 0 close"),
])
def test_format_failures_score_zero(text, reason):
    value, b = reward(text, "5")
    assert value == 0.0 and not b["format_ok"] and b["reason"] == reason
    assert b["answer"] is None and not b["correct"]


def test_text_after_answer_fails_format_but_reports_correctness():
    value, b = reward("<answer>5</answer> Hope this helps!", "5")
    assert value == 0.0 and not b["format_ok"] and b["correct"]
    assert b["reason"].startswith("text after </answer>")


def test_trailing_whitespace_and_end_tokens_are_allowed():
    for tail in ["", " ", "\n\n", "<|im_end|>", " <|im_end|>\n", "<|endoftext|>"]:
        value, b = reward(f"<answer>5</answer>{tail}", "5")
        assert value == 1.0, (tail, b)


def test_require_think_is_the_authors_stricter_rule():
    strict = RewardSettings(require_think=True)
    assert reward("<think>2+3=5</think>\n<answer>5</answer>", "5", strict)[0] == 1.0
    value, b = reward("<answer>5</answer>", "5", strict)
    assert value == 0.0 and b["reason"].startswith("expected one <think>…</think>") and b["correct"]
    value, b = reward("<answer>5</answer><think>x</think>", "5", strict)
    assert value == 0.0 and b["reason"].startswith("text after </answer>")
    assert check_format("<think>a</think><think>b</think><answer>5</answer>", True).ok is False
    assert check_format("</think>a<think><answer>5</answer>", True).ok is False


def test_shaped_reward_gives_format_credit():
    shaped = RewardSettings(mode="shaped", format_reward=0.1)
    assert reward("<answer>5</answer>", "5", shaped)[0] == 1.0
    assert reward("<answer>6</answer>", "5", shaped)[0] == pytest.approx(0.1)
    assert reward("5", "5", shaped)[0] == 0.0
    with pytest.raises(ValueError, match="reward must be one of"):
        RewardSettings(mode="partial")


def test_breakdown_has_the_documented_keys():
    _, b = reward("<answer>5</answer>", "5")
    assert set(b) == {"format_ok", "correct", "answer", "timed_out", "reason", "seconds"}
    assert isinstance(b["seconds"], float) and b["seconds"] < BINARY.timeout_s


@pytest.mark.parametrize("bomb, why", [
    ("9^{9^{9^{9^{9}}}}", "power tower"),
    ("9^9^9", "power tower"),
    ("2**2**100", "power tower"),
    ("10^{1000000}", "exponent too large"),
    ("12345678!", "factorial too large"),
    ("(" * 50 + "1" + ")" * 50, "nested deeper"),
    ("1" * 201, "longer than 200"),
])
def test_prefilter_refuses_bombs_in_microseconds(bomb, why):
    assert why in prefilter(bomb, BINARY)
    t0 = time.perf_counter()
    value, b = reward(f"<answer>{bomb}</answer>", "5")
    # never sent to a grader process: the answer comes back before that budget could run out
    # (how fast: benchmarks/bench_grader_latency.py)
    assert time.perf_counter() - t0 < BINARY.timeout_s
    assert value == 0.0 and b["format_ok"] and b["reason"].startswith("refused:")


@pytest.mark.parametrize("ok", ["x^2 + y^2 + z^2", "2^{10}", "5!", "\\left( 3, \\frac{\\pi}{2} \\right)"])
def test_prefilter_lets_ordinary_answers_through(ok):
    assert prefilter(ok, BINARY) is None


def _in_thread(fn):
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("out", fn()))
    t.start()
    t.join(timeout=30)
    return box["out"]


@pytest.mark.parametrize("bomb", ["9^{9^{9^{9^{9}}}}", "(" * 500 + "1" + ")" * 500])
def test_hostile_answer_times_out_within_budget_off_the_main_thread(bomb):
    """The pre-filter is off: the worker itself hangs and must be killed and replaced."""
    raw = RewardSettings(prefilter=False, timeout_s=0.5)
    grader = get_grader()
    restarts = grader.restarts

    def run():
        t0 = time.perf_counter()
        out = score(f"<answer>{bomb}</answer>", "5", raw)
        return out, time.perf_counter() - t0

    (value, b), wall = _in_thread(run)
    assert wall < 0.5 + 2.0, wall       # stopped at its budget, not hung (the overrun: bench_grader_latency)
    assert value == 0.0 and b["timed_out"] and not b["correct"], b
    assert grader.restarts == restarts + 1
    # the spare worker answers the very next call, well within budget
    value, b = _in_thread(lambda: score("<answer>1,080</answer>", "1080", raw))
    assert value == 1.0 and not b["timed_out"], b


def test_two_bombs_in_a_row_then_recovery():
    raw = RewardSettings(prefilter=False, timeout_s=0.3)
    for _ in range(2):
        t0 = time.perf_counter()
        _, b = score("<answer>9^{9^{9^{9^{9}}}}</answer>", "5", raw)
        assert b["timed_out"] and time.perf_counter() - t0 < 0.3 + 2.0     # stopped, not hung
    deadline = time.monotonic() + 20            # the replacement workers finish starting
    while time.monotonic() < deadline:
        value, b = score("<answer>12</answer>", "12", raw)
        if value == 1.0:
            break
        assert b["timed_out"]                   # never a wrong verdict, only "not ready yet"
        time.sleep(0.2)
    assert value == 1.0


def test_reward_many_respects_a_total_budget():
    raw = RewardSettings(prefilter=False, timeout_s=3.0)      # three bombs alone: >= 9 s without a total
    texts = ["<answer>9^{9^{9^{9^{9}}}}</answer>"] * 3 + ["<answer>4</answer>", "no tags"]
    t0 = time.perf_counter()
    out = score_many(texts, ["4"] * 5, raw, total_budget_s=0.6)
    wall = time.perf_counter() - t0
    assert wall < 0.6 + 2.0, wall
    assert len(out) == 5 and all(b["timed_out"] for _, b in out[:4])
    assert out[4][1]["reason"] == "no <answer> tag" and not out[4][1]["timed_out"]


def test_reward_many_scores_a_normal_batch():
    task = get_task("arith", level=1)
    texts = [f"<answer>{n}</answer>" for n in (3, 4, 5)]
    out = task.reward_many(texts, ["4", "4", "4"], total_budget_s=5.0)
    assert [v for v, _ in out] == [0.0, 1.0, 0.0]
    with pytest.raises(ValueError):
        task.reward_many(texts, ["4"])


def test_a_hundred_answers_in_a_row_are_each_graded_within_budget():
    """The overhead per call is measured by benchmarks/bench_grader_latency.py (a few ms); here
    every call must come back graded, none timed out."""
    out = [score(f"<answer>{i}</answer>", "50", BINARY) for i in range(100)]
    assert [v for v, _ in out] == [1.0 if i == 50 else 0.0 for i in range(100)]
    assert not any(b["timed_out"] for _, b in out)


def test_non_string_completion_is_a_format_failure():
    value, b = reward(None, "5")
    assert value == 0.0 and b["reason"] == "no <answer> tag"


def test_first_reward_in_a_fresh_process_waits_for_the_cold_start():
    """No warm_up(): the very first call may wait for the worker to start, then gets its budget."""
    import subprocess
    import sys

    code = ("from ftis_edge.tasks import get_task\n"
            "v, b = get_task('arith').reward('<answer>1,080</answer>', '1080')\n"
            "assert v == 1.0 and not b['timed_out'], b\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-1000:]


def test_a_round_counts_and_logs_own_answers_that_ran_out_of_grading_time(caplog):
    """A grading timeout scores 0 and so changes the reward; the round record says how many."""
    from ftis_edge.learn.batch import OwnGroup
    from ftis_edge.run.rounds import own_grading_stats
    raw = RewardSettings(prefilter=False, timeout_s=0.3)
    texts = ["<answer>9^{9^{9^{9^{9}}}}</answer>", "<answer>4</answer>", "no tags"]
    graded = score_many(texts, ["4"] * 3, raw)
    group = OwnGroup(prompt=None, prompt_ids=[], completions=[], group_id="g",
                     rewards=[v for v, _ in graded], breakdowns=[b for _, b in graded])
    with caplog.at_level("WARNING", logger="ftis_edge.run.node"):
        stats = own_grading_stats([group])
    assert stats["reward/timed_out"] == 1, graded
    assert stats["accuracy/own"] == pytest.approx(1 / 3) and stats["format/own"] == pytest.approx(2 / 3)
    assert "1 of 3 own answers ran out of the grading budget" in caplog.text
    caplog.clear()
    assert own_grading_stats([])["reward/timed_out"] == 0 and not caplog.text


def test_a_round_counts_own_answers_the_rules_refused():
    """A learner that finds a way around the grader shows as reward/refused climbing."""
    from ftis_edge.learn.batch import OwnGroup
    from ftis_edge.run.rounds import own_grading_stats
    texts = ["<answer>9 - 4</answer>", "<answer>5</answer>", "<answer>6</answer>"]
    graded = score_many(texts, ["5"] * 3, RewardSettings())
    group = OwnGroup(prompt=None, prompt_ids=[], completions=[], group_id="g",
                     rewards=[v for v, _ in graded], breakdowns=[b for _, b in graded])
    stats = own_grading_stats([group])
    assert stats["reward/refused"] == 1, graded
    assert stats["accuracy/own"] == pytest.approx(1 / 3)
