"""TRL's `DistillationTrainer` as the baseline our trainer is compared with: the same target, draft
architecture, steps, batch and learning rate, everything else at TRL's defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from distill.common.models import load_model, load_tokenizer
from distill.common.prompts import chat


def trl_dataset(rows: list[dict[str, Any]]):
    """TRL's conversational prompt format: {"prompt": [{"role": "user", "content": ...}]}."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": chat(r["prompt"])} for r in rows])


def run_trl_trainer(
    target_dir: Path, draft_config: dict[str, Any], rows: list[dict[str, Any]], training: dict[str, Any], out: Path, seed: int, max_completion_length: int
) -> dict[str, Any]:
    """trl.DistillationTrainer with its defaults except the shared steps/batch/lr, fp32 on CPU and
    the completion length; the draft's embedding matches the target's (TRL requires it). Saves the
    draft to out/draft; returns training time and tokens/s and the defaults that shaped them."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, set_seed
    from trl import DistillationConfig, DistillationTrainer

    tokenizer = load_tokenizer(target_dir)
    tokenizer.padding_side = "left"
    teacher = load_model(target_dir, dtype=torch.float32)
    config = Qwen2Config(**{**draft_config, "vocab_size": teacher.config.vocab_size})
    config.eos_token_id, config.pad_token_id, config.bos_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id, None
    set_seed(seed)
    student = Qwen2ForCausalLM(config)
    cpu = not torch.cuda.is_available()
    args = DistillationConfig(
        output_dir=str(out),
        seed=seed,
        max_steps=training["max_steps"],
        per_device_train_batch_size=training["per_device_train_batch_size"],
        learning_rate=training["learning_rate"],
        max_completion_length=max_completion_length,
        bf16=not cpu,
        use_cpu=cpu,
        save_strategy="no",
        report_to="none",
    )
    trainer = DistillationTrainer(model=student, teacher_model=teacher, args=args, train_dataset=trl_dataset(rows), processing_class=tokenizer)
    result = trainer.train()
    trainer.model.save_pretrained(out / "draft")
    tokenizer.save_pretrained(out / "draft")
    return {
        "train_s": result.metrics["train_runtime"],
        "train_tokens_per_s": trainer.state.num_input_tokens_seen / result.metrics["train_runtime"],
        "beta": args.beta,
        "gradient_checkpointing": args.gradient_checkpointing,
        "lr_scheduler": str(args.lr_scheduler_type),
    }
