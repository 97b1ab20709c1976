"""Train a draft on its target's distribution: `accelerate launch scripts/train.py RECIPE [--resume]`.

`DistillTrainer` subclasses the transformers `Trainer` the way TRL's GKD/Distillation trainers do
(teacher placed with `prepare_deepspeed` / `prepare_model(evaluation_mode=True)`, on-policy
batches generated under `unwrap_model_for_generation`, the fused loss routed through the wrapped
model's forward) but accepts target/draft pairs whose embedding sizes differ — TRL refuses them
with a ValueError — and computes every loss on the shared real vocabulary with `distill.training.losses`,
from an online teacher or from the offline top-k cache written by `distill cache-teacher`.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import platform
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from transformers import (
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

from distill.common import trim
from distill.common.io import atomic_write, swap_folder
from distill.common.models import ModelLoadError, load_model, load_target, load_target_tokenizer, load_tokenizer
from distill.common.provenance import versions
from distill.common.vocab import check_tokenizers_agree
from distill.training import losses, trimmed
from distill.training.data import DataCollatorForDistill, build_eval_dataset, build_train_dataset, check_context, generate_share
from distill.training.recipe import check_paths, save_recipe
from distill.training.selection import TokenSelection
from distill.training.teacher import (
    MANIFEST,
    CachedTeacherCollator,
    TeacherCache,
    cache_dirs,
    cache_identity,
    cache_teacher,
    prepare_teacher,
    response_mask,
    teacher_logits,
    topk_logprobs,
)

logger = logging.getLogger(__name__)

TRAIN_COLUMNS = ("input_ids", "attention_mask", "labels")
# transformers 5.x renamed gradient_checkpointing (kept as a deprecated alias) to activation_checkpointing.
_CHECKPOINTING = "activation_checkpointing" if "activation_checkpointing" in TrainingArguments.__dataclass_fields__ else "gradient_checkpointing"


def _is_peft(model: torch.nn.Module) -> bool:
    from accelerate.utils import is_peft_model

    return is_peft_model(model)


def _zero3() -> bool:
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    return is_deepspeed_zero3_enabled()


def _eos_ids(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and the model's generation EOS ids."""
    declared = model.generation_config.eos_token_id
    declared = [declared] if isinstance(declared, int) else list(declared or [])
    return sorted({e for e in (tokenizer.eos_token_id, *declared) if e is not None})


