"""The reproduction's node files stay valid as the config schema evolves (no model is loaded)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.repro import batches, run, runon
from ftis_edge import config
from procs import ROOT


def test_no_experiment_patches_sys_path_and_one_runs_as_a_module():
    """Experiments run from the repository root as modules (python -m experiments.repro.run), like
    the benchmarks: they import ftis_edge and each other as packages, never by patching sys.path."""
    scripts = sorted((Path(ROOT) / "experiments").rglob("*.py"))
    assert len(scripts) >= 12
    for path in scripts:
        code = re.sub(r'"""[\s\S]*?"""', "", path.read_text(encoding="utf-8"))
        assert "sys.path" not in code, f"{path.name} patches sys.path: import as experiments.<module> instead"
        assert not re.search(r"python experiments/\S+\.py", path.read_text(encoding="utf-8")), \
            f"{path.name}: its usage says python experiments/...py, not python -m experiments...."
    out = subprocess.run([sys.executable, "-m", "experiments.repro.run", "--list"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "fill4" in out.stdout, out.stderr[-2000:]


PEER_BATCHES = sorted(n for n, b in batches.BATCHES.items() if not isinstance(b, batches.SwarmBatch))
SWARM_BATCHES = sorted(n for n, b in batches.BATCHES.items() if isinstance(b, batches.SwarmBatch))
ADDR = "tcp://127.0.0.1:5555"


@pytest.mark.parametrize("name", PEER_BATCHES)
def test_every_batch_writes_valid_configs(name, tmp_path):
    batch = batches.BATCHES[name]
    cfgs = run.receiver_configs(batch, 0, 8, tmp_path, ADDR, f"repro-{name}-s0")
    assert set(cfgs) == set(batch.receivers)
    loaded = {n: config.load(run.write_config(c, tmp_path / f"{n}.toml")) for n, c in cfgs.items()}
    # Paired design: every receiver sees the same prompts and sampling seeds and never shares.
    assert len({(c.node_id, c.node.seed) for c in loaded.values()}) == 1
    assert all(not c.swarm.share for c in loaded.values())
    for n, c in loaded.items():
        assert c.mode == ("alone" if n == "alone" else batch.collaboration)
        assert c.train.trainable == "lora" and c.model.spec == "smollm2-135m"
    peer = config.load(run.write_config(run.peer_config(batch, 0, 8, tmp_path, ADDR, "s"), tmp_path / "peer.toml"))
    assert peer.swarm.share and peer.swarm.relay == ADDR and peer.node.seed == 1000


@pytest.mark.parametrize("name", SWARM_BATCHES)
def test_swarm_batches_pair_each_node_with_itself_alone(name, tmp_path):
    batch = batches.BATCHES[name]
    cfgs = run.receiver_configs(batch, 2, None, tmp_path, ADDR, f"repro-{name}-s2")
    loaded = {n: config.load(run.write_config(c, tmp_path / f"{n}.toml")) for n, c in cfgs.items()}
    assert len(loaded) == (len(batch.arms) + 1) * batch.k + len(batch.extras)
    for name, (i, _) in batch.extras.items():     # an extra twin alone (H7: the Gemma node at 1 group a round)
        assert loaded[name].mode == "alone" and loaded[name].node_id == f"node-{i}"
    for arm in batch.arms:
        for i in range(batch.k):
            sw, al = loaded[f"{arm}-{i}"], loaded[f"alone-{i}"]
            assert (sw.node_id, sw.node.seed) == (al.node_id, al.node.seed) == (f"node-{i}", 200 + i)
            assert sw.swarm.share and sw.mode == batch.collaboration and sw.swarm.relay == ADDR
            assert al.mode == "alone" and not al.swarm.share
            # the same node: model, trainable, engine; the same prompts per round, group size, tokens, rounds
            assert (sw.model, sw.train.trainable) == (al.model, al.train.trainable)
            # (a node that runs on past R until its arm's slowest stops is scored on round R: test below)
            rounds = runon.limit(batch.rounds) if batch.runs_on(f"{arm}-{i}") else batch.rounds
            assert (sw.task, sw.node.rounds, al.node.rounds) == (al.task, rounds, batch.rounds)
            if sw.swarm.own_groups:     # batch fill: peers fill exactly the slots own generation leaves
                assert sw.swarm.max_peer_groups == sw.task.prompts_per_round - sw.swarm.own_groups
            else:                       # a node takes every group the other K - 1 nodes share each round
                assert sw.swarm.max_peer_groups == (batch.k - 1) * sw.task.prompts_per_round
                assert sw.swarm.max_groups_per_peer >= sw.task.prompts_per_round
    assert len({c.node_id for c in loaded.values()}) == batch.k
    # each arm is its own swarm: arms never hear each other
    assert len({loaded[f"{arm}-0"].swarm.name for arm in batch.arms}) == len(batch.arms)


def test_the_batch_fill_arms_are_the_pre_registered_ones(tmp_path):
    """docs/results.md, issue 28 plan: H4 generates 1 or 2 of 4 groups; H5's four nodes differ as
    in the paper and every node of an arm runs the arm's objective."""
    h4 = run.receiver_configs(batches.BATCHES["fill4"], 0, None, tmp_path, ADDR, "s")
    assert {n: c["swarm"]["own_groups"] for n, c in h4.items() if not n.startswith("alone")} == {
        **{f"own1-{i}": 1 for i in range(4)}, **{f"own2-{i}": 2 for i in range(4)}}
    h5 = {n: config.load(run.write_config(c, tmp_path / f"{n}.toml"))
          for n, c in run.receiver_configs(batches.BATCHES["fill-hetero"], 0, None, tmp_path, ADDR, "s").items()}
    for arm, method in (("ftis", "f-tis"), ("nois", "nois")):
        nodes = [h5[f"{arm}-{i}"] for i in range(4)]
        assert all(c.train.method == method and c.swarm.own_groups == 1 for c in nodes)
        assert [(c.model.spec, c.model.backend, c.train.trainable, c.task.temperature) for c in nodes] == [
            ("smollm2-135m", "llamacpp", "lora", 1.0), ("smollm2-135m", "llamacpp", "lora", 1.0),
            ("smollm2-135m", "hf", "full", 0.7), ("gemma3-270m", "llamacpp", "lora", 1.0)]
        assert nodes[3].train.cross_tokenizer_level == "span" and nodes[0].node.seed != nodes[1].node.seed
    # a run without a GGUF of its weights (full fine-tuning on HF) is exported once, then both
    # evals run on the export, in one job (two jobs exported the same model side by side)
    out = tmp_path / "runs"
    for name in ("nois-2", "nois-3"):
        (out / name).mkdir(parents=True)
        (out / name / "metrics.jsonl").write_text('{"type": "stop", "reason": "steps"}\n')
    (out / "nois-3" / "adapter").mkdir()
    (out / "nois-3" / "adapter" / "latest.gguf").write_bytes(b"")
    jobs = run.eval_jobs(batches.BATCHES["fill-hetero"], 0, out, 200, only={"nois-2", "nois-3"})
    full = [cmd for cmd, log in jobs if log.parent.name == "nois-2"]
    assert len(full) == 1 and full[0][:2] == ["sh", "-c"]
    steps = full[0][2].split(" && ")
    assert [" export " in s for s in steps] == [True, False, False]
    assert steps[0].endswith("--latest")          # final weights, as the LoRA nodes' latest.gguf
    assert all("--model " + str(out / "nois-2" / "export" / "model-f16.gguf") in s for s in steps[1:])
    lora = [cmd for cmd, log in jobs if log.parent.name == "nois-3"]
    assert len(lora) == 2 and all(cmd[-2:] == ["--model", str(out / "nois-3")] for cmd in lora)


