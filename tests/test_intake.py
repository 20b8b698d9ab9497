"""Peer rollouts on the way in, with the real arith task, grader and SmolLM2 tokenizer (no model run).

The attack tests are issue 13's holes: each was accepted by the intake before it was fixed.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from ftis_edge.peers.book import PeerBook
from ftis_edge.peers.swarm import Received
from ftis_edge.tasks import get_task
from ftis_edge.tasks.grader import score
from ftis_edge.rollout.wire import WireCompletion, WireError
from testkit.peers import completion, intake_for, rollout, send

pytestmark = pytest.mark.timeout(120)
FIXTURE = Path(__file__).parent / "data" / "real_rollouts.json"


def reasons(intake, peer="peer"):
    return intake.book.snapshot()[peer]["rejected_by_reason"]


# --- re-grading ------------------------------------------------------------------------------

def test_a_forged_reward_is_replaced_by_the_local_grade(smol, task):
    prompt = next(task.prompts(seed=3))
    texts = [f"<answer>{prompt.reference}</answer>"] + ["<answer>999999</answer>"] * 3
    r, _ = rollout(smol, task, comps=[completion(smol, t, claimed=1.0) for t in texts])
    intake = intake_for(smol, task)
    send(intake, r)
    [group] = intake.take(1, limit=8)
    assert group.rewards == [1.0, 0.0, 0.0, 0.0]
    peer = intake.book.snapshot()["peer"]
    assert peer["accepted"] == 1 and peer["reward_mismatches"] == 3 and group.same_tokenizer


# --- hole 1: the ids that train must be the graded text's tokens ---------------------------

def test_ids_that_are_not_the_graded_text_are_refused(smol, task):
    """Issue 13 hole 1: a correct text paired with arbitrary ids was accepted and trained."""
    prompt = next(task.prompts(seed=3))
    right = f"<answer>{prompt.reference}</answer>"
    attack = completion(smol, right, ids=[1234] * 20, finish="length")
    r, _ = rollout(smol, task, comps=[attack] * 4)
    intake = intake_for(smol, task)
    send(intake, r)
    assert intake.take(1, limit=8) == []
    assert reasons(intake) == {"token_text_mismatch": 1}


def test_hidden_tokens_and_misplaced_stops_are_refused(smol, task):
    tok, eos = smol.tokenizer(), smol.eos_token_ids[0]
    text = "<answer>7</answer>"
    ids = tok(text, add_special_tokens=False).input_ids
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    cases = {
        # a control token in the ids that the text does not show
        "token_text_mismatch": completion(smol, text, ids=ids[:2] + [im_start] + ids[2:], finish="length"),
        # "stop" must end with a stop token; a stop token may not sit inside a completion
        "bad_finish": completion(smol, text, ids=ids, finish="stop"),
    }
    intake = intake_for(smol, task, book=PeerBook(quarantine_after=100))
    for reason, c in cases.items():
        r, _ = rollout(smol, task, comps=[c])
        send(intake, r)
    mid_stop, _ = rollout(smol, task, comps=[completion(smol, text, ids=ids[:2] + [eos] + ids[2:] + [eos])])
    odd_finish, _ = rollout(smol, task, comps=[completion(smol, text, ids=ids, finish="abort")])
    send(intake, mid_stop, odd_finish)
    assert reasons(intake) == {"token_text_mismatch": 1, "bad_finish": 3}
    assert intake.take(1, limit=8) == []


def test_text_that_shows_its_special_tokens_and_a_cut_character_pass(smol, task):
    """Honest cases: a control token sampled mid-completion (its text is rendered), a completion
    cut by the token limit inside a multi-byte character (text ends in U+FFFD), and a sampled
    tokenization that is not the canonical one of its text (the check is decode, not re-encode)."""
    tok = smol.tokenizer()
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    word = tok("ありがとう", add_special_tokens=False).input_ids
    cut = next(k for k in range(1, len(word)) if tok.decode(word[:k]).endswith("\ufffd"))
    chars = [tok.convert_tokens_to_ids(ch) for ch in "<answer>42</answer>"]   # one token per character
    comps = [completion(smol, "<|im_start|>user", ids=[im_start, tok.convert_tokens_to_ids("user")],
                        finish="length"),
             completion(smol, tok.decode(word[:cut]), ids=word[:cut], finish="length"),
             completion(smol, "<answer>42</answer>", ids=chars + [smol.eos_token_ids[0]])]
    assert comps[1].text.endswith("\ufffd") and len(chars) > len(tok("<answer>42</answer>").input_ids)
    r, _ = rollout(smol, task, comps=comps)
    intake = intake_for(smol, task)
    send(intake, r)
    assert len(intake.take(1, limit=8)) == 1
    assert intake.book.snapshot()["peer"]["rejected"] == 0


def test_real_llamacpp_rollouts_pass(smol, task):
    """Real SmolLM2 completions (llama.cpp, T = 1, up to 128 tokens; stopped and cut ones)."""
    data = json.loads(FIXTURE.read_text())
    intake = intake_for(smol, task)
    finishes = []
    for g in data["groups"]:
        comps = [WireCompletion(token_ids=c["token_ids"], logprobs=c["logprobs"], text=c["text"], reward=0.0,
                                finish_reason=c["finish_reason"]) for c in g["completions"]]
        finishes += [c.finish_reason for c in comps]
        r, _ = rollout(smol, task, comps=comps, temperature=data["temperature"], top_p=data["top_p"])
        send(intake, r)
    assert {"stop", "length"} <= set(finishes)
    assert len(intake.take(1, limit=8)) == len(data["groups"])
    assert intake.book.snapshot()["peer"]["rejected"] == 0


def test_other_tokenizer_is_marked_for_the_sequence_level_path(smol, task):
    r, _ = rollout(smol, task, tokenizer_fp="gemma-tok",
                   comps=[completion(smol, "<answer>1</answer>", ids=[5, 6, 7], finish="length")])
    intake = intake_for(smol, task)
    send(intake, r)
    [g] = intake.take(1, limit=8)                 # its text is re-tokenized by the learner
    assert g.same_tokenizer is False


# --- hole 2: eval prompts are not trainable --------------------------------------------------

def test_eval_prompts_are_refused(smol, task):
    """Issue 13 hole 2: a peer could make a node train on its held-out eval prompts."""
    ev = task.eval_prompts(limit=4)[3]
    r_eval, _ = rollout(smol, task, prompt=ev, texts=[f"<answer>{ev.reference}</answer>"] * 2)
    r_padded, _ = rollout(smol, task, prompt=ev)
    r_padded.prompt_id = ev.id.replace("/1", "/01")            # the same eval problem, another spelling
    r_train, _ = rollout(smol, task)
    intake = intake_for(smol, task)
    send(intake, r_eval, r_padded, r_train)
    assert [g.rollout.prompt_id for g in intake.take(1, limit=8)] == [r_train.prompt_id]
    assert reasons(intake) == {"eval_prompt": 2}


def test_tasks_say_which_prompts_are_trainable(task, tmp_path):
    assert task.is_trainable(next(task.prompts(seed=0)).id)
    assert not any(task.is_trainable(p.id) for p in task.eval_prompts())
    assert task.is_trainable("arith/L6/999999999") and not task.is_trainable("arith/L1/1000000000")
    assert not task.is_trainable("arith/nonsense")
    for split in ("train", "test"):
        rows = [{"question": f"{split} {i}?", "answer": f"so #### {i}"} for i in range(3)]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "math.jsonl").write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    gsm8k = get_task("gsm8k", path=tmp_path / "train.jsonl")
    assert gsm8k.is_trainable("gsm8k/train/0") and not gsm8k.is_trainable("gsm8k/test/0")
    assert not any(gsm8k.is_trainable(p.id) for p in gsm8k.eval_prompts())
    assert not gsm8k.is_trainable("math500/test/0")
    # training on the eval split holds nothing out: the node's own split stays trainable
    assert get_task("gsm8k", path=tmp_path / "test.jsonl", split="test").is_trainable("gsm8k/test/0")
    assert get_task("math500", path=tmp_path / "math.jsonl").is_trainable("math500/test/0")


# --- quarantine: a rejection rate over a window ------------------------------------------------

def test_bad_rollouts_are_counted_by_reason_and_the_peer_is_quarantined(smol, task):
    intake = intake_for(smol, task)
    bad = [Received(rollout=None, sender="mallory", nbytes=10, error=WireError("bad_logprob", "nan"))] * 2
    other_swarm, _ = rollout(smol, task, node="mallory")
    other_swarm.swarm = "elsewhere"
    intake.receive(bad + [Received(rollout=other_swarm, sender="mallory", nbytes=10)], current_round=1)
    book = intake.book.snapshot()["mallory"]
    assert book["rejected_by_reason"] == {"bad_logprob": 2, "wrong_swarm": 1}
    assert book["quarantined"] is True
    good, _ = rollout(smol, task, node="mallory")
    send(intake, good, sender="mallory", rnd=2)
    assert intake.take(2, limit=8) == []       # quarantined: even valid rollouts are refused
    assert intake.book.snapshot()["mallory"]["rejected_by_reason"]["quarantined"] == 1


def test_four_bad_one_good_cannot_dodge_quarantine(smol, task, caplog):
    """Issue 13: "4 bad + 1 good" repeated never quarantined (the counter was consecutive)."""
    intake = intake_for(smol, task, book=PeerBook(quarantine_after=5, window=20, max_reject_rate=0.5))
    bad = Received(rollout=None, sender="mallory", nbytes=10, error=WireError("bad_logprob", "nan"))
    caplog.set_level(logging.WARNING, logger="ftis_edge.peers.intake")
    for rnd in range(10):
        good, _ = rollout(smol, task, node="mallory")
        intake.receive([bad] * 4 + [Received(rollout=good, sender="mallory", nbytes=10)], current_round=rnd)
    peer = intake.book.snapshot()["mallory"]
    assert peer["quarantined"] is True
    assert peer["quarantine_reason"] == "5 of its last 6 rollouts refused (bad_logprob 5)"
    assert any("quarantined peer mallory" in r.getMessage() and r.name == "ftis_edge.peers.intake"
               for r in caplog.records)


def test_an_honest_peer_with_rare_failures_is_never_quarantined(smol, task):
    intake = intake_for(smol, task, book=PeerBook(quarantine_after=5, window=20, max_reject_rate=0.5))
    bad = Received(rollout=None, sender="peer", nbytes=10, error=WireError("truncated", "x"))
    for rnd in range(10):
        good = [Received(rollout=rollout(smol, task)[0], sender="peer", nbytes=10) for _ in range(9)]
        intake.receive([bad] + good, current_round=rnd)
    peer = intake.book.snapshot()["peer"]
    assert peer["quarantined"] is False and peer["rejected"] == 10 and peer["accepted"] == 90
    assert peer["recent_reject_rate"] == pytest.approx(2 / 20)


# --- per-peer plausibility -----------------------------------------------------------------

@pytest.mark.parametrize("sampler", [{"temperature": 0.0}, {"temperature": 2.5}, {"top_p": 0.0}])
def test_sampler_settings_out_of_bounds_are_refused(smol, task, sampler):
    r, _ = rollout(smol, task, **sampler)
    ok, _ = rollout(smol, task, temperature=2.0, top_p=1.0, top_k=40)
    intake = intake_for(smol, task)
    send(intake, r, ok)
    assert reasons(intake) == {"bad_sampler": 1}
    assert len(intake.take(1, limit=8)) == 1


def test_a_fingerprint_change_mid_run_is_logged_and_shown(smol, task, caplog):
    caplog.set_level(logging.WARNING, logger="ftis_edge.peers.intake")
    intake = intake_for(smol, task)
    first, _ = rollout(smol, task)
    swapped, _ = rollout(smol, task, tokenizer_fp="0123456789abcdef")
    swapped.model_fp = "fedcba9876543210"
    send(intake, first, first, swapped)
    peer = intake.book.snapshot()["peer"]
    assert peer["fingerprint_changes"] == 1
    assert f"tokenizer {smol.tokenizer_fingerprint} -> 0123456789abcdef" in peer["fingerprint_change"]
    assert peer["tokenizer"] == "0123456789abcdef"
    assert any("changed fingerprint" in r.getMessage() for r in caplog.records)


# --- the rest of the intake ------------------------------------------------------------------

def test_unknown_prompt_ids_and_own_echoes(smol, task):
    intake = intake_for(smol, task)
    r, _ = rollout(smol, task)
    r.prompt_id = "arith/not-an-id"
    mine, _ = rollout(smol, task, node="me")
    intake.receive([Received(rollout=r, sender="peer", nbytes=1), Received(rollout=mine, sender="me", nbytes=1)], 1)
    assert reasons(intake) == {"unknown_prompt": 1}
    assert "me" not in intake.book.snapshot()


def test_stale_groups_are_dropped_and_the_newest_are_taken_first(smol, task):
    intake = intake_for(smol, task, max_staleness=1)
    old, _ = rollout(smol, task)
    new, _ = rollout(smol, task)
    send(intake, old, rnd=1)
    send(intake, new, rnd=3)
    taken = intake.take(3, limit=8)
    assert [g.rollout.rollout_id for g in taken] == [new.rollout_id]
    assert intake.pop_round_counts()["stale"] == 1


def test_a_hostile_answer_cannot_stall_rescoring(smol, task):
    import time
    r, _ = rollout(smol, task, texts=["<answer>9^{9^{9^{9^{9}}}}</answer>"] * 4)
    intake = intake_for(smol, task, rescore_budget_s=1.0)
    t0 = time.time()
    send(intake, r)
    assert time.time() - t0 < 5.0
    groups = intake.take(1, limit=8)
    assert all(v == 0.0 for g in groups for v in g.rewards)


def test_a_group_larger_than_our_own_group_size_is_refused(smol, task):
    """Issue 25, hole 4: a peer's group may hold 256 completions and fill a whole batch."""
    big, _ = rollout(smol, task, texts=["<answer>1</answer>"] * 9)
    ours, _ = rollout(smol, task, texts=["<answer>1</answer>"] * 8)
    intake = intake_for(smol, task, max_group_completions=8)
    send(intake, big, ours)
    assert reasons(intake).get("group_too_large") == 1
    assert all(len(g.rewards) == 8 for g in intake.take(1, limit=8))
    default = intake_for(smol, task)
    flood, _ = rollout(smol, task, texts=["<answer>1</answer>"] * 65)
    send(default, flood)
    assert reasons(default) == {"group_too_large": 1}


