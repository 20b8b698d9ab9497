"""The task interface: a stream of prompts, rebuildable from ids, and a verifiable reward.

A task knows nothing about models: it gives chat ``messages`` (system + user) and the model's
``ModelBundle.render_prompt(messages)`` turns them into text elsewhere.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from .errors import TaskError
from .grader import score, score_many
from .rewards import RewardSettings
from .unseen import question_key

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant that solves math problems. "
    "Think about the problem inside <think> </think> tags, "
    "then give only the final answer inside <answer> </answer> tags."
)

# Worked examples sent as earlier chat turns (option ``few_shot``). A 135M instruct model
# almost never writes the tags from the system prompt alone (docs/tasks.md); after seeing
# them used it does often enough for the reward to carry signal.
FEW_SHOT = (
    ("What is 6 + 7?", "<think>6 + 7 = 13</think>\n<answer>13</answer>"),
    ("Ana has 4 bags with 5 marbles in each bag. How many marbles does Ana have?",
     "<think>4 bags × 5 marbles = 20 marbles</think>\n<answer>20</answer>"),
)
DEFAULT_FEW_SHOT = 2


@dataclass(frozen=True)
class Prompt:
    id: str             # enough to rebuild the prompt: "gsm8k/train/42", "arith/L2/12345"
    question: str
    reference: str      # the final answer, as the reward compares it
    meta: dict = field(default_factory=dict)


class Task:
    """Base class. Subclasses set ``name`` and implement ``get``, ``prompts``, ``eval_prompts``."""

    name = "task"
    _eval_ids: frozenset | None = None
    _eval_keys: frozenset = frozenset()

    def __init__(self, *, system_prompt: str | None = None, few_shot: int = DEFAULT_FEW_SHOT,
                 reward: str = "binary", require_think: bool = False, timeout_s: float = 0.5,
                 format_reward: float = 0.1):
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise TaskError(f"system_prompt must be a string, got {type(system_prompt).__name__}")
        self.system_prompt = DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt
        if isinstance(few_shot, bool) or not isinstance(few_shot, int) or not 0 <= few_shot <= len(FEW_SHOT):
            raise TaskError(f"few_shot must be an integer from 0 to {len(FEW_SHOT)}, got {few_shot!r}")
        self.few_shot = few_shot
        try:
            self.reward_settings = RewardSettings(mode=reward, require_think=bool(require_think),
                                                  timeout_s=float(timeout_s),
                                                  format_reward=float(format_reward))
        except ValueError as e:
            raise TaskError(str(e)) from None

    # --- tags: what the relay's task filter sees ------------------------------------------
    @property
    def tags(self) -> tuple[str, ...]:
        """The task tags this node subscribes to (the relay delivers only rollouts tagged so)."""
        return (self.name,)

    def tag_of(self, prompt_id: str) -> str | None:
        """The tag a rollout of this prompt carries, or None when the prompt is not this task's.
        A task whose prompts come from several sources (a reasoning-gym mix) tags each by its
        source, so a peer on another mix still gets the datasets the two share."""
        return self.name

    # --- prompts -------------------------------------------------------------------------
    def get(self, prompt_id: str) -> Prompt:
        """Rebuild a prompt (question and reference) from its id alone."""
        raise NotImplementedError

    def prompts(self, seed: int = 0, start: int = 0) -> Iterator[Prompt]:
        """Endless, deterministic training stream; ``start`` skips that many prompts."""
        raise NotImplementedError

    def eval_prompts(self, limit: int | None = None) -> list[Prompt]:
        """A fixed, ordered evaluation set (the test split when there is one)."""
        raise NotImplementedError

    def is_trainable(self, prompt_id: str) -> bool:
        """May a node train on this prompt? False for the held-out eval prompts, so a peer
        cannot make a node train on (and so inflate) its own evals.

        This default compares with the whole eval set, by id and by question text (held out means
        unseen: the same question under another id is refused too); tasks override it with a rule
        of their own.
        """
        if self._eval_ids is None:
            evals = self.eval_prompts()
            self._eval_ids = frozenset(p.id for p in evals)
            self._eval_keys = frozenset(question_key(p.question) for p in evals)
        if prompt_id in self._eval_ids:
            return False
        try:
            return question_key(self.get(prompt_id).question) not in self._eval_keys
        except (TaskError, NotImplementedError):
            return False

    def messages(self, question: str) -> list[dict]:
        """Chat messages for one question: the system prompt, ``few_shot`` worked examples as
        earlier turns, then the question."""
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        for user, assistant in FEW_SHOT[:self.few_shot]:
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        return msgs + [{"role": "user", "content": question}]

    # --- reward --------------------------------------------------------------------------
    def reward(self, completion_text: str, reference: str) -> tuple[float, dict]:
        """Score one completion; returns within ``timeout_s`` once the grader is warm."""
        return score(completion_text, reference, self.reward_settings)

    def reward_many(self, texts: Sequence[str], references: Sequence[str],
                    total_budget_s: float | None = None) -> list[tuple[float, dict]]:
        """Score a batch within a total time budget; items not reached count as timed out."""
        return score_many(texts, references, self.reward_settings, total_budget_s)

    def close(self) -> None:
        """Nothing to release by default (the grader worker is shared by the process)."""


def drawn_stream(key: str, seed: int, start: int, draw: Callable[[random.Random], Prompt | None],
                 max_redraws: int | None = None, exhausted: str = "") -> Iterator[Prompt]:
    """Endless training stream of generated prompts whose ``i``-th is a pure function of
    (key, seed, i), so ``start`` stays an index: ``draw`` gets ``random.Random(f"{key}:{seed}:{i}")``
    and returns a prompt, or None for one that is held out, drawn again from a sub-seed
    (``…:{i}:{redraw}``). After ``max_redraws`` held-out draws in a row: TaskError(exhausted)."""
    i = max(0, int(start))
    while True:
        redraw = 0
        while True:
            if max_redraws is not None and redraw >= max_redraws:
                raise TaskError(exhausted)
            # a string seed is hashed with sha512 by random: the same draw on every machine
            prompt = draw(random.Random(f"{key}:{seed}:{i}" if redraw == 0 else f"{key}:{seed}:{i}:{redraw}"))
            if prompt is not None:
                break
            redraw += 1
        yield prompt
        i += 1


def shuffled_stream(items: Sequence[Prompt], key: str, seed: int = 0,
                    start: int = 0) -> Iterator[Prompt]:
    """Endless epochs over ``items``, each in a fresh order fixed by (key, seed, epoch)."""
    n = len(items)
    if n == 0:
        raise TaskError(f"{key}: no prompts to draw from")
    epoch, offset = divmod(max(0, int(start)), n)
    while True:
        order = list(range(n))
        # a string seed is hashed with sha512 by random: the same order on every machine
        random.Random(f"{key}:{seed}:{epoch}").shuffle(order)
        for i in order[offset:]:
            yield items[i]
        epoch, offset = epoch + 1, 0