@pytest.mark.parametrize("name", sorted(n for n, b in batches.BATCHES.items() if getattr(b, "expert", None)))
def test_expert_batches_train_the_expert_first_then_share_it(name, tmp_path):
    batch = batches.BATCHES[name]
    ex = batch.expert
    exp = config.load(run.write_config(run.expert_config(ex, tmp_path / "e", batch.settings), tmp_path / "e.toml"))
    assert exp.mode == "alone" and exp.node.rounds == ex.rounds >= 40 and exp.node.checkpoint_every == 1
    peer = config.load(run.write_config(run.peer_config(batch, 1, None, tmp_path, ADDR, "s"), tmp_path / "p.toml"))
    # the peer continues the expert's run: same model and trainable mode, rounds counted on from it
    assert (peer.model.spec, peer.train.trainable) == (exp.model.spec, exp.train.trainable)
    # ... and outlasts the receivers even at twice their pace (a frozen expert does no update;
    # the runner stops it when the receivers are done)
    assert peer.node.rounds - ex.rounds >= 2 * batch.rounds and peer.swarm.share
    assert peer.train.learning_rate == (0.0 if ex.frozen else exp.train.learning_rate)
    assert peer.task == exp.task                        # it shares groups of the receivers' size
    # a pilot shortens both phases from the command line
    short = run.peer_config(batch, 1, 3, tmp_path, ADDR, "s", expert_rounds=4)
    assert short["node"]["rounds"] == 4 + 10 * 3 + 5