class DistillTrainer(Trainer):
    """A `Trainer` whose loss is a `distill.training.losses` divergence between the draft and the target on
    response tokens (plus `ce_weight` × CE), with GKD's on-policy fraction `lmbda`, optionally on
    the tokens AdaSPEC selects against a `reference` draft (training only; logged as `kept_fraction`),
    and whose evaluation logs `eval_expected_acceptance` (1 − TVD) and `eval_top1_agreement` on every
    response token."""

    loss_is_scaled_for_ga = False  # our losses are per-batch means; Trainer divides by the accumulation steps

    def __init__(
        self,
        model: PreTrainedModel,
        args: TrainingArguments,
        *,
        loss: Any,
        vocab_size: int,
        processing_class: PreTrainedTokenizerBase,
        teacher: PreTrainedModel | None = None,
        reference: PreTrainedModel | None = None,
        eval_data_collator: Any = None,
        max_length: int | None = None,
        **kwargs: Any,
    ):
        if loss.divergence not in losses.DIVERGENCES:
            raise ValueError(f"loss.divergence {loss.divergence!r} is not one of {losses.DIVERGENCES}")
        super().__init__(model=model, args=args, processing_class=processing_class, **kwargs)
        if teacher is None and loss.lmbda > 0:
            raise ValueError("on-policy batches (loss.lmbda > 0) need the online teacher: set teacher.mode: online, or loss.lmbda: 0")
        self.loss_spec = loss
        self.vocab_size = vocab_size
        self.trimmed = trimmed.loss_kwargs(model, getattr(loss, "trimmed_vocab", "renormalise"))  # {} unless the head is trimmed (draft.vocab)
        self._outside = torch.zeros(2, dtype=torch.float64)  # evaluation: [teacher mass outside the kept ids, tokens]
        self.max_length = max_length
        self.eval_data_collator = eval_data_collator
        self.teacher = prepare_teacher(teacher, self.accelerator) if teacher is not None else None
        self.selection = None
        if reference is not None:
            if loss.token_selection is None:
                raise ValueError("a reference draft was given but loss.token_selection is not set")
            self.selection = TokenSelection(prepare_teacher(reference, self.accelerator), loss.token_selection.keep_fraction, fused=self._fused_ok(reference))
        elif loss.token_selection is not None:
            raise ValueError("loss.token_selection is set but no reference draft was given to the trainer")
        from trl.models.utils import _ForwardRedirection

        self._forward_redirection = _ForwardRedirection()
        self._eval_stats = torch.zeros(3, dtype=torch.float64)
        self._micro = (-1, 0)  # (global step, micro-batch within it): the on-policy draw's key
        self.eos_token_ids = _eos_ids(processing_class, model)
        self.generation_config = GenerationConfig(
            max_new_tokens=loss.max_new_tokens_on_policy,
            do_sample=True,
            temperature=loss.temperature,
            top_k=0,
            top_p=1.0,
            pad_token_id=processing_class.pad_token_id,
            eos_token_id=self.eos_token_ids,
            # The draft's embedding padding rows are no tokens: never sample them.
            suppress_tokens=list(range(vocab_size, model.config.get_text_config().vocab_size)) or None,
        )

    # ---------------------------------------------------------------- data

    def _get_dataloader(self, dataset: Any, description: str, *args: Any, **kwargs: Any) -> Any:
        # Held-out batches read the held-out cache: swap in its collator for the evaluation loader.
        if description != "Evaluation" or self.eval_data_collator is None:
            return super()._get_dataloader(dataset, description, *args, **kwargs)
        train_collator, self.data_collator = self.data_collator, self.eval_data_collator
        try:
            return super()._get_dataloader(dataset, description, *args, **kwargs)
        finally:
            self.data_collator = train_collator

    # ---------------------------------------------------------------- loss

    def _teacher_signal(self, inputs: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Cached top-k rows from the batch, or the online teacher's logits (and top-k when the loss is sparse)."""
        if "teacher_topk_ids" in inputs:
            if not torch.equal(inputs["teacher_mask"].to(mask.device), mask):
                raise ValueError("the cached teacher positions differ from this batch's response tokens: the cache was built on other data; rebuild it")
            return {"teacher_topk_ids": inputs["teacher_topk_ids"], "teacher_topk_logprobs": inputs["teacher_topk_logprobs"]}
        if self.teacher is None:
            raise ValueError("no teacher signal: the batch carries no cached teacher rows and no online teacher was given")
        logits = teacher_logits(self.teacher, inputs["input_ids"], inputs["attention_mask"])
        signal = {"teacher_logits": logits}
        if self.loss_spec.top_k:
            signal["teacher_topk_ids"], signal["teacher_topk_logprobs"] = topk_logprobs(logits, self.loss_spec.top_k, self.vocab_size)
        return signal

    def _loss_kwargs(self, signal: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, Any]:
        spec = self.loss_spec
        common = dict(mask=mask, temperature=spec.temperature, beta=spec.beta, vocab_size=self.vocab_size)
        if "teacher_topk_ids" in signal:
            return {**common, "teacher_topk_ids": signal["teacher_topk_ids"], "teacher_topk_logprobs": signal["teacher_topk_logprobs"], **self.trimmed}
        return {**common, "teacher_logits": signal["teacher_logits"], **self.trimmed}

    def _fused_ok(self, causal_lm: PreTrainedModel) -> bool:
        head = causal_lm.get_output_embeddings()
        config = causal_lm.config.get_text_config()
        plain_head = isinstance(head, torch.nn.Linear) and head.bias is None
        scaled = any(getattr(config, a, None) is not None for a in ("logit_scale", "final_logit_softcapping", "logits_scaling"))
        # Under ZeRO-3 the head's weight only exists inside its own forward: use the model's logits instead.
        return plain_head and not scaled and not _zero3()

    def _select(self, logits_at: Any, inputs: dict[str, torch.Tensor], kwargs: dict[str, Any]) -> None:
        """AdaSPEC, while training: narrow the loss mask to the tokens the reference shows are learnable."""
        if self.selection is not None and torch.is_grad_enabled():
            kwargs["mask"] = self.selection.select(logits_at, inputs, kwargs, kwargs["mask"], self.loss_spec, self.vocab_size)

    def _fused_student(
        self, unwrapped: torch.nn.Module, inputs: dict[str, torch.Tensor], kwargs: dict[str, Any], labels: torch.Tensor, stats_signal: dict | None
    ):
        causal_lm = unwrapped.get_base_model() if _is_peft(unwrapped) else unwrapped
        hidden = causal_lm.base_model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False).last_hidden_state
        weight = causal_lm.get_output_embeddings().weight
        if not torch.is_grad_enabled():  # evaluation: nothing to differentiate
            hidden, weight = hidden.detach(), weight.detach()
        self._select(lambda sel: hidden.detach()[sel] @ weight.detach().T, inputs, kwargs)
        spec = self.loss_spec
        loss = losses.fused_divergence(
            spec.divergence,
            hidden,
            weight,
            chunk_size=spec.chunk_size,
            labels=labels,
            ce_weight=spec.ce_weight,
            divergence_weight=spec.divergence_weight,
            **kwargs,
        )
        stats = None
        if stats_signal is not None:
            h, w = hidden.detach(), weight.detach()
            stats = self._token_stats(lambda sel: h[sel] @ w.T, stats_signal, kwargs["mask"])
        return loss, stats

    def _loss(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], with_stats: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        mask = response_mask(inputs["labels"])
        shifted = torch.full_like(inputs["labels"], -100)
        shifted[:, :-1] = inputs["labels"][:, 1:]
        signal = self._teacher_signal(inputs, mask)
        kwargs = self._loss_kwargs(signal, mask)
        stats_signal = signal if with_stats else None
        unwrapped = self.accelerator.unwrap_model(model)
        causal_lm = unwrapped.get_base_model() if _is_peft(unwrapped) else unwrapped
        if self._fused_ok(causal_lm):
            # Through the wrapper's forward, so DDP/DeepSpeed hooks fire although we call the backbone directly.
            return self._forward_redirection(model, unwrapped, self._fused_student, unwrapped, inputs, kwargs, shifted, stats_signal)
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False).logits
        self._select(lambda sel: logits.detach()[sel], inputs, kwargs)
        spec = self.loss_spec
        loss = losses.distillation_loss(
            spec.divergence, logits, chunk_size=spec.chunk_size, labels=shifted, ce_weight=spec.ce_weight, divergence_weight=spec.divergence_weight, **kwargs
        )
        stats = self._token_stats(lambda sel: logits.detach()[sel], signal, mask) if with_stats else None
        return loss, stats

    @torch.no_grad()
    def _token_stats(self, student_logits_at: Any, signal: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """[sum of TVD, count of equal argmaxes, token count] over the masked positions (temperature 1,
        shared vocabulary), `chunk_size` positions at a time. Exact with the online teacher's logits;
        from a cache, TVD over its k+1 buckets (a lower bound, so acceptance reads slightly high)."""
        V = self.vocab_size
        if self.trimmed:  # a trimmed draft proposes nothing outside its kept ids: compare it as the decoder runs it
            ids = self.trimmed["draft_to_target"]
            self._outside += trimmed.outside_mass(signal, mask, ids, V, self.loss_spec.chunk_size).to(self._outside.device)
            kept_logits_at = student_logits_at
            student_logits_at = lambda sel: trim.expand_logits(kept_logits_at(sel), ids, V)  # noqa: E731
        rows, cols = mask.nonzero(as_tuple=True)
        total = torch.zeros(3, dtype=torch.float64, device=mask.device)
        for c in range(0, len(rows), self.loss_spec.chunk_size):
            sel = (rows[c : c + self.loss_spec.chunk_size], cols[c : c + self.loss_spec.chunk_size])
            s = student_logits_at(sel).float()
            n = len(sel[0])
            if "teacher_logits" in signal:
                t = signal["teacher_logits"][sel].float()
                tvd = losses.divergence("tvd", s[None], t[None], vocab_size=V)
                t_top = t[:, :V].argmax(-1)
            else:
                ids, lps = signal["teacher_topk_ids"][sel], signal["teacher_topk_logprobs"][sel]
                tvd = losses.sparse_divergence("tvd", s[None], ids[None], lps[None], vocab_size=V)
                t_top = ids[:, 0]
            agree = (s[:, :V].argmax(-1) == t_top).sum()
            total += torch.stack([tvd.double() * n, agree.double(), torch.tensor(float(n), dtype=torch.float64, device=total.device)])
        return total

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if self.selection is not None and "loss" in logs:
            kept = self.selection.take_stats()
            if kept is not None:
                logs["kept_fraction"] = kept
        super().log(logs, *args, **kwargs)

    def compute_loss(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], return_outputs: bool = False, num_items_in_batch: Any = None):
        loss, _ = self._loss(model, inputs)
        return (loss, None) if return_outputs else loss

    # ---------------------------------------------------------------- on-policy batches (GKD's lmbda)

    def _draw_on_policy(self) -> bool:
        """True for a fraction `lmbda` of micro-batches; keyed on (seed, step, micro-batch) so a
        resumed run draws the same batches as an uninterrupted one."""
        if self.loss_spec.lmbda <= 0:
            return False
        step, micro = self._micro
        self._micro = (self.state.global_step, micro + 1 if step == self.state.global_step else 0)
        return random.Random(f"{self.args.seed}:{self._micro[0]}:{self._micro[1]}").random() < self.loss_spec.lmbda

    @torch.no_grad()
    def _on_policy_inputs(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Replace each response by the draft's own sample for the same prompt (right-padded again)."""
        from trl.models.utils import unwrap_model_for_generation

        ids, att, labels = inputs["input_ids"], inputs["attention_mask"], inputs["labels"]
        pad = self.processing_class.pad_token_id
        prompts = []
        for i in range(ids.shape[0]):
            response = (labels[i] != -100).nonzero()
            start = int(response[0]) if len(response) else int(att[i].sum())
            prompts.append(ids[i, :start][att[i, :start].bool()])
        width = max(len(p) for p in prompts)
        prompt_ids = torch.full((len(prompts), width), pad, dtype=ids.dtype, device=ids.device)
        prompt_mask = torch.zeros_like(prompt_ids)
        for i, p in enumerate(prompts):
            prompt_ids[i, width - len(p) :], prompt_mask[i, width - len(p) :] = p, 1
        checkpointing_kwargs = getattr(self.args, f"{_CHECKPOINTING}_kwargs", None)
        with unwrap_model_for_generation(model, self.accelerator, gradient_checkpointing_kwargs=checkpointing_kwargs) as m:
            was_training = m.training
            m.eval()
            out = m.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=self.generation_config)
            m.train(was_training)
        eos = torch.tensor(self.eos_token_ids, device=ids.device)
        rows = []
        for i, p in enumerate(prompts):
            completion = out[i, width:]
            ends = torch.isin(completion, eos).nonzero()
            completion = completion[: int(ends[0]) + 1] if len(ends) else completion
            rows.append((p, completion))
        length = max(len(p) + len(c) for p, c in rows)
        if self.max_length:
            length = min(length, self.max_length)
        new = {
            "input_ids": torch.full((len(rows), length), pad, dtype=ids.dtype, device=ids.device),
            "attention_mask": torch.zeros((len(rows), length), dtype=att.dtype, device=ids.device),
            "labels": torch.full((len(rows), length), -100, dtype=labels.dtype, device=ids.device),
        }
        for i, (p, c) in enumerate(rows):
            seq = torch.cat([p, c])[:length]
            new["input_ids"][i, : len(seq)] = seq
            new["attention_mask"][i, : len(seq)] = 1
            new["labels"][i, len(p) : len(seq)] = seq[len(p) :]
        return new

    def training_step(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], num_items_in_batch: Any = None) -> torch.Tensor:
        if self._draw_on_policy():
            inputs = self._on_policy_inputs(model, self._prepare_inputs(inputs))
        return super().training_step(model, inputs, num_items_in_batch)

    # ---------------------------------------------------------------- evaluation

    def prediction_step(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor], prediction_loss_only: bool, ignore_keys: list[str] | None = None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss, stats = self._loss(model, inputs, with_stats=True)
        self._eval_stats += stats.to(self._eval_stats.device)
        return loss.detach(), None, None

    def evaluation_loop(
        self, dataloader: Any, description: str, prediction_loss_only: bool | None = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"
    ):
        self._eval_stats = torch.zeros(3, dtype=torch.float64, device=self.args.device)
        self._outside = torch.zeros(2, dtype=torch.float64, device=self.args.device)
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        if self.trimmed:
            outside, count = self.accelerator.reduce(self._outside, reduction="sum").tolist()
            if count > 0:
                output.metrics[f"{metric_key_prefix}_teacher_mass_outside"] = outside / count
        tvd, agree, n = self.accelerator.reduce(self._eval_stats, reduction="sum").tolist()  # every rank takes part
        if n > 0:
            output.metrics[f"{metric_key_prefix}_expected_acceptance"] = 1.0 - tvd / n
            output.metrics[f"{metric_key_prefix}_top1_agreement"] = agree / n
        return output


