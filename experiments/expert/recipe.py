"""The expert for H8 (issue 49 item 2): SmolLM2-135M trained alone on a skill apart from H8's task
(expert.toml: arith level 6, fractions and decimals), evaluated held out before and after, merged,
and recorded. letter_counting.toml is the first attempt (it collapsed to answering 1), kept with
its record in docs/runs/expert/letter-counting/ (``--config … --record …`` rebuilds it).

    python -m experiments.expert                         # everything, resumable: re-running continues
    python -m experiments.expert --until 08:55           # stop training at that UTC time (checkpointed)
    python -m experiments.expert --rounds 40             # the rebuild command the record gives

Stages, each skipped when already done (a stage's output is its marker):
1. base eval   RUN/eval-base.json      greedy, the task's first --eval-limit held-out prompts
2. training    RUN/                    `ftis-edge start CONFIG --headless`, resumed from its checkpoint
3. after eval  RUN/eval-trained.json   the newest adapter on the same prompts (redone when rounds changed)
4. export      RUN/export/model-f16.gguf  `ftis-edge export RUN --quant f16 --latest` (LoRA merged)
5. record      --record (docs/runs/expert/record.json): config, rounds, evals with 95% Wilson
               intervals and the paired McNemar test, sha256 of the GGUF, the rebuild command; the
               evals and the run's metrics are copied beside it (text, no weights)
``--check-node`` then starts a one-round node from the exported GGUF under /tmp and records what
a peer on the base model sees of it (model and tokenizer fingerprints, its peer kind).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.repro import records
from ftis_edge import config as cfgmod
from ftis_edge.metrics.records import read_rounds
from ftis_edge.common.atomic import sha256_of
from ftis_edge.metrics.stats import mcnemar_two_sided, mean_se, wilson_interval

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("expert.toml")
RECORD = ROOT / "docs" / "runs" / "expert" / "record.json"
CLI = [sys.executable, "-m", "ftis_edge.cli"]
EVAL_TOKENS = 64                        # answers are one small number; the training cap too
WINDOW = 5                              # rounds in the first/last training means


class RecipeError(ValueError):
    """Bad arguments or a run the recipe cannot continue: one line for the user."""


def parse_until(text: str | None, now: dt.datetime) -> float | None:
    """'HH:MM' (UTC, today; tomorrow when already past) -> a Unix time; None: no deadline."""
    if not text:
        return None
    try:
        hh, mm = (int(x) for x in text.split(":"))
        when = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    except ValueError:
        raise RecipeError(f"--until {text!r}: expected HH:MM in UTC, e.g. 08:55") from None
    if when <= now:
        when += dt.timedelta(days=1)
    return when.timestamp()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m experiments.expert", description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=CONFIG, help="the expert's node file (default %(default)s)")
    ap.add_argument("--run-dir", type=Path, default=None, help="default runs/<node id>")
    ap.add_argument("--rounds", type=int, default=None, help="train until this many rounds (default: node.rounds)")
    ap.add_argument("--until", default=None, help="stop training at this UTC time HH:MM (resume later)")
    ap.add_argument("--eval-limit", type=int, default=200, help="held-out prompts, greedy (default %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads for the evals and the export")
    ap.add_argument("--record", type=Path, default=RECORD, help="the record JSON (default %(default)s)")
    ap.add_argument("--no-train", action="store_true", help="skip training: evaluate, export and record what is there")
    ap.add_argument("--check-node", action="store_true",
                    help="also start a one-round node from the export under /tmp and record its fingerprints")
    a = ap.parse_args(argv)
    if a.rounds is not None and a.rounds < 1:
        raise RecipeError(f"--rounds {a.rounds}: must be at least 1")
    if a.eval_limit < 1:
        raise RecipeError(f"--eval-limit {a.eval_limit}: must be at least 1")
    if not a.config.is_file():
        raise RecipeError(f"--config {a.config}: no such file")
    a.deadline = parse_until(a.until, dt.datetime.now(dt.timezone.utc))
    return a


def run_dir_of(cfg, override: Path | None) -> Path:
    """The run directory; a relative one is under the repository (the stages run there)."""
    return ROOT / (override or Path(cfg.node.run_dir.replace("{id}", cfg.node.id)))


def task_spec_of(cfg) -> str:
    from ftis_edge.tasks import task_spec
    return task_spec(cfg.task)


def task_args(cfg) -> list[str]:
    """`ftis-edge eval`'s task arguments for the node's [task]: arith carries its levels in --level."""
    levels = ["--level", ",".join(map(str, cfg.task.level))] if cfg.task.name == "arith" and cfg.task.level else []
    return ["--task", task_spec_of(cfg)] + levels


def eval_command(model: str, task: list[str], limit: int, threads: int, out_json: Path) -> list[str]:
    """Greedy held-out eval: the task's first `limit` eval prompts, the same ones before and after."""
    return CLI + ["eval", "--model", model, *task, "--limit", str(limit), "--temperature", "0",
                  "--max-new-tokens", str(EVAL_TOKENS), "--threads", str(threads), "--quiet", "--json", str(out_json)]


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    with log.open("a") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        f.flush()
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)


