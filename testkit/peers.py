"""Peer rollouts as an honest SmolLM2 peer sends them (through the real wire), and an intake that
receives them: the helpers of the intake tests, of the tests that feed a node's intake and of
the grading attacks (benchmarks/attacks/grading_sybils.py, grading_flood.py)."""
from __future__ import annotations

import numpy as np

from ftis_edge.peers.book import PeerBook
from ftis_edge.peers.intake import Intake, ids_decoder
from ftis_edge.peers.swarm import Received
from ftis_edge.rollout.wire import Rollout, WireCompletion, decode, encode


def completion(smol, text, *, ids=None, finish="stop", claimed=0.0):
    """A completion as an honest SmolLM2 peer sends it: the ids of the text, plus the stop
    token when it stopped (in the ids, not in the text)."""
    if ids is None:
        ids = smol.tokenizer()(text, add_special_tokens=False).input_ids
        if finish == "stop":
            ids = ids + [smol.eos_token_ids[0]]
    return WireCompletion(token_ids=ids, logprobs=-np.full(len(ids), 0.5, np.float32), text=text,
                          reward=claimed, finish_reason=finish)


def rollout(smol, task, node="peer", texts=None, comps=None, prompt=None, tokenizer_fp=None, **kw):
    prompt = prompt or next(task.prompts(seed=3))
    if comps is None:
        comps = [completion(smol, t) for t in (texts or ["<answer>999999</answer>"] * 4)]
    r = Rollout(node_id=node, swarm="s", task="arith", prompt_id=prompt.id, completions=comps,
                vocab_size=smol.vocab_size, model_fp=smol.fingerprint,
                tokenizer_fp=tokenizer_fp or smol.tokenizer_fingerprint, group_size=len(comps), **kw)
    return decode(encode(r)), prompt          # through the real wire, as a peer's would arrive


def intake_for(smol, task, book=None, **kw):
    return Intake(task=task, swarm="s", my_node_id="me", my_tokenizer_fp=smol.tokenizer_fingerprint,
                  vocab_size=smol.vocab_size, book=book or PeerBook(quarantine_after=3),
                  decode=ids_decoder(smol.tokenizer()), stop_ids=smol.eos_token_ids, **kw)


def send(intake, *rollouts, sender="peer", rnd=1):
    intake.receive([Received(rollout=r, sender=sender, nbytes=100) for r in rollouts], current_round=rnd)
