"""arith and reasoning_gym draw their training streams with one helper (tasks.base.drawn_stream):
the same prompts in the same order for the same seed as the loops each had before (kept here as
the reference), redraws of held-out questions included."""
from __future__ import annotations

import itertools
import random

import pytest

from ftis_edge.tasks import get_task
from ftis_edge.tasks.arith import EVAL_OFFSET, ArithTask, is_held_out, make_problem
from ftis_edge.tasks.base import Prompt, TaskError, drawn_stream
from ftis_edge.tasks.gym import MAX_REDRAWS


def arith_before(task: ArithTask, seed: int, i: int, redraws: list) -> Prompt:
    """ArithTask._training_draw as it was: a held-out text drawn again from a sub-seed."""
    key, redraw = f"arith:{seed}:{i}", 0
    while True:
        rng = random.Random(key if redraw == 0 else f"{key}:{redraw}")
        prompt = make_problem(rng.choice(task.levels), rng.randrange(EVAL_OFFSET))
        if not is_held_out(prompt):
            redraws.append(redraw)
            return prompt
        redraw += 1


def gym_before(task, seed: int, i: int, redraws: list) -> Prompt:
    """ReasoningGymTask._training_draw as it was."""
    weights = [s.weight for s in task.sources]
    for redraw in range(MAX_REDRAWS):
        rng = random.Random(f"rg:{seed}:{i}" if redraw == 0 else f"rg:{seed}:{i}:{redraw}")
        source = rng.choices(task.sources, weights)[0]
        item = task._item(source, rng.randrange(source.size))
        if item.question not in task._eval_texts[source.tag]:
            redraws.append(redraw)
            return item
    raise AssertionError("the reference ran out of draws")


def _same_stream(task, before, n: int) -> list:
    redraws = []
    for seed in (0, 7):
        for start in (0, 5, 1000):
            got = list(itertools.islice(task.prompts(seed=seed, start=start), n))
            want = [before(task, seed, i, redraws) for i in range(start, start + n)]
            assert got == want, (seed, start)
    return redraws


@pytest.mark.parametrize("levels", [[1], [1, 2, 3], [3, 4, 5, 6]])
def test_arith_draws_the_stream_it_drew_before(levels):
    redraws = _same_stream(ArithTask(level=levels), arith_before, 300)
    if levels == [1]:                       # level 1's 162 questions: held-out twins are drawn again
        assert max(redraws) > 0


def test_reasoning_gym_draws_the_stream_it_drew_before():
    task = get_task("reasoning_gym", datasets={"chain_sum": {"weight": 2}, "binary_matrix": {}})
    _same_stream(task, gym_before, 150)


def test_start_is_an_index_and_a_held_out_draw_is_drawn_again():
    def draw(rng):
        n = rng.randrange(10)
        return None if n < 3 else Prompt(id=f"n{n}", question=str(n), reference=str(n))

    stream = list(itertools.islice(drawn_stream("k", 1, 0, draw), 50))
    assert list(itertools.islice(drawn_stream("k", 1, 20, draw), 30)) == stream[20:]
    assert all(int(p.question) >= 3 for p in stream)
    assert list(itertools.islice(drawn_stream("k", 2, 0, draw), 50)) != stream       # the seed matters


def test_a_stream_that_keeps_drawing_held_out_questions_says_so():
    stream = drawn_stream("k", 0, 0, lambda rng: None, max_redraws=4, exhausted="k: 4 draws in a row held out")
    with pytest.raises(TaskError, match="^k: 4 draws in a row held out$"):
        next(stream)
