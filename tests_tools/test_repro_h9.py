"""H9 (docs/results.md, "H9, as registered"; issue 65 item 6): the batch is the registered design,
the runner skips the control arm on the seeds it does not run and scores 400 ID / 200 OOD prompts,
and h9_decide applies the registered rule on fabricated run directories laid out as run.py and
publish.py write them. No model is loaded."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.repro import analyze, batches, h8_decide, h9_decide, run, runon
from ftis_edge import config
from ftis_edge.tasks.arith import ArithTask, is_held_out
from ftis_edge.tasks.unseen import question_key
from procs import ROOT

ADDR = "tcp://127.0.0.1:5555"
R = 4
N = 20                         # prompts per fabricated eval: one prompt = 0.05


# ------------------------------------------------------------------ the batch as registered

def _loaded(tmp_path: Path, seed: int, rounds=None) -> dict:
    cfgs = run.receiver_configs(batches.BATCHES["h9"], seed, rounds, tmp_path, ADDR, f"repro-h9-s{seed}")
    return {n: config.load(run.write_config(c, tmp_path / f"{n}.toml")) for n, c in cfgs.items()}


def test_h9_is_the_registered_design(tmp_path):
    """Five nodes (SmolLM2 LoRA x2 on llama.cpp, SmolLM2 full FT on HF at T = 0.7, Gemma 3 LoRA x2),
    each generating 1 of 4 groups, R = 32, in-run eval every 8 rounds with the guard; arm kin
    (fill = "kin") and today's default fill (arm any) differ in nothing else; the code's defaults
    otherwise, another tokenizer's text not trained; every swarm node runs on until the slowest."""
    batch = batches.BATCHES["h9"]
    assert batch.k == 5 and batch.rounds == 32 and batch.run_on_until == "slowest"
    assert set(batch.arms) == {"kin", "any"} and batch.arm_seeds == {"any": (0, 1, 2)}
    loaded = _loaded(tmp_path, 0)
    kinds = [("smollm2-135m", "llamacpp", "lora", 1.0)] * 2 + [("smollm2-135m", "hf", "full", 0.7)] + \
        [("gemma3-270m", "llamacpp", "lora", 1.0)] * 2
    defaults_train, defaults_swarm = config.TrainSection(), config.SwarmSection()
    assert defaults_swarm.fill == "any"                 # arm `any` is today's default fill
    for name, c in loaded.items():
        arm, i = name.rsplit("-", 1)
        i = int(i)
        assert (c.model.spec, c.model.backend, c.train.trainable, c.task.temperature) == kinds[i], name
        assert c.node_id == f"node-{i}" and c.node.seed == i                          # seed 0: 0 * 100 + i
        assert c.train.method == "f-tis" and c.train.kl_threshold == 5.0
        assert c.eval.every == 8 and c.eval.prompts == 32 and c.eval.guard
        assert (c.task.prompts_per_round, c.task.num_generations) == (4, 8)
        # the code's defaults: another tokenizer's text not trained, the protections as today
        # (which equal H7's PROTECTIONS_OFF: H9 need not name them)
        for key in ("other_tokenizer", "foreign_budget", *batches.PROTECTIONS_OFF["train"]):
            assert getattr(c.train, key) == getattr(defaults_train, key), (name, key)
        assert not c.train.other_tokenizer
        assert not c.swarm.fill_by_worth and c.swarm.prompt_choice == "stream" == defaults_swarm.prompt_choice
        if arm == "alone":
            assert c.mode == "alone" and c.node.rounds == 32
            continue
        assert c.swarm.own_groups == 1 and c.swarm.max_peer_groups == 3 and c.swarm.share
        assert c.swarm.fill == arm                                   # "any": today's default, named
        assert c.node.rounds == runon.limit(32) and c.node.checkpoint_every == 1        # runs on, scored at R
    assert all(loaded[f"{a}-{i}"].train.cross_tokenizer_level == "span" for a in ("kin", "alone") for i in (3, 4))
    assert loaded["kin-3"].node.seed != loaded["kin-4"].node.seed
    raw = run.receiver_configs(batch, 1, None, tmp_path, ADDR, "s")
    for i in range(5):                  # the two arms differ in their fill only (and where they run)
        kin, any_ = json.loads(json.dumps(raw[f"kin-{i}"])), json.loads(json.dumps(raw[f"any-{i}"]))
        assert (kin["swarm"].pop("fill"), any_["swarm"].pop("fill")) == ("kin", "any")
        assert kin["swarm"].pop("name") != any_["swarm"].pop("name")          # each arm its own swarm
        assert kin["node"].pop("run_dir") != any_["node"].pop("run_dir")
        assert kin == any_, i


