"""The expert recipe's arguments and record (experiments/expert, issue 49 item 2): fast, no model.
The recipe's stages run real ftis-edge commands; its real run is recorded in docs/runs/expert/."""
from __future__ import annotations

import datetime as dt
import hashlib
import json

import pytest

from experiments.expert import recipe
from experiments.repro import records
from ftis_edge import config as cfgmod


def ev(rights: list[bool], prefix: str = "rg/letter_counting/k") -> dict:
    return {"format_rate": 1.0, "items": [{"id": f"{prefix}/{i}", "reward": 1.0 if r else 0.1}
                                          for i, r in enumerate(rights)]}


LETTERS = recipe.CONFIG.with_name("letter_counting.toml")     # the first attempt, kept with its record


def test_the_committed_expert_trains_alone_on_harder_arithmetic_than_h8s_id_and_ood():
    cfg = cfgmod.load(recipe.CONFIG)
    assert cfg.task.name == "arith" and cfg.task.level == [6]            # H8: ID levels 1-2, OOD level 3
    assert cfg.swarm.collaboration == "alone" and cfg.train.trainable == "lora"
    assert cfg.model.spec == "smollm2-135m" and cfg.model.threads == 1
    assert cfg.node.checkpoint_every == 1                                 # a stop loses at most a round
    assert recipe.task_args(cfg) == ["--task", "arith", "--level", "6"]  # the evals see level 6 too
    first = cfgmod.load(LETTERS)
    assert first.task.name == "reasoning_gym" and list(first.task.datasets) == ["letter_counting"]
    assert first.node.id != cfg.node.id                                   # separate run directories


def test_the_experts_held_out_questions_are_unseen_by_text():
    """200 distinct level-6 eval questions, none of which training can draw under any id."""
    from ftis_edge.tasks import get_task
    from ftis_edge.tasks.unseen import question_key
    task = get_task("arith", level=[6])
    held = task.eval_prompts(200)
    assert len(held) == 200 and len({question_key(p.question) for p in held}) == 200
    texts = {question_key(p.question) for p in held}
    train = [p for p, _ in zip(task.prompts(seed=0), range(2000))]
    assert not texts & {question_key(p.question) for p in train}


@pytest.mark.parametrize("argv, message", [
    (["--until", "8.55"], "expected HH:MM"),
    (["--until", "25:00"], "expected HH:MM"),
    (["--rounds", "0"], "at least 1"),
    (["--eval-limit", "0"], "at least 1"),
    (["--config", "/nonexistent/expert.toml"], "no such file"),
])
def test_bad_arguments_are_one_clear_line(argv, message, capsys):
    assert recipe.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_until_is_the_next_such_utc_time():
    now = dt.datetime(2026, 12, 5, 8, 0, tzinfo=dt.timezone.utc)
    assert recipe.parse_until("08:55", now) == now.replace(minute=55).timestamp()
    assert recipe.parse_until("07:00", now) == (now.replace(hour=7) + dt.timedelta(days=1)).timestamp()
    assert recipe.parse_until(None, now) is None


def test_evals_are_compared_prompt_by_prompt_with_wilson_intervals():
    before = ev([True] * 10 + [False] * 190)
    after = ev([True] * 8 + [False] * 2 + [True] * 50 + [False] * 140)
    s = recipe.eval_summary(after)
    assert (s["n"], s["correct"], s["accuracy"]) == (200, 58, 0.29)
    assert s["ci95"][0] < 0.29 < s["ci95"][1]
    c = recipe.compare(before, after)
    assert (c["right_only_after"], c["right_only_before"]) == (50, 2)
    assert c["clearly_risen"] and c["mcnemar_p"] < 1e-6
    assert not recipe.compare(before, ev([True] * 12 + [False] * 188))["clearly_risen"]
    with pytest.raises(recipe.RecipeError, match="same prompts"):
        recipe.compare(before, ev([True] * 200, prefix="rg/other/k"))


