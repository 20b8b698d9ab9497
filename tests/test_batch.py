"""Batch building (ftis_edge.learn.batch) on hand-made groups: no model, a tiny real tokenizer class."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from ftis_edge.rollout.align import TokenBytes
from ftis_edge.learn.batch import LocalTokenizer, OwnGroup, advantages, build_batch, peer_usage
from ftis_edge.rollout.samples import OWN
from ftis_edge.generate.base import Completion
from ftis_edge.peers.book import KL_EDGES, PeerStats, kl_bin
from ftis_edge.peers.intake import PeerGroup
from ftis_edge.learn.objective import group_advantages
from ftis_edge.tasks.base import Prompt
from ftis_edge.rollout.wire import Rollout, WireCompletion

EOS = 2


class CharTokenizer:
    """A deterministic tokenizer: one id per character (ord % 250 + 3); ids 0-2 are special."""

    @staticmethod
    def ids(text: str) -> list[int]:
        return [ord(ch) % 250 + 3 for ch in text]

    def prompt_ids(self, prompt) -> list[int]:
        return [1] + self.ids(f"Q: {prompt.question}\nA:")


TOK = CharTokenizer()
LOCAL = LocalTokenizer(prompt_ids=TOK.prompt_ids, text_ids=TOK.ids, eos_token_id=EOS, max_completion_length=3)


def prompt(i: int) -> Prompt:
    return Prompt(id=f"p{i}", question=f"{i} + {i}?", reference=str(2 * i))


def completion(ids, text="x") -> Completion:
    return Completion(token_ids=list(ids), logprobs=[-0.5] * len(ids), text=text, finish_reason="stop")


def own_group(i: int, rewards: list[float]) -> OwnGroup:
    comps = [completion([10 + i, 20 + k]) for k in range(len(rewards))]
    return OwnGroup(prompt=prompt(i), prompt_ids=TOK.prompt_ids(prompt(i)), completions=comps,
                    rewards=list(rewards), breakdowns=[{}] * len(rewards), group_id=f"me:1:{i}")


def peer_group(node: str, i: int, rewards: list[float], *, same_tokenizer=True, group_id=None,
               texts=None) -> PeerGroup:
    texts = texts or ["ab"] * len(rewards)
    comps = [WireCompletion(token_ids=np.array([30 + k, 40], dtype=np.int64),
                            logprobs=np.array([-0.25, -0.75], dtype=np.float32), text=t, reward=r,
                            finish_reason="stop" if k % 2 == 0 else "length")
             for k, (r, t) in enumerate(zip(rewards, texts))]
    rollout = Rollout(rollout_id=f"{node}-{i}", node_id=node, swarm="s", task="arith", prompt_id=f"p{i}",
                      prompt_ids=None, group_id=group_id or f"{node}:1:{i}", group_index=0,
                      group_size=len(comps), round=1, completions=comps, model_fp="m", tokenizer_fp="t",
                      model_name="m", vocab_size=256, temperature=1.0, top_k=0, top_p=1.0,
                      adapter_version=0, sent_at=0.0)
    return PeerGroup(rollout=rollout, prompt=prompt(i), rewards=list(rewards), arrived_round=1,
                     same_tokenizer=same_tokenizer)


def test_equal_rewards_skip_the_group_else_group_advantages():
    assert advantages([1.0, 1.0, 1.0], "std") is None
    assert advantages([0.0], "none") is None
    adv = advantages([1.0, 0.0, 0.0, 1.0], "std")
    assert adv == group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), scale="std").tolist()
    assert adv[0] > 0 > adv[1] and math.isclose(sum(adv), 0.0, abs_tol=1e-6)
    assert advantages([0.9, 0.1], "none") == pytest.approx([0.4, -0.4])


def test_vertical_batch_normalises_each_group_within_itself():
    own = [own_group(0, [1.0, 0.0]), own_group(1, [0.5, 0.5]), own_group(2, [0.0, 0.0, 1.0])]
    peers = [peer_group("bob", 3, [1.0, 0.0, 0.0]), peer_group("eve", 4, [1.0, 1.0])]
    b = build_batch(own, peers, mode="vertical", scale="std", local=LOCAL)
    assert (b.groups, b.groups_zero_std, b.groups_with_peer_parts) == (5, 2, None)
    assert (b.own_samples, b.peer_samples) == (5, 3)
    assert [s.source for s in b.samples] == [OWN] * 5 + ["bob"] * 3
    assert [s.advantage for s in b.samples[:2]] == advantages([1.0, 0.0], "std")
    assert [s.advantage for s in b.samples[5:]] == advantages([1.0, 0.0, 0.0], "std")
    first = b.samples[0]
    assert first.prompt_ids == own[0].prompt_ids and first.completion_ids == [10, 20]
    assert first.gen_logprobs == [-0.5, -0.5] and first.gen_logprob_sum is None and not first.sequence_level
    peer = b.samples[5]     # same tokenizer: token level, the peer's ids and log-probs as sent
    assert peer.prompt_ids == TOK.prompt_ids(prompt(3)) and peer.completion_ids == [30, 40]
    assert peer.gen_logprobs == [-0.25, -0.75] and not peer.sequence_level
    assert all(type(t) is int for t in peer.completion_ids) and all(type(x) is float for x in peer.gen_logprobs)
    # "alone" is vertical without peers
    alone = build_batch(own, [], mode="alone", scale="std", local=LOCAL)
    assert alone.samples == b.samples[:5] and alone.groups == 3


def test_other_tokenizer_peers_are_retokenized_at_sequence_level():
    p = peer_group("gemma", 5, [1.0, 0.0], same_tokenizer=False, texts=["hello", "hi"])
    b = build_batch([], [p], mode="vertical", scale="none", local=LOCAL)
    stopped, cut = b.samples
    # stopped: our EOS appended; capped at max_completion_length * 4 = 12 ids
    assert stopped.completion_ids == TOK.ids("hello") + [EOS]
    assert cut.completion_ids == TOK.ids("hi")               # finish_reason "length": no EOS
    assert stopped.sequence_level and stopped.gen_logprobs is None
    assert stopped.gen_logprob_sum == pytest.approx(-1.0) and stopped.source == "gemma"
    long = LOCAL.retokenize("x" * 50, finished=True)
    assert len(long) == 12 and EOS not in long
    no_eos = LocalTokenizer(TOK.prompt_ids, TOK.ids, eos_token_id=None, max_completion_length=3)
    assert no_eos.retokenize("ab", finished=True) == TOK.ids("ab")


def char_token_bytes() -> TokenBytes:
    """CharTokenizer's per-token bytes: each printable ASCII id spells its character; 0-2 nothing."""
    tb = TokenBytes.__new__(TokenBytes)
    tb.table = [b""] * 256
    for o in range(32, 127):
        tb.table[o % 250 + 3] = bytes([o])
    tb.special = frozenset({0, 1, EOS})
    return tb