@pytest.mark.parametrize("name", sorted(n for n, b in batches.BATCHES.items() if getattr(b, "settings", None)))
def test_issue18_batches_resume_every_round_and_evaluate_200_prompts(name, tmp_path):
    batch = batches.BATCHES[name]
    cfg = next(c for n, c in run.receiver_configs(batch, 0, None, tmp_path, ADDR, "s").items()
               if not run.runs_on(batch, n))      # (H7's nodes that run on past R: their own test)
    assert cfg["node"]["checkpoint_every"] == 1 and cfg["node"]["rounds"] == batch.rounds
    assert run.eval_limit(batch, None) >= 200 and run.eval_limit(batch, 30) == 30


def test_gemma_expert_compares_span_and_sequence_weights():
    recv = batches.BATCHES["expert-gemma"].receivers
    assert recv["f-tis-span"]["train"]["cross_tokenizer_level"] == "span"
    assert recv["f-tis-seq"]["train"]["cross_tokenizer_level"] == "sequence"


def test_the_sweep_has_paper_thresholds_and_one_below():
    gs = sorted(c["train"]["kl_threshold"] for c in batches.BATCHES["sweep"].receivers.values())
    g5 = batches.BATCHES["methods"].receivers["f-tis"]["train"]["kl_threshold"]
    assert {1.0, 5.0} <= set(gs + [g5]) and min(gs) < 1.0


def test_merge_is_deep_and_later_wins():
    assert batches.merge({"a": {"x": 1, "y": 2}}, {"a": {"y": 3}, "b": 4}) == {"a": {"x": 1, "y": 3}, "b": 4}


def test_value_table_pairs_swarm_nodes_with_their_isolated_twins():
    from experiments.repro import analyze

    def run(rewards, acc):
        return {"rounds": [{"reward/own": r, "gen/tokens": 100} for r in rewards],
                "evals": {"id": {"accuracy": acc}, "ood": {"accuracy": acc / 2}}}
    # node 0 in the swarm reaches its twin's final running mean (0.3) after 3 rounds, the twin
    # alone after 6: 2x fewer own tokens; node 1 never reaches it
    data = {"swarm4": {"swarm-0": {0: run([0.3, 0.3, 0.3, 0.5, 0.5, 0.5], 0.6)},
                       "alone-0": {0: run([0.0, 0.0, 0.6, 0.2, 0.5, 0.5], 0.5)},
                       "swarm-1": {0: run([0.0] * 6, 0.4)},
                       "alone-1": {0: run([0.1] * 6, 0.5)}}}
    rows = analyze.table_value(data)
    assert len(rows) == 3
    cells = [c.strip() for c in rows[2].split("|")[1:-1]]
    assert cells[:3] == ["swarm4", "swarm − alone", "2"]
    assert cells[7] == "1/2" and cells[8].startswith("2.00")


