"""Held-out eval inside the run (heldout.py) and the swarm guard (guard.py).

The statistics and the guard's state machine run on real eval records: the per-prompt greedy
results that `ftis-edge eval` wrote for the H5 heterogeneous swarm (docs/runs/fill/fill-hetero:
the Gemma 3 node alone, with F-TIS, with `nois`, and a SmolLM2 node alone and with `nois`),
kept in tests/data/h5_evals.json. The node tests run
the real model on tiny settings.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from ftis_edge.store import checkpoint
from ftis_edge import config
from ftis_edge.run.guard import ALONE, SwarmGuard
from ftis_edge.run.heldout import EvalResult, HeldOut, eval_line
from ftis_edge.metrics.stats import mcnemar_two_sided, mcnemar_worse, paired_change
from ftis_edge.metrics.metric_keys import unregistered
from ftis_edge.metrics.records import read_rounds
from ftis_edge.tasks import Task
from procs import ROOT, run_node, write_config

H5_EVALS = json.loads((Path(ROOT) / "tests" / "data" / "h5_evals.json").read_text())["runs"]


def real_eval(run: str, round_: int, limit: int = 64) -> EvalResult:
    """The first ``limit`` held-out answers of a real run's eval (the same prompts in every run)."""
    return EvalResult.from_items(round_, H5_EVALS[run]["items"][:limit])


# --- statistics ------------------------------------------------------------------------------------

def test_paired_change_counts_only_prompts_that_changed():
    ref = [True] * 6 + [False] * 4
    now = [True] * 3 + [False] * 3 + [True] + [False] * 3      # 3 lost, 1 gained
    ch = paired_change(now, ref)
    assert (ch.lost, ch.gained, ch.n) == (3, 1, 10)
    assert ch.diff == pytest.approx(-0.2)
    assert ch.se == pytest.approx(math.sqrt(3 + 1 - 4 / 10) / 10)
    lo, hi = ch.interval
    assert lo < ch.diff < hi
    # no prompt changed: no variance, the interval is the point
    same = paired_change(ref, ref)
    assert same.diff == 0 and same.se == 0 and same.p_worse == 1.0
    with pytest.raises(ValueError, match="same prompts"):
        paired_change(now, ref[:-1])


def test_mcnemar_is_the_exact_binomial_tail():
    assert mcnemar_worse(5, 0) == pytest.approx(1 / 32)
    assert mcnemar_worse(4, 0) == pytest.approx(1 / 16)
    assert mcnemar_worse(0, 5) == 1.0
    assert mcnemar_worse(3, 1) == pytest.approx(5 / 16)
    assert mcnemar_two_sided(7, 0) == mcnemar_two_sided(0, 7) == pytest.approx(2 / 128)
    assert mcnemar_two_sided(3, 1) == pytest.approx(10 / 16) and mcnemar_two_sided(2, 2) == 1.0 == mcnemar_two_sided(0, 0)


def test_eval_result_of_real_records_and_its_round_trip():
    alone = real_eval("alone-3", 10, limit=200)
    assert alone.n == 200 and alone.accuracy == pytest.approx(0.725)   # the accuracy results.md reports
    nois = real_eval("nois-3", 20, limit=200)
    assert nois.accuracy == 0.0 and sum(nois.truncated) / nois.n == pytest.approx(0.185)
    lo, hi = alone.interval
    assert lo < 0.725 < hi and hi - lo < 0.14
    assert EvalResult.from_dict(json.loads(json.dumps(alone.as_dict()))) == alone


def test_record_keys_are_registered_and_paired_against_the_base():
    class Nothing:
        name = "nothing"
    h = HeldOut(Nothing(), None, None, every=10, prompts=0, max_new_tokens=8)   # inactive: no model needed
    h.observe(real_eval("alone-3", 0))
    h.observe(real_eval("ftis-3", 10))
    rec = h.record(h.last)
    assert unregistered(rec) == []
    assert rec["eval/base_accuracy"] == h.base.accuracy and rec["eval/best_round"] == 0
    ch = paired_change(h.last.correct, h.base.correct)
    assert rec["eval/change"] == ch.diff < 0 and rec["eval/change_lo"] < rec["eval/change"] < rec["eval/change_hi"]
    assert unregistered(h.base_record()) == []
    assert eval_line(rec).startswith(f"held-out {100 * h.last.accuracy:.0f}%") and "base" in eval_line(rec)
    assert eval_line({"reward": 1.0}) is None


