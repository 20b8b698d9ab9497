"""Outcomes as a second currency (issue 48.2): peers' rewards pick a node's own prompts."""
import gzip
import json
from pathlib import Path

import pytest

from ftis_edge.peers.outcomes import OutcomeBook, signal_chance
from ftis_edge.tasks.arith import ArithTask
from ftis_edge.peers.worth import OTHER_TOKENIZER, SAME_MODEL

H6 = Path(__file__).resolve().parents[1] / "docs" / "runs" / "h6" / "h6"


def test_signal_is_likeliest_at_one_half():
    assert signal_chance(0.5, 8) == pytest.approx(1 - 2 / 256)
    assert signal_chance(0.0, 8) == signal_chance(1.0, 8) == 0.0
    assert signal_chance(0.9, 8) < signal_chance(0.6, 8)


def test_choose_takes_peer_prompts_that_will_carry_signal_and_leaves_the_rest_to_the_stream():
    task = ArithTask(level=[1, 2])
    stream = [p for _, p in zip(range(4), task.prompts(seed=1))]
    peers = [p for _, p in zip(range(6), task.prompts(seed=9))]
    book = OutcomeBook()
    book.add_own([1.0] * 7 + [0.0])                       # we succeed 7 of 8 times overall
    book.add_peer(1, peers[0], SAME_MODEL, [1.0] * 8)     # too easy for them, so for us
    book.add_peer(1, peers[1], SAME_MODEL, [0.0] * 8)     # too hard for them: about ½ for us
    book.add_peer(1, peers[2], SAME_MODEL, [1.0] * 2 + [0.0] * 6)
    choice = book.choose(2, stream, group_size=8)
    assert len(choice.prompts) == 4 and choice.from_outcomes >= 1
    assert peers[0] not in choice.prompts                 # all right for them and for us: no signal
    assert choice.prompts[choice.from_outcomes:] == stream[: 4 - choice.from_outcomes]
    again = book.choose(3, stream, group_size=8)           # a prompt is used once
    assert not set(p.id for p in again.prompts[:again.from_outcomes]) & set(p.id for p in choice.prompts)


def test_without_outcomes_the_stream_is_unchanged_and_old_ones_are_forgotten():
    task = ArithTask()
    stream = [p for _, p in zip(range(4), task.prompts(seed=1))]
    book = OutcomeBook(max_age=2)
    assert book.choose(1, stream, 8).prompts == stream
    book.add_peer(1, next(task.prompts(seed=5)), SAME_MODEL, [1.0, 0.0] * 4)
    assert book.choose(10, stream, 8).from_outcomes == 0


def test_the_book_is_bounded():
    task = ArithTask()
    book = OutcomeBook(max_prompts=50)
    for _, p in zip(range(500), task.prompts(seed=2)):
        book.add_peer(1, p, OTHER_TOKENIZER, [1.0, 0.0])
    assert len(book.prompts) == 50



def test_the_book_survives_a_checkpoint_by_prompt_id(tmp_path):
    from ftis_edge.store import statefile
    task = ArithTask(level=[1, 2])
    stream = [p for _, p in zip(range(4), task.prompts(seed=1))]
    book = OutcomeBook()
    book.add_own([1.0] * 5 + [0.0] * 3)
    for i, (_, p) in enumerate(zip(range(12), task.prompts(seed=9))):
        book.add_peer(1, p, OTHER_TOKENIZER if i % 2 else SAME_MODEL, [1.0] * (i % 9) + [0.0] * (8 - i % 9))
    book.choose(2, stream, group_size=8)                  # some are used already
    statefile.save(tmp_path / "s.safetensors", {"outcomes": book.state()})
    back = OutcomeBook()
    assert back.load_state(statefile.load(tmp_path / "s.safetensors")["outcomes"], task.get) == 0
    assert back.choose(3, stream, 8) == book.choose(3, stream, 8)
    state = book.state()
    state["prompts"].append(["arith/L9/1", 1, {SAME_MODEL: [1.0, 2]}])   # a prompt the task cannot rebuild
    assert OutcomeBook().load_state(state, task.get) == 1
    with pytest.raises(ValueError, match="outcome book in the checkpoint does not read"):
        OutcomeBook().load_state({"prompts": 3}, task.get)

