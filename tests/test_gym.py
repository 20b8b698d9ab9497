"""reasoning_gym tasks on the real library: rebuildable ids, held-out evals, per-dataset relay
tags, the datasets' own verifiers in the grader worker, hostile answers bounded and defused."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftis_edge import config
from ftis_edge.tasks import TaskError, get_task, task_from_config, warm_up
from ftis_edge.tasks.gym_source import NOT_REPRODUCIBLE, dataset_names
from ftis_edge.tasks.gym_verify import math_text_ok
from procs import settled, subscribed

ROOT = Path(__file__).resolve().parents[1]
# SAPO's nine datasets
SAPO = ["base_conversion", "basic_arithmetic", "arc_1d", "bf", "propositional_logic",
        "fraction_simplification", "decimal_arithmetic", "calendar_arithmetic", "binary_matrix"]


@pytest.fixture(scope="module")
def mix():
    task = get_task("reasoning_gym", datasets={"chain_sum": {"weight": 2}, "binary_matrix": {},
                                               "countdown": {}, "basic_arithmetic": {"max_terms": 3}})
    assert warm_up()
    return task


def test_prompts_are_a_pure_function_of_seed_and_round_and_ids_rebuild_them(mix):
    a = [p for _, p in zip(range(12), mix.prompts(seed=3))]
    b = [p for _, p in zip(range(12), mix.prompts(seed=3))]
    assert [p.id for p in a] == [p.id for p in b]
    assert [p.id for p in a[5:]] == [p.id for _, p in zip(range(7), mix.prompts(seed=3, start=5))]
    assert [p.id for p in a] != [p.id for _, p in zip(range(12), mix.prompts(seed=4))]
    assert {p.meta["dataset"] for p in a} >= {"chain_sum", "binary_matrix"}
    other = get_task("reasoning_gym", datasets={"basic_arithmetic": {"max_terms": 3}, "chain_sum": {}})
    for p in a:                         # another node with the dataset rebuilds the same question
        assert mix.get(p.id) == p
        if p.meta["dataset"] in ("chain_sum", "basic_arithmetic"):
            assert other.get(p.id).question == p.question


def test_items_are_the_same_in_another_process():
    """Ids are enough across machines: another interpreter with another hash seed builds the
    same questions (the datasets in NOT_REPRODUCIBLE fail this, which is why they are refused)."""
    code = ("import json,sys; from ftis_edge.tasks import get_task\n"
            "t = get_task('reasoning_gym', datasets=sys.argv[1])\n"
            "print(json.dumps([[p.id, p.question] for _, p in zip(range(30), t.prompts(seed=1))]"
            " + [[p.id, p.question] for p in t.eval_prompts(9)]))")
    outs = []
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, PYTHONPATH=str(ROOT))
        r = subprocess.run([sys.executable, "-c", code, ",".join(SAPO)], capture_output=True, text=True,
                           env=env, cwd=ROOT, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert outs[0] == outs[1]
    here = get_task("reasoning_gym", datasets=",".join(SAPO))
    assert [[p.id, p.question] for p in here.eval_prompts(9)] == outs[0][30:]


def test_eval_prompts_are_held_out_and_refused_as_training(mix):
    evals = mix.eval_prompts()
    assert len(evals) == 4 * 50 and len({p.id for p in evals}) == 200
    assert not any(mix.is_trainable(p.id) for p in evals)
    train = [p for _, p in zip(range(50), mix.prompts(seed=0))]
    assert all(mix.is_trainable(p.id) for p in train)
    assert not {p.id for p in train} & {p.id for p in evals}
    assert [p.id for p in mix.eval_prompts(6)] == [p.id for p in evals[:6]]


def test_unknown_or_forged_ids_are_refused(mix):
    p = next(mix.prompts(seed=0))
    tag, _, index = p.id.rpartition("/")
    for bad in [f"{tag}/99999999", "rg/chain_sum/0000000000/1", "rg/evil/abc/1", f"{tag}/-1",
                f"{tag}/1/2", "gsm8k/train/1", 7, None]:
        with pytest.raises(TaskError):
            mix.get(bad)
        assert not mix.is_trainable(bad)


def test_relay_tags_carry_the_dataset_and_its_settings(mix):
    easy = get_task("reasoning_gym", datasets={"chain_sum": {"weight": 5}})      # weights do not matter
    harder = get_task("reasoning_gym", datasets={"chain_sum": {"max_terms": 4}})
    assert set(easy.tags) < set(mix.tags) and not set(harder.tags) & set(mix.tags)
    for p in [p for _, p in zip(range(30), mix.prompts(seed=0))]:
        assert mix.tag_of(p.id) == p.id.rpartition("/")[0]
        assert easy.tag_of(p.id) == (mix.tag_of(p.id) if p.meta["dataset"] == "chain_sum" else None)
        assert harder.tag_of(p.id) is None
    assert all(len(t.encode()) <= 128 for t in mix.tags)                  # the relay's attribute limit


def test_a_peer_on_another_dataset_is_filtered_out_by_a_real_relay(relay, mix):
    """The node subscribes with task.tags and tags each rollout with task.tag_of(prompt id)."""
    from relay.client import RelayClient
    from messages import raw_rollout

    only_chain = get_task("reasoning_gym", datasets={"chain_sum": {}})
    r = relay("--rate", "0", "--rate-mb", "0")
    peer = RelayClient(r.address, swarm="s", node_id="peer", subscribe=False).start()
    me = RelayClient(r.address, swarm="s", node_id="me", filters={"task": list(only_chain.tags)}).start()
    try:
        deadline = time.time() + 10
        while not (peer.stats()["connected"] and me.stats()["connected"]):
            assert time.time() < deadline
            time.sleep(0.02)
        assert subscribed(r, "me")
        sent = [p for _, p in zip(range(16), mix.prompts(seed=0))]
        for p in sent:
            peer.publish_bytes(raw_rollout(p.id, task=mix.tag_of(p.id)), task=mix.tag_of(p.id))
        want = sorted(p.id for p in sent if p.meta["dataset"] == "chain_sum")
        got, deadline = [], time.time() + 5
        while time.time() < deadline and len(got) < len(want):
            got += me.poll(timeout_s=0.05)
        assert settled(r, me)                   # nothing from another dataset is on its way
        got += me.poll()
        assert want and sorted(d.rollout_id for d in got) == want
    finally:
        peer.close()
        me.close()


def test_grading_uses_the_datasets_verifier_with_partial_credit(mix):
    for p in mix.eval_prompts(8):
        value, b = mix.reward(f"<think>sure</think><answer>{p.meta['answer']}</answer>", p.reference)
        assert value == 1.0 and b["correct"], (p.id, b)
        assert mix.reward(f"<answer>{p.meta['answer']}</answer> done", p.reference)[0] == 0.0   # format rule
    matrix = next(p for p in mix.eval_prompts(8) if p.meta["dataset"] == "binary_matrix")
    rows = [[int(x) for x in line.split()] for line in matrix.meta["answer"].splitlines()]
    value, b = mix.reward(f"<answer>{rows}</answer>", matrix.reference)   # a Python list: the verifier's 0.1
    assert value == pytest.approx(0.1) and not b["correct"] and b["partial"] == pytest.approx(0.1)
    strict = get_task("reasoning_gym", datasets={"binary_matrix": {}}, partial_credit=False)
    assert strict.reward(f"<answer>{rows}</answer>", strict.eval_prompts(1)[0].reference)[0] == 0.0


@pytest.mark.parametrize("attack", [
    "__import__('os').system('touch {marker}')",
    "[open('{marker}', 'w')]",
    "exec(\"open('{marker}', 'w')\")",
    "(lambda: open('{marker}', 'w'))()",
])
def test_code_in_an_answer_never_runs(tmp_path, mix, attack):
    """binary_matrix's verifier evals the answer, countdown's parse_expr evals it: with the
    pre-filter off (the worker's own defences alone) nothing of it runs."""
    from ftis_edge.tasks.grader import score
    import dataclasses
    raw = dataclasses.replace(mix.reward_settings, prefilter=False, timeout_s=2.0)
    marker = tmp_path / "pwned"
    for p in mix.eval_prompts(4):
        value, b = score(f"<answer>{attack.format(marker=marker)}</answer>", p.reference, raw)
        assert value <= 0.05, (p.id, b)          # countdown pays 0.01-0.05 for any answer
    assert not marker.exists()
    assert mix.reward("<answer>__import__('os')</answer>", mix.eval_prompts(1)[0].reference)[1]["reason"] \
        == "refused: dunder in the answer"


def test_math_text_guard():
    assert math_text_ok("-6 + (74*(55 + 48) - 10)/44") and math_text_ok("5*X**10/4 + sin(x) + C")
    for bad in ["__import__('os')", "open('x')", "exec(1)", "().__class__", "x.func", "[1]", "lambda: 1"]:
        assert not math_text_ok(bad), bad


@pytest.mark.slow       # ≥ 15 s on 2 cores: CI's slow tier keeps the README command under 20 min
def test_a_hostile_answer_is_bounded_by_the_grader_timeout(mix):
    countdown = next(p for p in mix.eval_prompts(4) if p.meta["dataset"] == "countdown")
    warm_up()
    t0 = time.monotonic()
    value, b = mix.reward("<answer>9**9**9**9**9</answer>", countdown.reference)   # sympy would never finish
    elapsed = time.monotonic() - t0
    assert value == 0.0 and b["timed_out"] and elapsed < mix.reward_settings.timeout_s + 2.0, (elapsed, b)
    assert warm_up()                           # the spare took over; the next answer grades normally
    assert mix.reward(f"<answer>{countdown.meta['answer']}</answer>", countdown.reference)[0] == 1.0


def test_bad_settings_are_one_line_task_errors():
    for datasets, match in [({"no_such_dataset": {}}, "unknown dataset"),
                            ({"chain_sum": {"max_termz": 3}}, "has no setting 'max_termz'"),
                            ({"chain_sum": {"weight": 0}}, "weight must be a positive"),
                            ({"chain_sum": {"min_terms": 5, "max_terms": 2}}, "bad settings"),
                            ({"list_functions": {}}, "not reproducible"),
                            ({}, "name at least one dataset")]:
        with pytest.raises(TaskError, match=match) as e:
            get_task("reasoning_gym", datasets=datasets)
        assert "\n" not in str(e.value)
    assert NOT_REPRODUCIBLE.isdisjoint(dataset_names()) and set(SAPO) <= set(dataset_names())


def test_a_node_config_names_the_mix():
    cfg = config.from_dict({"task": {"name": "reasoning_gym", "datasets": {
        "chain_sum": {"weight": 2, "level": 1}, "basic_arithmetic": {"max_terms": 2}}}})
    task = task_from_config(cfg.task)
    assert [s.dataset for s in task.sources] == ["chain_sum", "basic_arithmetic"]
    assert task.sources[0].weight == 2.0
    assert config.from_dict(config.tomllib.loads(config.to_toml(cfg))).task.datasets == cfg.task.datasets
    template = config.to_toml(config.Config())              # what `ftis-edge init` writes
    for key in ("datasets", "eval_path", "eval_fraction", "question_field", "answer_field", "grade", "options"):
        assert f"\n{key} = " in template, key
    with pytest.raises(config.ConfigError, match="task.datasets: expected a table"):
        config.from_dict({"task": {"name": "reasoning_gym", "datasets": "chain_sum"}})
    assert get_task("reasoning_gym:chain_sum,basic_arithmetic").tags[0].startswith("rg/chain_sum/")
