"""The stop rule on a real tokenizer's bytes (SmolLM2's byte-level BPE, shipped with the package)."""
from __future__ import annotations

import pytest

from ftis_edge.generate.stops import StopRule
from ftis_edge.tasks.rewards import check_format

# the shipped SmolLM2 tokenizer only (no model weights): part of the default suite


@pytest.fixture(scope="module")
def smol():
    from ftis_edge.rollout.align import TokenBytes
    from ftis_edge.models.resolve import resolve_model
    bundle = resolve_model("smollm2-135m")
    tok = bundle.tokenizer()
    return tok, TokenBytes(tok), bundle.eos_token_ids


def _first_stop(rule: StopRule, ids: list[int]) -> int | None:
    for i in range(1, len(ids) + 1):
        if rule.ends(ids[:i]):
            return i
    return None


def test_a_stop_text_ends_the_sequence_at_the_token_that_completes_it(smol):
    tok, tb, eos = smol
    ids = tok("<answer>14</answer>\n\nUser: What is 2 + 2?", add_special_tokens=False).input_ids
    rule = StopRule(eos, ["\nUser:"], tb)
    k = _first_stop(rule, ids)
    assert k is not None
    text = tok.decode(ids[:k])
    assert text.endswith("User:") and "User:" not in tok.decode(ids[:k - 1])
    assert check_format(text).ok                # the marker is an end of turn, not text after </answer>


def test_eos_still_ends_and_text_without_the_marker_runs_on(smol):
    tok, tb, eos = smol
    ids = tok("User said: 12 users\nUsers: none", add_special_tokens=False).input_ids   # no "\nUser:"
    rule = StopRule(eos, ["\nUser:"], tb)
    assert _first_stop(rule, ids) is None
    assert rule.ends(ids + [eos[0]])
    assert StopRule(eos).ends([eos[0]]) and not StopRule(eos).ends(ids)
    assert not StopRule(()).ends([eos[0]])       # ignore_eos: nothing ends a sequence
    assert not rule.ends([len(tb.table) + 5])    # an id past the tokenizer (padding row) is no text


def test_stop_texts_need_the_token_bytes(smol):
    with pytest.raises(ValueError, match="token bytes"):
        StopRule(smol[2], ["\nUser:"])
