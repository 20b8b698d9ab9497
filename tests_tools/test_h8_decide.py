"""H8's decision (experiments/repro/h8_decide.py) on fabricated run directories laid out as run.py
and publish.py write them, the batch as registered, and the runner's refusal to train on an expert
file other than the recorded one."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.repro import analyze, batches, h8_decide, run
from ftis_edge import config
from procs import ROOT

R = 4
N = 20
EDGES = [0.0, 1e-4, 1e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0]


def _run(run_dir: Path, id_right: int, *, ood_right: int = 5, tokens: int = 100, peers: dict | None = None,
         guard: dict | None = None) -> None:
    """A receiver as a node and run.py leave it: R rounds with TOKENS own tokens each, the peer book
    on the last round, a stop record, ID/OOD evals whose first ID_RIGHT / OOD_RIGHT prompts are right."""
    run_dir.mkdir(parents=True)
    recs = [{"type": "start", "resumed_from": None}]
    recs += [{"type": "round", "round": k, "gen/tokens": tokens, "filter/dropped": 1, "filter/kept": 9,
              "swarm/guard_level": (guard or {}).get(k, 0), "time": float(k),
              **({"peers": peers} if peers and k == R else {})} for k in range(1, R + 1)]
    recs.append({"type": "stop", "reason": "steps", "time": float(R)})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    for which, right in (("id", id_right), ("ood", ood_right)):
        items = [{"id": f"{which}-{k}", "correct": k < right, "reward": float(k < right)} for k in range(N)]
        (run_dir / f"eval-{which}.json").write_text(json.dumps({"accuracy": right / N, "n": N, "items": items}))


def _book(counts_from_expert: list[int]) -> dict:
    """A peer book: node-0 (base) sends KL ~0; node-2 (expert) sends COUNTS over EDGES."""
    return {"node-0": {"samples_used": 10, "kl_mean": 1e-4, "kl_hist": {"edges": EDGES, "counts": [10] + [0] * 9}},
            "node-2": {"samples_used": sum(counts_from_expert), "kl_mean": 0.2,
                       "kl_hist": {"edges": EDGES, "counts": counts_from_expert}}}


def _seed(root: Path, seed: int, ftis: tuple[int, int], alone: tuple[int, int], *, tokens: int = 30,
          arms=("ftis", "nois")) -> None:
    """Nodes 0, 1 (base) and 2, 3 (expert): ID right per kind in arm ftis / alone; nois 2 lower."""
    s = root / "h8" / f"s{seed}"
    for i in range(4):
        k = 0 if i < 2 else 1
        for arm in arms:
            right = ftis[k] - (2 if arm == "nois" else 0)
            _run(s / f"{arm}-{i}", right, ood_right=7, tokens=tokens, peers=_book([0, 0, 0, 2, 4, 2, 1, 1, 0, 0]),
                 guard={3: 2} if (arm, i) == ("nois", 0) else None)
        _run(s / f"alone-{i}", alone[k], tokens=100)


def test_fewer_than_three_seeds_is_undecided(tmp_path):
    for seed in range(2):
        _seed(tmp_path, seed, (12, 12), (12, 12))
    lines, holds = h8_decide.claim(analyze.load_all(tmp_path)["h8"])
    assert holds is None and "undecided" in h8_decide.verdict_line(holds)


def test_the_rule_per_kind_on_se_over_seeds(tmp_path):
    """Base level with alone in every seed: holds. Expert 2, 3, 1 prompts (of 20) below alone:
    mean −0.100, SE 0.029, −2 SE = −0.058: not met, so H8 does not hold."""
    for seed, expert_gap in enumerate((2, 3, 1)):
        _seed(tmp_path, seed, (12, 12 - expert_gap), (12, 12))
    recv = analyze.load_all(tmp_path)["h8"]
    lines, holds = h8_decide.claim(recv)
    base, expert = lines[2], lines[3]
    assert base.startswith("| base | 3 | s0 +0.000, s1 +0.000, s2 +0.000 |") and base.endswith("| yes |"), base
    assert "| expert | 3 | s0 -0.100, s1 -0.150, s2 -0.050 | -0.100 ± 0.029 | not met |" in expert, expert
    assert expert.endswith("| no |") and holds is False
    assert "3.33" in base and "| met |" in base                     # 100 / 30 own tokens every pair


def test_too_few_saved_tokens_fail_a_kind_that_keeps_its_accuracy(tmp_path):
    for seed in range(3):
        _seed(tmp_path, seed, (12, 12), (12, 12), tokens=40)        # 2.5x, under 3x
    lines, holds = h8_decide.claim(analyze.load_all(tmp_path)["h8"])
    assert holds is False and all("2.50" in row and "| not met | no |" in row for row in lines[2:4]), lines


def test_comparisons_kl_and_guard_are_reported(tmp_path):
    for seed in range(3):
        _seed(tmp_path, seed, (12, 12), (12, 12))
    recv = analyze.load_all(tmp_path)["h8"]
    rows = h8_decide.comparisons(recv)
    assert "| base | ftis − nois | 3 | +0.100 ± 0.000 | +0.000 ± 0.000 | 12 / 0, p = 0.00049 |" in "\n".join(rows), rows
    cells = h8_decide.kl_by_kind(recv, "ftis")
    # each learner heard node-0 (base) and node-2 (expert), 2 learners a kind x 3 seeds
    assert cells[("base", "expert")]["counts"] == [0, 0, 0, 12, 24, 12, 6, 6, 0, 0]
    assert h8_decide.share_above(cells[("base", "expert")], 0.05) == pytest.approx(48 / 60)
    assert h8_decide.share_above(cells[("expert", "expert")], 0.5) == pytest.approx(12 / 60)
    assert h8_decide.share_above(cells[("expert", "base")], 0.05) == 0.0
    with pytest.raises(ValueError, match="not a kl_hist edge"):
        h8_decide.share_above(cells[("base", "base")], 0.3)
    kl = "\n".join(h8_decide.kl_lines(recv))
    assert "| base ← expert | 60 | 0.2 | 80.0% | 20.0% | 0.0% |" in kl, kl
    assert "* nois-0 (base) s1: guard level 2 in rounds 3" in h8_decide.guard_lines(recv)


def test_each_node_row_reads_its_arms_evals_and_own_tokens(tmp_path):
    _seed(tmp_path, 0, (12, 14), (10, 16))
    (tmp_path / "h8" / "s0" / "nois-3" / "eval-ood.json").unlink()        # an eval not made yet
    rows = h8_decide.node_lines(analyze.load_all(tmp_path)["h8"])
    assert len(rows) == 2 + 4
    assert rows[2] == "| s0 | 0 base | 0.600 / 0.350 | 0.500 / 0.350 | 0.500 / 0.250 | 0.1 / 0.1 / 0.4 |"
    assert rows[5] == "| s0 | 3 expert | 0.700 / 0.350 | 0.600 / – | 0.800 / 0.250 | 0.1 / 0.1 / 0.4 |"


def test_the_sweep_reads_only_the_seeds_every_sweep_arm_ran(tmp_path):
    _seed(tmp_path, 0, (12, 12), (12, 12), arms=("ftis", "nois", "g0.05", "g0.5"))
    _seed(tmp_path, 1, (14, 14), (12, 12))
    rows = h8_decide.sweep_lines(analyze.load_all(tmp_path)["h8"])
    assert rows[2] == "| g0.05 | 0.05 | 1 | 0.600 | 0.600 | 0.350 | 0.350 | 10.0% |", rows
    assert rows[4].startswith("| ftis | 5 | 1 | 0.600 |"), rows       # seed 1's 0.700 is not in it
    out = subprocess.run([sys.executable, "-m", "experiments.repro.h8_decide", "--runs", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "undecided" in out.stdout and "The g sweep" in out.stdout, out.stderr[-2000:]


ADDR = "tcp://127.0.0.1:5555"


def test_h8_is_the_registered_design(tmp_path):
    """docs/results.md, "H8, as registered": 2 base + 2 expert SmolLM2 LoRA nodes on llama.cpp, each
    generating 1 of 4 groups, R = 32, arms ftis / nois / the g sweep, the code's defaults for the
    worth-aware exchange (as H7 decided: off), the twins alone."""
    batch = batches.BATCHES["h8"]
    cfgs = run.receiver_configs(batch, 0, None, tmp_path, ADDR, "repro-h8-s0")
    assert set(cfgs) == {f"{a}-{i}" for a in ("ftis", "nois", "g0.05", "g0.5", "alone") for i in range(4)}
    loaded = {n: config.load(run.write_config(c, tmp_path / f"{n}.toml")) for n, c in cfgs.items()}
    expert = str(Path(ROOT) / batches.EXPERT_GGUF)
    for name, c in loaded.items():
        i = int(name.rsplit("-", 1)[1])
        assert c.model.spec == ("smollm2-135m" if i < 2 else expert), name
        assert (c.model.backend, c.model.precision, c.train.trainable) == ("llamacpp", "f16", "lora")
        assert c.node.rounds == 32 and c.eval.every == 8 and c.eval.guard
        assert not c.swarm.fill_by_worth and c.swarm.prompt_choice == "stream"
        arm = name.rsplit("-", 1)[0]
        if arm == "alone":
            assert c.mode == "alone"
            continue
        assert c.swarm.own_groups == 1 and c.train.method == ("nois" if arm == "nois" else "f-tis")
        assert c.train.kl_threshold == {"g0.05": 0.05, "g0.5": 0.5}.get(arm, 5.0), name
    assert loaded["ftis-2"].node.seed == loaded["alone-2"].node.seed == 2 and loaded["nois-3"].node.seed == 3
    assert batches.BATCHES["h8"].weights == {batches.EXPERT_GGUF: batches.EXPERT_RECORD}


def test_the_runner_refuses_an_expert_file_it_was_not_registered_with(tmp_path, monkeypatch):
    record = tmp_path / "record.json"
    gguf = tmp_path / "runs" / "x" / "export" / "model-f16.gguf"
    record.write_text(json.dumps({"export": {"sha256": hashlib.sha256(b"the expert").hexdigest()},
                                  "rebuild": "python -m experiments.expert --rounds 173"}))
    monkeypatch.setattr(run, "ROOT", tmp_path)
    batch = batches.SwarmBatch("hx", "", k=1, node={}, weights={"runs/x/export/model-f16.gguf": "record.json"})
    with pytest.raises(SystemExit, match=r"is missing; build it first: python -m experiments.expert --rounds 173"):
        run.check_weights(batch)
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"another model")
    with pytest.raises(SystemExit, match=r"has sha256 .* but record.json names"):
        run.check_weights(batch)
    gguf.write_bytes(b"the expert")
    run.check_weights(batch)                                          # the recorded bytes: no error
