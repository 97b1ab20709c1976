"""The prompts evaluation tasks ask with, shared with training: a draft distilled on the prompts
it is measured on (`data.prompt_template: gsm8k` in a recipe) learns the answers it will be asked for;
and a question asked as a one-turn chat, the way benchmarks prompt a chat model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

# The Qwen2.5-Coder models answer a bare "#### <number>" request with a Python block and an invented
# output block; asked for short prose reasoning they write it, and end with `#### N` or `\boxed{N}`.
GSM8K = (
    "Solve the following math problem. Reason step by step in a few short sentences, without code. "
    'End with the final answer as a plain number on its own line, in the form "#### <number>".\n\nQuestion: {question}'
)

# Named templates a recipe may use; each formats the user's text given as {question}.
TEMPLATES = {"gsm8k": GSM8K}


def apply_template(template: str, text: str) -> str:
    """`text` inside `template`: a name from TEMPLATES, or a format string with one `{question}` field."""
    return TEMPLATES.get(template, template).replace("{question}", text)


def chat(text: str) -> list[dict[str, str]]:
    """`text` as a one-turn chat: the user's message."""
    return [{"role": "user", "content": text}]


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """`text` as a one-turn chat in the tokenizer's chat template, ending with the assistant's turn
    opened (the generation prompt): the ids a model answers from."""
    return list(tokenizer.apply_chat_template(chat(text), add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])


def chat_prompts(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> list[torch.Tensor]:
    """Each of `texts` as `chat_prompt_ids`, a [1, T] tensor of input ids."""
    import torch

    return [torch.tensor([chat_prompt_ids(tokenizer, text)]) for text in texts]
