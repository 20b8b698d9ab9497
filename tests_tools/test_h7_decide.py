"""H7's decision (experiments/repro/h7_decide.py) on fabricated run directories laid out as run.py
and publish.py write them: the registered primary endpoint, the "< 5 seeds" rule, and nodes 0–2
that ran on past R counting only their rounds 1..R."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.repro import analyze, h7_decide, runon
from ftis_edge.metrics.stats import t_sf, t_test_greater
from procs import ROOT

R = 4
N_ID = 20


def _run(run_dir: Path, id_right: int, *, tokens: int = 100, past: int = 0, stop: str = "steps",
         marked: bool = False, signal_frac: float = 0.5, extra: dict | None = None) -> None:
    """A receiver as a node and run.py leave it: R rounds (+ PAST more, each with TOKENS own tokens),
    a stop record, ID/OOD evals whose first ID_RIGHT prompts are right."""
    run_dir.mkdir(parents=True)
    recs = [{"type": "start", "resumed_from": None}]
    recs += [{"type": "round", "round": k, "gen/tokens": tokens, "groups/own": 2, "groups/own_signal_frac": signal_frac,
              "reward/own": 0.5, "time": float(k), **(extra or {})} for k in range(1, R + past + 1)]
    recs.append({"type": "stop", "reason": stop, "time": float(R + past)})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    for which, right in (("id", id_right), ("ood", N_ID // 4)):
        items = [{"id": f"{which}-{k}", "correct": k < right, "reward": float(k < right)} for k in range(N_ID)]
        (run_dir / f"eval-{which}.json").write_text(json.dumps({"accuracy": right / N_ID, "n": N_ID, "items": items}))
    if marked:
        runon.mark(run_dir, R, "arm-3")


def _seed(root: Path, seed: int, worth3: int, ftis3: int, alone3: int = 10) -> None:
    s = root / "h7" / f"s{seed}"
    for arm, right3, tokens3 in (("worth", worth3, 100), ("ftis", ftis3, 80)):
        _run(s / f"{arm}-3", right3, tokens=tokens3, extra={"worth/other_tokenizer/used": 1, "worth/other_tokenizer/value": 0.7,
                                                             "worth/same_model/used": 1})   # never met: prior
        for i in range(3):      # ran on 3 rounds past R with 10x the tokens: none of it may count
            _run(s / f"{arm}-{i}", 12, tokens=25, past=3, stop="signal", marked=True)
    for i in range(4):
        _run(s / f"alone-{i}", alone3 if i == 3 else 12, tokens=100 * (1.5 if i == 3 else 1))
    _run(s / "alone1-3", 9, tokens=100)


def _decide(root: Path):
    recv = analyze.load_all(root)["h7"]
    lines, holds = h7_decide.primary(recv)
    return recv, lines, holds


def test_fewer_than_five_seeds_is_undecided(tmp_path):
    for seed, (w, f) in enumerate([(12, 10), (13, 10), (11, 10)]):
        _seed(tmp_path, seed, w, f)
    recv, lines, holds = _decide(tmp_path)
    assert holds is None
    assert h7_decide.verdict_line(holds, 3) == "claim (mean D > 2 SE): undecided: n seeds = 3 < 5"
    assert "s0 +0.100, s1 +0.150, s2 +0.050" in lines[0], lines
    assert "mean D +0.100 ± 0.029" in lines[1], lines
    # pooled McNemar: worth right on 2 + 3 + 1 prompts that ftis missed, never the reverse
    assert "only in worth / only in ftis = 6 / 0" in lines[3], lines
    out = subprocess.run([sys.executable, "-m", "experiments.repro.h7_decide", "--runs", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "undecided: n seeds = 3 < 5" in out.stdout and "worth-0 s0" in out.stdout


def test_five_seeds_decide_on_mean_over_two_se(tmp_path):
    for seed, (w, f) in enumerate([(12, 10), (13, 10), (11, 10), (12, 10), (13, 10)]):
        _seed(tmp_path / "holds", seed, w, f)
    assert _decide(tmp_path / "holds")[2] is True
    for seed, (w, f) in enumerate([(12, 10), (8, 10), (11, 10), (12, 10), (9, 10)]):
        _seed(tmp_path / "fails", seed, w, f)
    _, lines, holds = _decide(tmp_path / "fails")
    assert holds is False and h7_decide.verdict_line(holds, 5).endswith("DOES NOT HOLD")
    t, p = t_test_greater([0.1, -0.1, 0.05, 0.1, -0.05])
    assert f"p = {p:.2g}" in lines[2]


def test_nodes_that_ran_on_count_rounds_one_to_r(tmp_path):
    for seed in range(2):
        _seed(tmp_path, seed, 12, 10)
    recv = analyze.load_all(tmp_path)["h7"]
    for arm in ("worth", "ftis"):
        for i in range(3):
            for run in recv[f"{arm}-{i}"].values():
                assert [r["round"] for r in run["rounds"]] == list(range(1, R + 1))
    # own tokens over rounds 1..R only: alone 4 x 100 against worth 4 x 25 (not 7 x 25)
    rows = "\n".join(h7_decide.same_model_secondaries(recv))
    assert "4.00, 4.00, 4.00, 4.00 | met" in rows, rows
    gemma = "\n".join(h7_decide.gemma_secondaries(recv))
    assert "| alone-3 ÷ worth-3 | 2 | 1.50, 1.50 | 1.50 ± 0.00 | ≥ 1.4×: met |" in gemma, gemma
    assert "worth − alone | 2 | +0.100 ± 0.000" in gemma, gemma
    per_arm = "\n".join(h7_decide.per_arm(recv))
    assert "| worth-0 | 2 | 4 | 0.500 ± 0.000 |" in per_arm, per_arm
    assert any("worth-3 s0: other_tokenizer: used in rounds 1–4; guard: quiet" in line
               for line in h7_decide.filling(recv))


def test_one_seeds_table_counts_rounds_one_to_r(tmp_path):
    """--seed N: the per-seed table results.md prints, re-derived; ran-on rounds do not count."""
    _seed(tmp_path, 0, 12, 10)
    _seed(tmp_path, 1, 14, 10)
    rows = h7_decide.seed_table(analyze.load_all(tmp_path)["h7"], 1)
    assert [r.split(" | ")[0].lstrip("| ") for r in rows[2:5]] == ["ftis-0", "worth-0", "alone-0"]
    assert "| worth-3 | 0.700 | 0.250 | 400 | 8 | – | quiet |" in rows, rows
    assert "| worth-0 | 0.600 | 0.250 | 100 | 8 | – | quiet |" in rows, rows     # 4 rounds x 25, not 7
    assert "| alone-3 | 0.500 | 0.250 | 600 | 8 | – | – |" in rows, rows
    assert rows[-1].startswith("| alone1-3 | 0.450 |"), rows
    out = subprocess.run([sys.executable, "-m", "experiments.repro.h7_decide", "--runs", str(tmp_path), "--seed", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.splitlines() == rows, out.stderr[-2000:]


def test_a_node_stopped_past_r_without_its_mark_is_not_finished(tmp_path):
    """Stopped by a signal past R (a user's Ctrl-C, not the runner at node 3's stop): run.py resumes
    it; the analysis does not count it."""
    rd = tmp_path / "h7" / "s0" / "worth-0"
    _run(rd, 12, past=2, stop="signal")
    assert analyze.load_run(rd) is None
    runon.mark(rd, R, "worth-3")
    assert len(analyze.load_run(rd)["rounds"]) == R


@pytest.mark.parametrize("df,t,p", [(1, 6.314, 0.05), (2, 2.920, 0.05), (4, 2.132, 0.05), (4, 3.747, 0.01),
                                    (9, 1.833, 0.05), (4, 0.0, 0.5), (4, -2.132, 0.95)])
def test_t_tail_matches_the_tables(df, t, p):
    assert t_sf(t, df) == pytest.approx(p, abs=2e-4)
