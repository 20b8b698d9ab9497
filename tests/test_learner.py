"""The PyTorch learner on the real SmolLM2-135M: log-probs, F-TIS steps, micro-batching, checkpoints."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

from ftis_edge.learn.learner import Learner, LearnerError, LearnerOOM, TrainSample, aggregate_stats
from ftis_edge.metrics.metric_keys import UnregisteredMetric
from ftis_edge.learn.objective import ftis_loss

torch.set_num_threads(2)

PROMPTS = [
    ("Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nAnswer:",
     " He has 3 + 5 = 8 apples. The answer is 8."),
    ("Question: What is 12 times 3?\nAnswer:", " 12 times 3 is 36."),
    ("The capital of France is", " Paris, which is also its largest city."),
    ("Write one word:", " Hello"),
    ("Question: A train travels 60 km in one hour. How far does it go in 3 hours?\nAnswer:",
     " It goes 60 * 3 = 180 km, so the answer is 180."),
]


# ------------------------------------------------------------------ fast tests (no model)

def test_aggregate_stats_sums_counts_maxes_extrema_and_weights_means():
    parts = [(3, {"loss": 0.25, "samples": 3.0, "tokens": 30.0, "filter/dropped": 1.0, "sampling/importance_sampling_ratio/max": 1.5,
                  "clip_ratio/region_mean": 0.1, "kl/mean": 1.0, "sampling/importance_sampling_ratio/mean": 2.0}),
             (1, {"loss": -0.5, "samples": 1.0, "tokens": 10.0, "filter/dropped": 0.0, "sampling/importance_sampling_ratio/max": 1.9,
                  "clip_ratio/region_mean": float("nan"), "kl/mean": 3.0, "sampling/importance_sampling_ratio/mean": float("nan")})]
    out = aggregate_stats(parts, {})
    assert out["loss"] == pytest.approx(-0.25) and out["samples"] == 4 and out["tokens"] == 40
    assert out["filter/dropped"] == 1 and out["sampling/importance_sampling_ratio/max"] == 1.9
    assert out["clip_ratio/region_mean"] == pytest.approx(0.1)          # NaN part has nothing to measure
    assert out["kl/mean"] == pytest.approx((3 * 1.0 + 1 * 3.0) / 4)
    assert out["sampling/importance_sampling_ratio/mean"] == pytest.approx(2.0)


def test_aggregate_stats_makes_fractions_exact_and_refuses_unregistered_stats():
    parts = [(3, {"samples": 3.0, "tokens": 30.0, "filter/adv_le0": 2.0, "filter/adv_le0_frac": 2 / 3}),
             (1, {"samples": 1.0, "tokens": 10.0, "filter/adv_le0": 1.0, "filter/adv_le0_frac": 1.0})]
    assert aggregate_stats(parts, {})["filter/adv_le0_frac"] == 3 / 4
    with pytest.raises(UnregisteredMetric, match="'my/new_stat' is not registered"):
        aggregate_stats([(1, {"samples": 1.0, "my/new_stat": 0.5})], {})
    with pytest.raises(LearnerError, match="not as a per-micro-batch stat"):
        aggregate_stats([(1, {"samples": 1.0, "grad_norm": 0.5})], {})


def test_aggregate_stats_weights_span_mismatch_by_spans():
    parts = [(2, {"samples": 2.0, "spans": 3.0, "sampling/span_logp_difference/mean": 1.0}),
             (2, {"samples": 2.0, "spans": 1.0, "sampling/span_logp_difference/mean": 5.0}),
             (1, {"samples": 1.0, "spans": 0.0, "sampling/span_logp_difference/mean": float("nan")})]
    out = aggregate_stats(parts, {})
    assert out["spans"] == 4 and out["sampling/span_logp_difference/mean"] == pytest.approx((3 * 1.0 + 5.0) / 4)


def test_learner_rejects_a_directory_without_a_model(tmp_path):
    with pytest.raises(LearnerError, match="config.json"):
        Learner(tmp_path)


# ------------------------------------------------------------------ model fixtures

@pytest.fixture(scope="module")
def bundle():
    from ftis_edge.models.resolve import resolve_model
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="module")
def hf_dir(bundle):
    return bundle.hf_dir()


@pytest.fixture(scope="module")
def encoded(bundle):
    tok = bundle.tokenizer()
    return [(tok(p, add_special_tokens=False).input_ids, tok(c, add_special_tokens=False).input_ids)
            for p, c in PROMPTS]


@pytest.fixture(scope="module")
def lora(hf_dir):
    return Learner(hf_dir, trainable="lora", lr=1e-3, seed=0)


def _on_policy(learner, encoded, advantages, idx=None):
    """Samples whose behaviour log-probs are the learner's own current ones (a node's own, exact)."""
    idx = range(len(advantages)) if idx is None else idx
    base = [TrainSample(encoded[i][0], encoded[i][1], None, 0.0, 0.0, sequence_level=True) for i in idx]
    with torch.no_grad():
        logp, mask = learner.logprobs(base)
    return [TrainSample(s.prompt_ids, s.completion_ids, logp[b][mask[b]].tolist(), None, float(a))
            for b, (s, a) in enumerate(zip(base, advantages))]


def _seq_logp(learner, samples):
    with torch.no_grad():
        logp, mask = learner.logprobs(samples)
    return (logp * mask).sum(-1)


def _trainable(learner):
    return {n: p.detach().clone() for n, p in learner.trainable_state().items()}


def _perturb_lora(learner, seed=1, std=0.02):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in learner.trainable_state().items():
            p.copy_(torch.randn(p.shape, generator=g) * std)


# ------------------------------------------------------------------ model tests

@pytest.mark.model
def test_logprobs_match_a_plain_full_vocab_forward(lora, encoded):
    snapshot = lora.state_dict()
    _perturb_lora(lora)                      # LoRA B starts at zero: make the adapter count
    try:
        samples = [TrainSample(p, c, None, 0.0, 0.0, sequence_level=True) for p, c in encoded]
        with torch.no_grad():
            logp, mask = lora.logprobs(samples)          # padded, chunked, completion rows only
            assert mask.sum(-1).tolist() == [len(c) for _, c in encoded]
            for b, (p, c) in enumerate(encoded):
                ids = torch.tensor([p + c])
                full = F.log_softmax(lora.model(input_ids=ids).logits[0].float(), dim=-1)
                ref = full[len(p) - 1:len(p) + len(c) - 1].gather(1, torch.tensor(c)[:, None])[:, 0]
                torch.testing.assert_close(logp[b, :len(c)], ref, atol=2e-4, rtol=0)
                assert torch.all(logp[b, len(c):] == 0) and not mask[b, len(c):].any()
    finally:
        lora.load_state_dict(snapshot)


@pytest.mark.model
def test_step_moves_lora_weights_toward_the_positive_sample(lora, encoded):
    snapshot = lora.state_dict()
    try:
        batch = _on_policy(lora, encoded, [1.0, -1.0], idx=[0, 2])
        before_w = _trainable(lora)
        before_lp = _seq_logp(lora, batch)
        gen = [torch.tensor(s.gen_logprobs) for s in batch]
        stats = lora.step(batch)
        after_lp = _seq_logp(lora, batch)
        assert stats["skipped"] == 0 and lora.version == snapshot["version"] + 1
        assert stats["samples"] == 2 and stats["filter/dropped"] == 0
        assert stats["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-3)   # on-policy
        assert math.isfinite(stats["grad_norm"]) and stats["grad_norm"] > 0
        changed = [n for n, w in _trainable(lora).items() if not torch.equal(w, before_w[n])]
        assert changed and all("lora_" in n for n in changed)
        assert any("lora_B" in n for n in changed)       # (A gets no gradient while B is still zero)
        assert after_lp[0] > before_lp[0] + 0.1, (before_lp, after_lp)   # positive advantage: more likely
        assert after_lp[1] < before_lp[1] - 0.1, (before_lp, after_lp)   # negative: less likely
        # the objective on the same batch went down
        with torch.no_grad():
            logp, mask = lora.logprobs(batch)
            gen_t = torch.zeros_like(logp)
            for b, g in enumerate(gen):
                gen_t[b, :len(g)] = g
            loss_after, _ = ftis_loss(logp, gen_t, torch.tensor([1.0, -1.0]), mask)
        assert float(loss_after) < stats["loss"] - 0.01
    finally:
        lora.load_state_dict(snapshot)


@pytest.mark.model
def test_micro_batch_1_and_4_give_the_same_gradient(lora, encoded):
    batch = _on_policy(lora, encoded, [1.0, -0.5, 0.7, -1.2, 0.0])
    grads = {}
    for mb in (1, 4):
        lora.micro_batch = mb
        stats = lora.compute_gradients(batch)
        grads[mb] = torch.cat([p.grad.flatten() for p in lora.trainable_state().values()])
        assert stats["micro_batches"] == math.ceil(5 / mb) and stats["samples"] == 5
        assert stats["per_sample"]["advantage"].tolist() == pytest.approx([1.0, -0.5, 0.7, -1.2, 0.0])
        grads[f"loss{mb}"] = stats["loss"]
    lora.optimizer.zero_grad(set_to_none=True)
    lora.micro_batch = 4
    rel = float((grads[1] - grads[4]).norm() / grads[4].norm())
    # float32 sums in another order: ~1e-4 apart, and how far depends on the CPU's kernels (1.04e-4 on an AMD EPYC,
    # < 1e-4 on a Xeon); a wrong per-micro-batch normaliser is off by 0.25 or more.
    assert grads[4].norm() > 0 and rel < 1e-3, rel
    assert grads["loss1"] == pytest.approx(grads["loss4"], abs=1e-5)


@pytest.mark.model
def test_normalize_kept_with_micro_batches_equals_the_full_batch_loss(lora, encoded):
    batch = _on_policy(lora, encoded, [1.0, -0.5, 0.7, -1.2])
    # make sample 1 far off-policy: negative advantage + huge KL -> the filter drops it
    batch[1].gen_logprobs = [min(0.0, g + 8.0) if i % 2 else g - 8.0 for i, g in enumerate(batch[1].gen_logprobs)]
    kw = dict(method="f-tis", kl_threshold=1.0, normalize="kept")
    lora.micro_batch = 2
    stats = lora.compute_gradients(batch, **kw)
    ours = torch.cat([p.grad.flatten() for p in lora.trainable_state().values()])
    assert stats["filter/dropped"] == 1 and bool(stats["per_sample"]["dropped"][1])
    lora.optimizer.zero_grad(set_to_none=True)
    logp, mask = lora.logprobs(batch)
    gen = torch.zeros_like(logp)
    for b, s in enumerate(batch):
        gen[b, :len(s.gen_logprobs)] = torch.tensor(s.gen_logprobs)
    loss, _ = ftis_loss(logp, gen, torch.tensor([s.advantage for s in batch]), mask, **kw)
    loss.backward()
    ref = torch.cat([p.grad.flatten() for p in lora.trainable_state().values()])
    lora.optimizer.zero_grad(set_to_none=True)
    lora.micro_batch = 4
    # the learner shares each prompt's forward (fp32 rounding ~1e-5 nats/token, docs/benchmarks.md)
    assert stats["loss"] == pytest.approx(float(loss), rel=1e-4)
    # fp32 rounding of other summation orders: 8.2e-5 with the checkpointed head, 1.0e-4 with head_logprob
    assert float((ours - ref).norm() / ref.norm()) < 2e-4


@pytest.mark.model
def test_same_seed_same_batch_gives_identical_weights(hf_dir, encoded, lora):
    batch = _on_policy(lora, encoded, [1.0, -1.0, 0.5])
    results = []
    for _ in range(2):
        learner = Learner(hf_dir, trainable="lora", lr=1e-3, seed=123)
        learner.step(batch)
        results.append(_trainable(learner))
        del learner
    assert results[0].keys() == results[1].keys()
    assert all(torch.equal(results[0][n], results[1][n]) for n in results[0])
    other = Learner(hf_dir, trainable="lora", lr=1e-3, seed=124)       # a different seed differs
    assert not all(torch.equal(results[0][n], w) for n, w in _trainable(other).items() if "lora_A" in n)


@pytest.mark.model
def test_zero_advantage_batch_skips_the_step_but_reports_stats(lora, encoded):
    batch = _on_policy(lora, encoded, [0.0, 0.0, 0.0])
    before, version = _trainable(lora), lora.version
    stats = lora.step(batch)
    assert stats["skipped"] == 1 and lora.version == version
    assert all(torch.equal(w, before[n]) for n, w in _trainable(lora).items())
    assert stats["samples"] == 3 and stats["kl/mean"] == pytest.approx(0.0, abs=1e-4)
    assert stats["per_sample"]["kl"].shape == (3,)
    assert all(p.grad is None for p in lora.trainable_state().values())


@pytest.mark.model
def test_state_dict_round_trip_restores_weights_and_optimiser(lora, encoded):
    snapshot = lora.state_dict()
    try:
        batch = _on_policy(lora, encoded, [1.0, -1.0, 0.5])
        lora.step(batch)
        saved = copy.deepcopy(lora.state_dict())
        after_one = _trainable(lora)
        lora.step(batch)
        after_two = _trainable(lora)
        assert not all(torch.equal(after_one[n], after_two[n]) for n in after_one)
        lora.load_state_dict(saved)
        assert lora.version == saved["version"]
        assert all(torch.equal(w, after_one[n]) for n, w in _trainable(lora).items())
        restored = lora.optimizer.state_dict()["state"]
        for k, st in saved["optimizer"]["state"].items():
            assert torch.equal(restored[k]["exp_avg"], st["exp_avg"])
            assert torch.equal(restored[k]["exp_avg_sq"], st["exp_avg_sq"])
        lora.step(batch)                       # the same second step again: same Adam moments, same result
        assert all(torch.equal(w, after_two[n]) for n, w in _trainable(lora).items())
        lora.lr = 0.0                          # resumed with lr 0 (a frozen expert): the config's lr wins
        lora.load_state_dict(saved)
        lora.step(batch)
        assert all(torch.equal(w, after_one[n]) for n, w in _trainable(lora).items())
    finally:
        lora.lr = 1e-3
        lora.load_state_dict(snapshot)


@pytest.mark.model
def test_oom_raises_typed_error_with_grads_cleared_then_retry_works(lora, encoded, monkeypatch):
    batch = _on_policy(lora, encoded, [1.0, -1.0, 0.5, -0.5])
    step = "_shared_micro_batch" if lora.share_prompts else "_logprobs_unshared"   # what a micro-batch runs
    real = getattr(lora, step)
    calls = []

    def second_call_oom(samples, *rest):     # the allocator failing on the 2nd micro-batch, after a backward
        calls.append(len(samples))
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(samples, *rest)

    monkeypatch.setattr(lora, step, second_call_oom)
    lora.micro_batch = 2
    with pytest.raises(LearnerOOM, match="micro_batch=2"):
        lora.compute_gradients(batch)
    assert all(p.grad is None for p in lora.trainable_state().values())
    monkeypatch.setattr(lora, step, real)
    lora.micro_batch = 1
    stats = lora.compute_gradients(batch)
    assert stats["micro_batches"] == 4
    lora.optimizer.zero_grad(set_to_none=True)
    lora.micro_batch = 4


@pytest.mark.model
def test_bad_samples_get_a_readable_error(lora, encoded):
    p, c = encoded[0]
    with pytest.raises(LearnerError, match="gen_logprobs"):
        lora.logprobs([TrainSample(p, c, [-1.0] * (len(c) - 1), None, 1.0)])
    with pytest.raises(LearnerError, match="out of range"):
        lora.logprobs([TrainSample(p, c + [10 ** 7], None, -3.0, 1.0, sequence_level=True)])
    with pytest.raises(LearnerError, match="sequence_level"):
        lora.logprobs([TrainSample(p, c, None, -3.0, 1.0)])
    with pytest.raises(LearnerError, match="empty completion"):
        lora.logprobs([TrainSample(p, [], [], None, 1.0)])
    with pytest.raises(LearnerError, match="set by the learner"):
        lora.step([TrainSample(p, c, None, -3.0, 1.0, sequence_level=True)], num_samples=3)


@pytest.mark.model
def test_mixed_token_and_sequence_level_batch_steps(lora, encoded):
    snapshot = lora.state_dict()
    try:
        batch = _on_policy(lora, encoded, [1.0, -1.0, 0.5])
        batch[2] = TrainSample(batch[2].prompt_ids, batch[2].completion_ids, None,
                               float(sum(batch[2].gen_logprobs)) - 0.3, 0.5, sequence_level=True, source="peer")
        stats = lora.step(batch)
        assert stats["skipped"] == 0 and stats["samples/sequence_level"] == 1
        assert stats["per_sample"]["sequence_level"].tolist() == [False, False, True]
    finally:
        lora.load_state_dict(snapshot)


@pytest.mark.model
def test_span_level_sample_with_one_token_spans_equals_its_token_level_twin(lora, encoded):
    batch = _on_policy(lora, encoded, [1.0, -1.0, 0.5])
    batch[2] = TrainSample(batch[2].prompt_ids, batch[2].completion_ids, None,
                           float(sum(batch[2].gen_logprobs)) - 0.3, 0.5, sequence_level=True, source="peer")
    s = batch[1]
    twin = TrainSample(s.prompt_ids, s.completion_ids, None, None, s.advantage, source="peer",
                       span_ids=list(range(len(s.completion_ids))), gen_span_logprobs=list(s.gen_logprobs))
    grads = []
    for b in (batch, [batch[0], twin, batch[2]]):
        lora.micro_batch = 2                      # token + span rows share a micro-batch, or not
        stats = lora.compute_gradients(b, method="f-tis", kl_threshold=0.5)
        grads.append([p.grad.clone() for p in lora.trainable_state().values()])
    lora.micro_batch = 4
    lora.optimizer.zero_grad(set_to_none=True)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)
    assert stats["samples/span_level"] == 1 and stats["samples/sequence_level"] == 1
    assert stats["per_sample"]["span_level"].tolist() == [False, True, False]
    assert stats["spans"] == len(s.completion_ids) and stats["sampling/span_logp_difference/mean"] < 1e-4
    with pytest.raises(LearnerError, match="span ids must lie"):
        lora.logprobs([TrainSample(s.prompt_ids, s.completion_ids, None, None, 1.0, span_ids=[0] * len(
            s.completion_ids), gen_span_logprobs=[])])
    with pytest.raises(LearnerError, match="both span_ids"):
        lora.logprobs([TrainSample(s.prompt_ids, s.completion_ids, None, None, 1.0, span_ids=[0])])


@pytest.mark.model
def test_save_adapter_writes_peft_files(lora, tmp_path):
    out = lora.save_adapter(tmp_path / "adapter")
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()


@pytest.mark.model
def test_full_fine_tuning_step(hf_dir, encoded):
    learner = Learner(hf_dir, trainable="full", lr=2e-5, seed=0)
    assert sum(p.numel() for p in learner.trainable_state().values()) > 100_000_000
    batch = _on_policy(learner, encoded, [1.0, -1.0], idx=[0, 2])
    before = _seq_logp(learner, batch)
    embed = learner.model.get_input_embeddings().weight.detach().clone()
    stats = learner.step(batch)
    after = _seq_logp(learner, batch)
    assert stats["skipped"] == 0 and learner.version == 1
    assert after[0] > before[0] + 0.1 and after[1] < before[1] - 0.1, (before, after)
    assert not torch.equal(embed, learner.model.get_input_embeddings().weight)


def _groups(encoded):
    """Two prompts' groups of mixed completion lengths (any completions will do) and a singleton."""
    comps = [c for _, c in encoded]
    return ([TrainSample(encoded[0][0], c, None, 0.0, 0.0, sequence_level=True) for c in comps]
            + [TrainSample(encoded[4][0], c, None, 0.0, 0.0, sequence_level=True) for c in comps[:3]]
            + [TrainSample(encoded[2][0], comps[2], None, 0.0, 0.0, sequence_level=True)])