def test_arm_vs_arm_table_pairs_node_i_with_node_i_without_isolated_twins():
    from experiments.repro import analyze

    def run(rewards, acc, tokens=100, cpu=10.0):
        return {"rounds": [{"reward/own": r, "gen/tokens": tokens, "cpu/round_s": cpu} for r in rewards],
                "evals": {"id": {"accuracy": acc}, "ood": {"accuracy": acc / 2}}}
    data = {"fill-hetero": {"ftis-0": {0: run([0.5] * 4, 0.6)}, "nois-0": {0: run([0.25] * 4, 0.4)},
                            "ftis-3": {0: run([0.2] * 4, 0.3)}, "nois-3": {0: run([0.3] * 4, 0.3)},
                            "ftis-1": {0: run([0.2] * 4, 0.3)}}}    # no nois-1: not a pair
    rows = analyze.table_arm_vs_arm(data, "fill-hetero", "ftis", "nois", analyze.HETERO_KIND)
    cells = [[c.strip() for c in r.split("|")[1:-1]] for r in rows[3:]]
    assert [c[1].split(":")[0] for c in cells] == ["0", "3", "pooled"]
    assert cells[0][1] == "0: SmolLM2 LoRA" and cells[1][1] == "3: Gemma 3 LoRA (span)"
    assert cells[0][5] == "+0.250" and cells[0][6] == "+0.200" and cells[1][5] == "-0.100"
    assert cells[2][5].startswith("**0.075 ± 0.175**") and cells[2][8] == "1.27"
    assert analyze.table_arm_vs_arm({"fill4": {}}, "fill-hetero", "ftis", "nois") == []
    # own1 − own2: what each arm paid, as totals over the run (node 0: own1 generated half)
    data = {"fill4": {"own1-0": {0: run([0.5] * 4, 0.6, tokens=50, cpu=8.0)},
                      "own2-0": {0: run([0.5] * 4, 0.6, tokens=100, cpu=10.0)}}}
    cells = [[c.strip() for c in r.split("|")[1:-1]] for r in analyze.table_arm_vs_arm(data, "fill4", "own1", "own2")[3:]]
    assert cells[0][1] == "0" and cells[0][5] == "+0.000"
    assert cells[0][9:] == ["0.50", "0.80"] and cells[1][9:] == ["0.50", "0.80"]
    assert any(r.startswith("| fill4 | 0 |") for r in analyze.table_fill(data))


def test_h6_arms_differ_only_in_the_protections_and_every_node_has_the_guard(tmp_path):
    cfgs = run.receiver_configs(batches.BATCHES["h6"], 0, None, tmp_path, ADDR, "s")
    loaded = {n: config.load(run.write_config(c, tmp_path / f"{n}.toml")) for n, c in cfgs.items()}
    default = config.Config().train
    for i in range(4):
        protect, ftis, alone = loaded[f"protect-{i}"], loaded[f"ftis-{i}"], loaded[f"alone-{i}"]
        assert protect.train.foreign_is_cap == 1.0                                 # as registered and run
        assert protect.train.foreign_length_rule == "refuse" and protect.train.foreign_success_floor == 0.5
        assert (ftis.train.foreign_is_cap, ftis.train.foreign_length_rule, ftis.train.foreign_success_floor) == \
            (default.foreign_is_cap, default.foreign_length_rule, default.foreign_success_floor) == \
            (0.0, "truncate", 1.0)                                                  # the defaults since H6
        drop = {"foreign_is_cap", "foreign_length_rule", "foreign_success_floor"}
        same = lambda c: {k: v for k, v in c.to_dict()["train"].items() if k not in drop}   # noqa: E731
        assert same(protect) == same(ftis)
        assert protect.swarm.own_groups == ftis.swarm.own_groups == 1 and alone.mode == "alone"
        assert protect.swarm.name != ftis.swarm.name                              # two swarms
        for c in (protect, ftis, alone):
            assert (c.eval.every, c.eval.prompts, c.eval.guard) == (8, 32, True) and c.node.rounds == 32
            assert (c.node_id, c.node.seed) == (alone.node_id, alone.node.seed)
    assert loaded["protect-3"].model.spec == "gemma3-270m" and loaded["protect-2"].train.trainable == "full"