def test_the_control_arm_runs_on_seeds_0_to_2_only(tmp_path):
    batch = batches.BATCHES["h9"]
    every = {f"{a}-{i}" for a in ("kin", "alone") for i in range(5)}
    for seed in range(6):
        want = every | ({f"any-{i}" for i in range(5)} if seed <= 2 else set())
        assert set(run.receiver_configs(batch, seed, None, tmp_path, ADDR, "s")) == want, seed
        assert set(run.seed_receivers(batch, seed)) == want
    on = {n for n in run.receiver_configs(batch, 0, None, tmp_path, ADDR, "s") if run.runs_on(batch, n)}
    assert on == {f"{a}-{i}" for a in ("kin", "any") for i in range(5)}
    assert run.waits_for(batch, "kin-2") == ("kin-0", "kin-1", "kin-3", "kin-4")
    plan = "\n".join(run.plan(batch, 3, None, None))
    assert "[h9 s3] 10 receivers, R = 32: kin-0 kin-1 kin-2 kin-3 kin-4 alone-0" in plan
    assert "not on this seed (arm_seeds): any-0 any-1 any-2 any-3 any-4" in plan
    assert "id 400, ood 200" in plan
    with pytest.raises(ValueError, match="arm_seeds names nois, not an arm"):
        batches.SwarmBatch("hx", "", k=1, node={}, arms={"kin": {}}, arm_seeds={"nois": (0,)})


def test_h9_scores_400_unseen_id_prompts_and_200_ood(tmp_path):
    """The eval sizes per set, in every eval command (a twin's and a run-on node's round-R export),
    and the split itself: 400 distinct level 1-2 questions held out by text (all 49 of level 1),
    whose first 200 are H7's and H8's, and 200 of level 3."""
    batch = batches.BATCHES["h9"]
    assert (run.eval_limit(batch, None, "id"), run.eval_limit(batch, None, "ood")) == (400, 200)
    assert run.eval_limit(batch, 4, "id") == run.eval_limit(batch, 4, "ood") == 4       # a pilot's --eval-limit
    assert run.eval_limit(batches.BATCHES["h7"], None, "ood") == 200
    out = tmp_path / "s0"
    cfgs = run.receiver_configs(batch, 0, None, out, ADDR, "s")
    for name in ("alone-0", "kin-0"):
        rd = out / name
        (rd / "adapter").mkdir(parents=True)
        (rd / "adapter" / "latest.gguf").write_bytes(b"")
        (rd / "metrics.jsonl").write_text('{"type": "stop", "reason": "steps"}\n')
    snap = runon.snapshot_dir(out / "kin-0")
    run.write_config(cfgs["kin-0"], snap / "config.toml")
    runon.mark(out / "kin-0", 32, "the slowest of its arm")
    jobs = run.eval_jobs(batch, 0, out, {"id": 400, "ood": 200}, only={"alone-0", "kin-0"})
    limits = {}
    for cmd, log in jobs:
        text = " ".join(cmd)
        for which, level in (("id", "1,2"), ("ood", "3")):
            if f"eval-{which}.json" in text:
                limits[(log.parent.name, which)] = text.split(f"--level {level} --limit ")[1].split()[0]
    assert limits == {("alone-0", "id"): "400", ("alone-0", "ood"): "200", ("kin-0", "id"): "400",
                      ("kin-0", "ood"): "200"}, jobs
    ids = ArithTask(level="1,2").eval_prompts(400)
    keys = [question_key(p.question) for p in ids]
    assert len(set(keys)) == 400 and all(is_held_out(p) for p in ids)
    assert sum(p.meta["level"] == 1 for p in ids) == 49 and sum(p.meta["level"] == 2 for p in ids) == 351
    assert [p.id for p in ids[:200]] == [p.id for p in ArithTask(level="1,2").eval_prompts(200)]
    ood = ArithTask(level="3").eval_prompts(200)
    assert len({question_key(p.question) for p in ood}) == 200 and all(is_held_out(p) for p in ood)


