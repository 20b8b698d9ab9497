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
import hashlib
import io
import json
import random
from typing import Iterator

from .base import Prompt, Task, TaskError

# Datasets whose items differ between processes (they depend on PYTHONHASHSEED: set order),
# measured with tests/test_gym.py::test_items_are_the_same_in_another_process over every
# dataset of reasoning-gym 0.1.25: a peer could not rebuild their prompts. "composite" mixes
# datasets itself (this task does the mixing).
NOT_REPRODUCIBLE = frozenset({"isomorphic_strings", "knight_swap", "list_functions",
                              "polynomial_multiplication", "ransom_note", "composite"})
DEFAULT_SIZE = 10_000          # training items per dataset (some datasets precompute `size` items)
DEFAULT_EVAL_SIZE = 50         # held-out items per dataset, after the training range
RESERVED = ("weight", "level", "size", "eval_size")   # ours; every other key goes to the dataset's config
SYSTEM_PROMPT = (
    "You are a helpful assistant that solves problems. "
    "Think about the problem inside <think> </think> tags, "
    "then give only the final answer inside <answer> </answer> tags."
)
MAX_TAGS_BYTES = 3000         # the tags ride in the relay's SUB frame (4096 bytes of JSON)
MAX_ANSWER_CHARS = 4000        # grids and lists are long; the grader's budget bounds the rest


def library():
    """The reasoning_gym package, or a TaskError saying how to get it."""
    try:
        import reasoning_gym  # noqa: F401 - a dependency of ftis-edge (pyproject)
        from reasoning_gym import factory
    except ImportError as e:
        raise TaskError(f"reasoning_gym: the reasoning-gym package is not installed ({e}); "
                        f"pip install reasoning-gym") from None
    return factory


def library_version() -> str:
    from importlib.metadata import version
    return version("reasoning-gym")


def dataset_names() -> list[str]:
    """Every dataset this task can use (the library's, less the irreproducible ones)."""
    return sorted(set(library().DATASETS) - NOT_REPRODUCIBLE)


@dataclasses.dataclass(frozen=True)
class Source:
    """One dataset of the mix, fully specified: everything a grader worker needs to rebuild items."""
    dataset: str
    settings: dict          # the user's settings (JSON-able), less weight
    weight: float
    size: int
    eval_size: int
    key: str                # hash of the full config + library version

    @property
    def tag(self) -> str:
        return f"rg/{self.dataset}/{self.key}"


def build_config(dataset: str, settings: dict):
    """The dataset's config object: the curriculum at ``level`` (0 = easiest) when the dataset has
    one, then the user's fields; ``seed`` defaults to 0 and ``size`` covers train + eval."""
    factory = library()
    if dataset not in factory.DATASETS:
        raise TaskError(f"reasoning_gym: unknown dataset {dataset!r} "
                        f"(see docs/tasks.md or reasoning_gym.factory.DATASETS)")
    if dataset in NOT_REPRODUCIBLE:
        raise TaskError(f"reasoning_gym: dataset {dataset!r} is not reproducible across machines "
                        f"(its items depend on Python's hash seed), so peers could not re-grade it")
    config_cls = factory.DATASETS[dataset][1]
    names = {f.name for f in dataclasses.fields(config_cls)}
    fields = {k: v for k, v in settings.items() if k not in RESERVED}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise TaskError(f"reasoning_gym: {dataset} has no setting {unknown[0]!r}; "
                        f"its settings: {', '.join(sorted(names - {'seed', 'size'}))}")
    size = int(settings.get("size", DEFAULT_SIZE)) + int(settings.get("eval_size", DEFAULT_EVAL_SIZE))
    base = {"seed": fields.pop("seed", 0), "size": size}
    level = settings.get("level", 0)
    try:
        if factory.has_curriculum(dataset):
            curriculum = factory.create_curriculum(dataset)
            curriculum.set_global_level(int(level))
            config = curriculum.generate_configuration(base)
            config = dataclasses.replace(config, **fields)
        else:
            config = config_cls(**base, **fields)
        if hasattr(config, "validate"):
            config.validate()
    except (AssertionError, ValueError, TypeError, KeyError) as e:
        raise TaskError(f"reasoning_gym: {dataset}: bad settings ({type(e).__name__}: {e})") from None
    return config


