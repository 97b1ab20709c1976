"""What an engine benchmark is given: drafts by name, and the evaluation's own GSM8K prompts, drawn and
tokenized as `distill accept` draws and tokenizes them, so every engine sees the prompts the bundled
decoder measured."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

DEFAULT_DATA = "../shared/data/gsm8k/test.jsonl"


class Prompt(NamedTuple):
    """One prompt: its id, its chat messages, the chat prompt text and its ids under this project's tokenizer."""

    id: str
    text: str
    ids: list[int]
    messages: list[dict[str, str]]


def gsm8k_prompts(tokenizer: Any, data_file: str | os.PathLike, n: int, seed: int = 0) -> list[Prompt]:
    """The first `n` GSM8K prompts `distill accept` draws with `seed`, under the chat template, tokenized as it does."""
    from distill.eval.tasks import gsm8k

    out = []
    for ex in gsm8k.load(data_file=data_file, num_samples=n, seed=seed):
        text = tokenizer.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=False)
        out.append(Prompt(ex.id, text, list(tokenizer(text, add_special_tokens=False)["input_ids"]), list(ex.messages)))
    return out


def prompt_key(pid: str, text: str) -> str:
    """A prompt's journal key: its id and a hash of its text (another template is measured afresh)."""
    return f"{pid}:{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def parse_drafts(specs: Sequence[str], what: str = "a .gguf, a model folder or a training output") -> dict[str, str]:
    """`NAME=PATH` options as name -> path, in the order given."""
    drafts = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--draft {spec!r}: expected NAME=PATH ({what})")
        if name in drafts:
            raise ValueError(f"--draft {name!r} given twice")
        drafts[name] = os.path.expanduser(path)
    return drafts


def prompt_mismatch(prompt: Prompt, engine: str, ids: Sequence[int]) -> str | None:
    """None when `engine` turned the prompt into this project's ids, else the one line that says where they part."""
    ids = list(ids)
    if ids == prompt.ids:
        return None
    first = next((i for i, (a, b) in enumerate(zip(ids, prompt.ids)) if a != b), min(len(ids), len(prompt.ids)))
    return (
        f"prompt {prompt.id}: {engine} gives {len(ids)} ids, this project {len(prompt.ids)}; first difference at position {first}: "
        "the tokenizers disagree, so the two decoders would not see the same prompt"
    )


def journal_path(report: str | os.PathLike) -> Path:
    """The journal beside a report: report.json -> report.records.jsonl."""
    return Path(report).with_suffix(".records.jsonl")
