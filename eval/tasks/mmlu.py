"""MMLU: four-option questions over 57 subjects, scored by matching the predicted option letter.

The sample is stratified by subject (proportional, at least one per subject when the sample is
large enough). The prompt is 0-shot, or k-shot with k solved questions of the same subject as
earlier chat turns: from the Hub's dev split, or from the data file's other rows.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from pathlib import Path

import datasets

from .base import Task, TaskExample, check_num_samples, load_rows

HUB_ID = "cais/mmlu"
HUB_CONFIG = "all"
COLUMNS = ["question", "subject", "choices", "answer"]
DEFAULT_NUM_SAMPLES = 500
MAX_NEW_TOKENS = 16
METRIC_NAME = "accuracy"
LETTERS = "ABCD"

HEADER = "The following are multiple choice questions about {subject}. Answer with the letter (A, B, C or D) of the correct option."

# "The answer is (B)", "Answer: B", "answer is B." ...
_EXPLICIT = re.compile(r"(?i:answer)\s*(?:(?i:is)\s*)?:?\s*\(?([A-D])\b")
# The output opens with the letter: "B", "B.", "(B)", "B) Paris".
_LEADING = re.compile(r"\A\s*\(?([A-D])(?:[.:)\s]|$)")
_STANDALONE = re.compile(r"\b([A-D])\b")


def extract_letter(text: str) -> str | None:
    """The option letter a model answered: explicit "answer is X", a leading letter, else the
    first standalone A-D; None when there is none."""
    for pattern in (_EXPLICIT, _LEADING, _STANDALONE):
        match = pattern.search(text)
        if match:
            return match.group(1)
    return None


def allocate(counts: dict[str, int], num_samples: int, seed: int) -> dict[str, int]:
    """How many items to draw per subject: proportional to `counts` by largest remainder, at
    least one per subject when `num_samples` allows it, never more than a subject holds.

    With fewer samples than subjects, `seed` picks which subjects get one item each.
    """
    subjects = sorted(counts)
    total = sum(counts.values())
    if num_samples >= total:
        return dict(counts)
    if num_samples < len(subjects):
        chosen = random.Random(seed).sample(subjects, num_samples)
        return {s: int(s in chosen) for s in subjects}
    quota = {s: num_samples * counts[s] / total for s in subjects}
    alloc = {s: min(counts[s], max(1, int(quota[s]))) for s in subjects}
    while sum(alloc.values()) < num_samples:
        s = max((s for s in subjects if alloc[s] < counts[s]), key=lambda s: quota[s] - alloc[s])
        alloc[s] += 1
    while sum(alloc.values()) > num_samples:
        s = min((s for s in subjects if alloc[s] > 1), key=lambda s: quota[s] - alloc[s])
        alloc[s] -= 1
    return alloc


def stratified_indices(subjects: list[str], num_samples: int | None, seed: int) -> list[int]:
    """Row indices stratified by subject (see `allocate`), drawn with `seed`, in dataset order."""
    check_num_samples(num_samples)
    if num_samples is None or num_samples >= len(subjects):
        return list(range(len(subjects)))
    by_subject: dict[str, list[int]] = defaultdict(list)
    for index, subject in enumerate(subjects):
        by_subject[subject].append(index)
    alloc = allocate({s: len(rows) for s, rows in by_subject.items()}, num_samples, seed)
    rng = random.Random(seed)
    picked = [i for s in sorted(by_subject) for i in rng.sample(by_subject[s], alloc[s])]
    return sorted(picked)


def _answer_letter(row: dict) -> str:
    """The gold letter of a row whose `answer` is an index 0-3 (or already a letter)."""
    answer = row["answer"]
    if isinstance(answer, str) and answer.strip().upper() in LETTERS:
        return answer.strip().upper()
    if isinstance(answer, int) and 0 <= answer < len(LETTERS):
        return LETTERS[answer]
    raise ValueError(f"MMLU 'answer' must be an index 0-3 or a letter A-D, got {answer!r}")


def format_question(row: dict) -> str:
    """The question followed by its lettered options and "Answer:"."""
    if len(row["choices"]) != len(LETTERS):
        raise ValueError(f"MMLU rows need exactly 4 choices, got {len(row['choices'])}: {row['question'][:60]!r}")
    options = "\n".join(f"{letter}. {choice}" for letter, choice in zip(LETTERS, row["choices"]))
    return f"{row['question'].strip()}\n{options}\nAnswer:"


def build_messages(row: dict, shots: list[dict]) -> list[dict[str, str]]:
    """Chat turns: the subject header, then each shot as a user question and the assistant's
    letter, then the question to answer."""
    header = HEADER.format(subject=row["subject"].replace("_", " "))
    turns = [*shots, row]
    messages = []
    for i, turn in enumerate(turns):
        content = format_question(turn)
        messages.append({"role": "user", "content": f"{header}\n\n{content}" if i == 0 else content})
        if i < len(shots):
            messages.append({"role": "assistant", "content": _answer_letter(turn)})
    return messages


def load(
    data_file: str | Path | None = None,
    num_samples: int | None = DEFAULT_NUM_SAMPLES,
    seed: int = 0,
    split: str = "test",
    num_fewshot: int = 0,
) -> list[TaskExample]:
    """MMLU questions as chat prompts, stratified by subject; the reference is the gold letter.

    Reads `cais/mmlu` (all) or a local file with `question`, `subject`, `choices`, `answer`.
    Shots come from the Hub's dev split, or from the file's first other rows of the same subject.
    """
    if num_fewshot < 0:
        raise ValueError(f"num_fewshot must be 0 or more, got {num_fewshot}")
    ds = load_rows(HUB_ID, HUB_CONFIG, split, data_file, COLUMNS)
    subjects = list(ds["subject"])
    indices = stratified_indices(subjects, num_samples, seed)
    shot_pool = _shot_pool(ds if data_file is not None else None, num_fewshot)
    examples = []
    for index in indices:
        row = ds[index]
        own = index if data_file is not None else None
        candidates = [r for i, r in shot_pool.get(row["subject"], []) if i != own]
        if len(candidates) < num_fewshot:
            raise ValueError(
                f"MMLU subject {row['subject']!r} has {len(candidates)} other example(s) for "
                f"num_fewshot={num_fewshot}; lower num_fewshot or add rows of that subject"
            )
        examples.append(
            TaskExample(
                id=f"mmlu-{row['subject']}-{split if data_file is None else 'file'}-{index}",
                messages=build_messages(row, candidates[:num_fewshot]),
                reference=_answer_letter(row),
                meta={"subject": row["subject"]},
            )
        )
    return examples


def _shot_pool(file_rows: datasets.Dataset | None, num_fewshot: int) -> dict[str, list[tuple[int, dict]]]:
    """Candidate shots by subject, as (row index, row): the file's own rows, or the Hub dev split."""
    if num_fewshot == 0:
        return {}
    rows = file_rows if file_rows is not None else load_rows(HUB_ID, HUB_CONFIG, "dev", None, COLUMNS)
    pool: dict[str, list[tuple[int, dict]]] = defaultdict(list)
    for i, row in enumerate(rows):
        pool[row["subject"]].append((i, row))
    return pool


def scores(prediction: str, example: TaskExample) -> dict[str, float]:
    """1.0 when the predicted letter is the gold one, else 0.0."""
    return {METRIC_NAME: float(extract_letter(prediction) == example.reference)}


def score(prediction: str, example: TaskExample) -> float:
    """Option-letter accuracy of one prediction."""
    return scores(prediction, example)[METRIC_NAME]


TASK = Task(
    name="mmlu",
    metric_name=METRIC_NAME,
    default_num_samples=DEFAULT_NUM_SAMPLES,
    max_new_tokens=MAX_NEW_TOKENS,
    load=load,
    scores=scores,
)
