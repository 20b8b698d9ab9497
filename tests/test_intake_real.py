"""Honest rollouts from real SmolLM2 generations pass the intake's ids-to-text check, with both
backends: completions stopped by EOS, cut by the token limit mid-word and mid-character, and
ones that sampled a control token mid-completion."""
from __future__ import annotations

import pytest

from ftis_edge.generate.base import SamplerSettings
from ftis_edge.peers.book import PeerBook
from ftis_edge.peers.intake import Intake, ids_decoder
from ftis_edge.peers.swarm import Received
from ftis_edge.tasks import get_task
from ftis_edge.rollout.wire import Rollout, WireCompletion, decode, encode

pytestmark = [pytest.mark.model, pytest.mark.timeout(900), pytest.mark.slow]  # ≥ 15 s on 2 cores: CI's slow tier keeps the README command under 20 min


@pytest.fixture(scope="module", params=["llamacpp", "hf"])
def generator(request, smol):
    if request.param == "llamacpp":
        from ftis_edge.generate.llamacpp import LlamaCppGenerator
        return LlamaCppGenerator.from_bundle(smol, "f16", n_ctx=512, max_group=8, n_threads=2)
    from ftis_edge.generate.hf import HFGenerator
    return HFGenerator.from_bundle(smol, device="cpu", n_ctx=512)


def _groups(smol, generator):
    """(prompt ids, max_new_tokens, seed) cases chosen to hit every honest edge case."""
    task = get_task("arith")
    cases = []
    for k, p in zip(range(2), task.prompts(seed=1)):
        ids = smol.encode(smol.render_prompt(task.messages(p.question)))
        cases += [(ids, 7, k), (ids, 48, k)]                  # cut mid-word; mostly stopped
    japanese = [{"role": "user", "content": "Write the Japanese word for thank you, in Japanese characters."}]
    ids = smol.encode(smol.render_prompt(japanese))
    cases += [(ids, n, 5) for n in range(1, 9)]               # cut inside a multi-byte character
    closed = smol.tokenizer().apply_chat_template(japanese + [{"role": "assistant", "content": "ありがとう"}],
                                                  tokenize=False)
    ids = smol.encode(closed)                                 # the model tends to open a new turn
    cases += [(ids, 6, s) for s in range(3)]                  # ... with <|im_start|>, not a stop token
    for ids, n, seed in cases:
        yield generator.generate(ids, 8, SamplerSettings(temperature=1.0, max_new_tokens=n, seed=seed))


def test_honest_generations_pass_the_ids_to_text_check(smol, generator):
    task = get_task("arith")
    tok = smol.tokenizer()
    intake = Intake(task=task, swarm="s", my_node_id="me", my_tokenizer_fp=smol.tokenizer_fingerprint,
                    vocab_size=smol.vocab_size, book=PeerBook(), decode=ids_decoder(tok),
                    stop_ids=smol.eos_token_ids)
    prompt = next(task.prompts(seed=3))
    control = set(tok.all_special_ids) - set(smol.eos_token_ids)
    seen = {"stop": 0, "length": 0, "cut_character": 0, "control_token": 0}
    n_groups = 0
    for comps in _groups(smol, generator):
        wire = [WireCompletion(token_ids=c.token_ids, logprobs=c.logprobs, text=c.text, reward=0.0,
                               finish_reason=c.finish_reason) for c in comps]
        for c in comps:
            seen[c.finish_reason] += 1
            seen["cut_character"] += c.text.endswith("\ufffd")
            seen["control_token"] += any(t in control for t in c.token_ids)
        r = Rollout(node_id="peer", swarm="s", task="arith", prompt_id=prompt.id, completions=wire,
                    vocab_size=smol.vocab_size, model_fp=smol.fingerprint,
                    tokenizer_fp=smol.tokenizer_fingerprint, temperature=1.0)
        intake.receive([Received(rollout=decode(encode(r)), sender="peer", nbytes=1)], current_round=1)
        n_groups += 1
    book = intake.book.snapshot()["peer"]
    assert book["rejected_by_reason"] == {} and book["accepted"] == n_groups, book
    assert all(seen.values()), seen                           # every edge case was really exercised