def test_a_task_without_an_eval_split_says_so_once(caplog):
    class NoEval(Task):
        name = "noeval"

    with caplog.at_level(logging.WARNING, logger="ftis_edge.run.heldout"):
        h = HeldOut(NoEval(), None, None, every=5, prompts=32, max_new_tokens=8)
    assert not h.active and not h.due(0, last=True) and not h.due(5, last=False)
    said = [r for r in caplog.records if "no eval split" in r.getMessage()]
    assert len(said) == 1 and "noeval" in said[0].getMessage()


# --- the guard's state machine on real eval records ----------------------------------------------

SMOL, GEMMA = "tok-smol", "tok-gemma"
PEERS = {"smol-a": {"tokenizer": SMOL, "model_fp": "smol"},
         "smol-b": {"tokenizer": SMOL, "model_fp": "smol-other"},
         "gemma-c": {"tokenizer": GEMMA, "model_fp": "gemma"}}


def test_guard_steps_down_the_ladder_on_real_harm_and_returns_on_recovery():
    guard = SwarmGuard(GEMMA, "gemma", alpha=0.05)
    base = real_eval("alone-3", 0)        # the Gemma node as it does alone: the reference
    # another tokenizer admitted at level 0
    assert guard.admits(SMOL, "smol") and guard.admits(GEMMA, "gemma")

    harmed = real_eval("ftis-3", 8)      # the same Gemma node in the swarm with F-TIS: 40% of 200
    step = guard.observe(harmed, base, base, PEERS)
    assert step.harmed and step.moved == 1 and guard.level == 2     # no batch fill: rung 1 changes nothing
    assert "McNemar p=" in step.line and "lost" in step.line and "another tokenizer" in step.line
    assert not guard.admits(SMOL, "smol") and guard.admits(GEMMA, "gemma")   # other tokenizer out first

    # still harmed: level 2 (no other base model) would exclude nobody new (every peer with another
    # base model has another tokenizer too), so the guard goes straight to training alone
    worse = real_eval("nois-3", 16)      # nois: 0 %
    step = guard.observe(worse, base, base, PEERS)
    assert step.moved == 1 and guard.level == ALONE and not guard.admits(GEMMA, "gemma")
    step = guard.observe(worse, base, base, PEERS)
    assert step.harmed and step.moved == 0 and guard.level == ALONE and "already" in step.line

    # accuracy back at the base: one step back per eval, skipping levels that exclude nobody new
    recovered = real_eval("alone-3", 24)
    step = guard.observe(recovered, base, base, PEERS)
    assert not step.harmed and step.moved == -1 and guard.level == 2
    step = guard.observe(recovered, base, base, PEERS)
    assert step.moved == -1 and guard.level == 0 and guard.admits(SMOL, "smol")
    assert guard.fired == 2


def test_a_filling_guards_first_step_is_to_generate_every_group_itself():
    """Batch fill on: the first harm stops the trade of own samples for peers' (peers still admitted,
    a false alarm costs compute); harm again, and another tokenizer goes."""
    guard = SwarmGuard(GEMMA, "gemma", alpha=0.05, fills=True)
    base = real_eval("alone-3", 0)
    step = guard.observe(real_eval("ftis-3", 8), base, base, PEERS)
    assert guard.level == 1 and guard.generates_all and step.line.endswith("every group generated here (peers only on top)")
    assert guard.admits(SMOL, "smol")
    guard.observe(real_eval("nois-3", 16), base, base, PEERS)
    assert guard.level == 2 and not guard.admits(SMOL, "smol")
    old = SwarmGuard(GEMMA, "gemma", fills=True)          # a checkpoint of the 4-rung ladder, at its level 1
    old.load_state({"level": 1, "fired": 1})
    assert old.level == 2


