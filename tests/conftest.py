"""Shared fixtures: a tokenizer trained on the spot and tiny Qwen2 models. Nothing from the Hub."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from distill.tiny import build_tokenizer, corpus_texts, make_examples, tiny_qwen2

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


@pytest.fixture(scope="session")
def script():
    """Import scripts/NAME.py as a module (the scripts are not a package): `script("bench_train")`."""
    scripts = Path(__file__).resolve().parents[1] / "scripts"

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, scripts / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