def sh(cmd: list[str], log: Path) -> None:
    """Run one stage's command, its output appended to LOG; a failure stops the recipe."""
    with log.open("a") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if rc:
        raise RecipeError(f"`{shlex.join(cmd[2:5])} …` failed ({rc}): see {log}")


def train(config: Path, run_dir: Path, rounds: int | None, deadline: float | None, log: Path) -> None:
    """`ftis-edge start`, resumed from the run's checkpoint when it has one; at the deadline the node
    is told to stop (SIGTERM: it finishes its round and checkpoints)."""
    from experiments.repro.run import has_checkpoint, stop
    cmd = CLI + ["start", str(config), "--headless", "--run-dir", str(run_dir),
                 "--resume" if has_checkpoint(run_dir) else "--overwrite"]
    if rounds is not None:
        cmd += ["--rounds", str(rounds)]
    proc = start(cmd, log)
    try:
        while proc.poll() is None:
            if deadline is not None and time.time() >= deadline:
                print("deadline reached: stopping after this round", flush=True)
                break
            time.sleep(5)
    finally:
        stop(proc, grace_s=900)           # a no-op when it already finished


def rounds_done(run_dir: Path) -> int:
    return len(read_rounds(run_dir)) if (run_dir / "metrics.jsonl").exists() else 0


def eval_summary(ev: dict) -> dict:
    """n, correct, accuracy with its 95% Wilson interval, format rate."""
    k = sum(it["reward"] >= 1.0 for it in ev["items"])
    n = len(ev["items"])
    lo, hi = wilson_interval(k, n)
    return {"n": n, "correct": k, "accuracy": k / n if n else 0.0, "ci95": [lo, hi],
            "format_rate": ev.get("format_rate")}


def compare(before: dict, after: dict) -> dict:
    """Same prompts, greedy: the paired change and whether it is clear (the intervals are apart)."""
    a, b = before["items"], after["items"]
    if [x["id"] for x in a] != [x["id"] for x in b]:
        raise RecipeError("the two evals did not use the same prompts: delete eval-*.json and rerun")
    won = sum(y["reward"] >= 1.0 > x["reward"] for x, y in zip(a, b))
    lost = sum(x["reward"] >= 1.0 > y["reward"] for x, y in zip(a, b))
    s0, s1 = eval_summary(before), eval_summary(after)
    return {"right_only_after": won, "right_only_before": lost, "mcnemar_p": mcnemar_two_sided(won, lost),
            "delta": s1["accuracy"] - s0["accuracy"],
            # "clearly risen": the after interval lies wholly above the before interval
            "clearly_risen": s1["ci95"][0] > s0["ci95"][1]}


def constant_candidates(before: dict, after: dict, top: int = 2) -> tuple[str, ...]:
    """The constants worth trying: the most common reference answers among the held-out prompts
    (arith: the true answers; reasoning-gym's references are ids, so none) and the trained model's
    own most frequent answers (a collapse to one answer shows up there)."""
    from collections import Counter
    refs = Counter(it["reference"] for it in before["items"] if it.get("reference") not in (None, it["id"]))
    said = Counter(it["answer"] for it in after["items"] if it.get("answer") not in (None, ""))
    out = [a for a, _ in refs.most_common(top)] + [a for a, _ in said.most_common(top)]
    return tuple(dict.fromkeys(str(a) for a in out))


def constant_answers(spec: str, before: dict, answers: tuple[str, ...]) -> dict[str, dict]:
    """What answering one constant on every eval prompt scores: does the expert have the skill, or
    has it learnt the most frequent answer? (letter_counting in short texts: mostly 1)"""
    from ftis_edge.tasks import get_task
    task = get_task(spec)
    refs = [it.get("reference") or it["id"] for it in before["items"]]   # reasoning-gym: the id
    out = {}
    for a in answers:
        results = task.reward_many([f"<answer>{a}</answer>"] * len(refs), refs)
        k = sum(r[0] >= 1.0 for r in results)
        out[a] = {"correct": k, "n": len(refs), "ci95": list(wilson_interval(k, len(refs)))}
    return out