# -------------------------------------------------------------------- building a run


def build_draft(spec: Any, tokenizer: PreTrainedTokenizerBase, seed: int) -> PreTrainedModel:
    """The draft: random-init from `spec.config` (a Qwen2Config; vocab defaults to the tokenizer's
    length) or loaded from `spec.name_or_path` (float32 master weights unless a dtype is given)."""
    if spec.config is not None:
        config = dict(spec.config)
        config.setdefault("vocab_size", len(tokenizer))
        if config["vocab_size"] < len(tokenizer):
            raise ValueError(
                f"draft.config.vocab_size={config['vocab_size']} is smaller than the tokenizer ({len(tokenizer)} tokens): make it at least {len(tokenizer)}"
            )
        qwen = Qwen2Config(**config)
        qwen.eos_token_id, qwen.pad_token_id, qwen.bos_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id, None
        set_seed(seed)
        model = Qwen2ForCausalLM(qwen)
    else:
        dtype = "float32" if spec.dtype == "auto" else spec.dtype
        model = load_model(spec.name_or_path, dtype=dtype, revision=spec.revision, trust_remote_code=spec.trust_remote_code, what="draft")
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def load_reference(name_or_path: str, tokenizer: PreTrainedTokenizerBase, dtype: torch.dtype, device: Any) -> PreTrainedModel:
    """AdaSPEC's reference draft, frozen, in the draft's dtype; refused unless it speaks the target's tokenizer."""
    try:
        check_tokenizers_agree(tokenizer, load_tokenizer(name_or_path, what="reference tokenizer"), names=("target", "reference"))
    except ValueError as err:
        raise ValueError(f"loss.token_selection.reference {name_or_path}: {err}") from None
    reference = load_model(name_or_path, dtype=dtype, device=device, what="reference draft")
    if reference.config.get_text_config().vocab_size < len(tokenizer):
        raise ValueError(f"loss.token_selection.reference {name_or_path}: its embedding has fewer rows than the tokenizer's {len(tokenizer)} tokens")
    return reference