# ------------------------------------------------------------------ the decision

def _run(run_dir: Path, id_right: int | None, *, tokens: float = 100, cpu: float = 10.0, ood_right: int = 5,
         kin_peers: int | None = None, guard: dict | None = None, peers: dict | None = None,
         boot: str = "boot-a") -> None:
    """A receiver as a node and run.py leave it: a start record naming its machine's BOOT, R rounds
    with TOKENS own tokens and CPU seconds each, the peer book PEERS on round R, a stop record,
    ID / OOD evals whose first ID_RIGHT / OOD_RIGHT prompts are right (none: no evals)."""
    run_dir.mkdir(parents=True)
    recs = [{"type": "start", "resumed_from": None,
             "machine": {"cpu": "AMD EPYC", "cores": 2, "usable_cores": 2, "boot_id": boot}}]
    recs += [{"type": "round", "round": k, "gen/tokens": tokens, "cpu/round_s": cpu, "time": float(k),
              "groups/own": 2 if kin_peers else 4, "kin/peers": kin_peers,
              "swarm/guard_level": (guard or {}).get(k, 0), **({"peers": peers} if peers and k == R else {})}
             for k in range(1, R + 1)]
    recs.append({"type": "stop", "reason": "steps", "time": float(R)})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    for which, right in (("id", id_right), ("ood", ood_right)) if id_right is not None else ():
        items = [{"id": f"{which}-{k}", "correct": k < right, "reward": float(k < right)} for k in range(N)]
        (run_dir / f"eval-{which}.json").write_text(json.dumps({"accuracy": right / N, "n": N, "items": items}))


KIND_OF = (0, 0, 1, 2, 2)      # node -> index into h9_decide.KINDS


EDGES = [0.0, 1e-4, 1e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0]       # peers.book.KL_EDGES


def _peer(n: int, kl_mean: float | None, counts: list[int]) -> dict:
    return {"samples_used": n, "kl_mean": kl_mean, "kl_hist": {"edges": EDGES, "counts": counts}}


def _book(learner: int, scale: int) -> dict:
    """LEARNER's peer book as PeerStats.as_dict writes it: SCALE x 8 samples of KL ~0 from each peer
    of its own kind; SCALE x 4 at KL 0.2 / 0.6 between the LoRA and full-FT nodes (one tokenizer);
    none from another tokenizer (its text is not trained by default); and an id outside the swarm
    (node-9) that the KL table leaves out."""
    book = {"node-9": _peer(1000, 50.0, [0] * 9 + [1000])}
    for j in range(5):
        kl, kj = KIND_OF[learner], KIND_OF[j]
        if j == learner:
            continue
        if kl == kj:
            book[f"node-{j}"] = _peer(8 * scale, 5e-5, [8 * scale] + [0] * 9)
        elif 2 not in (kl, kj):
            book[f"node-{j}"] = _peer(4 * scale, 0.4, [0] * 5 + [2 * scale, 2 * scale] + [0] * 3)
        else:
            book[f"node-{j}"] = _peer(0, None, [0] * 10)
    return book


def _seed(root: Path, seed: int, gaps=(0, 0, 0), *, kin_tokens=None, kin_cpu=6.0, guard_on=None,
          books: bool = False, twins_boot: str | None = None, evals: bool = True) -> None:
    """One seed: every twin alone 12 of 20 ID right with 100 tokens and 10 CPU-s a round; node i of
    arm kin GAPS[kind] prompts below it, with KIN_TOKENS[i] own tokens (LoRA and Gemma 50: 2x, the
    full-FT node 100: no saving) and KIN_CPU; arm any (seeds 0-2) one prompt below kin. BOOKS: each
    swarm node's round-R peer book is ``_book``'s (arm any's twice arm kin's). Every run on one boot
    of the seed's own, the twins on TWINS_BOOT where given; EVALS false: records without evals."""
    tokens = {0: 50, 1: 50, 2: 100, 3: 50, 4: 50, **(kin_tokens or {})}
    s, boot = root / "h9" / f"s{seed}", f"boot-{seed}"
    for i in range(5):
        gap = gaps[KIND_OF[i]]
        _run(s / f"kin-{i}", 12 - gap if evals else None, tokens=tokens[i], cpu=kin_cpu, ood_right=6, kin_peers=1,
             guard={3: 2} if guard_on == i else None, peers=_book(i, 1) if books else None, boot=boot)
        if seed <= 2:
            _run(s / f"any-{i}", 11 - gap if evals else None, tokens=25, cpu=4.0,
                 peers=_book(i, 2) if books else None, boot=boot)
        _run(s / f"alone-{i}", 12 if evals else None, boot=twins_boot or boot)


