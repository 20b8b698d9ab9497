"""One owner for each list: the lists other modules repeat are checked against the module that defines them.

Read from the source (AST), so a new refusal reason, a new objective option or a new end-of-turn
spelling added in one place and not the other fails here, not in a user's run.
"""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "ftis_edge"


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _str_consts(node) -> set[str]:
    """String constants directly in an expression (a tuple of them, or one)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


# ------------------------------------------------------------------ refusal reasons

def intake_reasons(path: Path = PKG / "peers" / "intake.py") -> set[str]:
    """Every reason intake.py can refuse a message for: string arguments of ``_refuse`` / ``reject``
    calls (also a ``getattr(error, "reason", DEFAULT)`` default), and the strings the check
    functions (``_check_*``, ``*_problem``) return."""
    found: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Call) and _call_name(node) in ("_refuse", "reject"):
            for arg in node.args[1:]:
                found |= _str_consts(arg)
                if isinstance(arg, ast.Call) and _call_name(arg) == "getattr" and len(arg.args) == 3:
                    found |= _str_consts(arg.args[2])
        if isinstance(node, ast.FunctionDef) and (node.name.startswith("_check") or node.name.endswith("_problem")):
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and ret.value is not None:
                    found |= _str_consts(ret.value)
    return found


def wire_error_reasons() -> set[str]:
    """The first argument of every ``WireError(...)`` in the package and ``PrefixError(...)`` in relay/protocol.py."""
    found: set[str] = set()
    files = list(PKG.rglob("*.py")) + [ROOT / "relay" / "protocol.py"]
    for path in files:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Call) and _call_name(node) in ("WireError", "PrefixError") and node.args:
                found |= _str_consts(node.args[0])
    return found


def test_the_reason_collectors_find_what_they_should():
    """The collectors themselves: the known reasons of each kind are found (an empty scan passes nothing)."""
    assert {"wrong_swarm", "quarantined", "grader_timeout", "token_text_mismatch", "bad_sampler",
            "unknown_prompt", "decode"} <= intake_reasons()
    assert {"sender_mismatch", "bad_header", "decompress", "bad_version"} <= wire_error_reasons()


def test_every_refusal_reason_the_intake_gives_is_listed():
    from ftis_edge.peers import intake
    from ftis_edge.rollout import wire
    listed = set(intake.REASONS) | set(wire.REASONS)
    assert intake_reasons() - listed == set(), "add these to intake.REASONS"
    assert wire_error_reasons() - set(wire.REASONS) == set(), "add these to wire.REASONS"


def test_a_new_unlisted_reason_is_caught(tmp_path):
    """The check fails for a reason added in code but not in the lists (what it exists for)."""
    from ftis_edge.peers import intake
    from ftis_edge.rollout import wire
    src = (PKG / "peers" / "intake.py").read_text().replace('self._refuse(sender, "quarantined")',
                                                  'self._refuse(sender, "brand_new_reason")', 1)
    (tmp_path / "intake.py").write_text(src)
    assert intake_reasons(tmp_path / "intake.py") - set(intake.REASONS) - set(wire.REASONS) == {"brand_new_reason"}


# ------------------------------------------------------------------ config choices

def _choices(section, name: str):
    return next(f for f in dataclasses.fields(section) if f.name == name).metadata["choices"]


def test_config_choices_are_those_of_the_modules_that_define_them():
    """The node file offers exactly what the objective, the learner, the tasks and the generators take.
    (config.py stays light: it cannot import torch to read objective.py, so this test holds them together.)"""
    from ftis_edge import config, tasks
    from ftis_edge.learn import objective
    from ftis_edge.generate.registry import BACKENDS
    from ftis_edge.tasks.rewards import REWARD_MODES
    assert tuple(_choices(config.TrainSection, "method")) == objective.METHODS
    assert tuple(_choices(config.TrainSection, "normalize")) == objective.NORMALIZE
    assert tuple(_choices(config.TrainSection, "advantage_scale")) == objective.ADVANTAGE_SCALES
    assert set(_choices(config.TrainSection, "cross_tokenizer_level")) == set(objective.LEVELS) - {"token"}
    assert tuple(_choices(config.TaskSection, "reward")) == REWARD_MODES
    assert tuple(_choices(config.ModelSection, "backend")) == ("auto", *BACKENDS)
    task_choices = _choices(config.TaskSection, "name")
    if task_choices is not None:                  # a closed list: the tasks registry's names
        assert tuple(task_choices) == tuple(tasks.TASK_NAMES)


def test_config_trainable_choices_are_what_the_learner_accepts():
    from ftis_edge import config
    from ftis_edge.learn.learner import TRAINABLE, Learner, LearnerError
    assert tuple(_choices(config.TrainSection, "trainable")) == TRAINABLE
    with pytest.raises(LearnerError, match="trainable"):
        Learner(None, trainable="half")             # refused before anything loads


# ------------------------------------------------------------------ end-of-turn spellings

def test_end_of_turn_texts_are_spelled_once():
    """turns.py holds them; no other module of the package spells the plain format's stop or
    repeats the list of end-of-turn tokens."""
    from ftis_edge.common import turns
    for path in PKG.rglob("*.py"):
        if path.name == "turns.py":
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Constant) and node.value == turns.PLAIN_TURN_STOP:
                pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno} spells PLAIN_TURN_STOP; import it from turns.py")
            if isinstance(node, (ast.Tuple, ast.List)):
                spelled = _str_consts(ast.Tuple(elts=node.elts)) & set(turns.END_OF_TURN_TEXTS)
                assert len(spelled) < 3, f"{path.relative_to(ROOT)}:{node.lineno} repeats turns.END_OF_TURN_TEXTS"


def test_the_reward_rule_and_the_generator_stop_at_the_same_markers():
    from ftis_edge.models import gguf_io, resolve as models
    from ftis_edge.common import turns
    from ftis_edge.export import _TEMPLATES
    from ftis_edge.tasks.rewards import END_TOKENS, check_format
    assert set(END_TOKENS) == set(turns.END_OF_TURN_TEXTS) | {turns.PLAIN_TURN_STOP}
    assert models.PLAIN_TURN_STOP is turns.PLAIN_TURN_STOP and gguf_io.END_OF_TURN_TEXTS is turns.END_OF_TURN_TEXTS
    assert _TEMPLATES["plain"][1] == [turns.PLAIN_TURN_STOP]
    for marker in END_TOKENS:
        assert check_format("<answer>4</answer>" + marker).ok, marker
