"""Which task a name means: the built-in ones, a reasoning-gym mix, your JSONL file, or your own class.

A task name is one of
  * a built-in name: ``arith``, ``gsm8k``, ``math500``, ``reasoning_gym``, ``jsonl``;
  * ``reasoning_gym:<dataset>,<dataset>`` — a mix at the datasets' easiest settings (handy for
    ``ftis-edge eval``);
  * a dotted path ``package.module:ClassName`` to a ``Task`` subclass (your own code, imported
    from ``sys.path``: PYTHONPATH or installed; never the current directory, see child.py);
  * the name of an entry point in the group ``ftis_edge.tasks`` (an installed package's tasks);
  * a JSON object ``{"name": …, "options": {…}}`` (``task_spec``: how export hands a node's
    whole task section to ``ftis-edge eval``).
Only the node's own config or command line names a task; a peer only ever sends prompt ids.
Whether a string can name a task is ``common/task_names.py`` (config validation asks it without
importing the task package and its grader).
"""
from __future__ import annotations

import importlib
import json

from ..common.task_names import BUILTIN, DOTTED, ENTRY_POINT_GROUP, entry_point, name_problem
from .base import Task, TaskError

__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "get_task", "name_problem", "task_class", "task_from_config",
           "task_options", "task_spec"]


def _builtin(name: str) -> type:
    if name == "arith":
        from .arith import ArithTask
        return ArithTask
    if name == "gsm8k":
        from .datasets import GSM8KTask
        return GSM8KTask
    if name == "math500":
        from .datasets import Math500Task
        return Math500Task
    if name == "reasoning_gym":
        from .gym import ReasoningGymTask
        return ReasoningGymTask
    from .jsonl_task import JsonlTask
    return JsonlTask


def task_class(name: str) -> type:
    """The Task subclass ``name`` means (imports a dotted path or an entry point)."""
    problem = name_problem(name)
    if problem:
        raise TaskError(problem)
    if name in BUILTIN:
        return _builtin(name)
    ep = None if DOTTED.fullmatch(name) else entry_point(name)
    try:
        if ep is not None:
            cls = ep.load()
        else:
            module, _, attr = name.partition(":")
            cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise TaskError(f"task {name!r}: cannot load it ({type(e).__name__}: {e})") from None
    except Exception as e:          # noqa: BLE001 - the user's module failed while importing
        raise TaskError(f"task {name!r}: importing it failed ({type(e).__name__}: {e})") from None
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TaskError(f"task {name!r} is not a subclass of ftis_edge.tasks.Task")
    return cls


def get_task(name: str, **options) -> Task:
    """Build a task by name (see the module docstring) with its options.

    Common options: system_prompt, few_shot (worked examples, 0-2, default 2), reward
    ("binary" | "shaped"), require_think, timeout_s, format_reward. arith: level. gsm8k: path,
    split. math500: path. reasoning_gym: datasets. jsonl: path, eval_path, eval_fraction,
    question_field, answer_field, grade, ignore_case. Raises TaskError with a readable reason.
    """
    if isinstance(name, str) and name.startswith("{"):
        try:
            spec = json.loads(name)
            name, options = spec["name"], {**spec.get("options", {}), **options}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise TaskError(f"task spec {name[:80]!r}: expected JSON {{\"name\": …, \"options\": {{…}}}}") from None
    if isinstance(name, str) and name.startswith("reasoning_gym:"):
        name, options = "reasoning_gym", {"datasets": name.split(":", 1)[1], **options}
    cls = task_class(name)
    try:
        return cls(**options)
    except TypeError as e:          # an option the task does not take
        raise TaskError(f"task {name!r}: {e}") from None


def task_options(section) -> dict:
    """The options a node's [task] section gives its task (config.TaskSection)."""
    name = section.name
    options = {"reward": section.reward, "timeout_s": section.reward_timeout_s,
               "few_shot": section.few_shot, "require_think": section.require_think}
    if name == "arith" and section.level:
        options["level"] = list(section.level)
    if name in ("gsm8k", "math500", "jsonl") and section.path:
        options["path"] = section.path
    if name == "reasoning_gym":
        options["datasets"] = section.datasets
    if name == "jsonl":
        options.update(eval_path=section.eval_path or None, eval_fraction=section.eval_fraction,
                       question_field=section.question_field, answer_field=section.answer_field,
                       grade=section.grade, ignore_case=section.ignore_case)
    options.update(section.options)     # a custom task's own settings (or overrides)
    return options


def task_from_config(section) -> Task:
    return get_task(section.name, **task_options(section))


def task_spec(section) -> str:
    """The whole [task] section as one task name (``ftis-edge eval --task`` takes it); the
    classic tasks keep their plain name (eval's --level / --path carry their options)."""
    if section.name in ("arith", "gsm8k", "math500"):
        return section.name
    options = {k: v for k, v in task_options(section).items()
               if k not in ("reward", "timeout_s", "few_shot", "require_think")}
    if not options:
        return section.name
    return json.dumps({"name": section.name, "options": options}, sort_keys=True)