def apply_lora(model: PreTrainedModel, lora: Any) -> torch.nn.Module:
    """Wrap the draft with a peft LoRA adapter (the head stays frozen: the fused loss reads its weight)."""
    from peft import LoraConfig, get_peft_model

    if "lm_head" in lora.target_modules:
        raise ValueError("draft.lora.target_modules includes lm_head: the fused loss reads the head's weight directly, so remove it")
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def training_arguments(recipe: Any, has_eval: bool) -> TrainingArguments:
    """TrainingArguments from the recipe; bf16 only where a GPU can run it (on CPU it is forced off:
    bf16 there is slow and gives a wrong loss under DeepSpeed)."""
    t = recipe.training
    bf16 = bool(t.bf16 and torch.cuda.is_available())
    if t.bf16 and not bf16:
        logger.warning("training.bf16 is set but no GPU is available: training in float32")
    report_to = [r for r in t.report_to if r != "none"] or "none"
    return TrainingArguments(
        output_dir=recipe.output_dir,
        seed=recipe.seed,
        data_seed=recipe.seed,
        max_steps=t.max_steps,
        per_device_train_batch_size=t.per_device_train_batch_size,
        per_device_eval_batch_size=t.per_device_train_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler_type,
        warmup_steps=t.warmup_ratio,
        weight_decay=t.weight_decay,
        logging_steps=t.logging_steps,
        eval_strategy="steps" if has_eval and t.eval_steps else "no",
        eval_steps=t.eval_steps if has_eval and t.eval_steps else None,
        save_strategy="steps",
        save_steps=t.save_steps,
        save_total_limit=t.save_total_limit,
        bf16=bf16,
        **{_CHECKPOINTING: t.gradient_checkpointing},
        report_to=report_to,
        dataloader_num_workers=t.dataloader_num_workers,
        remove_unused_columns=False,
        label_names=["labels"],
        disable_tqdm=False,
        include_num_input_tokens_seen="non_padding",
        use_cpu=not torch.cuda.is_available(),
    )