def _decide(root: Path):
    return h9_decide.decide(analyze.load_all(root)["h9"])


def test_h9_holds_when_every_kind_keeps_its_level_and_lora_and_gemma_save(tmp_path):
    """Gemma's kind within a prompt either way (mean 0, lower bound −0.027); the full-FT node saves
    nothing (1.0x), which is reported, not required: H9 holds."""
    for seed, g in enumerate((1, 0, -1, 1, 0, -1)):
        _seed(tmp_path, seed, (0, 0, g))
    lines, holds, n = _decide(tmp_path)
    assert (holds, n) == (True, 6), lines
    lora, full, gemma = lines[2:5]
    assert "| SmolLM2 LoRA (nodes 0, 1) | 6 |" in lora and "2.00, 2.00" in lora and lora.endswith("| holds |")
    assert "| full fine-tuning (node 2) | 6 |" in full and "1.00" in full
    assert full.endswith("| reported: not shown | holds |"), full
    assert "| -0.000 ± 0.018 | -0.027 | met |" in gemma or "| +0.000 ± 0.018 | -0.027 | met |" in gemma, gemma
    assert "| 1.67 (12 pairs) | met | required: shown | holds |" in gemma, gemma
    assert h9_decide.verdict_line(holds, n).endswith("HOLDS")


def test_the_lower_bound_not_the_mean_decides_a_kind(tmp_path):
    """Gemma 2, 3, 1, 2, 3, 1 prompts (of 20) below alone: mean −0.100, SE 0.0183, t(0.90, 5) =
    1.476: bound −0.127 < −0.05; H9 does not hold though both savings are met."""
    for seed, g in enumerate((2, 3, 1, 2, 3, 1)):
        _seed(tmp_path, seed, (0, 0, g))
    lines, holds, _ = _decide(tmp_path)
    gemma = lines[4]
    assert "| -0.100 ± 0.018 | -0.127 | not met |" in gemma and gemma.endswith("| required: shown | fails |"), gemma
    assert holds is False and lines[2].endswith("| holds |")
    assert h9_decide.lower_bound([-0.1, -0.15, -0.05, -0.1, -0.15, -0.05]) == pytest.approx(-0.1 - 1.4759 * 0.018257,
                                                                                                abs=1e-4)


def test_one_pair_at_1_7x_own_tokens_fails_its_kind(tmp_path):
    for seed in range(6):
        _seed(tmp_path, seed, kin_tokens={1: 100 / 1.7} if seed == 4 else None)
    lines, holds, _ = _decide(tmp_path)
    lora = lines[2]
    assert "1.70" in lora and "| not met | 1.67 (12 pairs) | met | required: not shown | fails |" in lora, lora
    assert holds is False and lines[4].endswith("| holds |")


def test_too_little_cpu_saved_fails_a_kind_whose_tokens_are_saved(tmp_path):
    for seed in range(6):
        _seed(tmp_path, seed, kin_cpu=7.5)                              # 10 / 7.5 = 1.33x < 1.4x
    lines, holds, _ = _decide(tmp_path)
    assert holds is False and "| 1.33 (12 pairs) | not met | required: not shown | fails |" in lines[2], lines[2]
    assert lines[3].endswith("| reported: not shown | holds |")          # full FT: not required


