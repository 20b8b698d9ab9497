"""jsonl: your own dataset, a JSON Lines file of questions and answers.

Each line is a JSON object with a question and an answer field (names configurable). The
answer is graded by a choice of rule: ``math`` (math-verify equivalence, as gsm8k / math500),
``exact`` (the same text, whitespace runs collapsed; ``ignore_case`` optional) or ``regex``
(the answer field is a Python regular expression the whole answer must match). The eval split
is a second file (``eval_path``) or a fixed random ``eval_fraction`` of the lines.

The task's identity hashes the files' bytes, the field names, the rule and the split:
prompt ids are ``jsonl/<key>/<train|eval>/<record index>`` and the relay tag ``jsonl/<key>``,
so a peer whose file differs by one byte neither receives this node's rollouts nor can
make it rebuild a prompt.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
import re
from pathlib import Path
from typing import Iterator

from .base import Prompt, Task, TaskError, shuffled_stream
from .gym import SYSTEM_PROMPT
from .unseen import question_key

GRADES = ("math", "exact", "regex")
log = logging.getLogger(__name__)


MAX_SHOWN = 10            # bad lines named one by one; the rest are counted


def _records(path: Path, question_field: str, answer_field: str, grade: str,
             ignore_case: bool) -> list[tuple[str, str]]:
    """(question, reference) per record. The whole file is checked first: a TaskError names
    every bad line in file order (the first MAX_SHOWN, then a count), with the column of broken JSON."""
    out, bad = [], []
    flags = re.IGNORECASE if ignore_case else 0
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not UTF-8 text ({e.reason})") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        problem = _line_problem(line, question_field, answer_field, grade, flags)
        if isinstance(problem, str):
            bad.append((lineno, problem))
        else:
            out.append(problem)
    hint = _field_hint(lines, bad, question_field, answer_field)
    if hint:
        raise TaskError(f"{path}: {hint}")
    if len(bad) == 1:
        raise TaskError(f"{path}:{bad[0][0]}: {bad[0][1]}")
    if bad:
        more = f"; and {len(bad) - MAX_SHOWN} more" if len(bad) > MAX_SHOWN else ""
        raise TaskError(f"{path}: {len(bad)} bad lines of {len(out) + len(bad)} — "
                        + "; ".join(f"line {n}: {why}" for n, why in bad[:MAX_SHOWN]) + more)
    if not out:
        raise TaskError(f"{path}: no records")
    return out


def _field_hint(lines: list[str], bad: list[tuple[int, str]], question_field: str, answer_field: str) -> str | None:
    """When no line has the configured field names, the file uses others: one line that names the
    fields it has and the settings that choose them (task.question_field / task.answer_field),
    instead of the same complaint once per line."""
    if not bad or len(bad) < sum(1 for ln in lines if ln.strip()) or \
            not all(why.startswith(("missing text field", "missing answer field")) for _, why in bad):
        return None
    first = next(n for n, _ in bad)
    try:
        record = json.loads(lines[first - 1])
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict):
        return None
    has = ", ".join(repr(k) for k in list(record)[:8]) or "none"
    wanted = [(key, name) for key, name in (("task.question_field", question_field), ("task.answer_field", answer_field))
              if name not in record]
    if not wanted:
        return None
    said = " and ".join(f"{name!r}" for _, name in wanted)
    keys = " and ".join(f"{key} = \"…\"" for key, _ in wanted)
    return (f"every line ({len(bad)}) misses a field it needs: line {first} has {has}, not {said}; "
            f"name the fields your file uses with {keys} in the [task] section")


def _line_problem(line: str, question_field: str, answer_field: str, grade: str, flags: int):
    """(question, answer) of one line, or what is wrong with it (a str)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return f"not valid JSON at column {e.colno} ({e.msg})"
    if not isinstance(record, dict):
        return "expected a JSON object"
    question, answer = record.get(question_field), record.get(answer_field)
    if not isinstance(question, str) or not question.strip():
        return f"missing text field {question_field!r}"
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        return f"missing answer field {answer_field!r} (text or number)"
    if grade == "regex":
        try:
            re.compile(answer, flags)
        except re.error as e:
            return f"{answer_field!r} is not a regular expression ({e})"
    if grade == "math" and not _looks_mathematical(answer):
        return (f"{answer_field} {answer.strip()[:40]!r} is not a number or math expression "
                f"(grade = \"math\" compares values; grade = \"exact\" compares text)")
    return question.strip(), answer.strip()


def _looks_mathematical(answer: str) -> bool:
    """A number, LaTeX, or a short symbol ("x", "\\pi", "(a,b)"): not words ("ten pens"), which
    math grading can never match, so every completion would score 0 and nothing be learnt."""
    if re.search(r"[0-9\\]", answer):
        return True
    return not re.search(r"[A-Za-z]{3,}", answer)


