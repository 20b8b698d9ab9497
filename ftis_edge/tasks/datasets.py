"""GSM8K (training) and MATH-500 (out-of-distribution eval) from JSON Lines or the HF hub.

Where the data comes from, in order: the ``path`` option; ``<data>/gsm8k/<split>.jsonl`` or
``<data>/math500/test.jsonl`` (``ftis_edge.common.paths.shared_data_dir()``: ``$FTIS_SHARED/data``,
else the folder ``./install.sh --data`` fills); the HF dataset (``openai/gsm8k``, ``HuggingFaceH4/MATH-500``) when the
``datasets`` package is installed and the hub is reachable. Prompt ids are
``<task>/<split>/<line index>``, so a peer rebuilds a prompt from its own copy.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterator

from ..common import install_hint
from ..common.paths import shared_data_dir
from .base import Prompt, Task, TaskError, shuffled_stream
from .unseen import EvalTexts


def gsm8k_reference(answer: str) -> str:
    """The final answer of a GSM8K solution: the text after ``####``, thousands commas removed."""
    if "####" not in answer:
        raise ValueError("no '####' final answer")
    ref = answer.split("####")[-1].strip().replace(",", "")
    if not ref:
        raise ValueError("empty final answer after '####'")
    return ref


def read_jsonl(path: str | os.PathLike, fields: tuple[str, ...]) -> list[tuple[int, dict]]:
    """(line number, record) for each non-blank line; TaskError naming file and line otherwise."""
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"{path}: no such file")
    rows = []
    try:
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise TaskError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
                if not isinstance(record, dict):
                    raise TaskError(f"{path}:{lineno}: expected a JSON object")
                for f in fields:
                    if not isinstance(record.get(f), str):
                        raise TaskError(f"{path}:{lineno}: missing text field {f!r}")
                rows.append((lineno, record))
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not UTF-8 text ({e.reason})") from None
    if not rows:
        raise TaskError(f"{path}: no records")
    return rows


def load_hf(dataset: str, config: str | None, split: str, task: str) -> list[dict]:
    """Rows of a hub dataset, or a TaskError saying how to run offline."""
    try:
        import datasets  # noqa: F401 - optional dependency
    except ImportError:
        raise TaskError(f"{task}: no local data; run ./install.sh --data once (it installs the missing datasets "
                        f"package, {install_hint.command('datasets')}, and downloads GSM8K and MATH-500), "
                        f"or pass a JSON Lines file (task.path / --path), or set FTIS_SHARED") from None
    from ..common import hub
    if hub.offline_env() or not hub.reachable():  # not five noisy retries before the same answer
        raise TaskError(f"{task}: no local data and the HF hub is unreachable; run ./install.sh --data once "
                        f"while online, or pass a JSON Lines file (task.path / --path), or set FTIS_SHARED")
    try:
        ds = datasets.load_dataset(dataset, config, split=split) if config else \
            datasets.load_dataset(dataset, split=split)
    except Exception as e:                      # noqa: BLE001 - unknown split, hub errors, ...
        raise TaskError(f"{task}: could not load {dataset} split {split!r} from the hub "
                        f"({type(e).__name__}: {str(e)[:200]}); pass a JSON Lines file (task.path / --path)") from None
    return [dict(row) for row in ds]