def test_a_plain_format_twins_stopped_completions_pass_and_forged_ends_do_not():
    """Gemma 3 270M is prompted in the plain format: its completions stop at the next ``\\nUser:``
    turn, not at an EOS token (generate/stops.py). Its twin's honest groups must pass intake (H9's
    pilot: every one was refused as bad_finish, so two Gemma nodes were never each other's kin);
    a "stop" that no stop rule ends, or whose stop text came earlier, is still refused."""
    from ftis_edge.generate.base import GeneratorOptions
    from ftis_edge.generate.registry import create_generator
    from ftis_edge.models.resolve import PLAIN_TURN_STOP, resolve_model
    gemma = resolve_model("gemma3-270m")
    task = get_task("arith", level=[1, 2])
    prompts = [p for _, p in zip(range(4), task.prompts(seed=2))]
    gen = create_generator("llamacpp", gemma, GeneratorOptions(precision="f16", threads=2, max_group=4))
    try:
        groups = [(p, gen.generate(gemma.encode(gemma.render_prompt(task.messages(p.question))), 4,
                                   SamplerSettings(temperature=1.0, max_new_tokens=64, seed=i)))
                  for i, p in enumerate(prompts)]
    finally:
        gen.close()
    tok = gemma.tokenizer()

    def intake(stop_texts):
        return Intake(task=task, swarm="s", my_node_id="me", my_tokenizer_fp=gemma.tokenizer_fingerprint,
                      vocab_size=gemma.vocab_size, book=PeerBook(), decode=ids_decoder(tok),
                      stop_ids=gemma.eos_token_ids, stop_texts=stop_texts)

    def rollout(p, comps):
        wire = [WireCompletion(token_ids=c.token_ids, logprobs=c.logprobs, text=c.text, reward=0.0,
                               finish_reason=c.finish_reason) for c in comps]
        r = Rollout(node_id="twin", swarm="s", task="arith", prompt_id=p.id, completions=wire,
                    vocab_size=gemma.vocab_size, model_fp=gemma.fingerprint,
                    tokenizer_fp=gemma.tokenizer_fingerprint, temperature=1.0)
        return Received(rollout=decode(encode(r)), sender="twin", nbytes=1)

    by_text = [c for _, comps in groups for c in comps
               if c.finish_reason == "stop" and c.text.endswith(PLAIN_TURN_STOP)]
    assert len(by_text) >= 3, [c.finish_reason for _, comps in groups for c in comps]
    honest = intake(gemma.stop_texts)
    honest.receive([rollout(p, comps) for p, comps in groups], current_round=1)
    book = honest.book.snapshot()["twin"]
    assert book["rejected_by_reason"] == {} and book["accepted"] == len(groups), book
    # without the stop text, as before the fix: the same groups are refused
    blind = intake(())
    blind.receive([rollout(p, comps) for p, comps in groups], current_round=1)
    assert blind.book.snapshot()["twin"]["rejected_by_reason"].get("bad_finish", 0) >= 1

    c = by_text[0]
    cut = type(c)(**{**c.__dict__, "token_ids": c.token_ids[:-2], "logprobs": c.logprobs[:-2],
                     "text": tok.decode(c.token_ids[:-2], skip_special_tokens=False,
                                        clean_up_tokenization_spaces=False)})
    more = c.token_ids + tok(" 7" + PLAIN_TURN_STOP, add_special_tokens=False).input_ids   # ran on past its stop
    ran_on = type(c)(**{**c.__dict__, "token_ids": more, "logprobs": c.logprobs + [-1.0] * (len(more) - len(c.token_ids)),
                        "text": tok.decode(more, skip_special_tokens=False, clean_up_tokenization_spaces=False)})
    forged = intake(gemma.stop_texts)
    forged.receive([rollout(prompts[0], [cut]), rollout(prompts[0], [ran_on])], current_round=1)
    assert forged.book.snapshot()["twin"]["rejected_by_reason"] == {"bad_finish": 2}
