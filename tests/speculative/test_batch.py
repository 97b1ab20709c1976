"""Left-padding a batch of prompts for batched decoding (distill.speculative.batch)."""

from __future__ import annotations

from distill.speculative.batch import left_pad


def test_left_pad_puts_every_prompt_against_the_right_edge():
    ids, mask = left_pad([[5, 6, 7], [8], [9, 10]], pad=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 9, 10]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