def test_h6_decision_rule_on_the_committed_h5_runs():
    """The H6 rule applied to H5's seed (arm ftis): the Gemma node's −0.325 ID fails the
    other-tokenizer kind, the SmolLM2 LoRA pair passes; every pair generated > 3x fewer tokens."""
    from experiments.repro import h6_decide
    data = h6_decide.load_all(Path(ROOT) / "docs" / "runs" / "fill")
    lines, holds = h6_decide.decide(data, "fill-hetero", "ftis", "nois")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith("| ")}
    assert holds is False
    assert "| **yes** |" in rows["same-model LoRA"] and "| 2 | -0.003 ± 0.013 |" in rows["same-model LoRA"]
    assert "| **no** |" in rows["other tokenizer"] and "-0.325" in rows["other tokenizer"]
    assert rows["other tokenizer"].endswith("| 8 / 73, p = 3e-14 |")       # per prompt, pooled McNemar
    assert "+0.400" in rows["3: other tokenizer"]                 # f-tis − nois on the Gemma node


def test_h6_plot_reads_the_committed_runs_as_the_decision_does(tmp_path):
    """plot_h6.py's markers are the final 200-prompt ID accuracies h6_decide.py pairs; its lines start
    at the base model's round-0 eval; a run without its final eval (still going) is left out."""
    from experiments.repro import plot_h6
    from experiments.repro import records
    runs = Path(ROOT) / "docs" / "runs" / "h6" / "h6"
    twin = runs / "s0" / "alone-3"
    x, acc, se = plot_h6.final_point([twin])
    assert acc == records.eval_of(twin, "id")["accuracy"] and se == 0.0 and 20 < x < 40   # ~28k tokens
    xs, ys = plot_h6.in_run_curve(twin)
    assert xs[0] == 0.0 and len(xs) == 5 and xs == sorted(xs) and all(0 <= y <= 1 for y in ys)
    going = tmp_path / "h6" / "s1" / "alone-3"
    going.mkdir(parents=True)
    (going / "metrics.jsonl").write_text('{"type":"start"}\n')
    assert plot_h6.finished_runs(tmp_path / "h6", "alone-3") == []
    said = plot_h6.plot(runs, tmp_path / "h6.png")
    assert (tmp_path / "h6.png").stat().st_size > 10_000 and any(s.startswith("node 3 protect") for s in said)


def test_h8_plot_draws_every_arm_the_h8_batch_runs():
    """The H8 figure's arms are the batch's F-TIS and NoIS arms and the twins alone, one panel a node."""
    from experiments.repro import plot_h6
    from experiments.repro.batches import BATCHES
    nodes, arms, _ = plot_h6.BATCHES["h8"]
    assert len(nodes) == BATCHES["h8"].k
    assert {a for a, _, _ in arms} == {"ftis", "nois", "alone"} and {"ftis", "nois"} <= set(BATCHES["h8"].arms)


def test_h6_records_table_reads_the_published_runs_back():
    """docs/results.md's "What the runs recorded" rows come from h6_records.py, not by hand."""
    from experiments.repro import h6_records
    lines = h6_records.table(Path(ROOT) / "docs" / "runs" / "h6" / "h6" / "s0")
    assert len(lines) == 2 + 12
    assert "| protect-3 | 44%, 44%, 41%, 34% | quiet | 7774 | 421 | 35 | 416 | 5 / 4551 | – |" in lines
    assert any(line.startswith("| alone-3 |") and "| – |" in line for line in lines)