def test_guard_stays_quiet_when_the_swarm_does_not_hurt():
    # SmolLM2 node 1 alone vs in the nois swarm (H5): the same 60.5 % of 200
    guard = SwarmGuard(SMOL, "smol")
    base = real_eval("alone-1", 0, limit=200)
    step = guard.observe(real_eval("nois-1", 10, limit=200), base, base, PEERS)
    assert not step.harmed and step.moved == 0 and guard.level == 0 and "no harm" in step.line
    # and a small dip within chance (2 prompts lost of 64) does not fire either
    ref = real_eval("alone-1", 0)
    flipped = [c for c in ref.correct]
    for i in [i for i, c in enumerate(flipped) if c][:2]:
        flipped[i] = False
    dip = EvalResult(round=5, correct=tuple(flipped), format_ok=ref.format_ok, truncated=ref.truncated)
    assert not guard.observe(dip, ref, ref, PEERS).harmed and guard.level == 0


def test_guard_skips_a_step_that_would_exclude_nobody():
    guard = SwarmGuard(SMOL, "smol")
    base = real_eval("alone-3", 0)
    same_kind = {"smol-b": {"tokenizer": SMOL, "model_fp": "smol-other"}}   # same tokenizer, other base
    guard.observe(real_eval("nois-3", 5), base, base, same_kind)
    assert guard.level == 3 and guard.admits(SMOL, "smol") and not guard.admits(SMOL, "smol-other")
    g2 = SwarmGuard(SMOL, "smol")
    g2.observe(real_eval("nois-3", 5), base, base, {})        # no peer seen: straight to alone
    assert g2.level == ALONE
    g2.load_state(SwarmGuard(SMOL, "smol").state())
    assert g2.level == 0


# --- the node (real model) -----------------------------------------------------------------------

# what training produced: must not depend on whether the eval ran
TRAINING_KEYS = ("reward", "reward/own", "accuracy/own", "loss", "grad_norm", "kl/mean", "gen/tokens",
                 "completions/mean_length", "version", "filter/dropped", "samples")


@pytest.mark.model
@pytest.mark.timeout(900)
@pytest.mark.slow
def test_eval_on_leaves_training_bit_identical_and_keeps_the_best(tmp_path):
    node = {"rounds": 2, "checkpoint_every": 1, "seed": 3}
    run_node(write_config(tmp_path, "n", name="off", node=node, eval={"every": 0}))
    out = run_node(write_config(tmp_path, "n", name="on", node=node, eval={"every": 1, "prompts": 6}))
    off = read_rounds(tmp_path / "off")
    on = read_rounds(tmp_path / "on")
    assert len(off) == len(on) == 2
    for a, b in zip(off, on):
        assert {k: a.get(k) for k in TRAINING_KEYS} == {k: b.get(k) for k in TRAINING_KEYS}
        assert not any(k.startswith("eval/") for k in a)            # eval off: no eval keys at all
        assert unregistered(b) == []
    # the weights themselves, bit for bit
    w_off = checkpoint.load_latest(tmp_path / "off")["learner"]["trainable"]
    w_on = checkpoint.load_latest(tmp_path / "on")["learner"]["trainable"]
    assert w_off.keys() == w_on.keys() and all((w_off[k] == w_on[k]).all() for k in w_off)

    # round 1 carries the base model's eval (round 0), each round its own eval with intervals
    r1, r2 = on
    assert r1["eval/n"] == 6 and r1["eval/base_lo"] <= r1["eval/base_accuracy"] <= r1["eval/base_hi"]
    for r in on:
        assert r["eval/accuracy_lo"] <= r["eval/accuracy"] <= r["eval/accuracy_hi"]
        assert r["eval/change_lo"] <= r["eval/change"] <= r["eval/change_hi"]
        assert r["eval/round"] == r["round"] and r["time/eval_s"] > 0
    assert "held-out eval of the base model" in out and "held-out " in out.splitlines()[-3] + out
    # the best eval's weights are kept, verified, and named in the checkpoint's manifest
    best = checkpoint.load_best(tmp_path / "on")
    assert best["round"] == r2["eval/best_round"] and best["best"]["accuracy"] == r2["eval/best_accuracy"]
    manifest = json.loads((tmp_path / "on" / "checkpoints" / "round-000002" / "manifest.json").read_text())
    assert manifest["best"]["round"] == best["round"]
    assert checkpoint.load_best(tmp_path / "off") is None


