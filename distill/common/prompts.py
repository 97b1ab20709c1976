"""The prompts evaluation tasks ask with, shared with training: a draft distilled on the prompts
it is measured on (`data.prompt_template: gsm8k` in a recipe) learns the answers it will be asked for."""

from __future__ import annotations

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
