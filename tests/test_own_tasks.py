"""Your own dataset (a JSON Lines file) and your own task class, on real files."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from ftis_edge import config
from ftis_edge.tasks import TaskError, get_task, task_from_config, task_spec, warm_up

DATA = Path(__file__).resolve().parent / "data"


def write(path: Path, rows, raw: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + raw, encoding="utf-8")
    return path


@pytest.fixture
def qa(tmp_path):
    rows = [{"q": f"What is {i} + {i}?", "a": 2 * i, "note": "x"} for i in range(40)]
    return write(tmp_path / "qa.jsonl", rows)


def test_jsonl_file_becomes_a_task_with_a_held_out_fraction(qa):
    task = get_task("jsonl", path=qa, question_field="q", answer_field="a", eval_fraction=0.25)
    evals = task.eval_prompts()
    train = task.splits["train"]
    assert len(evals) == 10 and len(train) == 30
    assert not {p.question for p in evals} & {p.question for p in train}
    assert all(task.is_trainable(p.id) for p in train) and not any(task.is_trainable(p.id) for p in evals)
    stream = [p for _, p in zip(range(60), task.prompts(seed=2))]
    assert {p.id for p in stream} == {p.id for p in train}            # every epoch covers the split
    assert [p.id for p in stream] == [p.id for _, p in zip(range(60), task.prompts(seed=2))]
    same = get_task("jsonl", path=qa, question_field="q", answer_field="a", eval_fraction=0.25)
    assert all(same.get(p.id) == p for p in stream + evals)          # a peer with the same file rebuilds
    warm_up()
    p = evals[0]
    assert task.reward(f"<answer>{p.reference}</answer>", p.reference)[0] == 1.0
    assert task.reward(f"<answer>{p.reference}.0</answer>", p.reference)[0] == 1.0     # math-verify
    assert task.reward("<answer>-1</answer>", p.reference)[0] == 0.0


def test_a_peer_with_another_file_content_does_not_match(qa, tmp_path):
    mine = get_task("jsonl", path=qa, question_field="q", answer_field="a")
    text = qa.read_text().replace("What is 3 + 3?", "What is 3 + 4?")
    theirs = get_task("jsonl", path=_same_name(tmp_path, text), question_field="q", answer_field="a")
    assert mine.tags != theirs.tags
    p = next(theirs.prompts())
    assert mine.tag_of(p.id) is None
    with pytest.raises(TaskError):
        mine.get(p.id)
    other_rule = get_task("jsonl", path=qa, question_field="q", answer_field="a", grade="exact")
    assert other_rule.tags != mine.tags


def _same_name(tmp_path: Path, text: str) -> Path:
    (tmp_path / "peer").mkdir()
    path = tmp_path / "peer" / "qa.jsonl"
    path.write_text(text, encoding="utf-8")
    return path


def test_exact_and_regex_rules_and_a_second_eval_file(tmp_path):
    train = write(tmp_path / "train.jsonl", [{"question": "Capital of France?", "answer": "Paris"},
                                             {"question": "Capital of Peru?", "answer": "Lima"}])
    held = write(tmp_path / "eval.jsonl", [{"question": "Capital of Japan?", "answer": "Tokyo"}])
    exact = get_task("jsonl", path=train, eval_path=held, grade="exact", ignore_case=True)
    assert [p.question for p in exact.eval_prompts()] == ["Capital of Japan?"]
    assert len(exact.splits["train"]) == 2
    ref = exact.eval_prompts()[0].reference
    assert exact.reward("<answer> tokyo </answer>", ref)[0] == 1.0
    assert exact.reward("<answer>Kyoto</answer>", ref)[0] == 0.0
    pattern = write(tmp_path / "re.jsonl", [{"question": "Name a prime above 10", "answer": r"1[137]|2[39]"}] * 3)
    regex = get_task("jsonl", path=pattern, grade="regex", eval_fraction=0.0)
    warm_up()
    ref = regex.splits["train"][0].reference
    assert regex.reward("<answer>13</answer>", ref)[0] == 1.0
    assert regex.reward("<answer>15</answer>", ref)[0] == 0.0


def test_a_catastrophic_regex_is_bounded_by_the_grader_timeout(tmp_path):
    path = write(tmp_path / "evil.jsonl", [{"question": "say a", "answer": r"(a+)+b"}] * 2)
    task = get_task("jsonl", path=path, grade="regex", eval_fraction=0.0, timeout_s=0.3)
    assert warm_up()
    t0 = time.monotonic()
    value, b = task.reward("<answer>" + "a" * 40 + "</answer>", r"(a+)+b")   # 2^40 backtracking steps
    assert value == 0.0 and b["timed_out"] and time.monotonic() - t0 < 0.3 + 2.0, b    # stopped, not hung
    assert warm_up()
    assert task.reward("<answer>aab</answer>", r"(a+)+b")[0] == 1.0


def test_bad_regex_and_options_are_task_errors(tmp_path):
    path = write(tmp_path / "r.jsonl", [{"question": "q", "answer": "(unclosed"}])
    with pytest.raises(TaskError, match=r"r\.jsonl:1: 'answer' is not a regular expression"):
        get_task("jsonl", path=path, grade="regex")
    with pytest.raises(TaskError, match="grade must be one of"):
        get_task("jsonl", path=path, grade="fuzzy")
    with pytest.raises(TaskError, match="set task.path"):
        get_task("jsonl")
    with pytest.raises(TaskError, match="no such file"):
        get_task("jsonl", path=tmp_path / "missing.jsonl")


def test_node_config_for_a_jsonl_task_and_the_eval_spec(qa):
    cfg = config.from_dict({"task": {"name": "jsonl", "path": str(qa), "question_field": "q",
                                     "answer_field": "a", "grade": "exact", "eval_fraction": 0.5}})
    task = task_from_config(cfg.task)
    assert len(task.eval_prompts()) == 20 and task.grade == "exact"
    again = get_task(task_spec(cfg.task))                 # what export hands to `ftis-edge eval --task`
    assert again.tags == task.tags and [p.id for p in again.eval_prompts()] == [p.id for p in task.eval_prompts()]


# --- your own task class -------------------------------------------------------------------

@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(DATA))
    yield
    sys.modules.pop("capitals_task", None)


def test_a_task_class_loads_from_a_dotted_path(on_path):
    cfg = config.from_dict({"task": {"name": "capitals_task:CapitalsTask", "options": {"countries": 6}}})
    task = task_from_config(cfg.task)
    assert type(task).__name__ == "CapitalsTask" and task.tags == ("capitals",)
    train = [p for _, p in zip(range(30), task.prompts(seed=1))]
    evals = task.eval_prompts()
    assert len(evals) == 2 and not {p.id for p in train} & {p.id for p in evals}
    assert not any(task.is_trainable(p.id) for p in evals) and all(task.is_trainable(p.id) for p in train)
    assert task.get(train[0].id) == train[0]
    assert task.reward(f"<answer>{evals[0].reference.upper()}</answer>", evals[0].reference)[0] == 1.0
    assert task.reward("<answer>Rome</answer>", evals[0].reference)[0] == 0.0


def test_bad_task_classes_are_one_line_errors(on_path, tmp_path, monkeypatch):
    (tmp_path / "not_a_task.py").write_text("class Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, match in [("no_such_module_xyz:Task", "cannot load it"), ("capitals_task:Nope", "cannot load it"),
                        ("not_a_task:Thing", "not a subclass"), ("nonsense", "unknown task")]:
        with pytest.raises(TaskError, match=match):
            get_task(name)
    with pytest.raises(TaskError, match="unexpected keyword"):
        get_task("capitals_task:CapitalsTask", colour="red")
    with pytest.raises(config.ConfigError, match="task.name: unknown task 'nonsense'"):
        config.from_dict({"task": {"name": "nonsense"}})


def test_a_task_class_loads_from_an_entry_point(tmp_path, monkeypatch, on_path):
    """An installed package's entry point in the group ftis_edge.tasks (a real dist-info on sys.path)."""
    dist = tmp_path / "my_tasks-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-tasks\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[ftis_edge.tasks]\ncapitals = capitals_task:CapitalsTask\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = config.from_dict({"task": {"name": "capitals"}})
    assert type(task_from_config(cfg.task)).__name__ == "CapitalsTask"


