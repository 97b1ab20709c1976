"""The GSM8K tiny pair the training benchmarks share (scripts/bench_train.py gsm8k,
scripts/bench_recipes.py): a tokenizer built on GSM8K train text, a tiny target trained briefly with
cross-entropy on it, and the base draft recipe on the train rows with the test rows held out."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from distill.commands.prepare_tiny import DEFAULTS as TINY_DEFAULTS
from distill.commands.prepare_tiny import saved_tokenizer, train_target
from distill.common.io import atomic_folder, read_jsonl, write_json
from distill.common.models import load_model, load_tokenizer
from distill.common.tiny import build_tokenizer


def gsm8k_target(rows: list[dict[str, Any]], out: Path, settings: dict[str, Any]) -> Path:
    """A tiny target with a tokenizer built on GSM8K train text, trained briefly with CE on it,
    saved to `out`/target (reused when out/target_info.json records the same settings)."""
    target_dir, info_path = out / "target", out / "target_info.json"
    if info_path.exists() and json.loads(info_path.read_text()).get("settings") == settings and (target_dir / "config.json").exists():
        return target_dir
    info_path.unlink(missing_ok=True)  # a run killed from here on leaves no record claiming the old folder
    with atomic_folder(target_dir) as work:
        texts = [t for r in rows for t in (r["question"], r["answer"])] + ["You are a helpful assistant.", "system user assistant"]
        tokenizer = saved_tokenizer(build_tokenizer(texts, vocab_size=settings["vocab_size"]), str(work))
        chats = [
            tokenizer.apply_chat_template([{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}], tokenize=False)
            for r in rows
        ]
        model, loss = train_target(tokenizer, chats, settings, str(work / "trainer"))
        shutil.rmtree(work / "trainer", ignore_errors=True)
        model.save_pretrained(work)
        tokenizer.save_pretrained(work)
    write_json(info_path, {"settings": settings, "final_train_loss": loss, "tokenizer_size": len(tokenizer), "embedding_rows": model.config.vocab_size})
    return target_dir


def gsm8k_pair(
    data_dir: str | os.PathLike, rows: int, vocab_size: int, target_steps: int, work: str | os.PathLike, base: dict[str, Any]
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase, dict[str, Any], list[dict[str, Any]]]:
    """The trained target (under `work`), its tokenizer, the draft recipe `base` (a recipe dict such as
    recipes/tiny-cpu.yaml's) on the first `rows` rows of `data_dir`/train.jsonl with test.jsonl held
    out, and those rows. `vocab_size` is the tokenizer's size asked, `target_steps` its CE steps."""
    data = Path(data_dir).resolve()
    train_file, test_file = data / "train.jsonl", data / "test.jsonl"
    train_rows = read_jsonl(train_file, rows)
    settings = {**TINY_DEFAULTS, "vocab_size": vocab_size, "steps": target_steps, "max_position_embeddings": 1024, "rows": len(train_rows)}
    settings.pop("train_examples"), settings.pop("eval_examples")
    target_dir = gsm8k_target(train_rows, Path(work).resolve(), settings)
    tokenizer = load_tokenizer(target_dir)
    target = load_model(target_dir, dtype=torch.float32)
    recipe = copy.deepcopy(base)
    recipe["target"]["name_or_path"] = str(target_dir)
    recipe["draft"]["config"]["vocab_size"] = len(tokenizer) + 8
    recipe["data"] = {
        "dataset": str(train_file),
        "adapter": "gsm8k",
        "num_samples": len(train_rows),
        "eval_split": str(test_file),
        "eval_samples": 64,
        "max_prompt_length": 192,
        "max_length": 384,
    }
    return target, tokenizer, recipe, train_rows