@pytest.mark.model
@pytest.mark.timeout(900)
@pytest.mark.slow
def test_export_takes_the_best_eval_by_default_and_the_newest_with_latest(tmp_path):
    from safetensors.torch import load_file

    from ftis_edge.export import export_run
    # lr high enough that round 2's weights differ from round 1's in every LoRA matrix
    run_node(write_config(tmp_path, "n", name="run", node={"rounds": 2, "checkpoint_every": 2},
                          train={"learning_rate": 1e-3}, eval={"every": 1, "prompts": 4}))
    run = tmp_path / "run"
    best = checkpoint.load_best(run)
    said = []
    info = export_run(run, tmp_path / "best", quant="f16", eval_limit=0, log=said.append)
    if best["round"] == 0:          # best.py: no eval beat the base model; the newest weights ship, said so
        assert info["weights"]["which"] == "latest" and said[0].startswith("no held-out eval beat the base model")
        return
    assert info["weights"]["which"] == "best" and info["weights"]["round"] == best["round"]
    assert said[0].startswith(f"exporting the best held-out eval's weights: round {best['round']}, accuracy ")
    assert "--latest" in said[0]
    # the rounds said agree: the weights restored are the best eval's, not "the checkpoint of round 2"
    assert any(line.startswith(f"restored the weights of round {best['round']} (the best held-out eval's; the "
                               f"newest checkpoint is round 2) (") for line in said)
    card = (tmp_path / "best" / "README.md").read_text()
    assert "| base | 0 |" in card and "| best |" in card and "| latest | 2 |" in card
    assert "**best** weights" in card
    exported = load_file(tmp_path / "best" / "peft" / "adapter_model.safetensors")

    # the learner's parameter names carry the adapter's name ("lora_A.default"); peft's file drops it
    kept = {k.replace(".default.", "."): v for k, v in best["trainable"].items()}
    assert kept.keys() == exported.keys() and all((kept[k] == exported[k]).all() for k in kept)
    info = export_run(run, tmp_path / "latest", quant="f16", eval_limit=0, log=said.append, latest=True)
    assert info["weights"] == {"which": "latest", "round": 2, "accuracy": None, "n": None, "latest_round": 2}
    newest = load_file(tmp_path / "latest" / "peft" / "adapter_model.safetensors")
    assert newest.keys() == exported.keys()
    if best["round"] != 2:
        assert any(not (newest[k] == exported[k]).all() for k in newest)