def test_h6_compute_readings_count_only_rounds_while_every_node_ran():
    """The two compute readings registered before seed 2: in seed 1 the SmolLM2 LoRA nodes finished
    first, so the Gemma node's rounds after that (it topped up alone) fall outside the window, and
    over the window its token ratio is higher than over the whole run."""
    from experiments.repro import h6_decide
    data = h6_decide.load_all(Path(ROOT) / "docs" / "runs" / "h6")
    recv = data["h6"]
    assert all(recv[f"protect-{i}"][1]["stopped"] > recv[f"protect-{i}"][1]["rounds"][-1]["time"] for i in range(4))
    windows = {i: h6_decide.shared_rounds(recv, "protect", 1, i) for i in range(4)}
    assert max(windows.values()) == 32 and windows[3] == 23       # the first to stop saw all its rounds
    twin, node = recv["alone-3"][1], recv["protect-3"][1]
    whole, window = h6_decide.token_ratio(twin, node), h6_decide.token_ratio(twin, node, windows[3])
    assert round(whole, 4) == 2.9992 and window > whole
    rows = h6_decide.compute_readings(data, "h6", "protect")
    assert len(rows) == 2 + 3 and all(r.count(" | ") == 7 for r in rows[2:])


def test_h6_per_prompt_test_counts_the_prompts_one_node_alone_got_right():
    """The pooled exact McNemar beside the SE over pairs: counted from the evals' items, p exact."""
    from experiments.repro import h6_decide
    data = h6_decide.load_all(Path(ROOT) / "docs" / "runs" / "h6")
    ps = h6_decide.pairs(data["h6"], "protect", "ftis", (3,))
    a_only, b_only, p = h6_decide.mcnemar(ps, "id")
    n_pairs = len(ps)
    diff = sum(a["evals"]["id"]["accuracy"] - b["evals"]["id"]["accuracy"] for _, _, a, b in ps)
    assert round((a_only - b_only) / 200, 6) == round(diff, 6)        # the discordant prompts are the whole difference
    assert n_pairs == 3 and 0.05 < p < 1
    same = h6_decide.pairs(data["h6"], "protect", "protect", (3,))
    assert h6_decide.mcnemar(same, "id") == (0, 0, 1.0)
    one_sided = [(0, 0, {"evals": {"id": {"items": [{"id": k, "correct": True, "reward": 1.0} for k in "abcdefg"]}}},
                  {"evals": {"id": {"items": [{"id": k, "correct": False, "reward": 0.0} for k in "abcdefg"]}}})]
    assert h6_decide.mcnemar(one_sided, "id") == (7, 0, 2 / 2 ** 7)


def test_per_prompt_counts_use_the_accuracys_correctness():
    """Issue 65.8: a prompt is right where the accuracy counts it right (reward 1), not where the
    answer alone was right: H8 s0 nois-0 has answers right but with text after </answer> (reward 0),
    so counting "correct" there gave counts that do not add up to the accuracies' difference."""
    from experiments.repro import h6_decide
    recv = h6_decide.load_all(Path(ROOT) / "docs" / "runs" / "h8")["h8"]
    items = recv["nois-0"][0]["evals"]["id"]["items"]
    assert any(it["correct"] and not h6_decide.right(it) for it in items)     # the case is in the records
    for arm, ref in (("nois", "alone"), ("ftis", "nois"), ("ftis", "alone")):
        ps = h6_decide.pairs(recv, arm, ref, (0, 1, 2, 3))
        a_only, b_only, _ = h6_decide.mcnemar(ps, "id")
        diff = sum(a["evals"]["id"]["accuracy"] - b["evals"]["id"]["accuracy"] for _, _, a, b in ps)
        assert a_only - b_only == round(diff * 200), (arm, ref)


