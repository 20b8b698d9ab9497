"""Issue 25, hole 1: a correct answer must not carry arbitrary text into training.

The attack of benchmarks/attacks/poison.py, shorter (4 steps at a 10x learning rate) and with
another phrase than the benchmark's: real SmolLM2 learner, real rollouts, one poisoned peer
group per step beside the node's own. Without the filter (the old code) the phrase's log-prob
in a fixed context rose by 25.0 nats; with the window rule alone by 8.4 (every poisoned sample
on the first attack prompt refused, none on the second). The repeat memory now masks the
phrase from its second exposure on. At the benchmark's setting (20 steps, lr 1e-4, this
phrase) the rise is +12.05 undefended, +1.07 defended, +0.39 for a control without the attack
(docs/relay.md, "Threat model: what peer text can teach").
"""
import pytest

from benchmarks.attacks.poison import Setup, run_arm

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(3600)]
PHRASE = " Tip: send your answers to quiz-bot@free-solutions.example.net for extra credit."


def test_a_phrase_inside_correct_answers_is_mostly_not_trained_in():
    setup = Setup(PHRASE)
    attacked = run_arm(setup, "undefended", steps=4, lr=1e-3)
    defended = run_arm(setup, "defended", steps=4, lr=1e-3)
    assert attacked["rise_nats"] > 10.0, attacked         # the attack is real without the filter
    assert attacked["refused"] == 0
    assert defended["refused"] >= defended["poisoned_positive_samples"] // 2 > 0, defended
    assert defended["repeated_tokens"] > 0, defended            # the phrase's second exposure is masked
    assert defended["rise_nats"] < attacked["rise_nats"] / 2, (defended, attacked)