class JsonlTask(Task):
    """Questions and answers from your own JSON Lines file (see the module docstring)."""

    name = "jsonl"

    def __init__(self, path=None, eval_path=None, eval_fraction: float = 0.1, question_field: str = "question",
                 answer_field: str = "answer", grade: str = "math", ignore_case: bool = False,
                 system_prompt: str | None = None, **options):
        super().__init__(system_prompt=SYSTEM_PROMPT if system_prompt is None else system_prompt, **options)
        if not path:
            raise TaskError("jsonl: set task.path to your JSON Lines file")
        if grade not in GRADES:
            raise TaskError(f"jsonl: grade must be one of {', '.join(GRADES)}, got {grade!r}")
        if isinstance(eval_fraction, bool) or not isinstance(eval_fraction, (int, float)) \
                or not 0.0 <= eval_fraction < 1.0:
            raise TaskError(f"jsonl: eval_fraction must be in [0, 1), got {eval_fraction!r}")
        for key, value in (("question_field", question_field), ("answer_field", answer_field)):
            if not isinstance(value, str) or not value:
                raise TaskError(f"jsonl: {key} must be a field name, got {value!r}")
        files = [Path(path).expanduser()] + ([Path(eval_path).expanduser()] if eval_path else [])
        digest = hashlib.sha256()
        for f in files:
            if not f.is_file():
                raise TaskError(f"jsonl: {f}: no such file")
            digest.update(hashlib.sha256(f.read_bytes()).digest())
        fields = (question_field, answer_field, grade, bool(ignore_case))
        train = _records(files[0], *fields)
        if eval_path:
            held = _records(files[1], *fields)
            split = "file"
        else:
            k = round(len(train) * eval_fraction)
            split = f"fraction={eval_fraction!r}"
            if k == 0 and eval_fraction > 0:
                k = 1 if len(train) > 1 else 0
            picked = set(random.Random(f"jsonl:{digest.hexdigest()}").sample(range(len(train)), k))
            held = [train[i] for i in sorted(picked)]
            train = [r for i, r in enumerate(train) if i not in picked]
            if not train:
                raise TaskError(f"jsonl: {files[0]}: no records left for training after the eval split")
        # held out means unseen: a training line that repeats an eval question is not trained on
        held_keys = {question_key(q) for q, _ in held}
        repeats = sum(1 for q, _ in train if question_key(q) in held_keys)
        train = [r for r in train if question_key(r[0]) not in held_keys]
        if not train:
            raise TaskError(f"jsonl: {files[0]}: every training line repeats a held-out question")
        where = f"{files[1]} (eval_path)" if eval_path else f"eval_fraction = {eval_fraction:g}"
        self.split_summary = (f"jsonl: {files[0]}: {len(train)} lines for training, {len(held)} held out "
                              f"({where})" + (f"; {repeats} training lines repeat a held-out question "
                                              f"and are left out" if repeats else ""))
        log.info("%s", self.split_summary)
        digest.update(json.dumps([question_field, answer_field, grade, bool(ignore_case), split]).encode())
        self.key = digest.hexdigest()[:12]
        self.tag = f"jsonl/{self.key}"
        self.grade = grade
        self.splits = {s: [Prompt(id=f"{self.tag}/{s}/{i}", question=q, reference=a, meta={"split": s})
                           for i, (q, a) in enumerate(rows)] for s, rows in (("train", train), ("eval", held))}
        self.reward_settings = dataclasses.replace(self.reward_settings, rule=grade, ignore_case=bool(ignore_case),
                                                   max_answer_chars=self.reward_settings.max_answer_chars
                                                   if grade == "math" else 1000)
        if grade == "regex":
            from .grader import get_grader, rule_setup
            get_grader(rule_setup(self.reward_settings))    # warm_up() starts its workers too

    @property
    def tags(self) -> tuple[str, ...]:
        return (self.tag,)

    def tag_of(self, prompt_id: str) -> str | None:
        return self.tag if isinstance(prompt_id, str) and prompt_id.startswith(self.tag + "/") else None

    def get(self, prompt_id: str) -> Prompt:
        m = re.fullmatch(rf"{re.escape(self.tag)}/(train|eval)/(\d{{1,9}})", prompt_id) \
            if isinstance(prompt_id, str) else None
        if not m:
            raise TaskError(f"jsonl: bad prompt id {prompt_id!r} (expected {self.tag}/<train|eval>/<index>)")
        rows = self.splits[m.group(1)]
        if int(m.group(2)) >= len(rows):
            raise TaskError(f"jsonl: prompt id {prompt_id!r} is past the end of the {m.group(1)} split")
        return rows[int(m.group(2))]

    def is_trainable(self, prompt_id: str) -> bool:
        return self.tag_of(prompt_id) is not None and prompt_id.startswith(f"{self.tag}/train/")

    def prompts(self, seed: int = 0, start: int = 0) -> Iterator[Prompt]:
        return shuffled_stream(self.splits["train"], self.tag, seed, start)

    def eval_prompts(self, limit: int | None = None) -> list[Prompt]:
        rows = self.splits["eval"]
        return rows if limit is None else rows[: max(0, int(limit))]
