"""experiments/repro/h4_cpu.py on H4's committed records (docs/runs/fill): read against itself it
gives H4's 1.91 back, and a faster learner shows up as the rescaled ratio it should."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from experiments.repro import h4_cpu
from experiments.repro.analyze import load_all

ROOT = Path(__file__).resolve().parents[1]


def _with_cpu(run: dict, factor) -> dict:
    return {**run, "rounds": [{**r, "cpu/round_s": r["cpu/round_s"] * factor(r)} for r in run["rounds"]]}


def test_h4_against_itself_is_h4():
    ref = h4_cpu.pairs_of(load_all(h4_cpu.REFERENCE))
    res = h4_cpu.rescaled(ref, ref)
    assert res["rounds"] == 32 and res["s_own"] == [1.0] * 4 == res["s_alone"]
    assert [round(x, 2) for x in res["speedup"]] == [1.70, 2.43, 1.77, 1.73]


def test_a_short_rerun_rescales_each_side_by_its_own_cpu():
    ref = h4_cpu.pairs_of(load_all(h4_cpu.REFERENCE))
    # a re-run of 8 rounds whose own1 nodes spend half the CPU, the isolated twins the same
    new = [(_with_cpu(h4_cpu.first(a, 8), lambda r: 0.5), h4_cpu.first(b, 8)) for a, b in ref]
    res = h4_cpu.rescaled(new, ref)
    assert res["rounds"] == 8
    assert all(abs(x - 2 * h) < 1e-9 for x, h in zip(res["speedup"], res["h4"]))


def test_the_plan_and_the_reading_print(tmp_path):
    out = subprocess.run([sys.executable, "-m", "experiments.repro.h4_cpu", "--plan"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "R = 32" in out.stdout and "1.91 ± 0.17" in out.stdout
    out = subprocess.run([sys.executable, "-m", "experiments.repro.h4_cpu", "--runs", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "no finished fill4 s0 run for own1-0" in out.stderr


def test_a_control_run_sets_the_scale_and_h4_the_rounds_to_reach():
    ref = h4_cpu.pairs_of(load_all(h4_cpu.REFERENCE))
    control = [(h4_cpu.first(a, 8), _with_cpu(h4_cpu.first(b, 8), lambda r: 1.3)) for a, b in ref]
    new = [(_with_cpu(a, lambda r: 0.5), b) for a, b in control]      # only own1 got faster
    res = h4_cpu.rescaled(new, control, ref)
    assert res["rounds"] == 8 and all(abs(x - 1.0) < 1e-9 for x in res["s_alone"])
    assert all(abs(x - 2 * h) < 1e-9 for x, h in zip(res["speedup"], res["h4"]))