def test_more_rounds_from_the_training_trend():
    before, after = ev([True] * 10 + [False] * 190), ev([True] * 16 + [False] * 184)
    rounds = [{"accuracy/own": 0.01 * i} for i in range(12)]
    t = recipe.trend(rounds)
    assert t["slope_per_round"] == pytest.approx(0.01) and t["first"][0] < t["last"][0]
    more = recipe.rounds_to_clear(before, after, t["slope_per_round"])
    assert 1 <= more <= 20
    assert recipe.rounds_to_clear(before, after, -0.01) is None            # no upward trend: say so
    assert recipe.rounds_to_clear(before, ev([True] * 60 + [False] * 140), None) == 0


def test_the_record_has_config_rounds_evals_sha256_and_rebuild_command(tmp_path):
    gguf = tmp_path / "model-f16.gguf"
    gguf.write_bytes(b"not really a model")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"type": "round", "round": 1}\n')
    args = recipe.parse_args(["--rounds", "3"])
    rounds = [{"round": i, "accuracy/own": 0.1, "time/round_s": 100.0} for i in (1, 2, 3)]
    rec = recipe.build_record(recipe.CONFIG, run, rounds, ev([False] * 4), ev([True, False, False, False]),
                              gguf, recipe.rebuild_command(args, 3))
    assert rec["rounds"] == 3 and rec["train_seconds"] == 300.0
    assert rec["config"]["file"] == "experiments/expert/expert.toml" and rec["config"]["task"] == "arith"
    assert rec["eval"]["before"]["correct"] == 0 and rec["eval"]["after"]["correct"] == 1
    assert rec["clearly_above_best_constant"] is None and rec["constant_answer_baselines"] == {}  # nothing to try
    assert rec["export"]["sha256"] == hashlib.sha256(b"not really a model").hexdigest()
    assert rec["rebuild"].startswith("python -m experiments.expert --config experiments/expert/expert.toml --rounds 3")
    out = tmp_path / "docs" / "record.json"
    (run / "config.toml").write_text(f'run_dir = "{recipe.ROOT}/runs/expert-x"\n')
    recipe.publish(rec, run, out)
    assert json.loads(out.read_text())["export"]["sha256"] == rec["export"]["sha256"]
    assert records.exists(out.parent / "metrics.jsonl") and not (out.parent / "model-f16.gguf").exists()
    assert (out.parent / "config.toml").read_text() == 'run_dir = "runs/expert-x"\n'   # no checkout's path
    old = recipe.parse_args(["--config", str(LETTERS), "--record", str(recipe.ROOT / "docs/runs/expert/lc.json")])
    assert recipe.rebuild_command(old, 60).startswith(
        "python -m experiments.expert --config experiments/expert/letter_counting.toml --rounds 60 --eval-limit 200 "
        "--threads 1 --record docs/runs/expert/lc.json")


def test_constant_answers_score_what_always_saying_one_number_would():
    """The yardstick for a counting expert: most short texts hold the asked letter once."""
    from ftis_edge.tasks import get_task
    spec = recipe.task_spec_of(cfgmod.load(LETTERS))
    prompts = get_task(spec).eval_prompts(12)
    base = {"items": [{"id": p.id, "reference": p.reference, "reward": 0.0} for p in prompts]}
    assert recipe.constant_candidates(base, {"items": []}) == ()           # gym references are ids
    scores = recipe.constant_answers(spec, base, ("1", "2", "99"))
    assert scores["99"]["correct"] == 0 and all(s["n"] == 12 for s in scores.values())
    assert 0 < scores["1"]["correct"] + scores["2"]["correct"] <= 12


def test_for_arithmetic_the_constants_are_the_commonest_answers_and_the_experts_own():
    from ftis_edge.tasks import get_task
    prompts = get_task("arith", level=[6]).eval_prompts(60)
    base = {"items": [{"id": p.id, "reference": p.reference, "reward": 0.0} for p in prompts]}
    after = {"items": [{"id": p.id, "answer": "7", "reward": 0.0} for p in prompts]}
    answers = recipe.constant_candidates(base, after)
    refs = [p.reference for p in prompts]
    commonest = answers[0]
    assert refs.count(commonest) == max(map(refs.count, refs)) and answers[-1] == "7"
    scores = recipe.constant_answers("arith", base, answers)
    assert scores[commonest]["correct"] == sum(p.reference == commonest for p in prompts) >= 1
