"""YAML recipes -> typed, validated dataclasses.

A recipe is data only: every key is declared here with its type and default, so a misspelt key,
a wrong type or an out-of-range value fails at load time, naming the key, instead of hours
into a run.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import re
import textwrap
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from distill.common.io import atomic_write
from distill.common.models import looks_local
from distill.common.prompts import TEMPLATES, TRAINING_TEMPLATES, held_out_names, template_problem

Dtype = Literal["float32", "bfloat16", "float16", "auto"]
Adapter = Literal["gsm8k", "mmlu", "cnndm", "cnndm_train", "messages", "prompt_response"]
Divergence = Literal["forward_kl", "reverse_kl", "jsd", "tvd"]

DEFAULT_LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class RecipeError(ValueError):
    """A recipe that does not validate; `errors` lists one message per problem."""

    def __init__(self, errors: list[str], source: str | None = None):
        self.errors = errors
        prefix = f"invalid recipe {source}:" if source else "invalid recipe:"
        super().__init__("\n  ".join([prefix, *errors]))


class RemovedKeyError(RecipeError):
    """A recipe that still sets a key this version removed: one line per such key, naming it and saying what to do."""

    def __init__(self, errors: list[str], source: str | None = None):
        self.errors = errors
        ValueError.__init__(self, "\n".join(f"{source}: {e}" if source else e for e in errors))


# Keys earlier versions accepted: dotted path -> why it went. A recipe that still sets one is refused
# with one line naming it (rather than as an unknown key, or silently ignored).
REMOVED_KEYS = {
    "data.packing": "examples are always padded per batch",
    "eval": (
        "it was read only by the model card; the speculative-decoding settings are options of `distill accept` "
        "(--num-draft-tokens, --max-new-tokens, --num-samples), whose report `distill publish --eval-report` reads"
    ),
}


def _removed(path: str, fix: str) -> str:
    return f"recipe key '{path}' was removed: {REMOVED_KEYS[path]}; {fix}"


def _removed_keys_in(data: Any) -> list[str]:
    """One message per key of REMOVED_KEYS that the raw recipe mapping `data` still sets."""
    found = []
    for path in REMOVED_KEYS:
        node, parts = data, path.split(".")
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and parts[-1] in node:
            found.append(_removed(path, "delete the key"))
    return found


def _removed_override(path: str) -> str | None:
    """The removed key that a `--set` dotted `path` is, or lies under; None when it is none."""
    return next((key for key in REMOVED_KEYS if path == key or path.startswith(key + ".")), None)


def _check(predicate: typing.Callable[[Any], bool], what: str) -> dict[str, Any]:
    """Field metadata: a range check applied after type conversion, `what` says the allowed range."""
    return {"check": (predicate, what)}


_POSITIVE = _check(lambda v: v > 0, "> 0")
_NON_NEGATIVE = _check(lambda v: v >= 0, ">= 0")
_UNIT = _check(lambda v: 0.0 <= v <= 1.0, "between 0 and 1")


@dataclass(kw_only=True)
class ModelSpec:
    """A Hugging Face model to load with `from_pretrained`."""

    name_or_path: str = field(
        metadata={
            "help": "The model: a Hub id (e.g. Qwen/Qwen2.5-7B-Instruct), a local model folder, a training output folder (its draft/ is read) or a .gguf file."
        }
    )
    revision: str | None = field(
        default=None,
        metadata={"help": "The Hub revision to load (a branch, tag or commit hash); null: the default branch. Ignored for local folders and .gguf files."},
    )
    dtype: Dtype = field(
        default="auto",
        metadata={"help": "The dtype the weights are loaded in; auto: float32 on a CPU (bfloat16 there is inexact), the checkpoint's own dtype on a GPU."},
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Run the Python shipped in the model's folder or Hub repo (its config's `auto_map`); off unless the recipe turns it on."},
    )


@dataclass(kw_only=True)
class LoraSpec:
    """peft LoRA settings for the draft."""

    r: int = field(default=16, metadata={"help": "The LoRA rank: the inner dimension of each adapter's two low-rank matrices.", **_POSITIVE})
    alpha: int = field(default=32, metadata={"help": "The LoRA scaling (peft's lora_alpha): each adapter's update is scaled by alpha / r.", **_POSITIVE})
    dropout: float = field(default=0.05, metadata={"help": "Dropout probability on each adapter's input (peft's lora_dropout), from 0 to 1.", **_UNIT})
    target_modules: list[str] = field(
        default_factory=lambda: list(DEFAULT_LORA_MODULES),
        metadata={
            "help": "Names of the linear layers that get an adapter (peft's target_modules); the rest stays frozen. lm_head is refused: the fused loss "
            "reads the head's weight directly."
        },
    )


@dataclass(kw_only=True)
class DraftVocabSpec:
    """A trimmed draft (distill.common.trim): its LM head keeps the K target ids most frequent in some text."""

    size: int = field(
        metadata={
            "help": "K, the rows the draft's LM head keeps: the target ids most frequent in draft.vocab.count_from (special and chat-template "
            "tokens always kept); the input embedding stays whole. At most the tokenizer's length.",
            **_POSITIVE,
        }
    )
    count_from: list[str] | None = field(
        default=None,
        metadata={
            "help": "JSONL or plain-text files whose tokens are counted (JSONL: response-like fields, a generation cache's response_ids); "
            "null: the training responses, the target's own (the seq-KD generation cache) when data.response_source is target."
        },
    )


@dataclass(kw_only=True)
class DraftSpec(ModelSpec):
    """The draft: pretrained weights (`name_or_path`) or a fresh random init from `config`; exactly one of the two."""

    name_or_path: str | None = field(
        default=None,
        metadata={"help": "The pretrained draft to start from: a Hub id, a local model folder or a .gguf file. Set this or draft.config, not both."},
    )
    dtype: Dtype = field(
        default="auto",
        metadata={
            "help": "The dtype the draft's weights are loaded and trained in; auto: float32 master weights (training.bf16 then autocasts). "
            "bfloat16 suits a LoRA draft, whose base stays frozen. A draft.config draft is always initialised in float32."
        },
    )
    config: dict | None = field(
        default=None,
        metadata={
            "help": "A fresh random-init draft instead: Qwen2Config keyword arguments (hidden_size, num_hidden_layers, ...), used with the target's "
            "tokenizer; vocab_size defaults to the tokenizer's length and may not be smaller. Set this or draft.name_or_path, not both."
        },
    )
    lora: LoraSpec | None = field(
        default=None,
        metadata={"help": "Train a peft LoRA adapter on the frozen draft instead of every weight (`lora: {}` takes the defaults below); null: full fine-tune."},
    )
    merge_on_save: bool = field(
        default=True,
        metadata={
            "help": "With draft.lora: write draft/ as the base with the adapter merged in (a plain model any decoder loads); false: write the adapter alone."
        },
    )
    vocab: DraftVocabSpec | None = field(
        default=None,
        metadata={
            "help": "Train a draft whose LM head is cut to the K most frequent target ids (loss.trimmed_vocab says how it learns there); "
            "draft/ then holds the map and the full head for a full-vocabulary export (distill publish); null: the whole vocabulary."
        },
    )


@dataclass(kw_only=True)
class DataSource:
    """One data source of a mixed recipe (data.sources): where its rows come from, its share of the prompts, its templates."""

    dataset: str = field(metadata={"help": "This source's rows: a Hub dataset id or a local .jsonl, .json or .parquet file."})
    adapter: Adapter | None = field(
        default=None,
        metadata={"help": "How a row becomes a prompt and a response (see data.adapter; cnndm_train reads only CNN/DM's training rows); null: detected."},
    )
    subset: str | None = field(default=None, metadata={"help": "The Hub dataset's configuration name; null: its only or default one."})
    split: str = field(default="train", metadata={"help": "The split of this source's dataset; a local file has one split, train."})
    share: float = field(
        default=1.0,
        metadata={
            "help": "This source's share of data.num_samples (shares are normalised over the sources; counts are rounded by largest remainder).",
            **_POSITIVE,
        },
    )
    templates: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Instruction templates the prompts are asked with, taken in turn over the drawn rows (so each is used equally): names from "
            "distill.common.prompts.TRAINING_TEMPLATES or strings with a {question} field; held-out templates are refused; []: prompts as the adapter gives them."
        },
    )
    max_article_words: int | None = field(
        default=512,
        metadata={"help": "CNN/DM rows: the article is cut to this many words, as `distill accept` cuts it (512); null: whole.", **_POSITIVE},
    )
    exclude: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Evaluation files (.jsonl, .json, .parquet) read with the same adapter: a row whose question (MMLU: with its options; CNN/DM: its "
            "article) is also one of theirs is dropped, so training never sees an evaluated prompt."
        },
    )


@dataclass(kw_only=True)
class DataSpec:
    """Where prompts and responses come from and how they are tokenized (see distill.training.data)."""

    dataset: str | None = field(
        default=None,
        metadata={
            "help": "The training data: a Hub dataset id (e.g. openai/gsm8k) or a local .jsonl, .json or .parquet file of rows; "
            "set this or data.sources, not both."
        },
    )
    sources: list[DataSource] = field(
        default_factory=list,
        metadata={
            "help": "Several datasets mixed instead of data.dataset: each with its adapter, share of data.num_samples and templates "
            "(data.adapter, data.subset, data.prompt_template and data.eval_split stay unset then); []: data.dataset alone."
        },
    )
    subset: str | None = field(
        default=None, metadata={"help": "The Hub dataset's configuration name (e.g. main for openai/gsm8k); null: its only or default one."}
    )
    adapter: Adapter | None = field(
        default=None,
        metadata={
            "help": "How a row becomes a prompt and a response: gsm8k, mmlu or cnndm (those datasets' Hub columns; cnndm_train: cnndm reading only "
            "the rows distill.common.splits leaves to training, 200-573 of the shared test file), messages (a chat `messages` list; "
            "a last assistant turn is the response) or prompt_response (`prompt` and an optional `response` column); null: detected from the columns."
        },
    )
    prompt_template: str | None = field(
        default=None,
        metadata={
            "help": "Rewrites each prompt's last user turn: the name of an evaluation task whose prompt to ask with (gsm8k, as `distill accept` asks), "
            "or a string with a {question} field where the prompt goes; null: prompts as the dataset has them."
        },
    )
    split: str = field(default="train", metadata={"help": "The split of data.dataset to train on; a local file has one split, train."})
    num_samples: int | None = field(
        default=None,
        metadata={
            "help": "Training rows drawn at random (seeded by `seed`) from the split; null: every row, in order. With data.sources (required then): "
            "the prompts of the mix, split between the sources by share.",
            **_POSITIVE,
        },
    )
    eval_split: str | None = field(
        default=None,
        metadata={
            "help": "Held-out data, evaluated with training.eval_steps and at the end: a split of data.dataset, or a local .jsonl, .json or .parquet file "
            "read with the same adapter; null: no held-out evaluation."
        },
    )
    eval_samples: int = field(
        default=64,
        metadata={"help": "Held-out rows drawn at random (seeded by `seed`) from data.eval_split; all of them, in order, when it has fewer.", **_POSITIVE},
    )
    max_prompt_length: int = field(
        default=512,
        metadata={
            "help": "Tokens kept of each chat-templated prompt, from its end (what the response follows); the target also generates from prompts cut "
            "so. Must be < data.max_length.",
            **_POSITIVE,
        },
    )
    max_length: int = field(
        default=1024,
        metadata={
            "help": "The longest example in tokens, prompt + response + EOS: the response is cut to fit. At most the context "
            "(max_position_embeddings) of either model.",
            **_POSITIVE,
        },
    )
    response_source: Literal["dataset", "target"] = field(
        default="dataset",
        metadata={
            "help": "Where responses come from: dataset, the dataset's own answers; target, sequence-level KD: the target answers every prompt once "
            "(greedy), cached in data.generation_cache, and the draft learns on those answers."
        },
    )
    generation_max_new_tokens: int = field(
        default=256, metadata={"help": "With data.response_source target: the most tokens the target generates per response.", **_POSITIVE}
    )
    generation_batch_size: int = field(default=8, metadata={"help": "With data.response_source target: prompts per generate call of the target.", **_POSITIVE})
    generation_cache: str | None = field(
        default=None,
        metadata={
            "help": "With data.response_source target (required then): the .jsonl file the target's responses are written to and reused from, "
            "next to a .manifest.json that pins model, tokenizer and settings; a stopped generation resumes where it left off."
        },
    )


@dataclass(kw_only=True)
class TeacherSpec:
    """The target's signal: computed online each step, or read from a top-k cache."""

    mode: Literal["online", "cache"] = field(
        default="online",
        metadata={
            "help": "online: the target runs next to the draft and gives its full logits every step; cache: the target's top-k log-probs are read "
            "from teacher.cache_dir, written once by `distill cache-teacher` (or by `distill train` first), so the target is not in memory "
            "while the draft trains."
        },
    )
    cache_dir: str | None = field(
        default=None,
        metadata={"help": "The folder of the top-k cache (train/ and eval/ inside), written by `distill cache-teacher`; required when teacher.mode is cache."},
    )
    top_k: int = field(
        default=32,
        metadata={
            "help": "Log-probs the cache keeps per response token, the target's most likely ones; the rest of the mass is one tail bucket. "
            "loss.top_k may not exceed it.",
            **_POSITIVE,
        },
    )
    batch_size: int = field(
        default=8, metadata={"help": "Examples per forward pass of the target while `distill cache-teacher` writes the cache.", **_POSITIVE}
    )