def _columns(dataset: Any) -> Any:
    missing = [c for c in TRAIN_COLUMNS if c not in dataset.column_names]
    if missing:
        raise ValueError(f"the training dataset lacks columns {missing}: distill.training.data.build_train_dataset must give {list(TRAIN_COLUMNS)}")
    return dataset.select_columns(list(TRAIN_COLUMNS))


def _open_cache(where: Path, identity: dict[str, Any], top_k: int | None) -> TeacherCache:
    cache = TeacherCache(where)
    cache.check(identity, top_k)
    return cache


def build_trainer(recipe: Any, callbacks: Sequence[TrainerCallback] = ()) -> DistillTrainer:
    """Everything a run needs, from the recipe: tokenizer, draft (LoRA or full), teacher (online or
    cache), datasets, collators and the trainer."""
    check_paths(recipe)
    # TrainingArguments first: under ZeRO-3 it switches on partitioned loading (zero3_init_flag).
    args = training_arguments(recipe, recipe.data.eval_split is not None)
    spec = recipe.target
    tokenizer = load_target_tokenizer(spec)
    if recipe.draft.config is None:
        try:
            draft_tokenizer = load_tokenizer(
                recipe.draft.name_or_path, revision=recipe.draft.revision, trust_remote_code=recipe.draft.trust_remote_code, what="draft tokenizer"
            )
        except ModelLoadError:
            logger.warning("draft %s ships no tokenizer: assuming it uses the target's", recipe.draft.name_or_path)
        else:
            check_tokenizers_agree(tokenizer, draft_tokenizer)

    mode = recipe.teacher.mode
    if mode not in ("online", "cache"):
        raise ValueError(f"teacher.mode {mode!r} unknown: use online or cache")
    # On the process's GPU from the start: seq-KD generation runs before the trainer places the teacher.
    # Under ZeRO-3 its weights are partitioned and cannot generate: responses then come from a finished cache.
    zero3 = _zero3()
    teacher = None
    if mode == "online":
        teacher = load_target(spec.name_or_path, spec.revision, spec.dtype, device=None if zero3 else args.device, trust_remote_code=spec.trust_remote_code)
    generator = None if zero3 else teacher

    model = build_draft(recipe.draft, tokenizer, recipe.seed)
    vocab_size = len(tokenizer)
    for name, m in (("draft", model), ("target", teacher)):
        if m is not None and m.config.get_text_config().vocab_size < vocab_size:
            raise ValueError(f"the {name}'s embedding has {m.config.get_text_config().vocab_size} rows, fewer than the tokenizer's {vocab_size} tokens")
        if m is not None:
            check_context(recipe.data, m, name)
    reference = None
    if recipe.loss.token_selection is not None:
        reference = load_reference(recipe.loss.token_selection.reference, tokenizer, model.dtype, None if zero3 else args.device)
    if recipe.draft.lora is not None:
        set_seed(recipe.seed)  # the adapter's random init
        model = apply_lora(model, recipe.draft.lora)
        if recipe.training.gradient_checkpointing:
            model.enable_input_require_grads()

    generate_share(recipe.data, tokenizer, generator, PartialState(), recipe.seed)  # every process answers its share
    with args.main_process_first(desc="building datasets"):  # the main process merges the shares into one cache
        train_ds = _columns(build_train_dataset(recipe.data, tokenizer, target=generator, seed=recipe.seed))
        eval_ds = build_eval_dataset(recipe.data, tokenizer, target=generator, seed=recipe.seed)
    eval_ds = _columns(eval_ds) if eval_ds is not None else None

    if recipe.draft.vocab is not None:
        if zero3:
            raise ValueError("draft.vocab: ZeRO-3 partitions the head that is cut; train a trimmed draft on one GPU, DDP or ZeRO-2")
        trimmed.trim_draft(model, recipe.draft.vocab, recipe.loss.trimmed_vocab, tokenizer, train_ds)

    collator = DataCollatorForDistill(tokenizer)
    eval_collator = None
    if mode == "cache":
        if not recipe.teacher.cache_dir:
            raise ValueError("teacher.mode is cache but teacher.cache_dir is not set: point it at the output of `distill cache-teacher`")
        dirs = cache_dirs(recipe.teacher.cache_dir)
        cache = _open_cache(dirs["train"], cache_identity(spec.name_or_path, spec.revision, tokenizer, train_ds), recipe.loss.top_k)
        train_ds = train_ds.add_column("example_index", list(range(len(train_ds))))
        collator = CachedTeacherCollator(DataCollatorForDistill(tokenizer), cache, recipe.loss.top_k)
        if eval_ds is not None:
            eval_cache = _open_cache(dirs["eval"], cache_identity(spec.name_or_path, spec.revision, tokenizer, eval_ds), recipe.loss.top_k)
            eval_ds = eval_ds.add_column("example_index", list(range(len(eval_ds))))
            eval_collator = CachedTeacherCollator(DataCollatorForDistill(tokenizer), eval_cache, recipe.loss.top_k)

    return DistillTrainer(
        model=model,
        args=args,
        loss=recipe.loss,
        vocab_size=vocab_size,
        processing_class=tokenizer,
        teacher=teacher,
        reference=reference,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        data_collator=collator,
        eval_data_collator=eval_collator,
        max_length=recipe.data.max_length,
        callbacks=list(callbacks),
    )