def build_dataset(source: Source):
    factory = library()
    config = build_config(source.dataset, source.settings)
    try:
        with contextlib.redirect_stdout(io.StringIO()):    # some print progress dots on stdout
            return factory.DATASETS[source.dataset][0](config=config)
    except Exception as e:      # noqa: BLE001 - the library's own checks (e.g. size too large)
        raise TaskError(f"reasoning_gym: {source.dataset}: {type(e).__name__}: {e}") from None


def _settings_of(value, dataset: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TaskError(f"reasoning_gym: settings of {dataset} must be a table, got {value!r}")
    for k in ("size", "eval_size", "level"):
        v = value.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < (1 if k == "size" else 0)):
            raise TaskError(f"reasoning_gym: {dataset}.{k} must be a non-negative integer, got {v!r}")
    w = value.get("weight", 1.0)
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0:
        raise TaskError(f"reasoning_gym: {dataset}.weight must be a positive number, got {w!r}")
    return dict(value)


def parse_datasets(datasets) -> dict[str, dict]:
    """``datasets`` as a user gives it: "a,b", ["a", "b"] or {"a": {weight, level, ...}, "b": {}}."""
    if isinstance(datasets, str):
        datasets = [d for d in (p.strip() for p in datasets.split(",")) if d]
    if isinstance(datasets, (list, tuple)):
        if not all(isinstance(d, str) for d in datasets):
            raise TaskError(f"reasoning_gym: datasets must be names, got {datasets!r}")
        datasets = {d: {} for d in datasets}
    if not isinstance(datasets, dict) or not datasets:
        raise TaskError("reasoning_gym: name at least one dataset (task.datasets), e.g. "
                        "datasets = { basic_arithmetic = {}, chain_sum = { weight = 2 } }")
    return {name: _settings_of(value, name) for name, value in datasets.items()}


def make_source(dataset: str, settings: dict, version: str) -> Source:
    config = build_config(dataset, settings)
    full = json.dumps({"dataset": dataset, "config": dataclasses.asdict(config), "version": version},
                      sort_keys=True, default=str)
    key = hashlib.sha256(full.encode()).hexdigest()[:10]
    user = {k: v for k, v in settings.items() if k != "weight"}
    return Source(dataset, user, float(settings.get("weight", 1.0)),
                  int(settings.get("size", DEFAULT_SIZE)), int(settings.get("eval_size", DEFAULT_EVAL_SIZE)), key)


def worker_setup(sources) -> str:
    """What a grader worker prepares: every source's dataset, by its tag."""
    return json.dumps({"rule": "reasoning_gym", "sources": [
        {"dataset": s.dataset, "settings": s.settings, "size": s.size, "eval_size": s.eval_size, "key": s.key}
        for s in sources]}, sort_keys=True)


def parse_id(prompt_id) -> tuple[str, int] | None:
    """(tag, index) of ``rg/<dataset>/<key>/<index>``, or None."""
    if not isinstance(prompt_id, str) or len(prompt_id) > 200:
        return None
    tag, _, index = prompt_id.rpartition("/")
    if not tag.startswith("rg/") or not index.isdigit() or len(index) > 12:
        return None
    return tag, int(index)


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
        return source is not None and parsed[1] < source.size

    def prompts(self, seed: int = 0, start: int = 0) -> Iterator[Prompt]:
        weights = [s.weight for s in self.sources]
        i = max(0, int(start))
        while True:
            rng = random.Random(f"rg:{seed}:{i}")
            source = rng.choices(self.sources, weights)[0]
            yield self._item(source, rng.randrange(source.size))
            i += 1

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