def trend(rounds: list[dict], key: str = "accuracy/own") -> dict:
    """Training accuracy in the first and last WINDOW rounds and its least-squares slope per round."""
    ys = [r.get(key) or 0.0 for r in rounds]
    out: dict = {"key": key, "rounds": len(ys)}
    if len(ys) >= 2:
        xs = range(len(ys))
        mx, my = (len(ys) - 1) / 2, sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        out["slope_per_round"] = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if len(ys) >= 2 * WINDOW:
        out["first"], out["last"] = mean_se(ys[:WINDOW]), mean_se(ys[-WINDOW:])
    return out


def rounds_to_clear(before: dict, after: dict, slope: float | None) -> int | None:
    """More rounds the training trend needs for the after accuracy to clear the before interval's
    upper bound by the after interval's half-width (a rough projection; None: no upward trend)."""
    s0, s1 = eval_summary(before), eval_summary(after)
    gap = s0["ci95"][1] + (s1["ci95"][1] - s1["ci95"][0]) / 2 - s1["accuracy"]
    if gap <= 0:
        return 0
    if not slope or slope <= 0:
        return None
    return int(-(-gap // slope))


def build_record(config: Path, run_dir: Path, rounds: list[dict], before: dict, after: dict,
                 gguf: Path | None, rebuild: str) -> dict:
    tr = trend(rounds)
    cmp = compare(before, after)
    return {
        "about": "the expert for H8 (issue 49 item 2): SmolLM2-135M trained alone on another task, merged",
        "config": {"file": str(config.relative_to(ROOT) if config.is_relative_to(ROOT) else config),
                   "toml": config.read_text(), "task": task_spec_of(cfgmod.load(config))},
        "rounds": len(rounds),
        "train_seconds": sum(r.get("time/round_s") or 0.0 for r in rounds),
        "training_trend": tr,
        "eval": {"prompts": "the task's first held-out prompts, unseen by text (ftis_edge/tasks/unseen.py; arith: "
                            "a held-out share of the question-text space; reasoning-gym: eval seeds, training "
                            "redraws any item whose text equals one), greedy",
                 "before": eval_summary(before), "after": eval_summary(after), **cmp},
        "constant_answer_baselines": (consts := constant_answers(task_spec_of(cfgmod.load(config)), before,
                                                                 constant_candidates(before, after))),
        # a skill, not the most frequent answer: the after interval above the best constant's
        "clearly_above_best_constant": (eval_summary(after)["ci95"][0] > max(c["ci95"][1] for c in consts.values())
                                        if consts else None),
        "more_rounds_suggested": (None if cmp["clearly_risen"]
                                  else rounds_to_clear(before, after, tr.get("slope_per_round"))),
        "more_rounds_rule": "rounds until the training accuracy's least-squares slope carries the after accuracy "
                            "past the before interval's upper bound by half the after interval (rough; None: no "
                            "upward trend, or already clear)",
        "export": (None if gguf is None
                   else {"file": gguf.name, "bytes": gguf.stat().st_size, "sha256": sha256_of(gguf)}),
        "rebuild": rebuild,
    }


def rebuild_command(args: argparse.Namespace, rounds: int) -> str:
    cfg = args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config
    record = "" if args.record.resolve() == RECORD else f" --record {relative_paths(str(args.record.resolve()))}"
    return (f"python -m experiments.expert --config {cfg} --rounds {rounds} --eval-limit {args.eval_limit} "
            f"--threads {args.threads}{record}   # -> runs/<id>/export/model-f16.gguf (sha256 in this record)")


def check_node(gguf: Path, log: Path) -> dict:
    """A one-round node started from the export (under /tmp): what its start record says, and what a
    node on the base model makes of it."""
    from ftis_edge.metrics.records import read_metrics
    from ftis_edge.models.resolve import resolve_model
    from ftis_edge.peers.worth import peer_kind
    base = resolve_model("smollm2-135m")
    with tempfile.TemporaryDirectory(prefix="expert-node-") as tmp:
        node_toml = Path(tmp) / "node.toml"
        data = {"node": {"id": "expert-check", "rounds": 1, "run_dir": str(Path(tmp) / "run")},
                "model": {"spec": str(gguf.resolve()), "threads": 1}, "eval": {"every": 0},
                "task": {"prompts_per_round": 1, "num_generations": 4, "max_completion_length": 32}}
        node_toml.write_text(cfgmod.to_toml(cfgmod.from_dict(data), comments=False))
        sh(CLI + ["start", str(node_toml), "--headless"], log)
        records = read_metrics(Path(tmp) / "run")
    start = next(r for r in records if r.get("type") == "start")
    return {"model_fp": start["model_fp"], "tokenizer_fp": start["tokenizer_fp"],
            "base_model_fp": base.fingerprint, "base_tokenizer_fp": base.tokenizer_fingerprint,
            "rounds": sum(r.get("type") == "round" for r in records),
            "peer_kind_to_base": peer_kind(start["tokenizer_fp"] == base.tokenizer_fingerprint,
                                           start["model_fp"], base.fingerprint)}


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        cfg = cfgmod.load(args.config)
    except (RecipeError, cfgmod.ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run_dir = run_dir_of(cfg, args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir.parent / f"{run_dir.name}.recipe.log"
    spec = task_args(cfg)
    base_json, after_json = run_dir / "eval-base.json", run_dir / "eval-trained.json"
    gguf = run_dir / "export" / "model-f16.gguf"
    try:
        base_eval = None
        if not base_json.exists():
            # beside the training (both single-threaded): the base model's eval needs no trained round
            print(f"[1/5] base eval ({args.eval_limit} prompts)", flush=True)
            base_log = run_dir.parent / f"{run_dir.name}.base-eval.log"
            base_eval = start(eval_command(cfg.model.spec, spec, args.eval_limit, args.threads, base_json), base_log)
        if not args.no_train:
            print(f"[2/5] training in {run_dir} (log {log})", flush=True)
            train(args.config, run_dir, args.rounds, args.deadline, log)
        if base_eval is not None and base_eval.wait():
            raise RecipeError(f"the base eval failed ({base_eval.returncode}): see {base_log}")
        done = rounds_done(run_dir)
        if done == 0:
            raise RecipeError(f"{run_dir} has no trained round yet: rerun to train")
        stale = not after_json.exists() or json.loads(after_json.read_text()).get("rounds") != done
        if stale:
            print(f"[3/5] eval after {done} rounds", flush=True)
            sh(eval_command(str(run_dir), spec, args.eval_limit, args.threads, after_json), log)
            ev = json.loads(after_json.read_text())
            ev["rounds"] = done                   # which weights it measured (a marker for reruns)
            after_json.write_text(json.dumps(ev))
        if stale or not gguf.exists():
            print("[4/5] export (merged F16 GGUF)", flush=True)
            shutil.rmtree(gguf.parent, ignore_errors=True)
            sh(CLI + ["export", str(run_dir), "--quant", "f16", "--latest", "--eval-limit", "0",
                      "--threads", str(args.threads)], log)
        print(f"[5/5] record {args.record}", flush=True)
        record = build_record(args.config.resolve(), run_dir, read_rounds(run_dir), json.loads(base_json.read_text()),
                              json.loads(after_json.read_text()), gguf, rebuild_command(args, done))
        if args.check_node:
            print("[+] a one-round node from the export", flush=True)
            record["node_check"] = check_node(gguf, log)
        else:                             # keep the last check while it was of these very weights
            old = json.loads(args.record.read_text()) if args.record.exists() else {}
            if "node_check" in old and (old.get("export") or {}).get("sha256") == record["export"]["sha256"]:
                record["node_check"] = old["node_check"]
        publish(record, run_dir, args.record)
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    ev = record["eval"]
    print(f"held out: {ev['before']['correct']}/{ev['before']['n']} -> {ev['after']['correct']}/{ev['after']['n']} "
          f"after {record['rounds']} rounds (McNemar p = {ev['mcnemar_p']:.4f}, clearly risen: {ev['clearly_risen']}, "
          f"above the best constant answer: {record['clearly_above_best_constant']}); "
          f"sha256 {record['export']['sha256']}", flush=True)
    return 0


def publish(record: dict, run_dir: Path, path: Path) -> None:
    """The record, and beside it the evals, the run's metrics (gzip-compressed: docs/ has a size
    limit) and config (text, no weights); paths under the repository are written relative to its
    root (the same on every checkout)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(relative_paths(json.dumps(record, indent=1) + "\n"))
    for name in ("eval-base.json", "eval-trained.json", "metrics.jsonl", "config.toml"):
        if (run_dir / name).exists():
            text = relative_paths((run_dir / name).read_text())
            if name == "metrics.jsonl":
                (path.parent / name).unlink(missing_ok=True)
                records.write_gz(path.parent / name, text.encode())
            else:
                (path.parent / name).write_text(text)


def relative_paths(text: str) -> str:
    return text.replace(f"{ROOT}/", "")
