"""benchmarks/ is a toolbox: every script runs as `python -m benchmarks.NAME` on the shared harness,
`--json PATH` writes the result wherever it exists, and run_all runs every benchmark there is."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from benchmarks import run_all

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
TOOLS = {"harness", "run_all", "calibrate_arith", "calibrate_tasks", "make_rollout_fixture", "bench_relay_rounds",
         "grader_spellings",   # writes the generated grader corpus that grader_corpus measures
         "quant_cost",         # needs a trained run directory: export's figure, run by hand
         "profile_update"}     # H4's 8 nodes for ~25 min under py-spy (issue 64 item 2), by hand


def _modules() -> dict[str, str]:
    """Every committed benchmark module (a file someone is still writing joins when it is committed)."""
    tracked = subprocess.run(["git", "ls-files", "-z", "benchmarks"], cwd=ROOT, capture_output=True).stdout
    paths = [ROOT / p for p in tracked.decode().split("\0") if p.endswith(".py")] or sorted(BENCH.rglob("*.py"))
    return {".".join(p.relative_to(BENCH).with_suffix("").parts): p.read_text(encoding="utf-8")
            for p in paths if p.name != "__init__.py" and p.exists()}


def test_no_benchmark_patches_sys_path_and_json_always_takes_a_path():
    for name, text in _modules().items():
        code = re.sub(r'"""[\s\S]*?"""', "", text)
        # (putting *another* checkout first, --relay-root, is what some attacks are for)
        assert not re.search(r"sys\.path\.insert\([^\n]*(ROOT|__file__|parent)", code), \
            f"{name} patches sys.path to find this repository: run it as python -m benchmarks.{name}"
        assert not re.search(r'"--json"[^)]*store_true', code), f"{name}: --json must take a PATH"


def test_run_all_runs_every_benchmark_and_attack():
    listed = {b.module for b in run_all.BENCHMARKS}
    benchmarks = {n for n in _modules() if n not in TOOLS}
    assert benchmarks - listed == set(), f"not in run_all.BENCHMARKS (or TOOLS here): {benchmarks - listed}"
    assert listed <= set(_modules())
    assert run_all.estimate_minutes(run_all.BENCHMARKS) <= 35


def test_a_benchmark_prints_and_writes_its_result_with_json(tmp_path):
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_wire", "--json", str(tmp_path / "w" / "wire.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ftis wire, lzma (default)" in out.stdout
    result = json.loads((tmp_path / "w" / "wire.json").read_text())
    lzma = next(r for r in result["rows"] if r["format"] == "ftis wire, lzma (default)")
    assert 3 < lzma["bytes_per_token"] < 8 and lzma["max_abs_dlogp"] < 1e-3