@dataclass(kw_only=True)
class TokenSelectionSpec:
    """AdaSPEC (distill.training.selection): the divergence is taken only on the tokens a reference draft shows are learnable."""

    reference: str = field(
        metadata={"help": "The reference draft, distilled first with plain KD (a folder, training output or Hub id); it must share the target's tokenizer."},
    )
    keep_fraction: float = field(
        default=0.4,
        metadata={
            "help": "The share of each batch's response tokens the divergence is taken on: those where the reference's loss is furthest below the "
            "draft's. In (0, 1]; 1 keeps every token.",
            **_check(lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
        },
    )


@dataclass(kw_only=True)
class LossSpec:
    """The distillation objective (see distill.training.losses): divergence_weight × mean divergence + ce_weight × mean CE over response tokens."""

    divergence: Divergence = field(
        default="forward_kl",
        metadata={
            "help": "The per-token divergence between the draft's and the target's next-token distributions: forward_kl, KL(target ‖ draft), "
            "mass-covering; reverse_kl, KL(draft ‖ target), mode-seeking; jsd, generalized Jensen-Shannon (see loss.beta); tvd, total variation "
            "(1 − TVD is speculative sampling's acceptance rate)."
        },
    )
    beta: float = field(
        default=0.5,
        metadata={
            "help": "For divergence jsd only: the mixture weight, m = (1 − beta)·draft + beta·target; 0 gives forward KL, 1 reverse KL.",
            **_UNIT,
        },
    )
    temperature: float = field(
        default=1.0,
        metadata={
            "help": "Both models' logits are divided by it before the divergence (no T² rescaling; 1.0 leaves them as they are); also the sampling "
            "temperature of the on-policy responses (loss.lmbda).",
            **_POSITIVE,
        },
    )
    divergence_weight: float = field(
        default=1.0,
        metadata={
            "help": "The weight of the mean divergence in the loss; 0, with loss.ce_weight > 0, trains on cross-entropy alone (the plain "
            "fine-tuning baseline).",
            **_NON_NEGATIVE,
        },
    )
    ce_weight: float = field(
        default=0.0,
        metadata={
            "help": "The weight of an added cross-entropy term: the mean CE of the draft's (untempered) logits on the response tokens; 0 turns it off.",
            **_NON_NEGATIVE,
        },
    )
    top_k: int | None = field(
        default=None,
        metadata={
            "help": "Compare on the target's k most likely tokens plus one tail bucket instead of its whole distribution (from a cache: its first k "
            "entries); null: the full logits online, every cached entry from a cache.",
            **_POSITIVE,
        },
    )
    chunk_size: int = field(
        default=1024,
        metadata={
            "help": "Response tokens whose draft logits exist at once: the loss (and the evaluation statistics and AdaSPEC's per-token losses) "
            "runs chunk by chunk, so the full tokens × vocabulary logits never do. Peak memory ≈ 10 × chunk_size × vocabulary × 4 bytes; "
            "lower it to save memory, raise it for speed.",
            **_POSITIVE,
        },
    )
    lmbda: float = field(
        default=0.0,
        metadata={
            "help": "GKD's on-policy fraction: the share of micro-batches (drawn reproducibly) whose responses are replaced by the draft's own "
            "samples for the same prompts before the loss; 0: never. Above 0 it needs teacher.mode online.",
            **_UNIT,
        },
    )
    max_new_tokens_on_policy: int = field(
        default=128, metadata={"help": "With loss.lmbda > 0: the most tokens the draft samples per on-policy response.", **_POSITIVE}
    )
    token_selection: TokenSelectionSpec | None = field(
        default=None,
        metadata={"help": "AdaSPEC: take the divergence only on the tokens a reference draft shows are learnable (training only); null: every response token."},
    )
    trimmed_vocab: Literal["renormalise", "other_bucket"] = field(
        default="renormalise",
        metadata={
            "help": "With a trimmed draft (draft.vocab): renormalise compares it with the target's distribution renormalised over the kept ids; "
            "other_bucket adds one bucket for every other id, scored by an extra head row that is dropped when draft/ is saved (the two measured "
            "the same within seed noise on the tiny pair: docs/benchmarks.md)."
        },
    )


@dataclass(kw_only=True)
class TrainingSpec:
    """Trainer settings, named as `transformers.TrainingArguments` names them."""

    max_steps: int = field(
        metadata={
            "help": "Optimizer steps to train; each takes per_device_train_batch_size × gradient_accumulation_steps × processes examples.",
            **_POSITIVE,
        }
    )
    per_device_train_batch_size: int = field(
        default=4,
        metadata={"help": "Examples per micro-batch on each process (also the evaluation batch size), padded to the longest of them.", **_POSITIVE},
    )
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Micro-batches whose gradients add up to one optimizer step.", **_POSITIVE})
    learning_rate: float = field(default=5e-5, metadata={"help": "The peak AdamW learning rate.", **_POSITIVE})
    lr_scheduler_type: str = field(
        default="cosine", metadata={"help": "The learning-rate schedule, a transformers scheduler name: cosine, linear, constant, constant_with_warmup, ..."}
    )
    warmup_ratio: float = field(
        default=0.0, metadata={"help": "The fraction (0 to 1) of training.max_steps over which the learning rate rises linearly from 0.", **_UNIT}
    )
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW's decoupled weight decay.", **_NON_NEGATIVE})
    logging_steps: int = field(
        default=10, metadata={"help": "Log the training loss (and kept_fraction with loss.token_selection) every this many steps.", **_POSITIVE}
    )
    eval_steps: int | None = field(
        default=None,
        metadata={
            "help": "Also evaluate on data.eval_split every this many steps (eval_loss, eval_expected_acceptance = 1 − TVD, eval_top1_agreement); "
            "null: only once, at the end, as every run with a data.eval_split does.",
            **_POSITIVE,
        },
    )
    save_steps: int = field(default=500, metadata={"help": "Write a checkpoint-N folder (what --resume continues from) every this many steps.", **_POSITIVE})
    save_total_limit: int | None = field(
        default=2, metadata={"help": "Keep at most this many checkpoint-N folders, deleting the oldest; null: keep them all.", **_POSITIVE}
    )
    bf16: bool = field(default=False, metadata={"help": "bfloat16 mixed precision (autocast) on a GPU; on a CPU it is turned off with a warning."})
    gradient_checkpointing: bool = field(
        default=False,
        metadata={
            "help": "Recompute each layer's activations in the backward pass instead of keeping them: far less activation memory for one more forward pass."
        },
    )
    report_to: list[str] = field(
        default_factory=lambda: ["none"],
        metadata={"help": "Where Trainer sends its logs, e.g. [tensorboard] or [wandb]; [none]: the console and trainer_state.json only."},
    )
    dataloader_num_workers: int = field(default=0, metadata={"help": "Worker processes that load batches; 0 loads them in the main process.", **_NON_NEGATIVE})


@dataclass(kw_only=True)
class Recipe:
    """One training run: which pair, which data, which objective, how long."""

    seed: int = field(
        default=0,
        metadata={
            "help": "Seeds the run: the Trainer (data order, dropout), the rows num_samples and eval_samples draw, a draft.config draft's and "
            "the LoRA adapter's initialisation, and the on-policy draws."
        },
    )
    output_dir: str = field(
        metadata={
            "help": "Where the run writes checkpoint-N folders, draft/ (the trained draft), recipe.yaml (this recipe, every default filled in) "
            "and run_info.json; it must hold no checkpoint unless --resume is given."
        }
    )
    target: ModelSpec = field(metadata={"help": "The target: the model the draft learns to predict and will speed up; its tokenizer is the run's."})
    draft: DraftSpec = field(metadata={"help": "The draft being trained: pretrained weights (name_or_path) or a fresh init (config), full or LoRA."})
    data: DataSpec = field(metadata={"help": "Where prompts and responses come from and how they are tokenized."})
    teacher: TeacherSpec = field(
        default_factory=TeacherSpec, metadata={"help": "Where the target's signal comes from: the live target, or a top-k cache of its log-probs."}
    )
    loss: LossSpec = field(default_factory=LossSpec, metadata={"help": "The distillation objective."})
    training: TrainingSpec = field(metadata={"help": "Trainer settings, named as transformers.TrainingArguments names them."})

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the whole recipe (every default filled in); `load_recipe` reads it back."""
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- validation


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list[{_type_name(typing.get_args(tp)[0])}]"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _given(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _convert(value: Any, tp: Any, where: str, errors: list[str]) -> Any:
    """`value` checked against type `tp` (and converted: int -> float, mapping -> dataclass)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        if value is None:
            errors.append(f"{where}: expected {_type_name(tp)}, got null")
            return None
        return _convert(value, inner, where, errors)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            errors.append(f"{where}: {value!r} is not allowed; choose one of {', '.join(map(repr, allowed))}{hint}")
        return value
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where, errors)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            errors.append(f"{where}: expected {_type_name(tp)}, got {_given(value)}")
            return value
        return [_convert(v, item_tp, f"{where}[{i}]", errors) for i, v in enumerate(value)]
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is dict:
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return value
    elif isinstance(value, tp):
        return value
    errors.append(f"{where}: expected {_type_name(tp)}, got {_given(value)}")
    return value


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key path the schema accepts, e.g. 'loss.divergence', 'draft.lora.r'."""
    paths = []
    for name, tp in typing.get_type_hints(cls).items():
        path = f"{prefix}{name}"
        paths.append(path)
        nested = [a for a in (typing.get_args(tp) or (tp,)) if dataclasses.is_dataclass(a)]
        for sub in nested:
            paths += _all_keys(sub, f"{path}.")
    return paths


def _unknown_key_message(key: str, where: str, valid: list[str]) -> str:
    path = f"{where}.{key}" if where else key
    close = difflib.get_close_matches(key, valid, n=1)
    if close:
        hint = f"did you mean '{where + '.' if where else ''}{close[0]}'?"
    else:
        elsewhere = [p for p in _all_keys(Recipe) if p.rsplit(".", 1)[-1] == key]
        hint = f"did you mean '{elsewhere[0]}'?" if elsewhere else f"valid keys here: {', '.join(valid)}"
    return f"{path}: unknown key; {hint}"


def _build(cls: type, data: Any, where: str, errors: list[str]) -> Any:
    """Instantiate dataclass `cls` from mapping `data`, appending every problem to `errors`."""
    label = where or "recipe"
    if not isinstance(data, dict):
        errors.append(f"{label}: expected a mapping of keys, got {_given(data)}")
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            errors.append(_unknown_key_message(str(key), where, list(fields)))
            continue
        path = f"{where}.{key}" if where else key
        n_errors = len(errors)
        converted = _convert(value, hints[key], path, errors)
        check = fields[key].metadata.get("check")
        if check and len(errors) == n_errors and converted is not None and not check[0](converted):
            errors.append(f"{path}: must be {check[1]}, got {converted!r}")
        kwargs[key] = converted
    missing = [name for name, f in fields.items() if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    for name in missing:
        errors.append(f"{where + '.' if where else ''}{name}: required key is missing")
    if missing or any(v is None and not _optional(hints[k]) for k, v in kwargs.items()):
        return None
    return cls(**kwargs)


def _optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp)


def _cross_checks(r: Recipe) -> list[str]:
    """Rules that tie keys together; each message says how to fix it."""
    errors = []
    if (r.draft.name_or_path is None) == (r.draft.config is None):
        errors.append("draft: set exactly one of draft.name_or_path (load weights) or draft.config (fresh init)")
    if r.loss.divergence_weight == 0 and r.loss.ce_weight == 0:
        errors.append("loss: divergence_weight and ce_weight are both 0, so nothing is trained; set one above 0")
    if r.teacher.mode == "cache" and not r.teacher.cache_dir:
        errors.append("teacher.cache_dir: required when teacher.mode is 'cache' (where `distill cache-teacher` wrote it)")
    if r.teacher.mode == "cache" and r.loss.top_k is not None and r.loss.top_k > r.teacher.top_k:
        errors.append(f"loss.top_k: {r.loss.top_k} exceeds the cached teacher.top_k {r.teacher.top_k}")
    if r.data.response_source == "target" and not r.data.generation_cache:
        errors.append("data.generation_cache: required when data.response_source is 'target' (a .jsonl path for the generations)")
    if r.data.max_prompt_length >= r.data.max_length:
        errors.append(f"data.max_prompt_length: must be < data.max_length ({r.data.max_prompt_length} >= {r.data.max_length}), or no response token would fit")
    if r.data.prompt_template is not None and r.data.prompt_template not in TEMPLATES and "{question}" not in r.data.prompt_template:
        errors.append(
            f"data.prompt_template: {r.data.prompt_template!r} is neither a task name ({', '.join(TEMPLATES)}) "
            "nor a string with a {question} field where the prompt goes"
        )
    if r.data.prompt_template is not None and (held := held_out_names(r.data.prompt_template)):
        errors.append(f"data.prompt_template: {held[0]!r} is held out of training (distill.common.prompts.HELD_OUT_TEMPLATES); {_training_names()}")
    return errors + _source_checks(r.data) + _vocab_checks(r)


def _vocab_checks(r: Recipe) -> list[str]:
    """A trimmed draft (draft.vocab) against the keys it cannot serve."""
    if r.draft.vocab is None:
        return []
    errors = []
    if r.loss.lmbda > 0:
        errors.append("draft.vocab: on-policy batches (loss.lmbda > 0) sample with transformers' generate over the whole vocabulary; set loss.lmbda: 0")
    if r.loss.token_selection is not None:
        errors.append("draft.vocab: AdaSPEC (loss.token_selection) compares full-vocabulary drafts; unset one of the two")
    if r.draft.lora is not None and not r.draft.merge_on_save:
        errors.append("draft.vocab: an adapter alone cannot carry the trimmed head; set draft.merge_on_save: true")
    if r.draft.lora is not None and r.loss.trimmed_vocab == "other_bucket":
        errors.append("loss.trimmed_vocab: other_bucket trains an extra head row, which a LoRA run keeps frozen with the head; use renormalise")
    return errors


def _training_names() -> str:
    return "train with one of " + ", ".join(name for names in TRAINING_TEMPLATES.values() for name in names) + " or a string with a {question} field"


def _source_checks(data: DataSpec) -> list[str]:
    """data.sources against data.dataset and the rest of data, and each source's templates."""
    if not data.sources:
        return [] if data.dataset else ["data: set data.dataset (one dataset) or data.sources (a mix), the data to train on"]
    errors = []
    if data.dataset:
        errors.append("data: set data.dataset (one dataset) or data.sources (a mix), not both")
    for key, per_source in (("adapter", "adapter"), ("subset", "subset"), ("prompt_template", "templates")):
        if getattr(data, key) is not None:
            errors.append(f"data.{key}: leave it unset with data.sources; set data.sources[i].{per_source} per source")
    if data.eval_split is not None:
        errors.append("data.eval_split: leave it unset with data.sources: a mix is measured by `distill accept` on the tasks' evaluation rows")
    if data.num_samples is None:
        errors.append("data.num_samples: required with data.sources: the number of prompts, split between the sources by their shares")
    elif data.num_samples < len(data.sources):
        errors.append(f"data.num_samples: {data.num_samples} is fewer than the {len(data.sources)} sources")
    for i, source in enumerate(data.sources):
        task = {"cnndm_train": "cnndm"}.get(source.adapter, source.adapter)
        errors += [
            f"data.sources[{i}].exclude: {path!r} is not a local .jsonl, .json or .parquet file (the evaluation's rows)"
            for path in source.exclude
            if Path(path).suffix.lower() not in (".jsonl", ".json", ".parquet")
        ]
        for template in source.templates:
            problem = template_problem(template, task if task in TRAINING_TEMPLATES else None)
            if problem:
                errors.append(f"data.sources[{i}].templates: {problem}")
            elif held := held_out_names(template):
                errors.append(
                    f"data.sources[{i}].templates: {held[0]!r} is held out of training (distill.common.prompts.HELD_OUT_TEMPLATES); {_training_names()}"
                )
    return errors