@pytest.mark.slow       # ≥ 15 s on 2 cores: CI's slow tier keeps the README command under 20 min
@pytest.mark.model
@pytest.mark.parametrize("trainable", ["lora", "full"])
def test_shared_prompt_matches_the_unshared_path_on_smollm2(hf_dir, encoded, trainable):
    """The prompt once per group: per-token log-probs within 1e-5 nats and gradients within 1e-5 (relative)
    of one full sequence per sample, micro-batches splitting and straddling groups."""
    learner = Learner(hf_dir, trainable=trainable, lr=1e-4, seed=0, micro_batch=3)
    if trainable == "lora":
        _perturb_lora(learner)
    base = _groups(encoded)
    with torch.no_grad():
        shared, mask = learner.logprobs(base)
        learner.share_prompts = False
        ref, ref_mask = learner.logprobs(base)
    assert torch.equal(mask, ref_mask)
    diff = (shared - ref)[mask].abs()
    # fp32 rounding: two batchings of the unshared path itself differ by up to ~5e-6 nats here, and
    # the shared path's attention runs over differently shaped blocks (measured max 1.1e-5, mean 2e-6).
    assert float(diff.max()) <= 2e-5 and float(diff.mean()) <= 5e-6, (float(diff.max()), float(diff.mean()))
    advs = [1.0, -0.5, 0.7, -1.2, 0.3, 0.9, -0.9, 0.1, -0.6]
    batch = [TrainSample(s.prompt_ids, s.completion_ids, (ref[b][mask[b]] - 0.05 * (b % 3)).clamp(max=0).tolist(),
                         None, a) for b, (s, a) in enumerate(zip(base, advs))]
    grads = {}
    for share in (False, True):
        learner.share_prompts = share
        stats = learner.compute_gradients(batch)
        grads[share] = {n: p.grad.detach().clone() for n, p in learner.trainable_state().items()
                        if p.grad is not None}
        grads[f"loss{share}"] = stats["loss"]
    learner.optimizer.zero_grad(set_to_none=True)
    flat = {k: torch.cat([g.flatten() for g in grads[k].values()]) for k in (False, True)}
    rel = float((flat[True] - flat[False]).norm() / flat[False].norm())
    assert flat[False].norm() > 0 and rel <= 1e-5, rel
    worst = max(float((grads[True][n] - g).norm() / g.norm()) for n, g in grads[False].items() if g.norm() > 0)
    assert worst <= 1e-4, worst       # every tensor, even the smallest-gradient ones
    # the loss is a mean over tokens whose log-probs may differ by the 2e-5 nats allowed above
    # (failed at abs 1e-6 on the unchanged base tree too: 1.3e-6 apart on this machine)
    assert grads["lossTrue"] == pytest.approx(grads["lossFalse"], abs=1e-5)


