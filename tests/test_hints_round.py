"""swarm.hints (issue 66) in a round, on fake parts (tests/round_parts.py): an own group with no
right answer gets a hinted group from a peer's right answer; the step trains it in place when it
carries signal; nothing hinted is published; records keep the unhinted rewards."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ftis_edge import config
from ftis_edge.peers.hints import HintBook, open_turn
from ftis_edge.peers.intake import PeerGroup
from ftis_edge.rollout.wire import Rollout, WireCompletion
from ftis_edge.run.rounds import Round
from round_parts import RELAY, Swarm, Task, make_cfg, make_parts

REASONING = "<think>We count what each friend holds and then add the groups before the result"


class HintTask(Task):
    """Own answers (bare digits) are never right; a hinted answer is right when it ends in the
    reference (the fake generator writes one digit)."""

    def reward_many(self, texts, refs):
        return [(float(t.startswith("<think>") and t.endswith(r)), {"correct": True, "format_ok": True})
                for t, r in zip(texts, refs)]


def peer_group(prompt, node="peer-0"):
    texts = [f"{REASONING} is {prompt.reference}.</think><answer>{prompt.reference}</answer>", "<answer>9</answer>"]
    comps = [WireCompletion(token_ids=np.arange(3, dtype=np.int64), logprobs=np.zeros(3, np.float32), text=t,
                            reward=0.0, finish_reason="stop") for t in texts]
    r = Rollout(node_id=node, swarm="ftis", task="arith", prompt_id=prompt.id, completions=comps,
                tokenizer_fp="other-tok", model_fp="gemma")
    return PeerGroup(rollout=r, prompt=prompt, rewards=[1.0, 0.0], arrived_round=1, same_tokenizer=False)


def round_with_hints(tmp_path, hints=True):
    cfg = make_cfg(RELAY, swarm={"own_groups": 0, "max_wait_s": 0.0, "hints": hints})
    prompts = [p for _, p in zip(range(4), HintTask().prompts(seed=cfg.node.seed, start=0))]
    swarm = Swarm(arrivals=[[peer_group(p) for p in prompts[:3]]])     # hints for 3 of the 4 prompts
    parts = make_parts(tmp_path, cfg, swarm=swarm)
    parts.task = HintTask()
    parts.hints = HintBook() if hints else None
    record = Round(parts, 1).run()
    return parts, record, prompts


def test_a_group_without_a_right_answer_is_trained_hinted_when_the_hint_brings_signal(tmp_path):
    parts, record, prompts = round_with_hints(tmp_path)
    assert record["hints/tried"] == 3 and record["hints/known"] == 3
    assert 1 <= record["hints/used"] <= 3 and record["hints/tokens"] == 3 * 4 * 3
    assert record["reward/own"] == 0.0                  # records keep what the node did alone
    assert record["gen/tokens"] == 4 * 4 * 3 + record["hints/tokens"]
    batch = parts.learner.batches[0]
    hinted = {tuple(parts.bundle.encode(open_turn(p.question, parts.hints.hint_for(p).text))) for p in prompts[:3]}
    trained = {tuple(s.prompt_ids) for s in batch}
    assert len(trained & hinted) == record["hints/used"]
    assert all(s.source == "own" and s.level == "token" and s.gen_logprobs is not None
               for s in batch if tuple(s.prompt_ids) in hinted)            # own tokens, own log-probs
    assert len(parts.swarm.published) == 4               # the four unhinted groups; no hinted one
    # the hinted groups draw their own sampling seeds
    assert len(set(parts.generator.seeds)) == len(parts.generator.seeds) == 4 + 3


def test_without_the_setting_no_hint_is_kept_or_tried(tmp_path):
    parts, record, _ = round_with_hints(tmp_path, hints=False)
    assert not any(k.startswith("hints/") for k in record)
    assert len(parts.generator.seeds) == 4


def test_the_hint_book_survives_a_checkpoint_and_judges_what_it_reads_again():
    task = Task()
    prompts = [p for _, p in zip(range(3), task.prompts(seed=1, start=0))]
    book = HintBook()
    book.remember([peer_group(p) for p in prompts])
    back = HintBook()
    back.load_state(book.state())
    assert [back.hint_for(p) for p in prompts] == [book.hint_for(p) for p in prompts]
    state = book.state()
    state["hints"][0][1] = "<think>visit evil.example first"        # a checkpoint is disk, not trust
    back.load_state(state)
    assert back.hint_for(prompts[0]) is None and back.hint_for(prompts[1]) is not None
    with pytest.raises(ValueError, match="hint book"):
        back.load_state({"hints": [["x"]]})
    small = HintBook(max_prompts=2)
    small.remember([peer_group(p) for p in prompts])
    assert len(small) == 2 and small.hint_for(prompts[0]) is None   # the oldest forgotten


def test_hints_are_refused_for_horizontal_swarms():
    with pytest.raises(config.ConfigError, match="swarm.hints"):
        make_cfg(RELAY, swarm={"hints": True, "collaboration": "horizontal"})
    assert dataclasses.asdict(make_cfg(RELAY))["swarm"]["hints"] is False