# -------------------------------------------------------------------- outputs


def _git_revision() -> str | None:
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return rev.stdout.strip() if rev.returncode == 0 else None


def save_draft(trainer: DistillTrainer, recipe: Any) -> Path:
    """Write <output_dir>/draft atomically: the merged model when LoRA and merge_on_save, else the
    adapter (LoRA) or the full model, plus the target's tokenizer."""
    out = Path(recipe.output_dir) / "draft"
    tmp = Path(recipe.output_dir) / f".draft.tmp-{os.getpid()}"
    model = trainer.accelerator.unwrap_model(trainer.model)
    merge = _is_peft(model) and recipe.draft.merge_on_save
    if merge and _zero3():
        # The live weights are sharded: save the adapter through Trainer (it gathers), merge on the main process.
        trainer.save_model(str(tmp) + "-adapter")
        if trainer.is_world_process_zero():
            from peft import PeftModel

            if recipe.draft.config is not None:
                raise ValueError("LoRA on a random-init draft cannot be merged under ZeRO-3 (its base weights are not saved): set draft.merge_on_save: false")
            base = build_draft(recipe.draft, trainer.processing_class, recipe.seed)
            PeftModel.from_pretrained(base, str(tmp) + "-adapter").merge_and_unload().save_pretrained(tmp)
            shutil.rmtree(str(tmp) + "-adapter")
    elif merge:
        if trainer.is_world_process_zero():
            model.merge_and_unload().save_pretrained(tmp)
    else:
        trainer.save_model(str(tmp))
    if trainer.is_world_process_zero():
        trainer.processing_class.save_pretrained(tmp)
        (tmp / "training_args.bin").unlink(missing_ok=True)
        if trim.draft_to_target(model) is not None:  # a trimmed head: its map and full head, the head cut to its K rows
            trim.save_trim_files(model, tmp)
        swap_folder(tmp, out)
    trainer.accelerator.wait_for_everyone()
    return out


