"""The node end to end: real processes, a real relay on loopback, the real models, tiny settings."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from ftis_edge.store import checkpoint
from ftis_edge.metrics.metric_keys import unregistered
from ftis_edge.metrics.records import read_metrics
from procs import RelayProc, finish, finish_all, free_port, rounds_of, running, start_node, wait_for, write_config

pytestmark = [pytest.mark.model, pytest.mark.timeout(900)]


def test_default_node_alone_writes_metrics_checkpoints_and_adapter(solo_run):
    run = solo_run.run
    records = read_metrics(run)
    assert [r["type"] for r in records] == ["start", "base_eval", "round", "round", "stop"]
    start, base, r1, r2, stop = records
    assert base["round"] == 0 and base["eval/base_accuracy"] == r1["eval/base_accuracy"]   # on record before round 1
    assert start["collaboration"] == "alone" and start["relay"] is None
    assert stop["reason"] == "steps" and stop["round"] == 2
    for r in (r1, r2):
        for key in ("reward/own", "accuracy/own", "format/own", "time/gen_s", "time/train_s", "gen/tok_s",
                    "samples/own", "filter/dropped", "micro_batch", "memory/oom_retries"):
            assert key in r, key
        assert r["peers/samples_used"] == 0 and r["reward/peers"] is None
        assert unregistered(r) == []          # every key a real round writes is in the metric registry
        assert 0.0 <= r["reward/own"] <= 1.0 and r["gen/tokens"] > 0
    assert (run / "config.toml").exists() and (run / "node.log").stat().st_size > 0
    kept = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert [n for n in kept if n.startswith("round-")] == ["round-000001", "round-000002"], kept
    assert len([n for n in kept if n.startswith("best-")]) == 1, kept        # the best held-out eval's weights
    assert list((run / "adapter").glob("*.gguf")), "the GGUF LoRA the generator uses"


def _final_weights(run: Path) -> dict:
    state = checkpoint.load_round(run, 3)
    return state["learner"]


@pytest.mark.slow
def test_sigkill_then_resume_replays_the_next_round_bit_for_bit(tmp_path):
    settings = dict(node={"rounds": 3, "checkpoint_every": 1, "seed": 7})
    ref_dir, cut_dir = tmp_path / "ref", tmp_path / "cut"
    ref_dir.mkdir(), cut_dir.mkdir()
    ref = start_node(write_config(ref_dir, "n", **settings))
    cut = start_node(write_config(cut_dir, "n", **settings))
    cut_run = cut_dir / "n"
    assert wait_for(lambda: 2 in checkpoint.complete(cut_run), 600, every_s=0.5), "checkpoint 2"
    cut.send_signal(signal.SIGKILL)
    cut.wait(10)
    resumed = start_node(cut_dir / "n.toml", "--resume")
    finish(ref)
    finish(resumed)
    a = {r["round"]: r for r in rounds_of(ref_dir / "n")}
    b = {r["round"]: r for r in rounds_of(cut_run)}      # a re-run round 3 overrides a torn one
    assert read_metrics(cut_run)[-1]["type"] == "stop"
    assert any(r.get("type") == "start" and r.get("resumed_from") == 2 for r in read_metrics(cut_run))
    for key, value in a[3].items():
        if key in ("time", "peers", "paused") or key.endswith(("_s", "tok_s")):   # wall-clock readings
            continue
        assert b[3][key] == value, f"round 3 {key}: {b[3][key]} != {value}"
    wa, wb = _final_weights(ref_dir / "n"), _final_weights(cut_run)
    flat_a = {k: v for k, v in _flatten(wa)}
    flat_b = {k: v for k, v in _flatten(wb)}
    assert flat_a.keys() == flat_b.keys()
    for k in flat_a:
        assert torch.equal(flat_a[k], flat_b[k]), k


def _flatten(obj, prefix=""):
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flatten(v, f"{prefix}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _flatten(v, f"{prefix}[{i}]")


@pytest.mark.slow
def test_two_heterogeneous_nodes_share_groups_and_survive_a_relay_restart(tmp_path):
    """SmolLM2 LoRA on llama.cpp + SmolLM2 full fine-tuning on HF, through a real relay that is
    SIGKILLed and restarted on the same port mid-run."""
    relay = RelayProc()
    relay.wait_ready()
    common = {"swarm": {"relay": relay.address, "max_wait_s": 60.0, "max_peer_groups": 2},
              "node": {"rounds": 4}}
    a = start_node(write_config(tmp_path, "lora-llama", **common))
    b = start_node(write_config(tmp_path, "full-hf", model={"backend": "hf", "threads": 1},
                                train={"trainable": "full", "learning_rate": 5e-6}, **common))
    with running(a, b, relay=relay):
        assert wait_for(lambda: len(rounds_of(tmp_path / "lora-llama")) >= 1, 600, every_s=0.5), "first round of a"
        relay.kill()
        relay.start()
        relay.wait_ready()
        finish_all(a, b, relay=relay)
    for me, peer in (("lora-llama", "full-hf"), ("full-hf", "lora-llama")):
        rounds = rounds_of(tmp_path / me)
        assert len(rounds) == 4
        last = rounds[-1]
        assert last["peers"][peer]["accepted"] >= 4, last["peers"]          # groups kept flowing after the restart
        assert sum(r["peers/groups_received"] for r in rounds[2:]) >= 1
        used = sum(r["peers/samples_used"] for r in rounds)
        assert used > 0, f"{me} never trained on {peer}'s groups"
        trained = [r for r in rounds if r["peers/samples_used"]]
        assert all(r["sampling/importance_sampling_ratio/mean"] is not None and r["filter/dropped"] is not None
                   for r in trained)
        assert all(unregistered(r) == [] for r in rounds)    # swarm rounds too
        assert last["peers"][peer]["samples_used"] == used
        hist = last["peers"][peer]["kl_hist"]        # every sample it trained on, by its KL's bin
        assert sum(hist["counts"]) == used and hist["edges"][:2] == [0.0, 1e-4], hist
        assert any(r["wire/bytes_per_token_in"] for r in rounds)


@pytest.mark.slow
def test_smollm2_and_gemma3_nodes_take_the_cross_tokenizer_path(tmp_path):
    relay = RelayProc()
    relay.wait_ready()
    # delivery_budget -1 (everything): a node whose first load is slow (a cold cache converts
    # Gemma for minutes) may join after the other published its one round, outside a budgeted
    # subscriber's 10 s window (by design; test_relay_budgets covers budgets)
    # own_groups 0: each node generates both groups and takes both of the other's (the path under
    # test here; batch fill, which stops at the first peer group, is tests/test_fill.py's)
    common = {"swarm": {"relay": relay.address, "max_wait_s": 300.0, "max_peer_groups": 2,
                        "delivery_budget": -1, "own_groups": 0},
              "node": {"rounds": 1}, "task": {"prompts_per_round": 2, "num_generations": 4,
                                              "max_completion_length": 24, "reward": "shaped"},
              # at 24 tokens most answers are cut: the default length rule would refuse them all
              # (tests/test_foreign.py covers it); here the span path must get samples
              # another tokenizer's text is not trained unless train.other_tokenizer says so (issue 65)
              "train": {"foreign_length_rule": "truncate", "other_tokenizer": True}}
    a = start_node(write_config(tmp_path, "smol", **common))
    b = start_node(write_config(tmp_path, "gemma", model={"spec": "gemma3-270m", "threads": 1}, **common))
    finish_all(a, b, relay=relay, timeout=800)
    smol, gemma = rounds_of(tmp_path / "smol")[0], rounds_of(tmp_path / "gemma")[0]
    assert smol["peers"]["gemma"]["accepted"] == 2 and gemma["peers"]["smol"]["accepted"] == 2
    assert smol["peers"]["gemma"]["tokenizer"] != gemma["peers"]["smol"]["tokenizer"]
    # Peer samples from the other tokenizer are trained per span (train.cross_tokenizer_level =
    # "span", the default): the wire carried their token byte lengths; a completion whose tokens
    # cannot be placed on its text falls back to the sequence level (when a group had signal).
    # Some peer samples must have been trained on (else nothing here is tested): each node gets
    # the other's 2 groups; a group counts when its rewards differ (shaped reward, fixed seeds).
    assert smol["peers/samples_used"] + gemma["peers/samples_used"] > 0, (smol, gemma)
    for rec in (smol, gemma):
        assert rec.get("samples/span_level", 0) + rec.get("samples/sequence_level", 0) == rec["peers/samples_used"]
    assert smol.get("samples/span_level", 0) + gemma.get("samples/span_level", 0) > 0
    # each is the other's foreign peer (another tokenizer): marked as such, none refused here
    for rec in (smol, gemma):
        assert rec["peers/refused_length"] == 0
        assert rec.get("samples/foreign", 0) == rec["peers/samples_used"]
    assert all(r["wire/bytes_per_token_out"] for r in (smol, gemma))


@pytest.mark.slow
def test_horizontal_mode_merges_parts_of_the_same_groups(tmp_path):
    relay = RelayProc()
    relay.wait_ready()
    common = {"swarm": {"relay": relay.address, "collaboration": "horizontal", "max_wait_s": 120.0,
                        "max_peer_groups": 2}, "node": {"rounds": 1}}
    a = start_node(write_config(tmp_path, "h1", **common))
    b = start_node(write_config(tmp_path, "h2", **common))
    finish_all(a, b, relay=relay)
    r1, r2 = rounds_of(tmp_path / "h1")[0], rounds_of(tmp_path / "h2")[0]
    assert r1["groups/with_peer_parts"] == 2 and r2["groups/with_peer_parts"] == 2
    assert r1["gen/tokens"] > 0 and read_metrics(tmp_path / "h1")[0]["collaboration"] == "horizontal"


@pytest.mark.slow
def test_a_node_that_does_not_share_learns_from_peers_and_publishes_nothing(tmp_path):
    """swarm.share = false: the listener trains on the sharer's groups; the sharer, waiting for
    peers, never hears of the listener."""
    relay = RelayProc()
    relay.wait_ready()
    common = {"node": {"rounds": 1}}
    sharer = start_node(write_config(tmp_path, "sharer", swarm={"relay": relay.address, "max_wait_s": 20.0,
                                                                "max_peer_groups": 2, "own_groups": 0}, **common))
    listener = start_node(write_config(tmp_path, "listener", swarm={"relay": relay.address, "share": False,
                                                                    "max_wait_s": 300.0, "max_peer_groups": 2,
                                                                    "own_groups": 0},
                                       **common))
    finish_all(listener, sharer, relay=relay)
    heard, said = rounds_of(tmp_path / "listener")[0], rounds_of(tmp_path / "sharer")[0]
    assert heard["peers"]["sharer"]["accepted"] == 2
    assert heard.get("wire/bytes_per_token_out") is None
    assert "listener" not in said["peers"] and said["peers/groups_received"] == 0


@pytest.mark.slow       # a real node/relay process end to end: CI's slow tier (README command < 20 min)
def test_a_node_whose_relay_is_not_there_says_so_in_its_log_and_records(tmp_path):
    cfg = write_config(tmp_path, "lonely", node={"rounds": 1},
                       swarm={"relay": f"tcp://127.0.0.1:{free_port()}", "max_wait_s": 6.0})
    out = finish(start_node(cfg))
    log = (tmp_path / "lonely" / "node.log").read_text()
    assert "unreachable" in log and "joined swarm" not in log, log[-2000:]
    assert "unreachable" in out                       # the headless terminal shows it too
    (last,) = rounds_of(tmp_path / "lonely")
    assert last["relay/state"] == "unreachable" and last["relay/reason"], last
    assert last["relay/connected"] is False