def test_other_tokenizer_peers_with_token_bytes_are_weighted_per_span():
    p = peer_group("gemma", 5, [1.0, 0.0], same_tokenizer=False, texts=["hello", "hi"])
    c0, c1 = p.rollout.completions
    c0.token_bytes = np.array([2, 3])        # the peer's tokens: "he" "llo" (then it stopped)
    c1.token_bytes = None                    # sent without byte lengths: sequence level
    local = LocalTokenizer(TOK.prompt_ids, TOK.ids, EOS, max_completion_length=3, token_bytes=char_token_bytes())
    stopped, cut = build_batch([], [p], mode="vertical", scale="none", local=local).samples
    # ours: h e l l o EOS; shared byte boundaries {2, 5}: spans "he" | "llo" (+ our EOS)
    assert stopped.level == "span" and stopped.span_ids == [0, 0, 1, 1, 1, 1]
    assert stopped.gen_span_logprobs == pytest.approx([-0.25, -0.75])
    assert stopped.completion_ids == TOK.ids("hello") + [EOS] and stopped.gen_logprob_sum == pytest.approx(-1.0)
    assert cut.level == "sequence" and cut.span_ids is None
    # the option: sequence level for everyone
    seq = LocalTokenizer(TOK.prompt_ids, TOK.ids, EOS, 3, token_bytes=char_token_bytes(),
                         cross_tokenizer_level="sequence")
    assert [s.level for s in build_batch([], [p], mode="vertical", scale="none", local=seq).samples] == \
        ["sequence", "sequence"]
    # a re-tokenization cut at max_completion_length * 4 ids no longer spells the text: fallback
    c0.text, c0.token_bytes = "x" * 20, np.array([10, 10])
    assert build_batch([], [p], mode="vertical", scale="none", local=local).samples[0].level == "sequence"


