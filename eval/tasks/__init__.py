"""GSM8K, MMLU and CNN/DailyMail: prompts, answer extraction and metrics, by name."""

from __future__ import annotations

from . import cnndm, gsm8k, mmlu
from .base import Task, TaskExample

TASKS: dict[str, Task] = {task.name: task for task in (gsm8k.TASK, mmlu.TASK, cnndm.TASK)}


def get_task(name: str) -> Task:
    """The registered task called `name`; an unknown name is an error listing the valid ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)}") from None


__all__ = ["TASKS", "Task", "TaskExample", "get_task", "cnndm", "gsm8k", "mmlu"]
