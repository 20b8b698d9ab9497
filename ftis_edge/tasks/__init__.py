"""Tasks: prompt streams with verifiable rewards. ``get_task(name, **options)`` is the entry point."""
from __future__ import annotations

from .base import DEFAULT_SYSTEM_PROMPT, Prompt, Task, TaskError
from .grader import warm_up
from .rewards import RewardSettings, check_format

__all__ = ["DEFAULT_SYSTEM_PROMPT", "Prompt", "RewardSettings", "Task", "TaskError",
           "TASK_NAMES", "check_format", "get_task", "warm_up"]

TASK_NAMES = ("arith", "gsm8k", "math500")


def get_task(name: str, **options) -> Task:
    """Build a task by name: ``arith`` (built-in, offline), ``gsm8k`` or ``math500``.

    Common options: system_prompt, few_shot (worked examples, 0-2, default 2), reward
    ("binary" | "shaped"), require_think, timeout_s, format_reward. arith: level (int, list of ints, or "1,2"). gsm8k: path, split. math500: path.
    Raises TaskError with a readable reason for an unknown name, bad option or missing data.
    """
    if name == "arith":
        from .arith import ArithTask
        factory = ArithTask
    elif name == "gsm8k":
        from .datasets import GSM8KTask
        factory = GSM8KTask
    elif name == "math500":
        from .datasets import Math500Task
        factory = Math500Task
    else:
        raise TaskError(f"unknown task {name!r}; choose one of {', '.join(TASK_NAMES)}")
    try:
        return factory(**options)
    except TypeError as e:        # an option the task does not take
        raise TaskError(f"task {name!r}: {e}") from None
