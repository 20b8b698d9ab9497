"""Fake parts for a round (rounds.Parts): no model, no relay, no grader process.

What is fake is what loads a model or opens a socket (bundle, task's prompts and grading,
generator, learner, weight sync, swarm client, intake's buffer); what is pure stays real (the
config, the peer book, the guard, the divergence watch, build_batch, the wire encoding of what
a round publishes, the progress file). Peer groups are the committed real rollouts.
"""
from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

from ftis_edge import config
from ftis_edge.rollout import wire
from ftis_edge.learn.batch import LocalTokenizer, SampleRules
from ftis_edge.metrics.compute import ComputeTotals
from ftis_edge.run.divergence import DivergenceWatch
from ftis_edge.generate.base import Completion
from ftis_edge.run.guard import SwarmGuard
from ftis_edge.peers.book import PeerBook
from ftis_edge.peers.intake import PeerGroup
from ftis_edge.store.progress import ProgressReport
from ftis_edge.run.rounds import Parts
from ftis_edge.tasks.base import Prompt
from messages import real_rollouts

ME_TOK, ME_MODEL = "1a7674eb4ee78df7", "9372c470eeadd5ec"     # the fixture's: its rollouts are "ours"
RELAY = "tcp://127.0.0.1:1"                                     # never dialled: the swarm client is fake


class Bundle:
    fingerprint, tokenizer_fingerprint, vocab_size, name = ME_MODEL, ME_TOK, 49152, "fake"

    def render_prompt(self, messages) -> str:
        return messages[-1]["content"]

    def encode(self, text: str) -> list[int]:
        return [1 + ord(c) % 97 for c in text]


class Task:
    tags = ("arith",)

    def prompts(self, seed: int, start: int):
        i = start
        while True:
            yield Prompt(id=f"arith-{seed}-{i}", question=f"{seed}/{i}", reference=str(i % 3))
            i += 1

    def messages(self, question: str) -> list[dict]:
        return [{"role": "user", "content": question}]

    def reward_many(self, texts, refs):
        return [(float(t == r), {"correct": t == r, "format_ok": True}) for t, r in zip(texts, refs)]

    def tag_of(self, prompt_id: str) -> str:
        return "arith"


class Generator:
    """Completions that are a function of the sampling seed only (what the real sampler promises)."""

    def __init__(self):
        self.seeds: list[int] = []

    def generate(self, prompt_ids, n: int, sampler) -> list[Completion]:
        self.seeds.append(sampler.seed)
        rng = random.Random(sampler.seed)
        return [Completion(token_ids=[rng.randrange(1, 90) for _ in range(3)], logprobs=[-1.0] * 3,
                           text=str(rng.randrange(3)), finish_reason="stop") for _ in range(n)]


class Learner:
    def __init__(self):
        self.version, self.micro_batch, self.batches, self.measured = 0, 4, [], []

    def compute_gradients(self, samples, plausible=None, **kw) -> dict:
        """A pass without a step (rounds.Round.measure): IS weight 1 for every sample."""
        self.measured.append(samples)
        n = len(samples)
        return {"samples": n, "per_sample": {"advantage": [s.advantage for s in samples], "dropped": [False] * n,
                                             "is_weight": [1.0] * n}}

    def step(self, samples, **kw) -> dict:
        self.version += 1
        self.batches.append(samples)
        n = len(samples)
        return {"loss": 0.5, "samples": n, "version": self.version,
                "per_sample": {"advantage": [s.advantage for s in samples], "dropped": [False] * n}}


class Sync:
    def sync(self, version: int) -> dict:
        return {}


class Intake:
    """A buffer of accepted peer groups, taken in arrival order (the real order is intake's)."""

    def __init__(self):
        self.buffer: list[PeerGroup] = []
        self.received = 0

    def receive(self, items, current_round: int) -> None:
        self.buffer += [it.group for it in items]
        self.received += len(items)

    def ready(self, current_round, limit, group_ids=None, per_peer=None) -> int:
        return len(self.buffer)

    def take(self, current_round, limit, group_ids=None, per_peer=None) -> list[PeerGroup]:
        taken, self.buffer = self.buffer[:limit], self.buffer[limit:]
        return taken

    def pop_round_counts(self) -> dict:
        counts, self.received = {"received": self.received}, 0
        return counts


class Swarm:
    """Delivers ``arrivals`` (one list per poll, then nothing), keeps what was published."""
    codec, limits = wire.DEFAULT_CODEC, wire.DEFAULT_LIMITS

    def __init__(self, arrivals=()):
        self.arrivals = [list(a) for a in arrivals]
        self.published: list[bytes] = []
        self.useful: list[set] = []
        self.polls: list[float] = []

    def poll(self, timeout_s: float):
        self.polls.append(timeout_s)
        groups = self.arrivals.pop(0) if self.arrivals else []
        return [SimpleNamespace(rollout=g.rollout, nbytes=1000, group=g) for g in groups]

    def publish_bytes(self, data: bytes, **tags) -> None:
        self.published.append(data)

    def mark_useful(self, ids) -> None:
        self.useful.append(set(ids))

    def stats(self) -> dict:
        return {"connected": True, "latency_ms": 1.0, "replayed": 0}

    def health(self) -> dict:
        return {"state": "connected"}


def peer_groups(kinds=(("peer-0", ME_TOK, ME_MODEL), ("peer-1", "other-tok", "gemma"),
                       ("peer-2", ME_TOK, "other-base"))) -> list[PeerGroup]:
    """Real rollouts as peers of the given (node id, tokenizer, base model), rewards with a signal."""
    out = []
    for ro, (nid, tok, mfp) in zip(real_rollouts(), kinds):
        ro = dataclasses.replace(ro, node_id=nid, tokenizer_fp=tok, model_fp=mfp)
        out.append(PeerGroup(rollout=ro, prompt=Prompt(id=ro.prompt_id, question="q", reference="0"),
                             rewards=[float(i % 2) for i in range(len(ro.completions))], arrived_round=1,
                             same_tokenizer=tok == ME_TOK))
    return out


def make_cfg(relay: str = "", **sections) -> config.Config:
    data = {"task": {"prompts_per_round": 4, "num_generations": 4, "max_completion_length": 8},
            "node": {"seed": 5, "id": "me"}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    if relay:
        data.setdefault("swarm", {})["relay"] = relay
    return config.from_dict(data)


def make_parts(tmp_path, cfg: config.Config, *, swarm: Swarm | None = None, guard: bool = False) -> Parts:
    return Parts(cfg=cfg, node_id=cfg.node_id, bundle=Bundle(), task=Task(), generator=Generator(),
                 learner=Learner(), sync=Sync(), intake=Intake(), book=PeerBook(),
                 progress=ProgressReport(tmp_path), divergence=DivergenceWatch(cfg),
                 local_tokenizer=LocalTokenizer(prompt_ids=lambda p: [1, 2, 3],
                                                text_ids=lambda text: [1 + ord(c) % 89 for c in text],
                                                eos_token_id=2, max_completion_length=cfg.task.max_completion_length),
                 sample_rules=SampleRules(model_fp=ME_MODEL), totals=ComputeTotals(), swarm=swarm,
                 guard=SwarmGuard(ME_TOK, ME_MODEL) if guard else None)