@pytest.mark.model
def test_the_plausibility_filter_never_judges_own_samples_and_refuses_implausible_peer_text(hf_dir, encoded):
    """Alone (own samples only) a step with the filter is bit-identical to one without; a peer
    sample of random tokens is refused (weight 0, counted), whatever its advantage."""
    from ftis_edge.peers.plausibility import PlausibilityConfig
    cfg = PlausibilityConfig(min_own=2)
    weights = []
    for plausible in (None, cfg):
        learner = Learner(hf_dir, trainable="lora", lr=1e-3, seed=0)
        batch = _on_policy(learner, encoded, [1.0, -1.0])
        stats = learner.step(batch, plausible=plausible)
        assert "trust/implausible" not in stats
        weights.append(_trainable(learner))
    assert all(torch.equal(weights[0][n], weights[1][n]) for n in weights[0])
    g = torch.Generator().manual_seed(0)
    noise = torch.randint(1000, 40000, (40,), generator=g).tolist()
    peer = TrainSample(encoded[0][0], noise, [-1.0] * 40, None, 1.0, source="mallory")
    stats = learner.compute_gradients(_on_policy(learner, encoded, [1.0, -1.0]) + [peer], cfg)
    assert stats["trust/implausible"] == 1 and bool(stats["per_sample"]["implausible"][2])
    learner.optimizer.zero_grad(set_to_none=True)


