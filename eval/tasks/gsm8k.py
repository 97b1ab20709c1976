"""GSM8K: grade-school maths, scored by exact match on the final number.

lm-eval-harness's two extractions run on every prediction: "strict" takes the number after the
first `#### `, "flexible" takes the last number-like span in the text. Instruct models often box
their answer instead (`\\boxed{623}`), so the primary metric, `exact_match`, takes the first of:
the `#### ` number, else the last boxed number, else the flexible one (and reads 18.00 as 18).
Every extraction is normalised the same way (commas, `$` and one trailing `.` removed) and
compared to the gold number as strings.
"""

from __future__ import annotations

import re
from pathlib import Path

from distill.common import prompts
from distill.common.datafiles import text_field

from .base import Task, TaskExample, load_rows, sample_indices

HUB_ID = "openai/gsm8k"
HUB_CONFIG = "main"
DEFAULT_NUM_SAMPLES = 300
MAX_NEW_TOKENS = 256
METRIC_NAME = "exact_match"

# lm-eval-harness gsm8k.yaml, filter_list: "strict-match" (first match) and "flexible-extract"
# (group_select -1: the last match, first non-empty group).
STRICT_PATTERN = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE_PATTERN = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
# \boxed{...} with at most one level of nested braces (\boxed{12 \text{ dollars}}).
BOXED_PATTERN = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")

PROMPT = prompts.GSM8K


def normalize_number(text: str) -> str:
    """Drop commas, `$` and one trailing `.`, as lm-eval-harness's `regexes_to_ignore` does."""
    return re.sub(r"\.$", "", text.strip().replace(",", "").replace("$", ""))


def extract_strict(text: str) -> str | None:
    """The normalised number after the first `#### `, or None when there is none."""
    match = STRICT_PATTERN.search(text)
    return normalize_number(match.group(1)) if match else None


def extract_flexible(text: str) -> str | None:
    """The normalised last number-like span in `text`, or None when there is none."""
    matches = FLEXIBLE_PATTERN.findall(text)
    if not matches:
        return None
    return normalize_number(next(group for group in matches[-1] if group))


def extract_boxed(text: str) -> str | None:
    """The normalised last number inside the last `\\boxed{...}`, or None when there is none."""
    boxes = BOXED_PATTERN.findall(text)
    return extract_flexible(boxes[-1]) if boxes else None


def extract_answer(text: str) -> str | None:
    """The answer the primary metric scores: `#### N`, else the last boxed number, else the last
    number in the text; a zero decimal part dropped (18.00 -> 18)."""
    for extract in (extract_strict, extract_boxed, extract_flexible):
        found = extract(text)
        if found is not None:
            return re.sub(r"\.0+$", "", found)
    return None


def check_row(row: dict) -> str | None:
    """The problem with a GSM8K row (a question, and an answer ending in `#### <number>`), or None."""
    problem = text_field(row, "question", "GSM8K") or text_field(row, "answer", "GSM8K")
    if problem is None and extract_strict(row["answer"]) is None:
        problem = f"'answer' has no '#### <number>' gold answer: {row['answer'][-80:]!r}; end it with '#### N'"
    return problem


def load(
    data_file: str | Path | None = None,
    num_samples: int | None = DEFAULT_NUM_SAMPLES,
    seed: int = 0,
    split: str = "test",
    template: str = "gsm8k",
) -> list[TaskExample]:
    """GSM8K problems as chat prompts; the reference is the gold final number.

    Reads `openai/gsm8k` (main) or a local file with `question` and `answer` columns;
    `num_samples=None` keeps every problem. `template`: a name from `distill.common.prompts.TEMPLATES`
    or a string with a {question} field (default: the task's own prompt).
    """
    rows = load_rows(HUB_ID, HUB_CONFIG, split, data_file, check_row)
    examples = []
    for index in sample_indices(len(rows), num_samples, seed):
        row = rows[index]
        examples.append(
            TaskExample(
                id=f"gsm8k-{split if data_file is None else 'file'}-{index}",
                messages=[{"role": "user", "content": prompts.apply_template(template, row["question"])}],
                reference=extract_strict(row["answer"]),
                meta={"solution": row["answer"]},
            )
        )
    return examples


def scores(prediction: str, example: TaskExample) -> dict[str, float]:
    """Exact match of the primary (strict, boxed, flexible), the flexible and the strict extraction against the gold number."""
    return {
        "exact_match": float(extract_answer(prediction) == example.reference),
        "exact_match_flexible": float(extract_flexible(prediction) == example.reference),
        "exact_match_strict": float(extract_strict(prediction) == example.reference),
    }


def score(prediction: str, example: TaskExample) -> float:
    """Exact match of `extract_answer` (the primary GSM8K metric)."""
    return scores(prediction, example)[METRIC_NAME]


TASK = Task(
    name="gsm8k",
    metric_name=METRIC_NAME,
    default_num_samples=DEFAULT_NUM_SAMPLES,
    max_new_tokens=MAX_NEW_TOKENS,
    load=load,
    scores=scores,
)