def test_h7_is_the_registered_design(tmp_path):
    """docs/results.md, "H7, pre-registered": H6's four nodes, plain F-TIS against the worth-aware
    exchange, the twins alone, and the Gemma node alone at one group a round."""
    batch = batches.BATCHES["h7"]
    cfgs = run.receiver_configs(batch, 0, None, tmp_path, ADDR, "repro-h7-s0")
    loaded = {n: config.load(run.write_config(c, tmp_path / f"{n}.toml")) for n, c in cfgs.items()}
    for i in range(4):
        ftis, worth = loaded[f"ftis-{i}"], loaded[f"worth-{i}"]
        assert not ftis.swarm.fill_by_worth and ftis.swarm.prompt_choice == "stream"
        assert worth.swarm.fill_by_worth and worth.swarm.prompt_choice == "outcomes"
        assert ftis.swarm.own_groups == worth.swarm.own_groups == 1
        assert ftis.node.rounds == worth.node.rounds == (32 if i == 3 else runon.limit(32))   # R = 32; 0-2 run on
        assert (ftis.model, ftis.train) == (worth.model, worth.train)
    gemma1 = loaded["alone1-3"]
    assert gemma1.model.spec == "gemma3-270m" and gemma1.task.prompts_per_round == 1 and gemma1.mode == "alone"


def test_h7_smollm2_peers_run_on_until_the_gemma_node_stops(tmp_path):
    """H7's registration: nodes 0-2 of each swarm arm run past R with a checkpoint every round (the
    runner stops them at node 3's stop and scores round R); node 3, the twins alone and alone1-3
    run R rounds. Other batches are untouched."""
    batch = batches.BATCHES["h7"]
    for rounds, r in ((None, 32), (2, 2)):          # the batch's R, and a pilot's --rounds
        cfgs = run.receiver_configs(batch, 0, rounds, tmp_path, ADDR, "repro-h7-s0")
        loaded = {n: config.load(run.write_config(c, tmp_path / f"{n}.toml")) for n, c in cfgs.items()}
        on = {n for n in loaded if run.runs_on(batch, n)}
        assert on == {f"{arm}-{i}" for arm in ("ftis", "worth") for i in range(3)}
        for n, c in loaded.items():
            if n in on:
                assert c.node.rounds == runon.limit(r) > r and c.node.checkpoint_every == 1
                assert run.waits_for(batch, n) == f"{n.rsplit('-', 1)[0]}-3"
            else:
                assert c.node.rounds == r, n
    for name, b in batches.BATCHES.items():
        if name not in ("h7", "h9"):        # H9 runs every node on until the slowest: test_repro_h9
            assert not any(run.runs_on(b, n) for n in b.receivers), name


def test_a_relative_out_puts_every_run_where_the_runner_looks(tmp_path, monkeypatch):
    """`run.py … --out runs/h7`: a node file under runs/h7/h7/s0/ resolves a relative run_dir
    against its own folder, so written relative the runs landed in runs/h7/h7/s0/runs/h7/… while
    the runner, the scorer and the analysis looked in runs/h7/h7/s0/NAME (seen in H4's CPU re-run)."""
    monkeypatch.chdir(tmp_path)
    out = Path("runs") / "h7" / "h7" / "s0"
    out.mkdir(parents=True)
    for name, c in run.receiver_configs(batches.BATCHES["h7"], 0, None, out, ADDR, "repro-h7-s0").items():
        loaded = config.load(run.write_config(c, out / f"{name}.toml"))
        assert loaded.run_path.resolve() == (tmp_path / out / name).resolve(), name
    peer = run.peer_config(batches.BATCHES[PEER_BATCHES[0]], 0, None, out, ADDR, "s")
    assert config.load(run.write_config(peer, out / "peer.toml")).run_path == (tmp_path / out / "peer").resolve()
