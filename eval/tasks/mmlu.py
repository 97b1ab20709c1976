"""MMLU: four-option questions over 57 subjects, scored by matching the predicted option letter.

The sample is stratified by subject (proportional, at least one per subject when the sample is
large enough) and nested (a smaller sample is the start of a larger one). The prompt is 0-shot, or
k-shot with k solved questions of the same subject as earlier chat turns: from the dev split (its
file given as `fewshot_file`, or the Hub's), or from the data file's other rows.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from pathlib import Path

from distill.common.datafiles import text_field
from distill.common.prompts import MMLU, apply_template, format_mmlu_question

from .base import Task, TaskExample, check_num_samples, load_rows

HUB_ID = "cais/mmlu"
HUB_CONFIG = "all"
COLUMNS = ["question", "subject", "choices", "answer"]
DEFAULT_NUM_SAMPLES = 500
# 0-shot, a chat model often reasons before it names the letter: under this task's own prompt, Qwen2.5-Coder-
# 1.5B-Instruct's answers to 32 validation questions averaged 139 tokens (13 cut at 256), and 16 tokens cut
# every such answer off before its letter. A letter-only answer (5-shot, "letter only") stops at end of turn.
MAX_NEW_TOKENS = 256
METRIC_NAME = "accuracy"
LETTERS = "ABCD"

HEADER = MMLU.split("\n\n", 1)[0]  # the task's own prompt (distill.common.prompts.MMLU) before the question

# The letter as reasoning answers write it: "(B)", "**B**", "\\(\\boxed{B}\\)", "B."
_LETTER = r"(?:\\\(|\\boxed\{|\*\*|\()*\s*([A-D])\b"
# "The answer is (B)", "Answer: B", "the correct answer is:\nB.", "answer is \\(\\boxed{B}\\)" ...
_EXPLICIT = re.compile(r"(?i:answer)\s*(?:(?i:is)\s*)?:?\s*" + _LETTER)
_BOXED = re.compile(r"\\boxed\{\s*\(?([A-D])\b")
# The output opens with the letter: "B", "B.", "(B)", "B) Paris".
_LEADING = re.compile(r"\A\s*\(?([A-D])(?:[.:)\s]|$)")
_STANDALONE = re.compile(r"\b([A-D])\b")


def extract_letter(text: str) -> str | None:
    """The option letter a model answered: explicit "answer is X", a boxed letter, a leading letter,
    else the first standalone A-D; None when there is none."""
    for pattern in (_EXPLICIT, _BOXED, _LEADING, _STANDALONE):
        match = pattern.search(text)
        if match:
            return match.group(1)
    return None


def _draw_subjects(counts: dict[str, int], num_samples: int, seed: int) -> list[str]:
    """The subject of each of the first `num_samples` draws of one seeded stratified order: first one
    item of every subject (in a seeded order of subjects), then, item by item, the subject furthest
    below its proportional share of the items drawn so far (ties: the earlier in that order). Each
    prefix is itself such a draw, so a smaller sample is the start of a larger one."""
    subjects = sorted(counts)
    total = sum(counts.values())
    order = random.Random(seed).sample(subjects, len(subjects))
    rank = {s: i for i, s in enumerate(order)}
    drawn = order[:num_samples]
    taken = dict.fromkeys(subjects, 0)
    for s in drawn:
        taken[s] += 1
    for t in range(len(drawn) + 1, num_samples + 1):
        left = [s for s in subjects if taken[s] < counts[s]]
        s = max(left, key=lambda s: (t * counts[s] / total - taken[s], -rank[s]))
        taken[s] += 1
        drawn.append(s)
    return drawn


def allocate(counts: dict[str, int], num_samples: int, seed: int) -> dict[str, int]:
    """How many items the first `num_samples` of the stratified order (`_draw_subjects`) take per
    subject: proportional to `counts`, at least one per subject when `num_samples` allows it, never
    more than a subject holds. With fewer samples than subjects, `seed` picks which subjects get one."""
    if num_samples >= sum(counts.values()):
        return dict(counts)
    alloc = dict.fromkeys(counts, 0)
    for s in _draw_subjects(counts, num_samples, seed):
        alloc[s] += 1
    return alloc


def stratified_indices(subjects: list[str], num_samples: int | None, seed: int) -> list[int]:
    """Row indices stratified by subject (see `_draw_subjects`), each subject's rows in a seeded order,
    in the order drawn: nested, so the first 200 of a seed are the first 200 of its 500 (the runs of
    one study share prompts). All rows, in dataset order, when `num_samples` covers them."""
    check_num_samples(num_samples)
    if num_samples is None or num_samples >= len(subjects):
        return list(range(len(subjects)))
    by_subject: dict[str, list[int]] = defaultdict(list)
    for index, subject in enumerate(subjects):
        by_subject[subject].append(index)
    rng = random.Random(seed)
    queues = {s: rng.sample(by_subject[s], len(by_subject[s])) for s in sorted(by_subject)}
    return [queues[s].pop(0) for s in _draw_subjects({s: len(rows) for s, rows in by_subject.items()}, num_samples, seed)]


def _answer_letter(row: dict) -> str:
    """The gold letter of a row whose `answer` is an index 0-3 (or already a letter)."""
    answer = row["answer"]
    if isinstance(answer, str) and answer.strip().upper() in LETTERS:
        return answer.strip().upper()
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(LETTERS):
        return LETTERS[answer]
    raise ValueError(f"MMLU 'answer' must be an index 0-3 or a letter A-D, got {answer!r}")


def check_row(row: dict) -> str | None:
    """The problem with an MMLU row (question, subject, 4 choices, answer 0-3 or A-D), or None."""
    problem = text_field(row, "question", "MMLU") or text_field(row, "subject", "MMLU")
    if problem:
        return problem
    choices = row.get("choices")
    if not isinstance(choices, list) or len(choices) != len(LETTERS) or not all(isinstance(c, str) for c in choices):
        return f"'choices' must be a list of 4 texts, got {choices!r:.120}"
    if "answer" not in row or row["answer"] is None:
        return "no 'answer' field; MMLU rows need it (an index 0-3 or a letter A-D)"
    try:
        _answer_letter(row)
    except ValueError:
        return f"'answer' {row['answer']!r} is out of range: use an index 0-3 or a letter A-D"
    return None


def format_question(row: dict) -> str:
    """The question followed by its lettered options and "Answer:"."""
    if len(row["choices"]) != len(LETTERS):
        raise ValueError(f"MMLU rows need exactly 4 choices, got {len(row['choices'])}: {row['question'][:60]!r}")
    return format_mmlu_question(row["question"], row["choices"])


def build_messages(row: dict, shots: list[dict], template: str = "mmlu") -> list[dict[str, str]]:
    """Chat turns: the first question inside `template` (default the task's own: the subject header),
    each shot as a user question and the assistant's letter, then the question to answer."""
    turns = [*shots, row]
    messages = []
    for i, turn in enumerate(turns):
        content = format_question(turn)
        if i == 0:
            content = apply_template(template, content, subject=row["subject"].replace("_", " "))
        messages.append({"role": "user", "content": content})
        if i < len(shots):
            messages.append({"role": "assistant", "content": _answer_letter(turn)})
    return messages


def load(
    data_file: str | Path | None = None,
    num_samples: int | None = DEFAULT_NUM_SAMPLES,
    seed: int = 0,
    split: str = "test",
    num_fewshot: int = 0,
    fewshot_file: str | Path | None = None,
    template: str = "mmlu",
) -> list[TaskExample]:
    """MMLU questions as chat prompts, stratified by subject; the reference is the gold letter.

    Reads `cais/mmlu` (all) or a local file with `question`, `subject`, `choices`, `answer`. Shots come
    from `fewshot_file` (the dev split's file: the first rows of the same subject), else the Hub's dev
    split, or with a data file and no shot file the file's first other rows of the same subject.
    `template`: a name from `distill.common.prompts.TEMPLATES` or a string with a {question} (and
    optional {subject}) field, asked in the first user turn (default: the task's own prompt).
    """
    if num_fewshot < 0:
        raise ValueError(f"num_fewshot must be 0 or more, got {num_fewshot}")
    rows = load_rows(HUB_ID, HUB_CONFIG, split, data_file, check_row)
    indices = stratified_indices([row["subject"] for row in rows], num_samples, seed)
    own_pool = data_file is not None and fewshot_file is None
    shot_pool = _shot_pool(rows if own_pool else None, fewshot_file, num_fewshot)
    examples = []
    for index in indices:
        row = rows[index]
        candidates = [r for i, r in shot_pool.get(row["subject"], []) if not (own_pool and i == index)]
        if len(candidates) < num_fewshot:
            raise ValueError(
                f"MMLU subject {row['subject']!r} has {len(candidates)} other example(s) for "
                f"num_fewshot={num_fewshot}; lower num_fewshot or add rows of that subject" + (f" to {fewshot_file}" if fewshot_file is not None else "")
            )
        examples.append(
            TaskExample(
                id=f"mmlu-{row['subject']}-{split if data_file is None else 'file'}-{index}",
                messages=build_messages(row, candidates[:num_fewshot], template),
                reference=_answer_letter(row),
                meta={"subject": row["subject"]},
            )
        )
    return examples


def _shot_pool(file_rows: list[dict] | None, fewshot_file: str | Path | None, num_fewshot: int) -> dict[str, list[tuple[int, dict]]]:
    """Candidate shots by subject, as (row index, row): the data file's own rows, the shot file's, or the Hub dev split's."""
    if num_fewshot == 0:
        return {}
    rows = file_rows if file_rows is not None else load_rows(HUB_ID, HUB_CONFIG, "dev", fewshot_file, check_row)
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
    drawn="the first {n} of an order stratified by subject, seeded {seed}",
)
