"""A node's parts and run-long books, without a model: swarm_parts builds the books the config
asks for into the node's Parts, and a checkpoint writes and restores them from one table
(Node._books), each book on its own (one that does not read starts empty, the rest restore)."""
from __future__ import annotations

import itertools
import logging

from ftis_edge.config import from_dict
from ftis_edge.peers.worth import SAME_MODEL
from ftis_edge.run import swarm_parts
from ftis_edge.run.node import Node
from ftis_edge.tasks import get_task

SWARM = {"relay": "tcp://127.0.0.1:1", "fill_by_worth": True, "fill": "kin", "prompt_choice": "outcomes"}


def _node(tmp_path, name: str, swarm: dict = SWARM) -> Node:
    cfg = from_dict({"node": {"run_dir": str(tmp_path / name), "id": name}, "swarm": swarm})
    node = Node(cfg, console_log=False)
    node.parts.task = get_task("arith")
    for field_name, book in swarm_parts.books(cfg, node.parts.task).items():
        setattr(node.parts, field_name, book)
    return node


def _group(k: int) -> list[float]:
    return [1.0] * k + [0.0] * (8 - k)


def test_the_books_the_config_asks_for_and_nothing_else():
    books = swarm_parts.books(from_dict({"swarm": {"relay": "tcp://127.0.0.1:1"}}), get_task("arith"))
    assert books == {"worth": None, "kin": None, "outcomes": None, "budget": None, "direction": None,
                     "hints": None}   # defaults: none
    full = swarm_parts.books(from_dict({"swarm": SWARM}), get_task("arith"))
    assert sorted(k for k, b in full.items() if b is not None) == ["kin", "outcomes", "worth"]
    hinted = swarm_parts.books(from_dict({"swarm": {**SWARM, "hints": True}}), get_task("arith"))
    assert sorted(k for k, b in hinted.items() if b is not None) == ["hints", "kin", "outcomes", "worth"]


def test_a_checkpoint_writes_and_restores_the_books_from_one_table(tmp_path, caplog):
    a = _node(tmp_path, "a")
    p = a.parts
    for r in range(1, 4):
        p.worth.observe(r, _group(4), [(SAME_MODEL, _group(4), "twin")], [(SAME_MODEL, 0.98, "twin")] * 8)
        p.kin.observe(r, _group(4), [("twin", _group(4))], [("twin", 0.98)] * 8)
    prompts = list(itertools.islice(p.task.prompts(seed=1, start=0), 2))
    p.outcomes.add_own(_group(4))
    p.outcomes.add_peer(1, prompts[0], SAME_MODEL, _group(8))
    state = {key: book.state() for key, book in a._books().items()}
    assert list(state) == ["worth", "kin", "outcomes"]        # no guard: it comes with held-out evals
    b = _node(tmp_path, "b")
    empty = {key: book.state() for key, book in b._books().items()}
    assert empty != state
    b._restore_books(state)
    assert {key: book.state() for key, book in b._books().items()} == state
    c = _node(tmp_path, "c")
    with caplog.at_level(logging.WARNING, logger="ftis_edge.run.node"):
        c._restore_books({**state, "outcomes": {"prompts": 3}})       # one book that does not read
    assert c.parts.outcomes.state() == empty["outcomes"] and "starting it empty" in caplog.text
    assert c.parts.worth.state() == state["worth"] and c.parts.kin.state() == state["kin"]
    alone = _node(tmp_path, "alone", swarm={})
    assert alone._books() == {}
    assert a.new_round().parts is a.parts and b.new_round().parts is b.parts      # built from them, not copied


def test_another_tokenizers_budget_is_a_book_when_its_text_trains(tmp_path):
    from ftis_edge.rollout.samples import TrainSample
    cfg = {"relay": "tcp://127.0.0.1:1"}
    on = from_dict({"swarm": cfg, "train": {"other_tokenizer": True},
                    "node": {"run_dir": str(tmp_path / "run"), "id": "n"}})
    assert swarm_parts.books(on, get_task("arith"))["budget"] is not None
    off = from_dict({"swarm": cfg, "train": {"other_tokenizer": True, "foreign_budget": False}})
    assert swarm_parts.books(off, get_task("arith"))["budget"] is None
    a = Node(on, console_log=False)
    for field_name, book in swarm_parts.books(on, get_task("arith")).items():
        setattr(a.parts, field_name, book)
    own = [TrainSample([1], [2], [-1.0], None, 1.0), TrainSample([1], [3], [-1.0], None, -1.0)]
    a.parts.budget.apply(own + [TrainSample([1], [4], None, -1.0, 1.0, sequence_level=True, source="g")])
    state = {key: book.state() for key, book in a._books().items()}
    assert list(state) == ["budget", "direction"] and state["budget"]["steps"]
    b = Node(on, console_log=False)
    for field_name, book in swarm_parts.books(on, get_task("arith")).items():
        setattr(b.parts, field_name, book)
    b._restore_books(state)
    assert b.parts.budget.spent() == a.parts.budget.spent()
