"""CNN/DailyMail 3.0.0: news summarisation, scored by ROUGE-L F1 against the highlights.

ROUGE-L comes from the `rouge_score` package (stemmed, as in the usual CNN/DM reports), not
`evaluate`, which needs the Hub to load its metric script.
"""

from __future__ import annotations

import functools
from pathlib import Path

from rouge_score import rouge_scorer

from distill.common.datafiles import text_field
from distill.common.prompts import CNNDM, apply_template, truncate_words
from distill.common.splits import CNNDM_EVAL_ROWS, CNNDM_TRAIN_ROWS, positions

from .base import Task, TaskExample, load_rows, sample_indices

HUB_ID = "abisee/cnn_dailymail"
HUB_CONFIG = "3.0.0"
DEFAULT_NUM_SAMPLES = 200
MAX_NEW_TOKENS = 128
DEFAULT_MAX_ARTICLE_WORDS = 512
METRIC_NAME = "rougeL"

PROMPT = CNNDM.replace("{question}", "{article}")
EVAL_ROWS, TRAIN_ROWS = CNNDM_EVAL_ROWS, CNNDM_TRAIN_ROWS  # declared in distill.common.splits


@functools.cache
def _scorer() -> rouge_scorer.RougeScorer:
    """One stemmed ROUGE-L scorer, built on first use."""
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F1 of `prediction` against `reference` (0.0 when either has no words)."""
    return _scorer().score(reference, prediction)["rougeL"].fmeasure


def check_row(row: dict) -> str | None:
    """The problem with a CNN/DailyMail row (article, highlights, id), or None."""
    return text_field(row, "article", "CNN/DailyMail") or text_field(row, "highlights", "CNN/DailyMail") or text_field(row, "id", "CNN/DailyMail")


def load(
    data_file: str | Path | None = None,
    num_samples: int | None = DEFAULT_NUM_SAMPLES,
    seed: int = 0,
    split: str = "test",
    max_article_words: int | None = DEFAULT_MAX_ARTICLE_WORDS,
    template: str = "cnndm",
) -> list[TaskExample]:
    """CNN/DailyMail articles as summarisation prompts; the reference is the highlights.

    Reads `abisee/cnn_dailymail` (3.0.0) or a local file with `article`, `highlights`, `id`; only the
    evaluation's rows (`EVAL_ROWS`, the first 200: the rest of the shared file may train, see
    distill.common.splits) are sampled. Articles are cut to `max_article_words` words (None keeps
    them whole). `template`: a name from `distill.common.prompts.TEMPLATES` or a string with a
    {question} field where the article goes (default: the task's own prompt).
    """
    if max_article_words is not None and max_article_words < 1:
        raise ValueError(f"max_article_words must be a positive integer or None, got {max_article_words}")
    rows = load_rows(HUB_ID, HUB_CONFIG, split, data_file, check_row)
    eligible = positions(EVAL_ROWS, len(rows))
    examples = []
    for index in sample_indices(len(eligible), num_samples, seed):
        row = rows[eligible[index]]
        article = truncate_words(row["article"], max_article_words)
        examples.append(
            TaskExample(
                id=f"cnndm-{row['id']}",
                messages=[{"role": "user", "content": apply_template(template, article)}],
                reference=row["highlights"],
            )
        )
    return examples


def scores(prediction: str, example: TaskExample) -> dict[str, float]:
    """ROUGE-L F1 of the summary against the highlights."""
    return {METRIC_NAME: rouge_l(prediction, example.reference)}


def score(prediction: str, example: TaskExample) -> float:
    """ROUGE-L F1 of one summary."""
    return scores(prediction, example)[METRIC_NAME]


TASK = Task(
    name="cnndm",
    metric_name=METRIC_NAME,
    default_num_samples=DEFAULT_NUM_SAMPLES,
    max_new_tokens=MAX_NEW_TOKENS,
    load=load,
    scores=scores,
    drawn=f"the first {{n}} of a shuffle seeded {{seed}} of the evaluation rows {EVAL_ROWS.start}-{EVAL_ROWS.stop - 1} (distill.common.splits)",
)