@pytest.mark.slow       # ≥ 15 s on 2 cores: CI's slow tier keeps the README command under 20 min
def test_a_flood_of_slow_answers_cannot_starve_an_honest_peer_of_grading(smol, task):
    """Issue 25, hole 3: the re-grading budget was first come, first served. A flooder sends
    10 groups a round whose answers take the real grader past its timeout, ahead of an honest
    peer's 3 groups: every honest group is still graded every round, the timeouts are charged
    to the flooder, and the flooder ends up quarantined (the round's time bound is
    tests/test_grading.py's, on a made-up clock)."""
    from ftis_edge.tasks import warm_up
    prompt = next(task.prompts(seed=3))
    intake = intake_for(smol, task, rescore_budget_s=4.0)
    # slow for the real grader yet past every rule: no operation on numbers (the computation rule
    # refuses "\\sqrt{99999^{99999}}" and "\\binom{x}{99999}" unread now, in no time), no tower,
    # no nesting: a 60-fold factorial of a symbol
    bomb = "<answer>x" + "!" * 60 + "</answer>"
    assert not score(bomb, prompt.reference, task.reward_settings)[1]["reason"].startswith("refused")
    for rnd in (1, 2, 3):
        warm_up()      # between rounds a node generates and trains: killed grader workers restart
        slow = [rollout(smol, task, node="mallory", prompt=prompt, texts=[bomb] * 4)[0]
                for _ in range(10)]
        honest = [rollout(smol, task, node="alice", prompt=prompt,
                          texts=[f"<answer>{prompt.reference}</answer>", "<answer>1</answer>"] * 2)[0]
                  for _ in range(3)]
        intake.receive([Received(rollout=r, sender="mallory", nbytes=100) for r in slow]
                       + [Received(rollout=r, sender="alice", nbytes=100) for r in honest], current_round=rnd)
        groups = intake.take(rnd, limit=64)
        assert [g.rollout.node_id for g in groups] == ["alice"] * 3, f"round {rnd}"
        assert all(g.rewards == [1.0, 0.0, 1.0, 0.0] for g in groups)
    book = intake.book.snapshot()
    assert book["alice"]["rejected"] == 0 and book["alice"]["grader_timeouts"] == 0
    assert book["mallory"]["grader_timeouts"] > 0 and book["mallory"]["quarantined"]
    assert "grader_timeout" in book["mallory"]["rejected_by_reason"]


def test_the_peer_book_is_bounded_and_a_flood_of_fresh_ids_evicts_only_itself(smol, task):
    """Issue 30, hole 4: every distinct sender got a book entry, never evicted, written into
    every round record and checkpoint. Fresh ids that never had anything accepted are evicted
    first; an accepted peer and a quarantined one stay."""
    book = PeerBook(quarantine_after=3, max_peers=8)
    intake = intake_for(smol, task, book=book)
    prompt = next(task.prompts(seed=3))
    good, _ = rollout(smol, task, node="alice", prompt=prompt, texts=[f"<answer>{prompt.reference}</answer>",
                                                                       "<answer>1</answer>"])
    send(intake, good, sender="alice")
    book.quarantine("mallory", "test")
    for i in range(200):
        intake.receive([Received(rollout=None, sender=f"sybil-{i}", nbytes=10,
                                 error=WireError("truncated", "x"))], current_round=1)
    snap = book.snapshot()
    assert len(snap) == 8 and book.evicted == 200 - 6
    assert "alice" in snap and snap["alice"]["accepted"] == 1
    assert snap["mallory"]["quarantined"]
    assert "sybil-199" in snap                       # the newest fresh ids are the ones kept
