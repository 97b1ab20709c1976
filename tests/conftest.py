"""Shared fixtures: a tokenizer trained on the spot, tiny Qwen2 models (a tied `target`/`draft`, and
the untied `tiny_pair` the decoder, speed-model and acceptance tests share), hand-checked costs, and
tiny training runs on disk (`tiny_run`). Nothing from the Hub."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2ForCausalLM

from distill.common.tiny import build_tokenizer, corpus_texts, make_examples, noisy_copy, tiny_qwen2
from distill.speculative.costs import Costs

# Tiny models gain nothing from a second thread, and oversubscribed cores slow them badly.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def examples() -> list[dict[str, str]]:
    return make_examples(400, seed=0)


@pytest.fixture(scope="session")
def tokenizer(examples):
    return build_tokenizer(corpus_texts(examples), vocab_size=384)


@pytest.fixture(scope="session")
def target(tokenizer):
    """A tiny target whose embedding is padded past the tokenizer, as Qwen2.5-7B's is (152,064 rows)."""
    return tiny_qwen2(len(tokenizer) + 32, hidden_size=64, num_layers=2, tokenizer=tokenizer, seed=1)


@pytest.fixture(scope="session")
def draft(tokenizer):
    """A smaller draft padded less than the target, as Qwen2.5-0.5B (151,936 rows) is under 7B."""
    return tiny_qwen2(len(tokenizer) + 8, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, tokenizer=tokenizer, seed=2)


@dataclass
class TinyPair:
    """An untied target padded +32 rows past the tokenizer and a smaller untied draft padded +8 (as
    Qwen2.5-7B's 152,064 rows are over 0.5B's 151,936), sharing the tokenizer. Initialised wider than
    the default (0.1), so greedy output is diverse, the small draft is rarely right, and the target
    emits padding-row ids the draft cannot embed. Shared: derive, never modify in place."""

    target: Qwen2ForCausalLM
    draft: Qwen2ForCausalLM
    tokenizer: PreTrainedTokenizerBase

    @cached_property
    def noisy_draft(self) -> Qwen2ForCausalLM:
        """The target with a little noise: right often but not always, so blocks are partly accepted."""
        return noisy_copy(self.target, 0.05, 13)

    @cached_property
    def real_vocab_target(self) -> Qwen2ForCausalLM:
        """A copy of the target whose padded rows never win (each is the mean row), as in Qwen2.5: it
        emits tokenizer ids only, so a self-draft over the real vocabulary or a synthetic draft can
        match every token it emits."""
        target = copy.deepcopy(self.target)
        with torch.no_grad():
            target.lm_head.weight[len(self.tokenizer) :] = target.lm_head.weight[: len(self.tokenizer)].mean(0)
        return target


@pytest.fixture(scope="session")
def tiny_pair(tokenizer) -> TinyPair:
    """The one untied target/draft pair of the decoder, speed-model and acceptance tests (seeds 11 and 12)."""
    target = tiny_qwen2(len(tokenizer) + 32, hidden_size=64, num_layers=2, tokenizer=tokenizer, seed=11, tie_word_embeddings=False, initializer_range=0.1)
    draft = tiny_qwen2(
        len(tokenizer) + 8,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        tokenizer=tokenizer,
        seed=12,
        tie_word_embeddings=False,
        initializer_range=0.1,
    )
    return TinyPair(target, draft, tokenizer)


@pytest.fixture(scope="session")
def pair(tiny_pair):
    """The decoder tests' target and drafts of three kinds: partly right (noisy), always right (self), and
    a smaller one padded +8 rows that the target's padding-row ids overflow (small)."""
    return tiny_pair.target, {"small": tiny_pair.draft, "noisy": tiny_pair.noisy_draft, "self": tiny_pair.target}