def check_paths(recipe: Recipe) -> None:
    """Raise RecipeError naming every local model or data path of `recipe` that does not exist, at
    the start of a run (a missing folder would otherwise reach the Hub client as a malformed repo id)."""
    wanted = [
        ("target.name_or_path", recipe.target.name_or_path),
        ("draft.name_or_path", recipe.draft.name_or_path),
        ("data.dataset", recipe.data.dataset),
        ("data.eval_split", recipe.data.eval_split),
        ("loss.token_selection.reference", recipe.loss.token_selection and recipe.loss.token_selection.reference),
        *((f"draft.vocab.count_from[{i}]", path) for i, path in enumerate((recipe.draft.vocab and recipe.draft.vocab.count_from) or [])),
        *((f"data.sources[{i}].dataset", source.dataset) for i, source in enumerate(recipe.data.sources)),
        *((f"data.sources[{i}].exclude", path) for i, source in enumerate(recipe.data.sources) for path in source.exclude),
    ]
    missing = [
        f"{key}: {value} does not exist (relative paths are read from {os.getcwd()}); fix the path or create it first"
        for key, value in wanted
        if value and looks_local(value) and not Path(value).exists()
    ]
    if missing:
        raise RecipeError(missing)


# --------------------------------------------------------------------------- help


@dataclass(frozen=True)
class KeyHelp:
    """One recipe key as `distill train --help-recipe` lists it."""

    path: str  # dotted, e.g. "data.max_length"
    type: str  # as validation names it, e.g. "int | null"; a section is a "mapping"
    default: str  # as YAML writes it, or "(required)"
    help: str
    section: bool  # a mapping of keys of its own (listed with its keys after it)