def test_the_guard_on_real_evals_gates_a_rounds_peers(tmp_path):
    """The guard, fired by real held-out evals (H5), gates one round (rounds.py, fake parts: no
    model, no relay): at each level the round keeps only the peer groups the guard admits (real
    rollouts of another tokenizer / base model); alone, the round takes no peer group and does not
    wait; back at the base, it returns. The real node runs the same round (test_node.py)."""
    from ftis_edge.run.guard import LEVELS
    from ftis_edge.run.rounds import Round
    from round_parts import RELAY, Swarm, make_cfg, make_parts, peer_groups

    parts = make_parts(tmp_path, make_cfg(RELAY, swarm={"own_groups": 0, "max_wait_s": 3.0}), swarm=Swarm(),
                       guard=True)
    guard, book = parts.guard, parts.book
    for g in peer_groups():                           # the peers this node has seen, in its peer book
        seen = book.get(g.rollout.node_id)
        seen.tokenizer, seen.model_fp = g.rollout.tokenizer_fp, g.rollout.model_fp
    base = real_eval("alone-3", 0)
    rnd = Round(parts, 1)

    def gate() -> list[str]:
        parts.intake.buffer = peer_groups()
        rnd.admit(only=("guard",))
        return [g.rollout.node_id for g in parts.intake.buffer]

    assert guard.level == 0 and gate() == ["peer-0", "peer-1", "peer-2"] and rnd.excluded["guard"] == 0
    step = guard.observe(real_eval("ftis-3", 8), base, base, book.snapshot())
    assert guard.level == 2 and step.line.endswith(LEVELS[2]) and "McNemar p=" in step.line
    assert gate() == ["peer-0", "peer-2"] and rnd.excluded["guard"] == 1       # another tokenizer out first
    worse = real_eval("nois-3", 16)
    guard.observe(worse, base, base, book.snapshot())                        # still below: other base models go too
    assert guard.level == 3 and gate() == ["peer-0"] and rnd.excluded["guard"] == 3
    guard.observe(worse, base, base, book.snapshot())                        # and then all peers: alone
    assert guard.level == ALONE and gate() == [] and rnd.peer_limit(8) == 0
    parts.intake.buffer = []
    parts.swarm.arrivals = [peer_groups()]
    rec = Round(parts, 2).run()
    assert rec["swarm/guard_level"] == ALONE and rec["peers/groups_used"] == 0 and rec["swarm/guard_excluded"] == 3
    assert rec["time/peer_wait_s"] < 1.0                                     # no wait for peers it would not take
    assert unregistered(rec) == []
    step = guard.observe(real_eval("alone-3", 24), base, base, book.snapshot())   # recovered: one step back
    assert guard.level == 3 and "back to" in step.line and gate() == ["peer-0"]


def _task(name: str, tmp_path: Path, **task):
    from ftis_edge.tasks import task_from_config
    if name == "jsonl":
        rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(40)]
        path = tmp_path / "mine.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        task["path"] = str(path)
    return task_from_config(config.from_dict({"task": {"name": name, **task}}).task)


@pytest.mark.parametrize("name,task", [
    ("arith", {}), ("jsonl", {}), ("reasoning_gym", {"datasets": {"chain_sum": {}, "basic_arithmetic": {}}}),
    ("capitals_task:CapitalsTask", {"options": {"countries": 4}}), ("gsm8k", {}), ("math500", {})])
def test_every_task_kind_with_an_eval_split_takes_part(name, task, tmp_path, monkeypatch, caplog):
    """The node's held-out set is the first eval.prompts of the task's eval split, each rendered
    with the model's chat template, and not one of them can be trained on — except on math500,
    whose one split is both (said once in the log)."""
    from ftis_edge.models.resolve import resolve_model
    from ftis_edge.common.paths import shared_data_dir
    if name in ("gsm8k", "math500") and shared_data_dir() is None:
        pytest.skip("no data folder (set $FTIS_SHARED as CI does, or run ./install.sh --data)")
    monkeypatch.syspath_prepend(str(Path(ROOT) / "tests" / "data"))     # the user's own task class
    t = _task(name, tmp_path, **task)
    bundle = resolve_model("smollm2-135m")
    with caplog.at_level(logging.WARNING, logger="ftis_edge.run.heldout"):
        h = HeldOut(t, bundle, None, every=10, prompts=4, max_new_tokens=16)
    assert h.active and 1 <= len(h.prompts) <= 4
    assert [p.id for p in h.prompts] == [p.id for p in t.eval_prompts(4)]
    trainable = sum(t.is_trainable(p.id) for p in h.prompts)
    said = [r.getMessage() for r in caplog.records if "not a held-out measure" in r.getMessage()]
    if name == "math500":
        assert trainable == h.overlap == len(h.prompts) and len(said) == 1
    else:
        assert trainable == h.overlap == 0 and not said
    assert all(ids and ids == bundle.encode(bundle.render_prompt(t.messages(p.question)))
               for ids, p in zip(h.ids, h.prompts))
    assert h.sampler.temperature == 0.0 and h.sampler.max_new_tokens == 16