@pytest.fixture(scope="session")
def hand_costs() -> Costs:
    """Costs that make every speed prediction from them a number checked by hand (c = 0.2, v(3) = 1.1)."""
    return Costs(target_step_s=0.01, draft_step_s=0.002, c=0.2, v={1: 1.0, 2: 1.05, 3: 1.1, 4: 1.2}, device="cpu", dtype="float32")


# The draft the tiny runs train, from scratch (a config, no weights).
TINY_DRAFT = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 128,
    "tie_word_embeddings": True,
}


@dataclass
class TinyRun:
    """A folder holding the tiny target (target/, with its tokenizer), train.jsonl and eval.jsonl, and
    the recipe sections its tests share. Stands for its folder: `run / "target"`, `os.fspath(run)`."""

    root: Path
    eval_rows: int
    draft_vocab_size: int | None
    sections: dict[str, dict[str, Any]]

    def __truediv__(self, part: str | os.PathLike) -> Path:
        return self.root / part

    def __fspath__(self) -> str:
        return os.fspath(self.root)

    def __str__(self) -> str:
        return str(self.root)

    def recipe(self, out: str = "out", *, root: str | os.PathLike | None = None, **sections: dict[str, Any]) -> dict[str, Any]:
        """A recipe dict training into `root / out` (root: this run's folder) on this run's target and
        data; each of `sections` updates the section of that name, except `draft`, which replaces it
        (a pretrained draft has no config)."""
        root = Path(root or self.root)
        config = ({"vocab_size": self.draft_vocab_size} if self.draft_vocab_size is not None else {}) | TINY_DRAFT
        d = {
            "seed": 0,
            "output_dir": str(root / out),
            "target": {"name_or_path": str(root / "target"), "dtype": "float32"},
            "draft": {"dtype": "float32", "config": config},
            "data": {
                "dataset": str(root / "train.jsonl"),
                "adapter": "prompt_response",
                "eval_split": str(root / "eval.jsonl"),
                "eval_samples": self.eval_rows,
                "max_prompt_length": 40,
                "max_length": 64,
            },
            "teacher": {"mode": "online"},
            "loss": {"divergence": "forward_kl"},
            **copy.deepcopy(self.sections),
        }
        for key, value in sections.items():
            d[key] = value if key == "draft" else {**d[key], **value}
        return d

    def write_recipe(self, name: str, **sections: dict[str, Any]) -> Path:
        """`recipe(name, **sections)` written to `<folder>/<name>.yaml`."""
        path = self.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(self.recipe(name, **sections)))
        return path


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, tokenizer, target, examples):
    """`tiny_run(name, train_rows=, eval_rows=, training=, draft_vocab_pad=None, **sections) -> TinyRun`:
    a fresh folder with the tiny target saved (embedding padded +32 past the tokenizer) with its
    tokenizer, examples[:train_rows] as train.jsonl and examples[300:300 + eval_rows] as eval.jsonl
    (all evaluated: data.eval_samples = eval_rows). `training` and `sections` (e.g. teacher) are the
    recipe sections its tests share; `draft_vocab_pad` sets the draft's vocab_size to the saved
    tokenizer's length plus that many rows (None: left out, so the draft gets the tokenizer's length)."""

    def make(
        name: str, *, train_rows: int, eval_rows: int, training: dict[str, Any], draft_vocab_pad: int | None = None, **sections: dict[str, Any]
    ) -> TinyRun:
        root = tmp_path_factory.mktemp(name)
        target.save_pretrained(root / "target")
        tokenizer.save_pretrained(root / "target")
        for file, rows in (("train.jsonl", examples[:train_rows]), ("eval.jsonl", examples[300 : 300 + eval_rows])):
            (root / file).write_text("".join(json.dumps(r) + "\n" for r in rows))
        vocab = None if draft_vocab_pad is None else len(AutoTokenizer.from_pretrained(root / "target")) + draft_vocab_pad
        return TinyRun(root, eval_rows, vocab, {**sections, "training": training})

    return make
