"""The prompts evaluation tasks ask with, shared with training: a draft distilled on the prompts
it is measured on (`data.prompt_template: gsm8k` in a recipe) learns the answers it will be asked for;
and a question asked as a one-turn chat, the way benchmarks prompt a chat model.

Named templates (TEMPLATES): each task's own prompt, named after the task (what `distill accept` asks
by default), and variants named TASK-VARIANT. Per task, TRAINING_TEMPLATES are the ones recipes may
train on and HELD_OUT_TEMPLATES the ones kept out of training, so that `distill accept --template`
measures a draft on instructions it has never seen (a recipe naming a held-out template is refused).
A template holds `{question}` where the task's text goes (the GSM8K question, the MMLU question with
its lettered options, the CNN/DM article) and, for MMLU, may hold `{subject}`.
"""

from __future__ import annotations

import re
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
MMLU = "The following are multiple choice questions about {subject}. Answer with the letter (A, B, C or D) of the correct option.\n\n{question}"
CNNDM = "Summarize the following news article in three sentences.\n\n{question}"

# Named templates a recipe or `distill accept --template` may use; each formats the task's text given as {question}.
TEMPLATES = {
    # GSM8K: the question.
    "gsm8k": GSM8K,
    "gsm8k-brief": 'Answer this word problem. Show the key steps briefly in plain words, then give the result on the last line as "#### <number>".\n\n{question}',
    "gsm8k-boxed": "{question}\nPlease reason step by step, and put your final answer within \\boxed{}.",
    "gsm8k-plain": "{question}",
    # MMLU: the question, its lettered options and "Answer:"; {subject} is the subject in words.
    "mmlu": MMLU,
    "mmlu-brief": "A question on {subject}. Reply with the letter of the correct option only.\n\n{question}",
    "mmlu-exam": "You are taking an exam in {subject}. Read the question and the four options, then give the letter of the best option (A, B, C or D).\n\n{question}",
    "mmlu-plain": "{question}",
    # CNN/DailyMail: the article (cut to the task's word limit).
    "cnndm": CNNDM,
    "cnndm-brief": "Write a short summary, two or three sentences, of this news story.\n\n{question}",
    "cnndm-tldr": "{question}\n\nTL;DR:",
    "cnndm-bullets": "Read the article below and list its key points as three short bullet points.\n\nArticle:\n{question}",
}
TRAINING_TEMPLATES = {"gsm8k": ("gsm8k", "gsm8k-brief"), "mmlu": ("mmlu", "mmlu-brief"), "cnndm": ("cnndm", "cnndm-brief")}
HELD_OUT_TEMPLATES = {"gsm8k": ("gsm8k-boxed", "gsm8k-plain"), "mmlu": ("mmlu-exam", "mmlu-plain"), "cnndm": ("cnndm-tldr", "cnndm-bullets")}
# The fields each task fills in (every template needs {question}).
FIELDS = {"gsm8k": ("question",), "mmlu": ("question", "subject"), "cnndm": ("question",)}
_FIELD = re.compile(r"\{(question|subject)\}")


def apply_template(template: str, text: str, **fields: str) -> str:
    """`text` inside `template`: a name from TEMPLATES, or a format string with one `{question}` field
    (and `{subject}` when given in `fields`). One pass: text put in is never read as a field."""
    values = {"question": text, **fields}
    return _FIELD.sub(lambda m: values.get(m.group(1), m.group(0)), TEMPLATES.get(template, template))


def template_problem(template: str, task: str | None = None) -> str | None:
    """Why `template` (a name or a string) cannot be asked for `task` (None: any task), or None when it can."""
    text = TEMPLATES.get(template)
    if text is None:
        if "{question}" not in template:
            return f"{template!r} is neither a template name ({', '.join(TEMPLATES)}) nor a string with a {{question}} field where the text goes"
        text = template
    if task is not None and "{subject}" in text and "subject" not in FIELDS.get(task, ()):
        return f"{template!r} uses {{subject}}, which only MMLU rows give; {task} rows do not"
    return None


def held_out_names(template: str) -> list[str]:
    """The held-out template names `template` is (by name or by text): a training recipe may not use it."""
    text = TEMPLATES.get(template, template)
    return [name for names in HELD_OUT_TEMPLATES.values() for name in names if name == template or TEMPLATES[name] == text]


def variant(task: str, name: str) -> str:
    """The short name of template `name` for `task`, as reports label it (`gsm8k@boxed`): `default` for
    the task's own prompt, the name without its `TASK-` prefix otherwise."""
    return "default" if name == task else name.removeprefix(f"{task}-")


def format_mmlu_question(question: str, choices: Sequence[str]) -> str:
    """An MMLU question followed by its lettered options and "Answer:" (the text its templates wrap)."""
    options = "\n".join(f"{letter}. {choice}" for letter, choice in zip("ABCDEFGHIJ", choices))
    return f"{question.strip()}\n{options}\nAnswer:"


def truncate_words(text: str, max_words: int | None) -> str:
    """`text` cut to its first `max_words` whitespace-separated words (whole when None or short)."""
    words = text.split()
    if max_words is None or len(words) <= max_words:
        return text.strip()
    return " ".join(words[:max_words])


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