def _cache_finished(recipe: Any) -> bool:
    """Whether `distill cache-teacher` finished the recipe's train cache (and its held-out one, when it has one)."""
    dirs = cache_dirs(recipe.teacher.cache_dir)
    wanted = [dirs["train"]] + ([dirs["eval"]] if recipe.data.eval_split is not None else [])
    try:
        return all(json.loads((d / MANIFEST).read_text()).get("complete") is True for d in wanted)
    except (OSError, ValueError):
        return False


def _saved_step(checkpoint: Path) -> int | None:
    """The global step in `checkpoint`'s trainer_state.json, None when it is absent or torn. Trainer
    writes that file last, so a checkpoint without a whole one was cut off while saving."""
    try:
        return int(json.loads((checkpoint / "trainer_state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def checkpoint_problems(checkpoint: Path, num_processes: int = 1) -> list[str]:
    """What a resume from `checkpoint` would silently lack: weights, optimizer and scheduler state
    (Trainer restarts them fresh when their file is missing) and each process's RNG state."""
    names = {p.name for p in checkpoint.iterdir()}
    deepspeed = "latest" in names  # DeepSpeed keeps weights, optimizer and scheduler in its own global_stepN/
    wanted = [] if deepspeed else [("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors"), ("optimizer.pt",), ("scheduler.pt",)]
    wanted += [("rng_state.pth",)] if num_processes == 1 else [(f"rng_state_{i}.pth",) for i in range(num_processes)]
    return [" or ".join(files) for files in wanted if not names.intersection(files)]


def _check_output_dir(output_dir: str, resume: bool) -> str | None:
    """The checkpoint to resume from: the newest one saved whole (one cut off mid-save is passed over),
    refused when it lacks a file a faithful resume needs."""
    steps = {int(p.name[len("checkpoint-") :]): p for p in Path(output_dir).glob("checkpoint-*") if p.is_dir() and p.name[len("checkpoint-") :].isdigit()}
    found = [steps[s] for s in sorted(steps, reverse=True)]
    if not resume:
        if found:
            raise FileExistsError(f"{output_dir} already has {found[0].name}: pass --resume to continue it, or set output_dir to a new directory")
        return None
    torn = [p for s, p in sorted(steps.items(), reverse=True) if _saved_step(p) != s]
    whole = [p for p in found if p not in torn]
    if torn:
        logger.warning("passing over %s: cut off while saving (no whole trainer_state.json)", ", ".join(p.name for p in torn))
    if not whole:
        if torn:
            raise FileNotFoundError(
                f"--resume: {', '.join(p.name for p in torn)} in {output_dir} were cut off while saving and no earlier checkpoint exists; delete them and run without --resume"
            )
        raise FileNotFoundError(f"--resume: no checkpoint-N directory in {output_dir}; run without --resume to start")
    missing = checkpoint_problems(whole[0], int(os.environ.get("WORLD_SIZE", "1")))
    if missing:
        previous = f"resume from {whole[1].name}" if len(whole) > 1 else "start again"
        raise FileNotFoundError(
            f"--resume: {whole[0]} lacks {'; '.join(missing)}, so the run would not continue as it was (Trainer restarts what is missing): "
            f"restore the files, or delete {whole[0].name} to {previous}"
        )
    return str(whole[0])


def train(recipe: Any, resume: bool = False, recipe_path: str | None = None, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    """Run a recipe end to end: train (resuming from the last checkpoint when asked), evaluate,
    write draft/, recipe.yaml and run_info.json under output_dir. Returns the final metrics."""
    last = _check_output_dir(recipe.output_dir, resume)
    started = time.time()
    if recipe.teacher.mode == "cache" and not _cache_finished(recipe):
        # The whole pipeline in one command: generate (seq-KD) and cache the teacher first, as
        # `distill cache-teacher RECIPE` does; each stage resumes where a stopped run left it.
        logger.warning("teacher cache %s is not finished: building it first (distill cache-teacher)", recipe.teacher.cache_dir)
        cache_teacher(recipe, recipe_path)
        gc.collect()
    trainer = build_trainer(recipe, callbacks)
    result = trainer.train(resume_from_checkpoint=last)
    metrics = dict(result.metrics)
    if trainer.eval_dataset is not None:
        metrics.update(trainer.evaluate())
    save_draft(trainer, recipe)
    if trainer.is_world_process_zero():
        out = Path(recipe.output_dir)
        save_recipe(recipe, out / "recipe.yaml")
        info = {
            "recipe_path": recipe_path,
            "seed": recipe.seed,
            "git_revision": _git_revision(),
            "versions": versions(),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
            "num_processes": trainer.accelerator.num_processes,
            "deepspeed": trainer.is_deepspeed_enabled,
            "resumed_from": last,
            "global_step": trainer.state.global_step,
            "wall_s": time.time() - started,
            "metrics": metrics,
        }
        atomic_write(out / "run_info.json", json.dumps(info, indent=2, default=str))
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    """`distill train RECIPE [--resume] [--set KEY=VALUE ...]` (or `accelerate launch scripts/train.py RECIPE`);
    `--help-recipe` lists every recipe key instead."""
    from distill.arguments import parser
    from distill.training.recipe import load_recipe, recipe_help

    cli = parser("train")
    args = cli.parse_args(argv)
    if args.help_recipe:
        print(recipe_help())
        return 0
    if args.recipe is None:
        cli.error("the following arguments are required: recipe")
    try:
        metrics = train(load_recipe(args.recipe, args.overrides), resume=args.resume, recipe_path=args.recipe)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"distill train: error: {err}", file=sys.stderr)
        return 2
    shown = {
        k: v for k, v in metrics.items() if k in ("train_loss", "eval_loss", "eval_expected_acceptance", "eval_top1_agreement", "eval_teacher_mass_outside")
    }
    print(json.dumps(shown, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
