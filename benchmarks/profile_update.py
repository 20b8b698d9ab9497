"""Where a filling node's update phase spends its CPU under H4's contention (issue 64 item 2).

Runs H4's batch as its CPU re-run does (`fill4`, arm `own1` + alone, 4 pairs = 8 nodes of one thread
each on this machine's cores, rounds 1..R, no final eval: docs/results.md, "H4's CPU-seconds after
the learner changes") and samples two of its nodes with py-spy (`--pids own1-0 alone-0` by
default) for the whole run. Each sample's Python stack is put in one bucket, the first rule of
``BUCKETS`` that its frames match from the innermost out, so a torch call is charged to the
Python function that made it (the backward pass to ``backward``, a layer's forward to the
learner's forward), then the buckets are grouped by the round's phases as the round record counts
them (``cpu/gen_s``, ``cpu/train_s``, ...). Beside it, each node's own CPU per round by phase
from its metrics.

py-spy counts a sample where a thread is not idle; a process waiting for a core is not idle, so
under contention the counts are proportional to wall time in each place, which is what the
phases' shares need (every phase waits alike). Needs the bench extra (py-spy).

    .venv/bin/python -m benchmarks.profile_update [--rounds 8] [--pids own1-0 alone-0] [--out runs/h4-prof]
        [--json docs/runs/profile-update.json]
    .venv/bin/python -m benchmarks.profile_update --read runs/h4-prof     # the profiles already there
"""
from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from benchmarks.harness import ROOT, parser, write_json

RECEIVERS = [f"own1-{i}" for i in range(4)] + [f"alone-{i}" for i in range(4)]
# (bucket, phase, frame pattern) — the first whose pattern a frame matches, innermost frame first
BUCKETS = [
    ("optimiser step + clip", "update", r"^(step|_single_tensor_adam\w*|_multi_tensor_adam\w*|clip_grad_norm_\w*) \(.*torch/(optim|nn/utils)"),
    ("backward", "update", r"^(backward|_engine_run_backward|run_backward) \("),
    ("judge (plausibility)", "update", r"^_judge \("),
    ("learner forward (log-probs)", "update", r"^(_logprobs_on_prompts|_packed_logprobs|packed_hidden|logprobs|_logprobs_unshared|prompt_states|_token_logprobs) \("),
    ("objective + per-sample stats", "update", r"^(compute_gradients|_micro_batch|_step_stats|aggregate_stats) \("),
    ("measure unmeasured peers", "update", r"^measure \(.*rounds\.py"),
    ("learner step, other", "update", r"^step \(.*learner\.py"),
    ("batch building", "update", r"^(build_batch|bounded|peer_usage) \("),
    ("worth / books", "update", r"^(weigh|record_use|observe) \("),
    ("weight sync", "sync", r"^sync \(.*sync\.py"),
    ("checkpoint", "between", r"^(save|save_checkpoint|write_checkpoint) \(.*(checkpoint|store)"),
    ("in-run eval", "between", r"^(run_eval|evaluate) \(.*heldout"),
    ("metrics + progress", "between", r"^(write|append|round_done|phase) \(.*(records|progress|metrics)"),
    ("generation", "gen", r"^(generate|fill_batch|_generate\w*|_decode|_pool_step|_decode_step|_prefill) \("),
    ("intake (receive, check, re-grade)", "intake", r"^(poll|receive|collect_peers|take|share) \("),
    ("grading own", "grade", r"^(reward_many|grade\w*) \("),
]
PHASES = ("gen", "grade", "intake", "update", "sync", "between")


def bucket_of(frames: list[str]) -> tuple[str, str]:
    """(bucket, phase) of one stack, innermost frame first; ('other', 'between') if none matches."""
    for frame in frames:
        frame = re.sub(r"^[\w<>]+\.(?=\w+ \()", "", frame)      # py-spy names a method Class.method
        for name, phase, pattern in BUCKETS:
            if re.search(pattern, frame):
                return name, phase
    return "other (start-up, idle loop, imports)", "between"


def read_raw(path: Path) -> tuple[Counter, Counter]:
    """py-spy's raw format: one stack a line, outermost first, ';'-separated, then its count.
    (samples per bucket, samples per outermost-but-two frame of the stacks no rule matched)"""
    counts: Counter = Counter()
    unmatched: Counter = Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        key = bucket_of(list(reversed(frames)))
        counts[key] += int(n)
        if key[0].startswith("other"):
            unmatched[" < ".join(frames[-1:-4:-1])] += int(n)
    return counts, unmatched


