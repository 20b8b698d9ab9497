"""What a swarm node adds to its parts (rounds.Parts): the relay client, the thread that keeps
the dashboard's relay cell current, and the run-long books that decide fill and prompts.

``Node.build`` calls these once; an alone node has none of them. A new book is built in
``books`` and listed in ``Node._books`` (what a checkpoint keeps).
"""
from __future__ import annotations

import threading

from ..learn.foreign_budget import ForeignBudget
from ..peers.hints import HintBook
from ..peers.kin import KinBook
from ..peers.outcomes import OutcomeBook
from ..peers.swarm import ClientKeys, SwarmClient
from ..peers.worth import WorthBook
from .rounds import direction_bound, other_tokenizer_bound


def connect(cfg, node_id: str, tags) -> SwarmClient:
    """The started relay client of this node (``tags``: the task's, the relay's delivery filter)."""
    keys = ClientKeys.load(cfg.swarm.client_keys, cfg.swarm.server_key) if cfg.swarm.client_keys else None
    k = cfg.swarm.delivery_budget or max(1, cfg.swarm.max_peer_groups)
    swarm = SwarmClient(cfg.swarm.relay, swarm=cfg.swarm.name, node_id=node_id, keys=keys,
                        budget_k=0 if k < 0 or cfg.mode == "horizontal" else k,     # horizontal needs every part
                        filters={"task": list(tags)})
    swarm.start()
    return swarm


def books(cfg, task) -> dict:
    """The books this config asks for, by their Parts field: worth (swarm.fill_by_worth), kin
    (swarm.fill = "kin"), outcomes (swarm.prompt_choice = "outcomes"), the budget and the direction
    bound on another tokenizer's text (train.other_tokenizer and train.foreign_budget), hints (swarm.hints)."""
    s, t = cfg.swarm, cfg.train
    return {"worth": WorthBook(window=s.worth_window, threshold=s.worth_threshold,
                               other_bound=other_tokenizer_bound(cfg)) if s.fill_by_worth else None,
            "kin": KinBook(window=s.worth_window, share_min=s.kin_share,
                           capability_min=s.kin_capability) if s.fill == "kin" else None,
            "outcomes": OutcomeBook(prompt_of=task.get) if s.prompt_choice == "outcomes" else None,
            "budget": ForeignBudget() if t.bounds_other_tokenizer else None,
            "direction": direction_bound(cfg) if t.bounds_other_tokenizer else None,
            "hints": HintBook() if s.hints else None}


def trust_note(cfg) -> str | None:
    """What train.other_tokenizer asks the user to know, once at start: on an open relay the node
    ids it names are claims, and with no names every peer's such text trains (docs/relay.md)."""
    t = cfg.train
    if not t.other_tokenizer:
        return None
    if not t.other_tokenizer_peers:
        return ("train.other_tokenizer: another tokenizer's text trains from any peer, and no judge checks it "
                "(bounded by train.foreign_budget, not closed: docs/relay.md; all its senders share one peer's "
                "budget); name the peers you trust in train.other_tokenizer_peers")
    if not cfg.swarm.server_key:
        return (f"train.other_tokenizer_peers names {len(t.other_tokenizer_peers)} node id(s), but this relay "
                "has no CURVE keys: there a node id is a claim anyone can make (docs/relay.md, Identity), so "
                "they share one peer's budget")
    return None


def watch_relay(swarm, progress, stop: threading.Event, every_s: float = 1.0) -> None:
    """The relay's health into progress.json within a second of a change, from a thread (until
    ``stop`` is set): a round (and its record) can take minutes, the dashboard's relay cell must not."""
    def watch() -> None:
        while not stop.wait(every_s):
            try:
                health = swarm.health()
                latency = swarm.stats().get("latency_ms")
            except Exception:      # noqa: BLE001 - a closing client; the round record still tells
                return
            progress.relay({"state": health.get("state"), "reason": health.get("reason") or None,
                            "latency_ms": round(latency) if health.get("state") == "connected"
                            and isinstance(latency, (int, float)) else None})

    threading.Thread(target=watch, name="relay-watch", daemon=True).start()
