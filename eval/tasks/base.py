"""The shape every evaluation task shares: examples, the Task record, file/Hub loading, sampling.

A task turns dataset rows into chat prompts (`TaskExample.messages`, ready for the target's chat
template) and scores one generated text against the example's reference.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distill.common.datafiles import check_rows, hub_rows, read_rows

Message = dict[str, str]


@dataclass(frozen=True)
class TaskExample:
    """One prompt to generate from, and what its generation is scored against."""

    id: str
    messages: list[Message]
    reference: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    """A named evaluation task: how to load its examples and how to score a prediction.

    `scores` returns every metric the task reports; `metric_name` names the primary one, which
    `score` returns alone.
    """

    name: str
    metric_name: str
    default_num_samples: int
    max_new_tokens: int
    load: Callable[..., list[TaskExample]]
    scores: Callable[[str, TaskExample], dict[str, float]]
    drawn: str = "the first {n} of a shuffle seeded {seed}"  # how `load` draws n prompts, as reports describe it

    def score(self, prediction: str, example: TaskExample) -> float:
        """The primary metric of `prediction` for `example`."""
        return self.scores(prediction, example)[self.metric_name]


def load_rows(
    hub_id: str,
    config: str | None,
    split: str,
    data_file: str | Path | None,
    check: Callable[[dict[str, Any]], str | None],
) -> list[dict[str, Any]]:
    """Rows from `data_file` (JSONL, JSON or Parquet) when given, else `hub_id`/`config`/`split`, each
    checked by `check` (the problem with a row, or None): a bad row, or a line that is not JSON, is a
    DataFileError `FILE:LINE: problem`. A local file is one split, so `split` applies to the Hub only."""
    rows = hub_rows(hub_id, config, split) if data_file is None else read_rows(data_file)
    check_rows(rows, check)
    return [row for _, row in rows]


def check_num_samples(num_samples: int | None) -> None:
    """Refuse a sample count that is not a positive integer (None means every row)."""
    if num_samples is not None and (not isinstance(num_samples, int) or num_samples < 1):
        raise ValueError(f"num_samples must be a positive integer or None (all rows), got {num_samples!r}")


def sample_indices(total: int, num_samples: int | None, seed: int) -> list[int]:
    """The first `num_samples` rows of one seeded shuffle of the data, in the order drawn, so the
    samples of one seed are nested: 8 prompts are the first 8 of 30 (the runs of one study share
    prompts). All rows, in dataset order, when `num_samples` covers them."""
    check_num_samples(num_samples)
    if num_samples is None or num_samples >= total:
        return list(range(total))
    order = list(range(total))
    random.Random(seed).shuffle(order)
    return order[:num_samples]
