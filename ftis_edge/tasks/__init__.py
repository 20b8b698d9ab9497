"""Tasks: prompt streams with verifiable rewards. ``get_task(name, **options)`` is the entry point."""
from __future__ import annotations

from .base import DEFAULT_SYSTEM_PROMPT, Prompt, Task, TaskError
from .grader import warm_up
from .registry import BUILTIN as TASK_NAMES
from .registry import get_task, name_problem, task_from_config, task_spec
from .rewards import RewardSettings, check_format

__all__ = ["DEFAULT_SYSTEM_PROMPT", "Prompt", "RewardSettings", "Task", "TaskError",
           "TASK_NAMES", "check_format", "get_task", "name_problem", "task_from_config", "task_spec",
           "warm_up"]
