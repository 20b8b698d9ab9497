"""The prompt once per group (ftis_edge.learn.shared_prompt): exactly the unshared learner's log-probs and gradients.

Fast: tiny random-weight models built from transformers configs (a llama, and a gemma3 with sliding-window
layers and logit soft-capping), saved to a temp dir and loaded by the real ``Learner``.
"""
import random

import pytest
import torch

from ftis_edge.learn.learner import Learner, TrainSample
from ftis_edge.learn.shared_prompt import plan_micro_batches, prompt_key

torch.set_num_threads(2)
VOCAB = 101


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg)


def _tiny_gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    cfg = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=6,
                           layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                           max_position_embeddings=256, final_logit_softcapping=5.0)
    return Gemma3ForCausalLM(cfg)


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tiny_dir(request, tmp_path_factory):
    torch.manual_seed(0)
    model = _tiny_llama() if request.param == "llama" else _tiny_gemma3()
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return path


def _samples(seed=0):
    """Two groups with different prompt lengths and mixed completion lengths, a peer's singleton with
    its own prompt, and a cross-tokenizer (sequence-level) sample in the first group."""
    rng = random.Random(seed)

    def ids(n):
        return [rng.randrange(VOCAB) for _ in range(n)]

    def lps(n):
        return [-rng.uniform(0.05, 3.0) for _ in range(n)]

    p1, p2, p3 = ids(13), ids(7), ids(10)
    out = []
    for k, c in enumerate((5, 9, 1, 9, 4)):
        out.append(TrainSample(p1, ids(c), lps(c), None, rng.uniform(-1, 1), source="own"))
    for c in (3, 11, 6):
        out.append(TrainSample(p2, ids(c), lps(c), None, rng.uniform(-1, 1), source="peer-a"))
    out.append(TrainSample(p3, ids(8), lps(8), None, 0.7, source="peer-b"))
    out.append(TrainSample(p1, ids(6), None, -9.0, -0.4, sequence_level=True, source="peer-c"))
    rng.shuffle(out)
    return out


def _learner(path, trainable, micro_batch=100, share=True):
    learner = Learner(path, trainable=trainable, lr=1e-3, micro_batch=micro_batch, device="cpu", seed=0,
                      share_prompts=share)
    if trainable == "lora":
        # LoRA B starts at zero, which would make every A gradient (and the prompt's) vanish: randomise it.
        torch.manual_seed(1)
        with torch.no_grad():
            for name, p in learner.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.2)
    return learner


def _grads(learner, samples):
    stats = learner.compute_gradients(samples, method="f-tis", C=2.0, kl_threshold=0.5)
    grads = {n: p.grad.detach().clone() for n, p in learner.model.named_parameters() if p.grad is not None}
    learner.optimizer.zero_grad(set_to_none=True)
    return grads, stats


def _assert_close_grads(got, ref):
    assert got.keys() == ref.keys() and ref
    for name in ref:
        scale = float(ref[name].norm())
        err = float((got[name] - ref[name]).norm())
        assert err <= 1e-5 * max(scale, 1e-8), f"{name}: |diff| {err:.3g} vs |grad| {scale:.3g}"


def test_plan_keeps_each_prompt_contiguous_and_every_sample_once():
    prompts = [[1, 2], [3], [1, 2], [4, 5, 6], [3], [1, 2], [4, 5, 6]]
    lengths = [5, 2, 3, 9, 1, 4, 2]
    for mb in (1, 2, 3, 100):
        plan = plan_micro_batches(prompts, lengths, mb)
        flat = [i for chunk in plan for i in chunk]
        assert sorted(flat) == list(range(len(prompts))) and all(len(c) <= mb for c in plan)
        keys = [prompt_key(prompts[i]) for i in flat]
        runs = [k for j, k in enumerate(keys) if j == 0 or keys[j - 1] != k]
        assert len(runs) == len(set(keys)), "a prompt's samples are split by another prompt's"
        for key in set(keys):   # within a prompt, shortest completion first
            ls = [lengths[i] for i in flat if prompt_key(prompts[i]) == key]
            assert ls == sorted(ls)


@pytest.mark.parametrize("trainable", ["lora", "full"])
def test_shared_logprobs_equal_the_unshared_ones(tiny_dir, trainable):
    learner = _learner(tiny_dir, trainable)
    samples = _samples()
    with torch.no_grad():
        shared, m1 = learner.logprobs(samples)
        learner.share_prompts = False
        ref, m2 = learner.logprobs(samples)
    assert torch.equal(m1, m2)
    assert float((shared - ref)[m1].abs().max()) <= 1e-5
    assert float(ref[m1].abs().mean()) > 1.0     # real log-probs, not zeros


@pytest.mark.parametrize("trainable", ["lora", "full"])
@pytest.mark.parametrize("micro_batch", [1, 3, 100])
def test_shared_gradients_equal_the_unshared_ones(tiny_dir, trainable, micro_batch):
    """Micro-batches that split groups, that straddle two groups, and one for the whole batch: the
    prompt's gradient (the sum over its completions) arrives whole in every case."""
    samples = _samples(seed=micro_batch)
    ref_learner = _learner(tiny_dir, trainable, micro_batch=100, share=False)
    ref, ref_stats = _grads(ref_learner, samples)
    learner = _learner(tiny_dir, trainable, micro_batch=micro_batch, share=True)
    got, stats = _grads(learner, samples)
    _assert_close_grads(got, ref)
    # the prompts' own weights get gradient only through the shared pass: make sure it is there
    emb = next(n for n in ref if "embed_tokens" in n) if trainable == "full" else None
    if emb:
        prompt_only = sorted({t for s in samples for t in s.prompt_ids}
                             - {t for s in samples for t in s.completion_ids})
        assert float(got[emb][prompt_only].norm()) > 0
    assert stats["loss"] == pytest.approx(ref_stats["loss"], abs=1e-6)
    for key in ("filter/kept", "tokens", "samples"):
        assert stats[key] == ref_stats[key]
    assert torch.equal(stats["per_sample"]["dropped"], ref_stats["per_sample"]["dropped"])


def test_shared_step_leaves_the_same_weights(tiny_dir):
    samples = _samples(seed=5)
    a, b = _learner(tiny_dir, "lora", micro_batch=2), _learner(tiny_dir, "lora", micro_batch=4, share=False)
    a.step(samples)
    b.step(samples)
    for (n, p), (_, q) in zip(a.trainable_state().items(), b.trainable_state().items()):
        assert float((p - q).abs().max()) <= 1e-6, n


def test_gradient_checkpointing_falls_back_to_the_unshared_path(tiny_dir):
    learner = Learner(tiny_dir, trainable="full", device="cpu", gradient_checkpointing=True)
    assert learner.share_prompts is False


def test_length_buckets_split_where_padding_costs_more_than_a_forward():
    from ftis_edge.learn.shared_prompt import length_buckets
    assert length_buckets([5, 5, 6, 6], overhead=8) == [[0, 1, 2, 3]]          # near-equal: one forward
    assert length_buckets([3, 4, 5, 120, 128], overhead=8) == [[0, 1, 2], [3, 4]]
    assert length_buckets([7]) == [[0]] and length_buckets([]) == []
    many = length_buckets(list(range(1, 200, 7)), overhead=8)
    assert [i for b in many for i in b] == list(range(len(range(1, 200, 7)))) and len(many) > 2
    with pytest.raises(ValueError, match="ascending"):
        length_buckets([5, 3])
