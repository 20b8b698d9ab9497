"""Held out means unseen: no eval question's text reaches training, under any id (issue 48.4)."""
import itertools
import json

import pytest

from ftis_edge.tasks import get_task
from ftis_edge.tasks.arith import EVAL_OFFSET, ArithTask, make_problem
from ftis_edge.tasks.unseen import held_out_by_text, question_key


def keys(prompts):
    return {question_key(p.question) for p in prompts}


@pytest.mark.parametrize("levels", [[1], [1, 2], [3, 4, 5, 6]])
def test_arith_training_never_draws_an_eval_question(levels):
    task = ArithTask(level=levels)
    evals = task.eval_prompts(200)
    assert len(keys(evals)) == len(evals)                      # each eval question once
    assert not any(task.is_trainable(p.id) for p in evals)
    for seed in (0, 7):
        train = list(itertools.islice(task.prompts(seed=seed), 3000))
        assert not keys(train) & keys(evals)
        assert all(task.is_trainable(p.id) for p in train[:300])


def test_arith_refuses_an_eval_question_under_a_training_id():
    """Level 1 has 162 questions: most eval questions have a twin below 10^9. The twin is refused."""
    task = ArithTask(level=[1])
    held = keys(task.eval_prompts())
    twins = [make_problem(1, n) for n in range(400)]
    twins = [p for p in twins if question_key(p.question) in held]
    assert twins, "level 1's eval questions have twins under training ids"
    assert not any(task.is_trainable(p.id) for p in twins)
    # a question that is not held out stays trainable under any training id
    other = next(p for p in (make_problem(1, n) for n in range(400)) if question_key(p.question) not in held)
    assert task.is_trainable(other.id)


def test_arith_eval_set_is_a_fixed_prefix_and_says_when_a_level_runs_out():
    task = ArithTask(level=[1, 2])
    full = task.eval_prompts(200)
    assert task.eval_prompts(6) == full[:6]
    assert [p.meta["level"] for p in full[:4]] == [1, 2, 1, 2]     # levels in turn
    level1 = [p for p in full if p.meta["level"] == 1]
    assert 30 <= len(level1) < 81                                # level 1's held-out part, each once
    assert len(full) == 200                                      # level 2 fills the rest
    assert ArithTask(level=[1]).eval_prompts(500) == level1      # exhausted, not repeated


def test_the_text_split_is_a_property_of_the_text():
    assert held_out_by_text("What is 3 × 4?", "arith") == held_out_by_text("  what is 3 ×   4? ", "arith")
    share = sum(held_out_by_text(f"question {i}", "arith") for i in range(4000)) / 4000
    assert 0.22 < share < 0.28


def test_jsonl_leaves_out_training_lines_that_repeat_an_eval_question(tmp_path):
    train = tmp_path / "train.jsonl"
    held = tmp_path / "eval.jsonl"
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(12)]
    train.write_text("\n".join(json.dumps(r) for r in rows))
    held.write_text("\n".join(json.dumps(r) for r in [{"question": "what is 3  + 1?", "answer": "4"},
                                                       {"question": "What is 99 + 1?", "answer": "100"}]))
    task = get_task("jsonl", path=str(train), eval_path=str(held))
    assert "1 training lines repeat a held-out question" in task.split_summary
    trained = list(itertools.islice(task.prompts(seed=0), 50))
    assert question_key("What is 3 + 1?") not in keys(trained)
    assert len(keys(trained)) == 11


def test_reasoning_gym_training_never_draws_an_eval_question():
    task = get_task("reasoning_gym", datasets={"basic_arithmetic": {"max_terms": 2, "eval_size": 40}})
    evals = keys(task.eval_prompts())
    train = list(itertools.islice(task.prompts(seed=1), 300))
    assert not keys(train) & evals