def node_pid(cfg_name: str) -> int | None:
    """The pid of the `ftis-edge start .../RECEIVER/...config.toml` process, if it runs."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"start" in cmd and any(f"/{cfg_name}/".encode() in c or c.endswith(f"{cfg_name}.toml".encode())
                                   for c in cmd):
            return int(proc.name)
    return None


def node_phases(run_dir: Path) -> dict:
    """The node's own CPU per round by phase (means over its rounds), from its metrics."""
    from ftis_edge.metrics.records import read_metrics
    rounds = [r for r in read_metrics(run_dir) if r.get("cpu/round_s") is not None]
    if not rounds:
        return {}
    keys = ("cpu/gen_s", "cpu/grade_s", "cpu/intake_s", "cpu/train_s", "cpu/sync_s", "cpu/round_s")
    return {k: round(statistics.fmean(r.get(k) or 0.0 for r in rounds), 2) for k in keys} | {"rounds": len(rounds)}


def report(out: Path, pids: list[str]) -> dict:
    result = {}
    for name in pids:
        raw = out / f"pyspy-{name}.txt"
        if not raw.exists():
            print(f"{name}: no profile at {raw}")
            continue
        counts, unmatched = read_raw(raw)
        total = sum(counts.values())
        update = sum(n for (b, ph), n in counts.items() if ph == "update")
        runs = list(out.glob(f"fill4/s0/{name}"))
        own = node_phases(runs[0]) if runs else {}
        print(f"\n{name}: {total} samples; own CPU a round (s, its metrics): " +
              ", ".join(f"{k.split('/')[1]} {v}" for k, v in own.items() if k != "rounds"))
        by_phase = Counter()
        for (b, ph), n in counts.items():
            by_phase[ph] += n
        print("  by phase: " + ", ".join(f"{ph} {by_phase[ph] / total:.0%}" for ph in PHASES if by_phase[ph]))
        print("  inside the update phase (cpu/train_s):")
        rows = []
        for (b, ph), n in counts.most_common():
            if ph == "update":
                rows.append({"bucket": b, "samples": n, "of_update": round(n / update, 3)})
                print(f"    {b:<34} {n / update:6.1%}")
        print("  most samples no rule matched (innermost frames):")
        for frames, n in unmatched.most_common(5):
            print(f"    {n / total:6.1%}  {frames[:150]}")
        result[name] = {"samples": total, "unmatched": dict(unmatched.most_common(20)), "by_phase": {ph: round(by_phase[ph] / total, 3) for ph in PHASES},
                        "update": rows, "own_cpu_per_round": own,
                        "buckets": {f"{ph}: {b}": n for (b, ph), n in counts.most_common()}}
    return result


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--pids", nargs="+", default=["own1-0", "alone-0"], help="receivers to sample")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "h4-prof")
    ap.add_argument("--rate", type=int, default=20, help="py-spy samples a second")
    ap.add_argument("--read", type=Path, help="do not run: report the profiles in this folder")
    a = ap.parse_args()
    if a.read is not None:
        write_json(a.json, {"out": str(a.read), "profiles": report(a.read, a.pids)})
        return 0
    spy = shutil.which("py-spy", path=str(ROOT / ".venv" / "bin")) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("profile_update: py-spy is not installed; ./install.sh --bench (or pip install py-spy)")
    out = a.out.resolve()
    base = out / "base"
    base.mkdir(parents=True, exist_ok=True)
    for f in (ROOT / "docs" / "runs" / "fill" / "base").glob("eval-*.json"):   # the base evals are H4's
        shutil.copy(f, base / f.name)
    t0 = time.time()
    runner = subprocess.Popen([sys.executable, "-m", "experiments.repro.run", "fill4", "--seeds", "0", "--rounds",
                               str(a.rounds), "--no-eval", "--receivers", *RECEIVERS, "--out", str(out)], cwd=ROOT)
    spies: dict[str, subprocess.Popen] = {}
    while runner.poll() is None:
        for name in a.pids:
            if name not in spies and (pid := node_pid(name)) is not None:
                spies[name] = subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", str(a.rate),
                                                "--format", "raw", "--nonblocking",
                                                "-o", str(out / f"pyspy-{name}.txt")],
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
    for p in spies.values():
        p.wait(timeout=120)
    print(f"fill4 R = {a.rounds}, 8 nodes: {time.time() - t0:.0f} s (runner exit {runner.returncode})")
    write_json(a.json, {"rounds": a.rounds, "out": str(out), "wall_s": round(time.time() - t0),
                        "profiles": report(out, a.pids)})
    return 0 if runner.returncode == 0 else runner.returncode


if __name__ == "__main__":
    sys.exit(main())