class DatasetTask(Task):
    """Prompts from fixed dataset splits, loaded on first use and kept in memory."""

    name = "dataset"
    folder = ""                                 # subfolder of the shared data dir
    fields: tuple[str, ...] = ()                # text fields every record must have
    splits: tuple[str, ...] = ()
    train_split = "train"
    eval_split = "test"

    def __init__(self, path: str | os.PathLike | None = None, split: str | None = None,
                 **options):
        super().__init__(**options)
        split = split or self.train_split
        if split not in self.splits:
            raise TaskError(f"{self.name}: unknown split {split!r}; choose one of {', '.join(self.splits)}")
        self.split = split
        self._files: dict[str, Path] = {}
        if path is not None:
            path = Path(path).expanduser()
            if not path.is_file():
                raise TaskError(f"{self.name}: {path}: no such file")
            self._files[split] = path
            for other in self.splits:           # the sibling split beside it, for eval / ids
                sibling = path.with_name(f"{other}.jsonl")
                if other != split and sibling.is_file():
                    self._files[other] = sibling
        else:
            shared = shared_data_dir()
            for s in self.splits:
                if shared is not None and (shared / self.folder / f"{s}.jsonl").is_file():
                    self._files[s] = shared / self.folder / f"{s}.jsonl"
        self._use_hub = path is None and not self._files
        self._cache: dict[str, list[Prompt]] = {}
        self._training: list[Prompt] | None = None
        self._eval_texts = EvalTexts(lambda: [p.question for p in self.eval_prompts()])
        self.split_prompts(self.split)          # fail now, not in the middle of a run

    def _from_record(self, record: dict, split: str, index: int) -> Prompt:
        raise NotImplementedError

    def _hub_rows(self, split: str) -> list[dict]:
        raise NotImplementedError

    def split_prompts(self, split: str) -> list[Prompt]:
        """All prompts of one split, in file order."""
        if split in self._cache:
            return self._cache[split]
        if split in self._files:
            path = self._files[split]
            prompts = []
            for index, (lineno, record) in enumerate(read_jsonl(path, self.fields)):
                try:
                    prompts.append(self._from_record(record, split, index))
                except ValueError as e:
                    raise TaskError(f"{path}:{lineno}: {e}") from None
        elif self._use_hub:
            rows = self._hub_rows(split)
            try:
                prompts = [self._from_record(r, split, i) for i, r in enumerate(rows)]
            except (ValueError, KeyError, AttributeError) as e:
                raise TaskError(f"{self.name}: unexpected hub record ({e})") from None
        else:
            have = ", ".join(str(p) for p in self._files.values())
            raise TaskError(f"{self.name}: no {split!r} split beside {have}; "
                            f"expected {split}.jsonl in the same folder")
        self._cache[split] = prompts
        return prompts

    def _parse_id(self, prompt_id) -> re.Match | None:
        return re.fullmatch(rf"{self.name}/([a-z]+)/(\d{{1,9}})", prompt_id) \
            if isinstance(prompt_id, str) else None

    def is_trainable(self, prompt_id: str) -> bool:
        """Every split but the held-out eval split. A node that trains on the eval split itself
        (math500, or gsm8k with split="test") holds nothing out, so its own split stays trainable."""
        m = self._parse_id(prompt_id)
        if not m or m.group(1) not in self.splits:
            return False
        if self._holds_out():
            if m.group(1) == self.eval_split:
                return False
            try:
                return self.get(prompt_id).question not in self._eval_texts
            except TaskError:
                return False
        return True

    def _holds_out(self) -> bool:
        """Is there an eval split apart from the one trained on?"""
        return self.split != self.eval_split and (self.eval_split in self._files or self._use_hub)

    def training_prompts(self) -> list[Prompt]:
        """The trained split less any question that is also an eval question (GSM8K repeats a
        few across train and test): held out means unseen."""
        if self._training is None:
            prompts = self.split_prompts(self.split)
            self._training = [p for p in prompts if p.question not in self._eval_texts] \
                if self._holds_out() else prompts
        return self._training

    def get(self, prompt_id: str) -> Prompt:
        m = self._parse_id(prompt_id)
        if not m or m.group(1) not in self.splits:
            raise TaskError(f"{self.name}: bad prompt id {prompt_id!r} "
                            f"(expected {self.name}/<{'|'.join(self.splits)}>/<index>)")
        prompts = self.split_prompts(m.group(1))
        index = int(m.group(2))
        if index >= len(prompts):
            raise TaskError(f"{self.name}: prompt id {prompt_id!r} is past the end "
                            f"of the {m.group(1)} split ({len(prompts)} prompts)")
        return prompts[index]

    def prompts(self, seed: int = 0, start: int = 0) -> Iterator[Prompt]:
        return shuffled_stream(self.training_prompts(), self.name, seed, start)

    def eval_prompts(self, limit: int | None = None) -> list[Prompt]:
        """The eval split (the task's own split when only that one is available), file order."""
        split = self.eval_split if (self.eval_split in self._files or self._use_hub) else self.split
        prompts = self.split_prompts(split)
        return prompts if limit is None else prompts[: max(0, int(limit))]


class GSM8KTask(DatasetTask):
    """Grade-school math word problems; the reference is the integer after ``####``."""

    name = "gsm8k"
    folder = "gsm8k"
    splits = ("train", "test")
    fields = ("question", "answer")

    def _from_record(self, record: dict, split: str, index: int) -> Prompt:
        return Prompt(id=f"gsm8k/{split}/{index}", question=record["question"].strip(),
                      reference=gsm8k_reference(record["answer"]), meta={"split": split})

    def _hub_rows(self, split: str) -> list[dict]:
        return load_hf("openai/gsm8k", "main", split, self.name)


class Math500Task(DatasetTask):
    """The 500-problem MATH test subset; the reference is the ``answer`` field (LaTeX)."""

    name = "math500"
    folder = "math500"
    splits = ("test",)
    train_split = "test"
    fields = ("problem", "answer")

    def _from_record(self, record: dict, split: str, index: int) -> Prompt:
        answer = record["answer"].strip()
        if not answer:
            raise ValueError("empty 'answer'")
        meta = {k: record[k] for k in ("subject", "level", "unique_id") if k in record}
        return Prompt(id=f"math500/{split}/{index}", question=record["problem"].strip(),
                      reference=answer, meta=meta)

    def _hub_rows(self, split: str) -> list[dict]:
        return load_hf("HuggingFaceH4/MATH-500", None, split, self.name)