def _yaml_value(value: Any) -> str:
    if dataclasses.is_dataclass(value):
        return "{}"  # a section left out: each of its keys takes its default
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=1_000_000).strip()
    return text.removesuffix("...").strip()


def _default_of(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return _yaml_value(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return _yaml_value(f.default_factory())
    return "(required)"


def _section_of(tp: Any) -> type | None:
    """The dataclass a field of type `tp` holds (a section), None for a plain value."""
    return next((a for a in (typing.get_args(tp) or (tp,)) if dataclasses.is_dataclass(a)), None)


def recipe_keys(cls: type = Recipe, prefix: str = "") -> list[KeyHelp]:
    """Every key the schema declares, walked from the dataclasses: a section's plain keys, then each
    nested section followed by its own keys."""
    hints = typing.get_type_hints(cls)
    plain, sections = [], []
    for f in dataclasses.fields(cls):
        path, sub = f"{prefix}{f.name}", _section_of(hints[f.name])
        key = KeyHelp(path, _type_name(hints[f.name]), _default_of(f), f.metadata.get("help", ""), sub is not None)
        if sub is None:
            plain.append(key)
        else:
            sections += [key, *recipe_keys(sub, f"{path}.")]
    return plain + sections


def recipe_help(width: int = 100) -> str:
    """The text of `distill train --help-recipe`: each key as `path: type = default` and its help, grouped by section."""
    lines = [
        "Recipe keys: a recipe is a YAML mapping of these (sections nest), each listed as `path: type = default` and",
        "what it does. Any key can also be set on the command line: distill train RECIPE --set KEY=VALUE.",
    ]
    wrap = {n: textwrap.TextWrapper(width=width, initial_indent=" " * n, subsequent_indent=" " * n, break_on_hyphens=False) for n in (4, 6)}
    lines.append("")
    for key in recipe_keys():
        default = key.default if key.default == "(required)" else f"= {key.default}"
        if key.section:
            lines += ["", f"{key.path}: {key.type} {default}", *wrap[4].wrap(key.help)]
        else:
            lines += [f"  {key.path}: {key.type} {default}", *wrap[6].wrap(key.help)]
    lines += ["", "Removed keys: a recipe that still sets one is refused with a line that names it."]
    for path, why in REMOVED_KEYS.items():
        lines += [f"  {path}", *wrap[6].wrap(f"{why}.")]
    return "\n".join(lines)


# --------------------------------------------------------------------------- YAML


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads `5e-5` as a float (YAML 1.2) and refuses duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _override_field(path: str) -> tuple[list[str], list[str]]:
    """The dotted `path` checked against the schema: (its parts, errors with did-you-mean hints).
    Keys below a free-form mapping (draft.config) are not checked here; the model config checks them."""
    parts, cls, where = path.split("."), Recipe, ""
    for i, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if part not in fields:
            return parts, ["--set " + _unknown_key_message(part, where, list(fields))]
        tp = typing.get_type_hints(cls)[part]
        inner = [a for a in (typing.get_args(tp) or (tp,)) if a is not type(None)]
        where = f"{where}.{part}" if where else part
        if dataclasses.is_dataclass(inner[0]):
            cls = inner[0]
        elif inner[0] is dict:
            return parts, []
        elif i < len(parts) - 1:
            return parts, [f"--set {path}: {where} is a {_type_name(tp)} value, not a section with keys"]
    return parts, []


def apply_overrides(data: dict, overrides: Sequence[str]) -> dict:
    """A copy of the raw recipe `data` with each `key.path=value` applied (value read as YAML, so
    `null`, `2`, `5e-5` and `[a, b]` are typed); a misspelt key is an error naming the closest one,
    a removed one (REMOVED_KEYS) a RemovedKeyError."""
    data, errors, gone = copy.deepcopy(data), [], []
    for item in overrides:
        path, sep, text = item.partition("=")
        if not sep or not path.strip():
            errors.append(f"--set {item!r}: write KEY=VALUE with a dotted key, e.g. training.max_steps=10")
            continue
        removed = _removed_override(path.strip())
        if removed:
            gone.append(f"--set {path.strip()}: " + _removed(removed, "drop this --set"))
            continue
        parts, problems = _override_field(path.strip())
        if problems:
            errors += problems
            continue
        try:
            value = yaml.load(text, Loader=_Loader)
        except yaml.YAMLError as e:
            errors.append(f"--set {item!r}: the value is not valid YAML ({e})")
            continue
        node = data
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    if gone:
        raise RemovedKeyError(gone)
    if errors:
        raise RecipeError(errors)
    return data


def load_recipe(path_or_dict: str | os.PathLike | dict, overrides: Sequence[str] = ()) -> Recipe:
    """Read and validate a recipe from a YAML file or a dict, after the `--set key.path=value`
    `overrides` (see `apply_overrides`); raise RecipeError listing every problem."""
    source = None
    if isinstance(path_or_dict, dict):
        data = path_or_dict
    else:
        source = str(path_or_dict)
        if not os.path.isfile(source):
            raise FileNotFoundError(f"recipe file not found: {source}")
        with open(source, encoding="utf-8") as f:
            try:
                data = yaml.load(f, Loader=_Loader)
            except yaml.YAMLError as e:
                raise RecipeError([f"not valid YAML: {e}"], source) from e
        if data is None:
            raise RecipeError(["the file is empty"], source)
    gone = _removed_keys_in(data)
    if gone:
        raise RemovedKeyError(gone, source)
    if overrides:
        if not isinstance(data, dict):
            raise RecipeError([f"expected a mapping of keys, got {_given(data)}"], source)
        try:
            data = apply_overrides(data, overrides)
        except RecipeError as e:
            raise type(e)(e.errors, source) from None
    errors: list[str] = []
    recipe = _build(Recipe, data, "", errors)
    if recipe is not None and not errors:
        errors = _cross_checks(recipe)
    if errors:
        raise RecipeError(errors, source)
    return recipe


def save_recipe(recipe: Recipe, path: str | os.PathLike) -> Path:
    """Write `recipe` as YAML atomically (temp file + rename), so a crash never leaves half a file."""
    return atomic_write(path, yaml.safe_dump(recipe.to_dict(), sort_keys=False))
