"""Prompt batches the decoder tests share: left-padded, of growing length, from the tiny corpus."""

from __future__ import annotations


def left_padded_batch(tokenizer, examples, n):
    """`n` prompts of different lengths (prompt + the first 7·i characters of the response), left-padded."""
    tokenizer.padding_side = "left"
    texts = [examples[i]["prompt"] + " " + examples[i]["response"][: 7 * i] for i in range(n)]
    return tokenizer(texts, return_tensors="pt", padding=True)