def test_cpu_counts_only_pairs_on_one_boot_and_needs_three_seeds_of_them(tmp_path):
    """Seeds 0-3 with their twins on another boot (CPU 10 / 6 there would pass): their CPU pairs are
    reported split, not counted; seeds 4, 5 leave 2 seeds of one-boot pairs < 3, so the LoRA and
    Gemma kinds (which need the saving) and H9 are undecided at 6 seeds, while the full-FT kind
    (saving reported only) holds. A third one-boot seed decides it."""
    for seed in range(6):
        _seed(tmp_path, seed, twins_boot="another" if seed < 4 else None)
    lines, holds, n = _decide(tmp_path)
    assert (holds, n) == (None, 6), lines
    lora, full, gemma = lines[2:5]
    assert "| 1.67 (4 pairs; 8 split across boots, not counted) | undecided | required: undecided |" in lora, lora
    assert lora.endswith("| undecided (so far the CPU part undecided) |") and gemma.endswith(
        "| undecided (so far the CPU part undecided) |")
    assert full.endswith("| reported: not shown | holds |"), full      # its tokens: 1.0x
    assert h9_decide.verdict_line(holds, n).endswith("CPU pairs on one boot from < 3 seeds")
    for k in range(5):                                                 # seed 3's twins again, on its boot
        run_dir = tmp_path / "h9" / "s3" / f"alone-{k}"
        shutil.rmtree(run_dir)
        _run(run_dir, 12, boot="boot-3")
    lines, holds, n = _decide(tmp_path)
    assert (holds, n) == (True, 6) and "1.67 (6 pairs; 6 split" in lines[2], lines[2]


def test_a_kind_that_fails_decides_h9_while_another_kinds_cpu_is_undecided(tmp_path):
    """Gemma 1-3 prompts below alone on every seed fails its kind; every twin on another boot leaves
    the CPU part undecided: H9 does not hold (one failing kind is enough)."""
    for seed, g in enumerate((2, 3, 1, 2, 3, 1)):
        _seed(tmp_path, seed, (0, 0, g), twins_boot="another")
    lines, holds, n = _decide(tmp_path)
    assert (holds, n) == (False, 6), lines
    assert lines[2].endswith("| undecided (so far the CPU part undecided) |") and lines[4].endswith("| fails |")


def test_first_runs_count_for_the_saving_only(tmp_path):
    """Seeds 1 and 2's first runs (records, no evals) add token and one-boot CPU pairs, not seeds:
    one first-run pair at 1.7x own tokens fails the LoRA kind; at 2x with 6 seeds scored they only
    add pairs to the means."""
    for seed in range(6):
        _seed(tmp_path / "main", seed)
    for seed in (1, 2):
        _seed(tmp_path / "first", seed, evals=False, kin_cpu=5.0,
              kin_tokens={0: 100 / 1.7} if seed == 2 else None)
    recv, first = (analyze.load_all(tmp_path / d)["h9"] for d in ("main", "first"))
    lines, holds, n = h9_decide.decide(recv, first)
    lora = lines[2]
    assert (holds, n) == (False, 6) and "| 6 |" in lora and "1.70" in lora, lora
    assert "| not met | 1.75 (16 pairs) | met | required: not shown | fails |" in lora, lora
    lines, holds, n = h9_decide.decide(recv)                          # without them: as before
    assert (holds, n) == (True, 6) and "1.67 (12 pairs) | met |" in lines[2], lines[2]


def test_five_seeds_are_undecided_but_the_table_is_printed(tmp_path):
    for seed in range(5):
        _seed(tmp_path, seed)
    lines, holds, n = _decide(tmp_path)
    assert (holds, n) == (None, 5)
    assert lines[2].endswith("| undecided (so far holds) |") and "| 5 |" in lines[2]
    assert h9_decide.verdict_line(holds, n).endswith("undecided: n seeds = 5 < 6")


