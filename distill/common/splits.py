"""Which rows evaluate and which may train, declared once for every command.

CNN/DailyMail: the shared file (../shared/data/cnndm/test.jsonl, see its PROVENANCE.md) holds the
first 574 rows of the abisee/cnn_dailymail 3.0.0 *test* split, in the Hub's order, and there is no
other CNN/DM data offline. It serves both sides, split by position (from 0, in file or Hub order):
rows 0-199 are evaluated (`distill accept --tasks cnndm` samples only these, whatever file or split
it reads), rows 200-573 may train (the `cnndm_train` recipe adapter reads only these). The Hub test
split lists the same rows first, so the split holds there too.

MMLU: recipes train on prompts derived from its validation split (../shared/data/mmlu/validation.jsonl,
with the test file's questions excluded: 27 validation items repeat test items) and the evaluation asks
test questions, its shots from the dev split. GSM8K: recipes train on its train split, the evaluation
asks test questions.
"""

from __future__ import annotations

CNNDM_ROWS = 574  # rows of the shared CNN/DM file
CNNDM_EVAL_ROWS = range(0, 200)
CNNDM_TRAIN_ROWS = range(200, CNNDM_ROWS)


def positions(rows: range, total: int) -> list[int]:
    """The positions of `rows` that a dataset of `total` rows has."""
    return [i for i in rows if i < total]