@pytest.mark.parametrize("seed", ["s0", "s1", "s2"])
def test_another_models_outcomes_predict_the_gemma_nodes(seed):
    """H6's final evals, per prompt: the three SmolLM2 twins' answers, as outcomes in the book,
    rank the prompts the Gemma twin gets right above those it gets wrong (no token shared)."""
    def items(name):
        with gzip.open(H6 / seed / name / "eval-id.json.gz", "rt") as fh:
            return {i["id"]: float(i["correct"]) for i in json.load(fh)["items"]}
    smol = [items(f"alone-{i}") for i in range(3)]
    gemma = items("alone-3")
    task, book = ArithTask(), OutcomeBook(max_prompts=1000)
    book.add_own(list(gemma.values())[:40])                # its overall rate, from a few prompts
    for pid in gemma:
        for node in smol:
            book.add_peer(1, task.get(pid), OTHER_TOKENIZER, [node[pid]])
    right = [book.predict(pid) for pid, ok in gemma.items() if ok]
    wrong = [book.predict(pid) for pid, ok in gemma.items() if not ok]
    auc = sum((a > b) + 0.5 * (a == b) for a in right for b in wrong) / (len(right) * len(wrong))
    assert auc > 0.6, auc


def test_sybil_ids_steer_at_most_one_shared_pick_and_a_proven_peer_keeps_its_own():
    """Issue 62.6: a Sybil answering prompts of its choice 3 of 8 right (its other groups all right,
    lifting its kind's rate) picked 62 of 120 of a node's own prompts. Now each pick is checked by
    the node's own group on it; 200 new ids a round share the newcomers' one pick, which closes
    (one every NEWCOMER_BACKOFF rounds) once their picks carry no signal for us, while a twin
    whose picks held keeps its one a round."""
    from ftis_edge.peers.outcomes import MIN_PICKS, NEWCOMER_BACKOFF
    task = ArithTask(level=[1, 2])
    stream, sybil, twin = task.prompts(seed=1), task.prompts(seed=77), task.prompts(seed=99)
    book, picks = OutcomeBook(), {"sybil": 0, "twin": 0, "stream": 0}
    for r in range(1, 41):
        if r > 10:                                     # the flood starts once the twin has a record
            for i in range(200):
                sid = f"sybil-{r}-{i}"
                book.add_peer(r, next(sybil), SAME_MODEL, [1.0] * 8, peer=sid)
                book.add_peer(r, next(sybil), SAME_MODEL, [1.0] * 3 + [0.0] * 5, peer=sid)
        book.add_peer(r, next(twin), SAME_MODEL, [1.0] * 4 + [0.0] * 4, peer="twin")
        choice = book.choose(r, [next(stream) for _ in range(4)], group_size=8)
        own = []
        for p in choice.prompts:
            who = book.pending.get(p.id, "stream")
            who = "sybil" if who.startswith("sybil") else who
            if r > 10:
                picks[who] += 1
            # the truth on each prompt for this node: its stream's mostly right (7 of 8: a fresh prompt
            # rarely teaches, so peers' prompts look better), the Sybils' easy (no signal), the twin's mixed
            truth = {"sybil": [1.0] * 8, "twin": [1.0] * 4 + [0.0] * 4, "stream": [1.0] * 7 + [0.0]}
            own.append((p.id, truth[who]))
        book.add_own([x for _, rs in own for x in rs])
        book.validate(own)
    assert (MIN_PICKS, NEWCOMER_BACKOFF) == (2, 4)
    assert picks["sybil"] <= 10, picks                    # of 120 own prompts (was 62; 2 + 30 / 4 + 1 here)
    assert picks["twin"] == 30, picks                                          # one a round, every round
    assert len(book.standing) <= 1024
