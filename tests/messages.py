"""What tests send a real relay or a node's intake: rollouts (real ones from the committed fixture,
made-up ones, and raw bytes with only the prefix the relay reads), and a bare DEALER socket that
speaks the relay protocol by hand."""
from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import numpy as np
import orjson
import zmq

from ftis_edge.rollout import wire
from ftis_edge.rollout.wire import Rollout, WireCompletion
from relay import protocol as P
from relay.keys import ClientKeys

_RNG = np.random.default_rng(0)
REAL_ROLLOUTS = Path(__file__).parent / "data" / "real_rollouts.json"


def real_rollouts(with_prompt_ids: bool = False, with_token_bytes: bool = True) -> list[Rollout]:
    """One Rollout per group of the committed fixture (benchmarks/make_rollout_fixture.py)."""
    fx = json.loads(REAL_ROLLOUTS.read_text())
    out = []
    for i, g in enumerate(fx["groups"]):
        comps = [WireCompletion(c["token_ids"], c["logprobs"], c["text"], reward=float(i % 2),
                                finish_reason=c["finish_reason"],
                                token_bytes=c["token_bytes"] if with_token_bytes else None)
                 for c in g["completions"]]
        out.append(Rollout(
            node_id="node-7f3a2c", swarm="gsm8k-smollm2", task=g["task"], prompt_id=g["prompt_id"],
            completions=comps, group_id=uuid.uuid4().hex, round=123, adapter_version=122,
            prompt_ids=g["prompt_ids"] if with_prompt_ids else None,
            model_fp="9372c470eeadd5ec",              # sha256[:16], as ftis_edge.models.resolve
            tokenizer_fp="1a7674eb4ee78df7",
            model_name=fx["model_name"], vocab_size=fx["vocab_size"], temperature=1.0))
    return out


def make_rollout(node_id: str, n: int = 4, tokens: int = 24, **kw) -> wire.Rollout:
    comps = [wire.WireCompletion(_RNG.integers(0, 49152, tokens), -_RNG.exponential(1.0, tokens),
                                 f"answer {i} #### {i}", reward=float(i % 2), finish_reason="stop")
             for i in range(n)]
    return wire.Rollout(node_id=node_id, swarm="s", prompt_id=uuid.uuid4().hex[:8], completions=comps,
                        vocab_size=49152, model_fp="m", **{"task": "arith", "tokenizer_fp": "t", **kw})


def raw_rollout(rid: str, body: bytes = b"", task: str = "", tok: str = "") -> bytes:
    """A message with a valid rollout prefix (codec none): all the relay ever reads."""
    return P.pack_prefix("none", rid, task, tok, len(body)) + body


def dealer(address: str, keys: ClientKeys | None = None) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if keys:
        keys.apply(s)
    s.connect(address)
    return s


def hello(s: zmq.Socket, node_id: str) -> list[bytes]:
    s.send_multipart([P.HELLO, orjson.dumps({"node_id": node_id, "protocol": P.RELAY_PROTOCOL})])
    assert s.poll(5000), "no answer to HELLO"
    return s.recv_multipart()


def replies(s: zmq.Socket, wait_ms: int = 300, n: int | None = None, timeout_s: float = 20) -> list[list[bytes]]:
    """Replies until none comes for wait_ms (or, given n, until n came or timeout_s passed)."""
    out, deadline = [], time.time() + timeout_s
    while (len(out) < n and time.time() < deadline) if n is not None else True:
        if not s.poll(wait_ms if n is None else 100):
            if n is None:
                break
            continue
        out.append(s.recv_multipart())
    return out


def subscribe(s: zmq.Socket, filters: dict | None = None, budget: dict | None = None, swarm: bytes = b"s") -> None:
    """SUB from the start of the swarm's replay (with the given filters / delivery budget), answered SUBOK."""
    body = {"epoch": None, "last_seq": 0, **({"filters": filters} if filters is not None else {}),
            **({"budget": budget} if budget is not None else {})}
    s.send_multipart([P.SUB, swarm, orjson.dumps(body)])
    assert replies(s, n=1)[0][0] == P.SUBOK


def join(s: zmq.Socket, node_id: str, **sub) -> None:
    """HELLO as ``node_id`` (answered WELCOME), then SUB (``subscribe``'s filters / budget)."""
    assert hello(s, node_id)[0] == P.WELCOME
    subscribe(s, **sub)
