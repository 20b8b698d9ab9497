"""reasoning_gym: prompts from the reasoning-gym library's procedural datasets, graded by their own verifiers.

A node names one or several datasets, each with a weight and its settings (a curriculum
``level``, 0 = easiest, then any field of the dataset's config class). Item ``i`` of a dataset
is ``Random(seed + i)``'s draw, so the same (dataset, settings, library version, i) is the
same question on every machine. A prompt id is ``rg/<dataset>/<key>/<i>``; ``key`` hashes the
full settings and the library version, and the receiver rebuilds the item from its *own*
settings for that key (an unknown key is an unknown prompt: a peer cannot make a node build
datasets it did not choose). Training draws ``i < size``; the eval set is ``size <= i <
size + eval_size``, so the two never share a seed. The relay's task tag of a rollout is
``rg/<dataset>/<key>``: a node subscribes to the tags of its own mix.

Grading runs ``score_answer`` in a grader worker prepared with the same datasets (gym_verify.py):
it rebuilds the item from the id and scores the extracted answer, with partial credit where
the dataset gives it, under the task's time budget.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import random
from typing import Iterator

from .base import Prompt, Task, TaskError, drawn_stream
from .unseen import EvalTexts
from .gym_source import (MAX_ANSWER_CHARS, MAX_TAGS_BYTES, SYSTEM_PROMPT, Source, build_dataset, library,
                         library_version, make_source, parse_datasets, parse_id, worker_setup)


MAX_REDRAWS = 64          # a mix whose training draws keep hitting eval questions is refused


class ReasoningGymTask(Task):
    """A weighted mix of reasoning-gym datasets (see the module docstring)."""

    name = "reasoning_gym"

    def __init__(self, datasets=None, system_prompt: str | None = None, partial_credit: bool = True, **options):
        super().__init__(system_prompt=SYSTEM_PROMPT if system_prompt is None else system_prompt, **options)
        library()
        version = library_version()
        self.sources = [make_source(d, s, version) for d, s in parse_datasets(datasets).items()]
        self.by_tag = {s.tag: s for s in self.sources}
        if len(json.dumps(self.tags)) > MAX_TAGS_BYTES:
            raise TaskError(f"reasoning_gym: {len(self.sources)} datasets are more than the relay's "
                            f"subscription filter holds; use at most ~60")
        self._datasets = {s.tag: build_dataset(s) for s in self.sources}   # fail now, not mid-run
        # held out means unseen: a training draw whose question is one of its dataset's eval
        # questions (a small generator repeats itself) is drawn again
        self._eval_texts = {s.tag: EvalTexts(lambda s=s: [self._item(s, s.size + j).question
                                                          for j in range(s.eval_size)]) for s in self.sources}
        self.partial_credit = bool(partial_credit)
        self.reward_settings = dataclasses.replace(
            self.reward_settings, rule="reasoning_gym", rule_setup=worker_setup(self.sources),
            max_answer_chars=MAX_ANSWER_CHARS)
        from .grader import get_grader
        get_grader(self.reward_settings.rule_setup)     # warm_up() starts its workers too

    # --- tags: what the relay filters on ------------------------------------------------
    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(self.by_tag)

    def tag_of(self, prompt_id: str) -> str | None:
        parsed = parse_id(prompt_id)
        return parsed[0] if parsed and parsed[0] in self.by_tag else None

    # --- prompts -------------------------------------------------------------------------
    def _item(self, source: Source, index: int) -> Prompt:
        with contextlib.redirect_stdout(io.StringIO()):    # bf's compiler prints dots
            entry = self._datasets[source.tag][index]
        pid = f"{source.tag}/{index}"
        # the reference is the id: the grader worker rebuilds the item (metadata and all) from it
        return Prompt(id=pid, question=str(entry["question"]), reference=pid,
                      meta={"dataset": source.dataset, "answer": entry.get("answer"), "index": index})

    def get(self, prompt_id: str) -> Prompt:
        parsed = parse_id(prompt_id)
        if parsed is None:
            raise TaskError(f"reasoning_gym: bad prompt id {prompt_id!r} (expected rg/<dataset>/<key>/<index>)")
        source = self.by_tag.get(parsed[0])
        if source is None:
            raise TaskError(f"reasoning_gym: {parsed[0]} is not in this node's mix")
        if parsed[1] >= source.size + source.eval_size:
            raise TaskError(f"reasoning_gym: prompt id {prompt_id!r} is past the end of {source.dataset}")
        return self._item(source, parsed[1])

    def is_trainable(self, prompt_id: str) -> bool:
        parsed = parse_id(prompt_id)
        source = self.by_tag.get(parsed[0]) if parsed else None
        if source is None or parsed[1] >= source.size:
            return False
        return self._item(source, parsed[1]).question not in self._eval_texts[source.tag]

    def prompts(self, seed: int = 0, start: int = 0) -> Iterator[Prompt]:
        return drawn_stream("rg", seed, start, self._training_draw, max_redraws=MAX_REDRAWS,
                            exhausted=f"reasoning_gym: {MAX_REDRAWS} training draws in a row repeated eval "
                                      f"questions; a dataset of this mix has too few distinct questions for its eval_size")

    def _training_draw(self, rng: random.Random) -> Prompt | None:
        """One draw of the stream; None for an eval question (drawn again from a sub-seed)."""
        source = rng.choices(self.sources, [s.weight for s in self.sources])[0]
        item = self._item(source, rng.randrange(source.size))
        return None if item.question in self._eval_texts[source.tag] else item

    def eval_prompts(self, limit: int | None = None) -> list[Prompt]:
        """Datasets in turn (first held-out item of each, then the second, …)."""
        out, j = [], 0
        total = sum(s.eval_size for s in self.sources) if limit is None else max(0, int(limit))
        while len(out) < total and any(j < s.eval_size for s in self.sources):
            out += [self._item(s, s.size + j) for s in self.sources if j < s.eval_size][: total - len(out)]
            j += 1
        return out

    # --- reward --------------------------------------------------------------------------
    def reward(self, completion_text: str, reference: str) -> tuple[float, dict]:
        return self._credit(super().reward(completion_text, reference))

    def reward_many(self, texts, references, total_budget_s=None):
        return [self._credit(r) for r in super().reward_many(texts, references, total_budget_s)]

    def _credit(self, result):
        """Without partial credit, a verifier's fraction counts as wrong."""
        value, breakdown = result
        if not self.partial_credit and value < 1.0 and breakdown.get("partial"):
            value = self.reward_settings.format_reward if (breakdown["format_ok"] and
                                                            self.reward_settings.mode == "shaped") else 0.0
        return value, breakdown
