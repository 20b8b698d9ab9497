"""reasoning-gym datasets as reproducible sources: what a prompt id names, rebuilt the same on every machine.

The part of the reasoning_gym task that the grader worker needs too (gym_verify.py), kept
apart from the Task class so the worker's imports do not loop back through tasks.base.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json

from ..common import install_hint
from .errors import TaskError

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
        raise TaskError(f"{install_hint.missing('reasoning_gym', 'reasoning_gym')} ({e})") from None
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
