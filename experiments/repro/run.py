"""Run the reproduction's batches: a local relay, one peer, the receivers, then a final eval of each.

    .venv/bin/python -m experiments.repro.run methods horizontal --seeds 0 1 2 [--rounds 10]
    .venv/bin/python -m experiments.repro.run --list
    .venv/bin/python -m experiments.repro.run h9 --seeds 0 3 --dry-run     # what each seed would run

Layout: OUT/BATCH/sSEED/{peer,RECEIVER}/ are ordinary run directories (metrics.jsonl, node.log,
adapter/), plus eval-id.json / eval-ood.json per receiver. They hold model weights, so OUT is never
inside docs/: experiments/repro/publish.py copies what docs/ keeps (metrics, configs, evals, and
each adapter's sha256 with the command that rebuilds it). A finished receiver (stop record +
both evals) is skipped, and an unfinished node with a checkpoint is restarted with --resume
(the issue-18 batches checkpoint every round: a stopped batch loses at most one round), so an
interrupted sweep resumes where it stopped. Every node uses one thread: a batch is 3–9
processes sharing the CPU, and the peer sets the pace.

Batches with an expert (batches.Expert) first train the expert alone, once, in
OUT/experts/NAME; each seed's peer then starts from a copy of the expert's run (its last
checkpoint) and shares, frozen (lr 0) or still learning. Swarm batches (batches.SwarmBatch)
run K nodes that all share and learn from each other, and the same K nodes alone.

In a swarm batch with ``run_on_until`` (H7), the other nodes of each arm run on past R until
that node has its stop record, and are scored on their round-R checkpoint (runon.py: what is
kept where, and why their stop reason is not "steps"). An arm named in ``arm_seeds`` trains only on
those seeds (H9's control arm); a batch's ``eval_limit`` may give each eval set its own size (H9).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from experiments.repro import runon
from experiments.repro.batches import BATCHES, COMMON, PEER, RECEIVER, SwarmBatch, merge
from ftis_edge.store import checkpoint, runlock
from ftis_edge.common.atomic import sha256_of
from ftis_edge import config as cfgmod
from ftis_edge.metrics.records import read_metrics
from ftis_edge.common.ports import free_port

ROOT = Path(__file__).resolve().parents[2]

BIN = ROOT / ".venv" / "bin"
EVAL_SETS = {"id": "1,2", "ood": "3"}    # arith levels: the training mix, and a harder held-out level


def write_config(data: dict, path: Path) -> Path:
    cfg = cfgmod.from_dict(data)               # validates: a typo fails here, not an hour later
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cfgmod.to_toml(cfg, comments=False))
    return path


def check_weights(batch) -> None:
    """Refuse to train a batch whose nodes start from a model file (H8's expert) unless the file has
    the bytes its record names: another file would make another experiment under the same name.
    Raises SystemExit with the record's rebuild command."""
    for rel, record_rel in getattr(batch, "weights", {}).items():
        path, record_path = ROOT / rel, ROOT / record_rel
        record = json.loads(record_path.read_text())
        want, rebuild = record["export"]["sha256"], record.get("rebuild", "")
        if not path.is_file():
            raise SystemExit(f"batch {batch.name}: {rel} is missing; build it first: {rebuild}")
        got = sha256_of(path)
        if got != want:
            raise SystemExit(f"batch {batch.name}: {rel} has sha256 {got[:16]}..., but {record_rel} names "
                             f"{want[:16]}...; rebuild it ({rebuild}) or register the new file's record first")


def completed(records: list[dict]) -> bool:
    """A run that stopped because it did all its rounds (not a crash, signal or user stop)."""
    stops = [r for r in records if r.get("type") == "stop"]
    return bool(stops) and stops[-1].get("reason") == "steps"


def finished(run_dir: Path, runs_on: bool = False) -> bool:
    """A receiver that needs no more training: it did all its rounds, or (``runs_on``: a node that
    runs on past R, runon.py) the runner stopped it after its arm's slowest node and marked it."""
    if runs_on:
        return runon.scored_round(run_dir) is not None
    return (run_dir / "metrics.jsonl").exists() and completed(read_metrics(run_dir))


def runs_on(batch, name: str) -> bool:
    """Whether receiver NAME of BATCH runs on past R until its arm's slowest node stops (H7)."""
    return isinstance(batch, SwarmBatch) and batch.runs_on(name)


def waits_for(batch, name: str) -> str | tuple[str, ...]:
    """The receiver a run-on node waits for: the same arm's ``run_on_until`` node, or ("slowest")
    every other node of its arm."""
    arm, i = name.rsplit("-", 1)
    if batch.run_on_until == "slowest":
        return tuple(f"{arm}-{j}" for j in range(batch.k) if j != int(i))
    return f"{arm}-{batch.run_on_until}"


def seed_receivers(batch, seed: int) -> dict[str, dict]:
    """The receivers BATCH trains on SEED: all of them, less an arm that runs on other seeds only
    (SwarmBatch.arm_seeds: H9's control arm)."""
    return {n: c for n, c in batch.receivers.items() if not isinstance(batch, SwarmBatch) or batch.on_seed(n, seed)}


def receiver_configs(batch, seed: int, rounds: int, out: Path, addr: str, swarm: str) -> dict[str, dict]:
    cfgs = {}
    rounds = batch_rounds(batch, rounds)
    for name, over in seed_receivers(batch, seed).items():
        alone = over.get("swarm", {}).get("collaboration") == "alone"
        # One node id and seed for every receiver: same prompts, same sampling seeds, same LoRA
        # init — a paired comparison in which only the compared setting differs. In a swarm
        # batch, swarm-i and alone-i share node-i's id and seed; the K nodes differ.
        node_id, node_seed, topic = "learner", seed, swarm
        if isinstance(batch, SwarmBatch):
            arm, i = name.rsplit("-", 1)
            node_id, node_seed = f"node-{int(i)}", seed * 100 + int(i)
            topic = swarm if arm in ("swarm", "alone") else f"{swarm}-{arm}"    # each arm its own swarm
        # run_dir absolute: a node file resolves a relative one against its own folder (out/BATCH/sSEED)
        cfgs[name] = merge(COMMON, getattr(batch, "settings", {}), RECEIVER, {
            "node": {"id": node_id, "seed": node_seed, "rounds": rounds, "run_dir": str(out.resolve() / name)},
            "swarm": {"relay": "" if alone else addr, "name": topic, "collaboration": batch.collaboration},
        }, over)
        if runs_on(batch, name):    # on past R until the runner stops it; round R is the one scored
            cfgs[name]["node"].update(rounds=runon.limit(rounds), checkpoint_every=1)
    return cfgs


DEFAULT_ROUNDS = 8


def batch_rounds(batch, rounds: int | None) -> int:
    """--rounds if given (a pilot), else the batch's own rounds, else DEFAULT_ROUNDS."""
    return rounds or getattr(batch, "rounds", None) or DEFAULT_ROUNDS


def expert_config(expert, out: Path, settings: dict, rounds: int | None = None) -> dict:
    """The expert's training run: alone, seed 0, checkpointing every round."""
    return merge(COMMON, settings, expert.config, {
        "node": {"id": f"expert-{expert.name}", "seed": 0, "rounds": rounds or expert.rounds,
                 "checkpoint_every": 1, "run_dir": str(out.resolve())},
        "swarm": {"collaboration": "alone", "relay": "", "share": False}})


def peer_config(batch, seed: int, rounds: int | None, out: Path, addr: str, swarm: str,
                expert_rounds: int | None = None) -> dict:
    """The sharing peer of one seed: the batch's peer, or its expert continued from its checkpoint."""
    # The peer must outlast the receivers; train() stops it when they are done. A frozen expert
    # (no update) runs rounds ~2x faster than learning receivers, so R + a few is not enough.
    extra_rounds = 10 * batch_rounds(batch, rounds) + 5
    cfg = merge(COMMON, getattr(batch, "settings", {}), batch.peer, PEER, {
        "node": {"id": "peer", "seed": 1000 + seed, "rounds": extra_rounds, "run_dir": str(out.resolve() / "peer")},
        "swarm": {"relay": addr, "name": swarm, "collaboration": batch.collaboration}})
    expert = getattr(batch, "expert", None)
    if expert is not None:
        cfg["node"]["rounds"] = (expert_rounds or expert.rounds) + extra_rounds
        if expert.frozen:
            cfg["train"]["learning_rate"] = 0.0   # the config's lr wins over the checkpoint's on resume
    return cfg


def has_checkpoint(run_dir: Path) -> bool:
    """A checkpoint the node can resume from, by the node's own rule (not a file name kept here)."""
    return bool(checkpoint.complete(run_dir))


def node_command(cfg_path: Path, run_dir: Path | None = None) -> list[str]:
    """`ftis-edge start`: --resume from the run's last checkpoint if it has one (an interrupted run
    continues where it stopped), else a fresh run (--overwrite: nothing there to keep)."""
    resume = run_dir is not None and has_checkpoint(run_dir)
    return [str(BIN / "ftis-edge"), "start", str(cfg_path), "--headless", "--resume" if resume else "--overwrite"]


def start_node(cfg_path: Path, log_path: Path, run_dir: Path | None = None) -> subprocess.Popen:
    cmd = node_command(cfg_path, run_dir)
    return subprocess.Popen(cmd, stdout=log_path.open("a" if "--resume" in cmd else "w"), stderr=subprocess.STDOUT,
                            cwd=ROOT, start_new_session=True)


def train_expert(expert, out: Path, settings: dict, timeout_s: float, rounds: int | None = None) -> bool:
    """Train the expert alone once (resumable); True when it has done all its rounds."""
    if finished(out):
        return True
    out.mkdir(parents=True, exist_ok=True)
    print(f"[expert {expert.name}] training alone ({rounds or expert.rounds} rounds)", flush=True)
    proc = start_node(write_config(expert_config(expert, out, settings, rounds), out.parent / f"{expert.name}.toml"),
                      out.parent / f"{expert.name}.out", out)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        stop(proc)
    return finished(out)


def seed_peer_from_expert(expert_dir: Path, peer_dir: Path) -> None:
    """The peer of one seed continues the expert's run (copied once; later restarts resume it)."""
    if not has_checkpoint(peer_dir):
        if peer_dir.exists():
            shutil.rmtree(peer_dir)
        shutil.copytree(expert_dir, peer_dir)


def stop(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)          # the node finishes its round and checkpoints
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def watch_for(batch, cfgs: dict, out: Path, rounds: int | None, only: set[str] | None) -> runon.Watch:
    """The run-on nodes this runner answers for: those it was asked to run (``--receivers``). A
    runner for other receivers of the same seed (the twins alone, in a sitting beside the arms)
    must not mark or stop nodes another runner is driving: it would see them as "not running"."""
    r = batch_rounds(batch, rounds)
    if getattr(batch, "run_on_until", None) == "slowest":      # each waits until every other has reached R
        return runon.Watch({n: (out / n, tuple(out / w for w in waits_for(batch, n))) for n in cfgs
                            if runs_on(batch, n) and (only is None or n in only)}, r,
                           lambda rd: runon.reached(rd, r))
    return runon.Watch({n: (out / n, out / waits_for(batch, n)) for n in cfgs
                        if runs_on(batch, n) and (only is None or n in only)}, r, finished)


def not_running(todo: dict, out: Path, label: str) -> dict:
    """TODO without the receivers a live node holds (another runner's, in its last round): starting
    one again would only be refused by its lock; its own runner finishes it, a rerun evaluates it."""
    left = {}
    for name, cfg in todo.items():
        held = runlock.holder(out / name) if (out / name).is_dir() else None
        if held is None:
            left[name] = cfg
        else:
            print(f"{label} {name}: a node (pid {held.get('pid')}) is running in {out / name}; not started "
                  "here, rerun once it stops", flush=True)
    return left


def train(batch, seed: int, rounds: int | None, out: Path, timeout_s: float, experts: Path | None = None,
          expert_rounds: int | None = None, only: set[str] | None = None) -> None:
    port = free_port()
    addr, swarm = f"tcp://127.0.0.1:{port}", f"repro-{batch.name}-s{seed}"
    cfgs = receiver_configs(batch, seed, rounds, out, addr, swarm)
    for name in sorted((only or set()) & set(batch.receivers) - set(cfgs)):
        print(f"[{batch.name} s{seed}] {name}: its arm does not run on seed {seed} (arm_seeds); skipped", flush=True)
    watch = watch_for(batch, cfgs, out, rounds, only)
    for line in watch.poll({}):     # a node past R whose arm's slowest finished meanwhile: done, not restarted
        print(f"[{batch.name} s{seed}] {line}", flush=True)
    todo = {n: c for n, c in cfgs.items() if (only is None or n in only) and not finished(out / n, runs_on(batch, n))}
    todo = not_running(todo, out, f"[{batch.name} s{seed}]")
    if not todo:
        return
    expert = getattr(batch, "expert", None)
    if expert is not None:
        expert_dir = (experts or out.parent.parent / "experts") / expert.name
        if not train_expert(expert, expert_dir, batch.settings, timeout_s, expert_rounds):
            print(f"[expert {expert.name}] not finished: see {expert_dir}; rerun to resume", flush=True)
            return
        seed_peer_from_expert(expert_dir, out / "peer")
    print(f"[{batch.name} s{seed}] training {', '.join(todo)} ({batch_rounds(batch, rounds)} rounds)", flush=True)
    relay = subprocess.Popen([str(BIN / "ftis-relay"), "--bind", addr], stdout=(out / "relay.out").open("a"),
                             stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    procs = {}
    try:
        time.sleep(1.0)
        # only isolated receivers left, or a swarm batch (its nodes are each other's peers): no peer
        if not isinstance(batch, SwarmBatch) and any(c["swarm"]["relay"] for c in todo.values()):
            peer_cfg = peer_config(batch, seed, rounds, out, addr, swarm, expert_rounds)
            procs["peer"] = start_node(write_config(peer_cfg, out / "peer.toml"), out / "peer.out", out / "peer")
        for name, c in todo.items():
            if runs_on(batch, name) and not has_checkpoint(out / name):
                runon.reset(out / name)         # a fresh start keeps nothing of an older run's round R
            procs[name] = start_node(write_config(c, out / f"{name}.toml"), out / f"{name}.out", out / name)
        deadline = time.time() + timeout_s
        while time.time() < deadline and any(p.poll() is None for n, p in procs.items() if n != "peer"):
            time.sleep(2.0)
            for line in watch.poll(procs):
                print(f"[{batch.name} s{seed}] {line}", flush=True)
        for line in watch.poll(procs):      # the last ones to stop
            print(f"[{batch.name} s{seed}] {line}", flush=True)
        for name, p in procs.items():
            if name != "peer" and p.returncode not in (0, None):
                print(f"[{batch.name} s{seed}] {name} exited with {p.returncode}: see {out / name}.out", flush=True)
    finally:
        for p in procs.values():
            stop(p)
        stop(relay, 5.0)


def last_adapter(run_dir: Path) -> Path | None:
    found = sorted((run_dir / "adapter").glob("adapter-v*.gguf"))
    return found[-1] if found else None


def eval_cmd(run_dir: Path | None, which: str, limit: int, precision: str, out_json: Path) -> list[str]:
    cmd = [str(BIN / "ftis-edge"), "eval", "--task", "arith", "--level", EVAL_SETS[which], "--limit", str(limit),
           "--threads", "1", "--max-new-tokens", "64", "--precision", precision, "--quiet", "--json", str(out_json)]
    if run_dir is not None:
        cmd += ["--adapter", str(last_adapter(run_dir))]
    return cmd


def run_evals(jobs: list[tuple[list[str], Path]], parallel: int = 2) -> None:
    """Run eval commands, `parallel` at a time (each is single-threaded)."""
    running: list[tuple[subprocess.Popen, Path]] = []
    pending = list(jobs)
    while pending or running:
        while pending and len(running) < parallel:
            cmd, log = pending.pop(0)
            running.append((subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT), log))
        time.sleep(1.0)
        for p, log in list(running):
            if p.poll() is not None:
                running.remove((p, log))
                if p.returncode:
                    print(f"eval failed ({p.returncode}): see {log}", flush=True)


def eval_limit(batch, override: int | None, which: str = "id") -> int:
    """Prompts of eval set WHICH: --eval-limit, else the batch's (one size, or one per set: H9), else 24."""
    own = getattr(batch, "eval_limit", None)
    return override or (own[which] if isinstance(own, dict) else own) or 24


def per_set(limit: int | dict[str, int]) -> dict[str, int]:
    """An eval size for every set: one for all, or already one per set."""
    return dict(limit) if isinstance(limit, dict) else dict.fromkeys(EVAL_SETS, limit)


def evaluated_prompts(path: Path) -> int:
    """Prompts in an eval json (0 if there is none): a base eval smaller than needed is redone."""
    import json
    return len(json.loads(path.read_text()).get("items", [])) if path.exists() else 0


def run_eval_cmd(run_dir: Path, which: str, limit: int, out_json: Path, lora: bool | None = False) -> list[str]:
    """Evaluate a node's own final weights whatever it trained (`eval --model RUN_DIR`: its LoRA
    on its base model, or its merged model: ``export_cmd`` makes that first). ``lora=None``: by
    the run's config (its adapter may not be written yet when the command is made)."""
    cmd = eval_cmd(None, which, limit, "f16", out_json)
    if lora is None:
        lora = cfgmod.load(run_dir / "config.toml").train.trainable == "lora"
    if lora or (run_dir / "adapter" / "latest.gguf").exists():
        return cmd + ["--model", str(run_dir)]
    return cmd + ["--model", str(run_dir / "export" / "model-f16.gguf")]


def export_cmd(run_dir: Path, force: bool = False) -> list[str] | None:
    """A run without adapter/latest.gguf (full fine-tuning on HF: live weights) is exported from
    its last checkpoint to one merged GGUF, once, before its evals (None: nothing to export);
    ``force``: whatever it trained (a run-on node's round-R checkpoint, runon.py)."""
    if (run_dir / "export" / "model-f16.gguf").exists() or \
            ((run_dir / "adapter" / "latest.gguf").exists() and not force):
        return None
    # --latest: the final weights, as a LoRA node's adapter/latest.gguf (not the best kept by the in-run eval)
    return [str(BIN / "ftis-edge"), "export", str(run_dir), "--to", str(run_dir / "export"), "--quant", "f16",
            "--eval-limit", "0", "--latest"]


def scored_job(run_dir: Path, todo: list[str], limit: int | dict[str, int]) -> tuple[list[str], Path]:
    """One job for a run-on node: export its round-R checkpoint (runon.py's scored/), then score it
    as its twin is scored: a LoRA node's adapter on its base model (scored/ as a run directory
    with that adapter as adapter/latest.gguf), a fully fine-tuned node's merged F16 model."""
    snap = runon.snapshot_dir(run_dir)
    steps = [c for c in [export_cmd(snap, force=True)] if c]
    if cfgmod.load(snap / "config.toml").train.trainable == "lora":
        steps += [["mkdir", "-p", str(snap / "adapter")],
                  ["ln", "-f", str(snap / "export" / "adapter.gguf"), str(snap / "adapter" / "latest.gguf")]]
    steps += [run_eval_cmd(snap, which, per_set(limit)[which], run_dir / f"eval-{which}.json", lora=None)
              for which in todo]
    return ["sh", "-c", " && ".join(shlex.join(c) for c in steps)], run_dir / "eval.out"


def eval_jobs(batch, seed: int, out: Path, limit: int | dict[str, int], only: set[str] | None = None) -> list:
    jobs = []
    limits = per_set(limit)
    own_weights = bool(getattr(batch, "per_node", None))     # heterogeneous nodes: each its own model
    for name in seed_receivers(batch, seed):
        rd = out / name
        if only is not None and name not in only:
            continue
        if not finished(rd, runs_on(batch, name)) or (last_adapter(rd) is None and not own_weights):
            continue
        precision = merge(RECEIVER, batch.receivers[name])["model"]["precision"]   # evaluate as it generated
        todo = [which for which in EVAL_SETS if not (rd / f"eval-{which}.json").exists()]
        if runs_on(batch, name):
            if todo:
                jobs.append(scored_job(rd, todo, limits))
            continue
        cmds = [run_eval_cmd(rd, which, limits[which], rd / f"eval-{which}.json") if own_weights else
                eval_cmd(rd, which, limits[which], precision, rd / f"eval-{which}.json") for which in todo]
        export = export_cmd(rd) if own_weights and cmds else None
        if export is None:
            jobs += [(cmd, rd / f"eval-{which}.out") for which, cmd in zip(todo, cmds)]
        else:       # one job: export once, then its evals (two jobs would both export the same model)
            script = " && ".join(shlex.join(c) for c in [export] + cmds)
            jobs.append((["sh", "-c", script], rd / "eval.out"))
    return jobs


def plan(batch, seed: int, rounds: int | None, eval_override: int | None, only: set[str] | None = None) -> list[str]:
    """What a seed of BATCH would train and score (--dry-run): its receivers, R, who runs on, eval sizes."""
    names = [n for n in seed_receivers(batch, seed) if only is None or n in only]
    on = [n for n in names if runs_on(batch, n)]
    sizes = ", ".join(f"{w} {eval_limit(batch, eval_override, w)}" for w in EVAL_SETS)
    lines = [f"[{batch.name} s{seed}] {len(names)} receivers, R = {batch_rounds(batch, rounds)}: {' '.join(names)}"]
    if on:
        lines.append(f"[{batch.name} s{seed}] run on past R until "
                     + ("every node of their arm has reached R" if batch.run_on_until == "slowest"
                        else f"node {batch.run_on_until} of their arm stops") + f": {' '.join(on)}")
    skipped = [n for n in batch.receivers if n not in seed_receivers(batch, seed) and (only is None or n in only)]
    if skipped:
        lines.append(f"[{batch.name} s{seed}] not on this seed (arm_seeds): {' '.join(skipped)}")
    lines.append(f"[{batch.name} s{seed}] final evals, greedy prompts per set: {sizes}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("batches", nargs="*", help=f"any of: {', '.join(BATCHES)}")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=None,
                    help=f"receivers' rounds (default: the batch's own, else {DEFAULT_ROUNDS}); set it for a pilot")
    ap.add_argument("--expert-rounds", type=int, default=None, help="override the experts' training rounds (pilot)")
    ap.add_argument("--eval-limit", type=int, default=None,
                    help="prompts per eval set (default: the batch's own, else 24)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "repro")
    ap.add_argument("--timeout-min", type=float, default=60.0, help="per batch and seed")
    ap.add_argument("--sweep-seeds", type=int, nargs="*", default=[0], help="seeds the `sweep` batch runs")
    ap.add_argument("--no-eval", action="store_true", help="train only (evaluate later by re-running)")
    ap.add_argument("--receivers", nargs="+", default=None,
                    help="run only these receivers of the batches (a follow-up seed of chosen comparisons)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="print what each seed would train and score; start nothing")
    args = ap.parse_args()
    # absolute: the nodes and evals start with cwd = ROOT, so every path handed to them (node files,
    # run directories, eval outputs) must not depend on where this command was started
    args.out = args.out.resolve()
    only = set(args.receivers) if args.receivers else None
    if only is not None:
        known = {n for b in args.batches if b in BATCHES for n in BATCHES[b].receivers}
        if only - known:
            ap.error(f"unknown receiver {', '.join(sorted(only - known))}; the batches have {', '.join(sorted(known))}")
    if args.list or not args.batches:
        for b in BATCHES.values():
            print(f"{b.name:12s} {b.about}")
        return 0
    if args.out.resolve().is_relative_to(ROOT / "docs"):
        ap.error(f"--out {args.out}: runs hold model weights, which stay out of docs/; write them under "
                 "runs/ and copy what docs/ keeps with experiments/repro/publish.py")
    unknown = [b for b in args.batches if b not in BATCHES]
    if unknown:
        ap.error(f"unknown batch {', '.join(unknown)}; choose from {', '.join(BATCHES)}")
    if args.dry_run:
        for seed in args.seeds:
            for name in args.batches:
                if not (name == "sweep" and seed not in args.sweep_seeds):
                    print("\n".join(plan(BATCHES[name], seed, args.rounds, args.eval_limit, only)))
        return 0
    for b in args.batches:
        check_weights(BATCHES[b])
    base = args.out / "base"
    limit = {w: max(eval_limit(BATCHES[b], args.eval_limit, w) for b in args.batches) for w in EVAL_SETS}
    # the untrained model's evals, and those of a model some nodes start from (H8's expert),
    # before any training: base/eval-*.json, base/RUN-ID/eval-*.json
    starts = [(base, [])] + [(base / Path(rel).parent.parent.name, ["--model", str(ROOT / rel)])
                             for rel in sorted({rel for b in args.batches for rel in getattr(BATCHES[b], "weights", {})})]
    for d, _ in starts:
        d.mkdir(parents=True, exist_ok=True)
    run_evals([(eval_cmd(None, w, limit[w], "f16", d / f"eval-{w}.json") + model, d / f"eval-{w}.out")
               for d, model in starts for w in EVAL_SETS if evaluated_prompts(d / f"eval-{w}.json") < limit[w]])
    for seed in args.seeds:
        for name in args.batches:
            if name == "sweep" and seed not in args.sweep_seeds:
                continue
            batch, out = BATCHES[name], args.out / name / f"s{seed}"
            out.mkdir(parents=True, exist_ok=True)
            t0 = time.time()
            train(batch, seed, args.rounds, out, args.timeout_min * 60, args.out / "experts", args.expert_rounds, only)
            if not args.no_eval:
                run_evals(eval_jobs(batch, seed, out, {w: eval_limit(batch, args.eval_limit, w) for w in EVAL_SETS},
                                    only))
            print(f"[{name} s{seed}] done in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