def test_horizontal_batch_merges_peer_parts_of_the_same_group():
    own = [own_group(0, [1.0, 1.0]), own_group(1, [0.0, 1.0]), own_group(2, [0.0, 0.0])]
    parts = [peer_group("bob", 0, [0.0, 0.0], group_id="me:1:0"),      # makes group 0 informative
             peer_group("bob", 1, [1.0], group_id="me:1:1"),
             peer_group("eve", 1, [0.0], group_id="me:1:1"),
             peer_group("eve", 9, [1.0, 0.0], group_id="other:1:9")]   # no own group: ignored
    b = build_batch(own, parts, mode="horizontal", scale="std", local=LOCAL)
    assert (b.groups, b.groups_zero_std, b.groups_with_peer_parts) == (3, 1, 2)
    union0 = advantages([1.0, 1.0, 0.0, 0.0], "std")
    union1 = advantages([0.0, 1.0, 1.0, 0.0], "std")
    assert [s.advantage for s in b.samples] == union0 + union1
    assert [s.source for s in b.samples] == [OWN, OWN, "bob", "bob", OWN, OWN, "bob", "eve"]


def test_peer_usage_adds_up_per_peer_in_batch_order():
    own = [own_group(0, [1.0, 0.0])]
    peers = [peer_group("bob", 1, [1.0, 0.0]), peer_group("eve", 2, [0.0, 1.0])]
    samples = build_batch(own, peers, mode="vertical", scale="std", local=LOCAL).samples
    per_sample = {"kl": torch.tensor([0.0, 0.0, 0.5, 1.5, 2.0, 0.25]),
                  "is_weight": torch.tensor([1.0, 1.0, 0.5, 2.0, 1.0, 1.0]),
                  "dropped": torch.tensor([False, True, False, True, True, False])}
    uses = peer_usage(samples, per_sample)
    assert [u.node_id for u in uses] == ["bob", "bob", "eve", "eve"]
    stats = {"bob": PeerStats(node_id="bob"), "eve": PeerStats(node_id="eve")}
    for u in uses:
        stats[u.node_id].record_use(u)
    bob = stats["bob"].as_dict()
    assert bob["samples_used"] == 2 and bob["kl_mean"] == 1.0 and bob["is_weight_mean"] == 1.25
    assert bob["filter_rate"] == 0.5 and stats["eve"].as_dict()["filter_rate"] == 0.5
    # KL 0.5 and 1.5: bins [0.5, 1) and [1, 5); eve's 2.0 and 0.25: [1, 5) and [0.1, 0.5)
    assert bob["kl_hist"] == {"edges": list(KL_EDGES), "counts": [0, 0, 0, 0, 0, 0, 1, 1, 0, 0]}
    assert stats["eve"].as_dict()["kl_hist"]["counts"] == [0, 0, 0, 0, 0, 1, 0, 1, 0, 0]
    # a resumed node continues the counts its checkpoint's snapshot holds (node._restore)
    again = PeerStats(node_id="bob")
    again.restore_use(json.loads(json.dumps(bob)))
    again.record_use(uses[0])
    after = again.as_dict()
    assert after["samples_used"] == 3 and after["kl_hist"]["counts"][6] == 2
    assert after["kl_mean"] == pytest.approx(2.5 / 3) and after["filter_rate"] == pytest.approx(1 / 3)
    assert peer_usage(samples, None) == [] and peer_usage(samples, {}) == []


def test_kl_bins_put_each_threshold_in_the_bin_it_opens():
    assert [kl_bin(x) for x in (-1e-9, 0.0, 5e-5, 1e-4, 0.049, 0.05, 0.5, 4.99, 5.0, 10.0, 1e9, math.inf)] == \
        [0, 0, 0, 1, 3, 4, 6, 7, 8, 9, 9, 9]
    assert len(KL_EDGES) == 10 and {0.05, 0.5, 5.0} <= set(KL_EDGES)
    stale = PeerStats(node_id="x")
    stale.restore_use({"samples_used": 4, "kl_mean": 1.0, "kl_hist": {"edges": [0.0, 1.0], "counts": [4, 0]}})
    assert stale.as_dict()["kl_hist"]["counts"] == [0] * 10      # other edges: counts start again