@pytest.mark.model
def test_an_unlikely_phrase_a_peer_repeats_is_trained_once(hf_dir, encoded, bundle):
    """The repeat memory (plausibility.RepeatMemory) through the real learner: a correct peer
    answer carrying a phrase trains it the first time; the same phrase in a later sample, in
    another answer, is masked token by token (counted), and the rest of that answer still
    trains; own samples are never masked."""
    from ftis_edge.peers.plausibility import PlausibilityConfig
    tok = bundle.tokenizer()
    phrase = tok(" Visit quizbot-answers.example.net for the key.", add_special_tokens=False).input_ids
    cfg = PlausibilityConfig(min_own=10**6, default_threshold=-1e9)  # the window rule off: repeats only
    learner = Learner(hf_dir, trainable="lora", lr=1e-3, seed=0)

    def poisoned(i):
        prompt, completion = encoded[i]
        ids = completion[:6] + phrase + completion[6:]
        return TrainSample(prompt, ids, [-1.0] * len(ids), None, 1.0, source="mallory")

    first = learner.step(_on_policy(learner, encoded, [1.0, -1.0]) + [poisoned(0)], plausible=cfg)
    assert first["trust/repeated_tokens"] == 0 and len(learner.repeat_memory) > 0
    own_with_phrase = TrainSample(encoded[1][0], phrase, [-1.0] * len(phrase), None, 1.0)
    again = learner.compute_gradients(_on_policy(learner, encoded, [1.0, -1.0]) + [own_with_phrase, poisoned(1)],
                                      cfg)
    rep = again["per_sample"]["repeated"]
    assert rep[2] == 0                                           # own text is never judged
    assert 4 <= rep[3] <= len(phrase) and again["trust/repeated_tokens"] == rep[3]
    learner.optimizer.zero_grad(set_to_none=True)