# --- `ftis-edge eval --task …` for every task kind --------------------------------------------

def test_eval_builds_every_task_kind_by_name(on_path, tmp_path):
    import argparse
    from ftis_edge import evaluate

    def build(*argv):
        p = argparse.ArgumentParser()
        evaluate.add_arguments(p)
        spec = evaluate.EvalSpec.from_args(p.parse_args(list(argv)))
        evaluate._check_spec(spec)
        return evaluate._build_task(spec)

    assert build("--task", "reasoning_gym:chain_sum").tags[0].startswith("rg/chain_sum/")
    plain = write(tmp_path / "plain.jsonl", [{"question": f"{i}?", "answer": str(i)} for i in range(10)])
    assert build("--task", "jsonl", "--path", str(plain)).eval_prompts()[0].id.startswith("jsonl/")
    assert type(build("--task", "capitals_task:CapitalsTask")).__name__ == "CapitalsTask"
    cfg = config.from_dict({"task": {"name": "reasoning_gym", "datasets": {"leg_counting": {"eval_size": 7}}}})
    spec = build("--task", task_spec(cfg.task))            # export's eval of a node's whole [task]
    assert len(spec.eval_prompts()) == 7
    with pytest.raises(evaluate.EvalError, match="unknown dataset"):
        build("--task", "reasoning_gym:nope")
