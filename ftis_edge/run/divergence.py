"""Is this node's own training falling apart? Said in words, with the likely cause and the setting.

A step that is far too large (a LoRA learning rate on a fully trained model) wrecks the policy in
one round: its own completions stop following the format, run to the length limit or shrink to
nothing, and the learner's KL to the generator on its OWN samples (normally ~0: the generator was
synced with the learner a round ago) jumps by orders of magnitude. Peers' samples are left out of
the KL on purpose: another model's text is far from ours by nature.

``DivergenceWatch.observe`` reads one round record (plus the own samples' KL) and returns the
warning to show, or None. One strong sign (own KL) or two weaker ones (format, length) make a
verdict: a single noisy round of a tiny group must not cry wolf.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..config import AUTO_LEARNING_RATE, Config
from ..rollout.samples import OWN

OWN_KL_LIMIT = 1.0           # nats per sample (k3); a synced generator gives ~0.001-0.05
FORMAT_FLOOR = 0.25          # format rate fell to a quarter of its best…
FORMAT_MIN_BEST = 0.2        # …and that best was real
LENGTH_CEILING = 0.95        # answers run to the length limit…
LENGTH_WAS = 0.8             # …where they used to stop well before it
LENGTH_SHRUNK = 0.2          # or shrank to a fifth of where they started
_WRECKED = "the collapsed weights are not worth resuming"


def own_kl(samples, per_sample: dict | None) -> float | None:
    """Mean k3 KL of the step's own (non-empty) samples; None when the step reported none."""
    if not per_sample or per_sample.get("kl") is None:
        return None
    kl, tokens = per_sample["kl"], per_sample.get("tokens")
    vals = [float(kl[i]) for i, s in enumerate(samples)
            if s.source == OWN and (tokens is None or float(tokens[i]) > 0)]
    vals = [v for v in vals if math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def learning_rate_advice(cfg: Config) -> str:
    """The likely cause and the setting to change."""
    lr, auto = cfg.train.lr, AUTO_LEARNING_RATE[cfg.train.trainable]
    what = "full fine-tuning" if cfg.train.trainable == "full" else "LoRA"
    if lr > 2 * auto:
        return (f"likely cause: train.learning_rate = {lr:g} is {lr / auto:.0f}x the usual {auto:g} for {what}; "
                f'set train.learning_rate = "auto" (or lower) and start the run over (--overwrite): {_WRECKED}')
    return (f"likely cause: steps too large for this model and task (train.learning_rate = {lr:g}, "
            f"train.max_grad_norm = {cfg.train.max_grad_norm:g}); lower train.learning_rate "
            f"(e.g. {lr / 4:g}) and start the run over (--overwrite): {_WRECKED}")


def learning_rate_note(cfg: Config) -> str | None:
    """Before the first round: a learning rate set far above what suits ``train.trainable``."""
    lr, auto = cfg.train.lr, AUTO_LEARNING_RATE[cfg.train.trainable]
    if cfg.train.learning_rate == "auto" or lr <= 4 * auto:
        return None
    what = "full fine-tuning" if cfg.train.trainable == "full" else "LoRA"
    return (f"train.learning_rate = {lr:g} is {lr / auto:.0f}x the usual {auto:g} for {what}: expect the model to "
            f'collapse within a few rounds (train.learning_rate = "auto" picks {auto:g})')


@dataclass
class DivergenceWatch:
    cfg: Config
    best_format: float = 0.0
    first_length: float | None = None
    diverging_since: int | None = None
    _said: str | None = field(default=None, repr=False)

    def observe(self, record: dict, kl_own: float | None) -> str | None:
        """The warning for this round (every round while it lasts), or None."""
        fmt, length = record.get("format/own"), record.get("completions/mean_length")
        limit = self.cfg.task.max_completion_length
        signs, strong = [], False
        if kl_own is not None and kl_own > OWN_KL_LIMIT:
            signs.append(f"its own KL is {kl_own:,.3g} (normally below 0.1)")
            strong = True
        if fmt is not None and self.best_format >= FORMAT_MIN_BEST and fmt <= FORMAT_FLOOR * self.best_format:
            signs.append(f"format {self.best_format:.0%} -> {fmt:.0%}")
        if length is not None and self.first_length is not None:
            if length >= LENGTH_CEILING * limit and self.first_length < LENGTH_WAS * limit:
                signs.append(f"answers run to the limit ({length:.0f} of {limit} tokens, were {self.first_length:.0f})")
            elif self.first_length >= 10 and length <= LENGTH_SHRUNK * self.first_length:
                signs.append(f"answers shrank to {length:.0f} tokens (were {self.first_length:.0f})")
        if fmt is not None:
            self.best_format = max(self.best_format, fmt)
        if length is not None and self.first_length is None:
            self.first_length = length
        if not (strong or len(signs) >= 2):
            self.diverging_since = None
            return None
        if self.diverging_since is None:
            self.diverging_since = record.get("round")
        return (f"training is diverging since round {self.diverging_since}: {', '.join(signs)}; "
                f"{learning_rate_advice(self.cfg)}")

    def is_new(self, message: str | None) -> bool:
        """Whether the log should say it (once per episode, not every round)."""
        episode = None if message is None else self.diverging_since
        new = message is not None and episode != self._said
        self._said = episode
        return new
