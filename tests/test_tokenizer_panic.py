"""A tokenizer.json someone else wrote (issue 51 item 9): a catastrophic regex in its pre-tokenizer
makes the tokenizers library panic (Oniguruma's retry limit) on a 24-character peer text, and
pyo3's PanicException is a BaseException that went through the round. Before: the exception
left build_batch (the node's round died); now that peer's samples are refused with a reason in
the log and the round goes on (the real tokenizers library, a crafted tokenizer.json file)."""
from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import numpy as np
import pytest

from ftis_edge.learn.batch import LocalTokenizer, UntokenizableText, build_batch, guarded
from ftis_edge.peers.intake import PeerGroup
from ftis_edge.tasks.base import Prompt
from ftis_edge.rollout.wire import Rollout, WireCompletion

CATASTROPHIC = "((a+)+)+c"
PEER_TEXT = "a" * 24


def crafted_tokenizer(tmp_path, pattern: str):
    """A small real tokenizer (WordLevel over characters) whose pre-tokenizer splits on ``pattern``."""
    from transformers import PreTrainedTokenizerFast
    vocab = {"[UNK]": 0, "</s>": 1, **{ch: i + 2 for i, ch in enumerate("abcdefghijklmnopqrstuvwxyz 0123456789")}}
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None, "post_processor": None, "decoder": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
                {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": False}]},
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    return PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token="</s>")


def local_of(tok) -> LocalTokenizer:
    bundle = SimpleNamespace(tokenizer=lambda: tok, eos_token_ids=[1])
    return LocalTokenizer.of_bundle(bundle, lambda prompt: [1, 2, 3], max_completion_length=64, token_bytes=None,
                                    cross_tokenizer_level="sequence")


def peer_group(texts, rewards=(1.0, 0.0)) -> PeerGroup:
    comps = [WireCompletion(token_ids=np.array([5, 6], dtype=np.int64), logprobs=np.array([-0.5, -0.5], dtype=np.float32),
                            text=t, reward=r, finish_reason="stop") for t, r in zip(texts, rewards)]
    rollout = Rollout(rollout_id="m-1", node_id="mallory\x1b[2J", swarm="s", task="arith", prompt_id="p1",
                      prompt_ids=None, group_id="m:1:1", group_index=0, group_size=len(comps), round=1,
                      completions=comps, model_fp="other", tokenizer_fp="other", model_name="x", vocab_size=64,
                      temperature=1.0, top_k=0, top_p=1.0, adapter_version=0, sent_at=0.0)
    return PeerGroup(rollout=rollout, prompt=Prompt(id="p1", question="1 + 1?", reference="2"), rewards=list(rewards),
                     arrived_round=1, same_tokenizer=False)


def test_the_crafted_tokenizer_panics_with_a_base_exception(tmp_path):
    """The attack itself: not an Exception, so `except Exception` never saw it."""
    tok = crafted_tokenizer(tmp_path, CATASTROPHIC)
    with pytest.raises(BaseException) as e:
        tok(PEER_TEXT, add_special_tokens=False)
    assert type(e.value).__name__ == "PanicException" and not isinstance(e.value, Exception)
    assert tok("ab c", add_special_tokens=False)["input_ids"]           # still usable after it


def test_a_panicking_peer_text_is_refused_and_the_round_goes_on(tmp_path, caplog):
    local = local_of(crafted_tokenizer(tmp_path, CATASTROPHIC))
    with pytest.raises(UntokenizableText):
        local.text_ids(PEER_TEXT)
    honest = peer_group(["ab", "cd"])
    hostile = peer_group([PEER_TEXT, "ab"])
    with caplog.at_level(logging.WARNING, logger="ftis_edge.learn.batch"):
        batch = build_batch([], [honest, hostile], mode="vertical", scale="std", local=local)
    assert batch.refused_untokenizable == 2                    # the claim check met it first: the group
    assert [s.source for s in batch.samples] == ["mallory\x1b[2J"] * 2 and len(batch.samples) == 2
    warning = next(r.getMessage() for r in caplog.records if "refused" in r.getMessage())
    assert "our tokenizer failed on their text" in warning and "panicked" in warning and "\x1b" not in warning


def test_a_retokenized_sample_that_panics_is_refused_alone(tmp_path):
    """No claim check (a LocalTokenizer without it): the re-tokenization meets the text."""
    tok = crafted_tokenizer(tmp_path, CATASTROPHIC)
    local = LocalTokenizer(prompt_ids=lambda p: [1], eos_token_id=1, max_completion_length=64,
                           text_ids=guarded(lambda t: tok(t, add_special_tokens=False)["input_ids"]))
    batch = build_batch([], [peer_group([PEER_TEXT, "ab"])], mode="vertical", scale="std", local=local)
    assert batch.refused_untokenizable == 1 and len(batch.samples) == 1


def test_keyboard_interrupt_is_not_swallowed():
    def interrupted(text):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        guarded(interrupted)("x")