def test_control_slots_and_guard_are_reported_beside(tmp_path):
    for seed in range(4):
        _seed(tmp_path, seed, guard_on=3 if seed == 1 else None)
    recv = analyze.load_all(tmp_path)["h9"]
    rows = "\n".join(h9_decide.comparisons(recv))
    # kin − any on the control seeds only (0-2): one prompt of 20 on every node; per prompt 2 nodes x 3 seeds
    assert "| SmolLM2 LoRA | kin − any | 3 | +0.050 ± 0.000 | +0.050 ± 0.000 | 6 / 0, p = 0.031 |" in rows, rows
    assert "| Gemma 3 LoRA | kin − alone | 4 | +0.000 ± 0.000 | +0.050 ± 0.000 |" in rows, rows
    slots = "\n".join(h9_decide.slot_lines(recv))
    assert "| Gemma 3 LoRA | kin: kin peers | 1.00 | – | – | – |" in slots, slots
    assert "| Gemma 3 LoRA | any: own groups | 4.00 | – | – | – |" in slots, slots
    guard = h9_decide.guard_lines(recv)
    assert "* kin-3 (Gemma 3 LoRA) s1: guard level 2 in rounds 3" in guard
    assert "* arm kin: guard quiet in 19 of 20 runs" in guard and "* arm any: guard quiet in 15 of 15 runs" in guard
    out = subprocess.run([sys.executable, "-m", "experiments.repro.h9_decide", "--runs", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "undecided: n seeds = 4 < 6" in out.stdout and "Kin slots" in out.stdout, \
        out.stderr[-2000:]


def test_kl_by_learner_and_sender_kind_per_arm(tmp_path):
    """Issue 65 item 6: the KL of the samples each learner kind trained on, by sender kind, per arm,
    summed over its nodes and seeds, kinds in node order; a pair never trained on (another
    tokenizer) shows – rather than a mean of nothing; an id outside the five nodes is left out."""
    for seed in (0, 1, 3):                    # seed 3 has no arm any
        _seed(tmp_path, seed, books=True)
    recv = analyze.load_all(tmp_path)["h9"]
    cells = h8_decide.kl_by_kind(recv, "kin", h9_decide.NODE_KINDS)
    lora, full, gemma = (k for k, _, _ in h9_decide.KINDS)
    assert set(cells) == {(a, b) for a in (lora, full, gemma) for b in (lora, full, gemma)} - {(full, full)}
    # 2 LoRA learners x 1 LoRA peer x 3 seeds x 8 samples; the full-FT learner hears both LoRA nodes
    assert cells[(lora, lora)]["samples"] == 48 and cells[(lora, lora)]["counts"] == [48] + [0] * 9
    assert cells[(full, lora)]["samples"] == 24 and cells[(full, lora)]["kl_sum"] == pytest.approx(0.4 * 24)
    assert h8_decide.share_above(cells[(lora, full)], 0.5) == pytest.approx(0.5)
    assert cells[(gemma, lora)]["samples"] == 0
    rows = h8_decide.kl_lines(recv, "kin", h9_decide.NODE_KINDS)
    assert rows[0].startswith("| arm kin: learner ← sender |") and len(rows) == 2 + 8
    assert [r.split(" | ")[0] for r in rows[2:]] == [
        f"| {a} ← {b}" for a, b in ((lora, lora), (lora, full), (lora, gemma), (full, lora), (full, gemma),
                                    (gemma, lora), (gemma, full), (gemma, gemma))]
    assert rows[3] == f"| {lora} ← {full} | 24 | 0.4 | 100.0% | 50.0% | 0.0% | [0.1, 0.5): 12, [0.5, 1): 12 |"
    assert rows[4] == f"| {lora} ← {gemma} | 0 | – | – | – | – | – |"
    assert rows[9] == f"| {gemma} ← {gemma} | 48 | 5e-05 | 0.0% | 0.0% | 0.0% | [0, 0.0001): 48 |"
    # arm any on its control seeds only (0, 1), its own books: 2 seeds x 2 learners x 16
    any_rows = h8_decide.kl_lines(recv, "any", h9_decide.NODE_KINDS)
    assert any_rows[2] == f"| {lora} ← {lora} | 64 | 5e-05 | 0.0% | 0.0% | 0.0% | [0, 0.0001): 64 |", any_rows
    out = subprocess.run([sys.executable, "-m", "experiments.repro.h9_decide", "--runs", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "KL by learner ← sender kind, arm kin" in out.stdout and rows[3] in out.stdout
    assert "KL by learner ← sender kind, arm any" in out.stdout and any_rows[2] in out.stdout
