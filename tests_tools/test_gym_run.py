"""The committed reasoning-gym learning run (docs/tasks.md "Does it learn?") agrees with its files."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "docs/runs/gym/smollm2-gym"


def _readme_mix() -> dict:
    readme = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```toml\n(.*?)```", readme, re.S) if 'name = "reasoning_gym"' in b)
    return tomllib.loads(block)["task"]


def test_readme_example_is_the_committed_runs_mix():
    node_file = tomllib.loads((ROOT / "docs/runs/gym/smollm2-gym.toml").read_text())["task"]
    run_config = tomllib.loads((RUN / "config.toml").read_text())["task"]
    readme = _readme_mix()
    assert readme["datasets"] == node_file["datasets"] == run_config["datasets"]
    assert readme["reward"] == node_file["reward"] == run_config["reward"] == "shaped"


def test_docs_numbers_come_from_the_committed_files():
    from experiments.gym_run import load, report

    rounds, evals = load(RUN)
    assert len(rounds) >= 20 and set(evals) == {"base", "trained"}
    assert [x["id"] for x in evals["base"]["items"]] == [x["id"] for x in evals["trained"]["items"]]
    lines = report(rounds, evals)
    docs = (ROOT / "docs/tasks.md").read_text()
    reward = next(line for line in lines if line.strip().startswith("reward/own:"))
    first, last = re.findall(r"(\d\.\d{3} ± \d\.\d{3})", reward)
    assert f"| reward/own (shaped) | {first} | {last} |" in docs
    for label, ev in evals.items():
        lo, hi = ev["accuracy_ci95"]
        assert f"| {ev['n']} | {ev['accuracy']:.1%} | {lo:.1%} – {hi:.1%} | {ev['format_rate']:.1%} |" in docs, label
    assert lines[-1].startswith("\npaired: ") and lines[-1].removeprefix("\npaired: ") in docs
