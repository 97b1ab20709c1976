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
import tempfile
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from distill.common.models import looks_local
from distill.common.prompts import TEMPLATES

Dtype = Literal["float32", "bfloat16", "float16", "auto"]
Adapter = Literal["gsm8k", "mmlu", "cnndm", "messages", "prompt_response"]
Divergence = Literal["forward_kl", "reverse_kl", "jsd", "tvd"]

DEFAULT_LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class RecipeError(ValueError):
    """A recipe that does not validate; `errors` lists one message per problem."""

    def __init__(self, errors: list[str], source: str | None = None):
        self.errors = errors
        prefix = f"invalid recipe {source}:" if source else "invalid recipe:"
        super().__init__("\n  ".join([prefix, *errors]))


def _check(predicate: typing.Callable[[Any], bool], what: str) -> dict[str, Any]:
    """Field metadata: a range check applied after type conversion, `what` says the allowed range."""
    return {"check": (predicate, what)}


_POSITIVE = _check(lambda v: v > 0, "> 0")
_NON_NEGATIVE = _check(lambda v: v >= 0, ">= 0")
_UNIT = _check(lambda v: 0.0 <= v <= 1.0, "between 0 and 1")


@dataclass(kw_only=True)
class ModelSpec:
    """A Hugging Face model to load with `from_pretrained`. `trust_remote_code` runs Python shipped
    in the model's folder or Hub repo (its `auto_map`): off unless the recipe turns it on."""

    name_or_path: str
    revision: str | None = None
    dtype: Dtype = "auto"
    trust_remote_code: bool = False


@dataclass(kw_only=True)
class LoraSpec:
    """peft LoRA settings for the draft."""

    r: int = field(default=16, metadata=_POSITIVE)
    alpha: int = field(default=32, metadata=_POSITIVE)
    dropout: float = field(default=0.05, metadata=_UNIT)
    target_modules: list[str] = field(default_factory=lambda: list(DEFAULT_LORA_MODULES))


@dataclass(kw_only=True)
class DraftSpec(ModelSpec):
    """The draft: pretrained weights (`name_or_path`) or a fresh random init from `config`
    (a `Qwen2Config` keyword dict, used with the target tokenizer); exactly one of the two."""

    name_or_path: str | None = None
    config: dict | None = None
    lora: LoraSpec | None = None
    merge_on_save: bool = True


@dataclass(kw_only=True)
class DataSpec:
    """Where prompts and responses come from and how they are tokenized (see distill.training.data).

    `eval_split` is a split of `dataset`, or a local .jsonl/.json/.parquet file of held-out data.
    `subset` is the Hub dataset's configuration name (e.g. "main" for openai/gsm8k).
    `prompt_template` rewrites each prompt's last user turn: the name of an evaluation task whose
    prompt to ask with (e.g. "gsm8k", as `distill accept` asks), or a string with a `{question}` field."""

    dataset: str
    subset: str | None = None
    adapter: Adapter | None = None
    prompt_template: str | None = None
    split: str = "train"
    num_samples: int | None = field(default=None, metadata=_POSITIVE)
    eval_split: str | None = None
    eval_samples: int = field(default=64, metadata=_POSITIVE)
    max_prompt_length: int = field(default=512, metadata=_POSITIVE)
    max_length: int = field(default=1024, metadata=_POSITIVE)
    response_source: Literal["dataset", "target"] = "dataset"
    generation_max_new_tokens: int = field(default=256, metadata=_POSITIVE)
    generation_batch_size: int = field(default=8, metadata=_POSITIVE)
    generation_cache: str | None = None
    packing: bool = False


@dataclass(kw_only=True)
class TeacherSpec:
    """The target's signal: computed online each step, or read from a top-k cache."""

    mode: Literal["online", "cache"] = "online"
    cache_dir: str | None = None
    top_k: int = field(default=32, metadata=_POSITIVE)
    batch_size: int = field(default=8, metadata=_POSITIVE)


@dataclass(kw_only=True)
class TokenSelectionSpec:
    """AdaSPEC (distill.training.selection): per batch, the divergence is taken only on the `keep_fraction` of
    response tokens where the `reference` draft's loss is furthest below the draft's. The reference
    is a draft distilled first with plain KD (a path or Hub id) and must share the target's tokenizer."""

    reference: str
    keep_fraction: float = field(default=0.4, metadata=_check(lambda v: 0.0 < v <= 1.0, "in (0, 1]"))


@dataclass(kw_only=True)
class LossSpec:
    """The distillation objective (see distill.training.losses)."""

    divergence: Divergence = "forward_kl"
    beta: float = field(default=0.5, metadata=_UNIT)
    temperature: float = field(default=1.0, metadata=_POSITIVE)
    divergence_weight: float = field(default=1.0, metadata=_NON_NEGATIVE)  # 0 with ce_weight > 0: plain CE baseline
    ce_weight: float = field(default=0.0, metadata=_NON_NEGATIVE)
    top_k: int | None = field(default=None, metadata=_POSITIVE)
    chunk_size: int = field(default=1024, metadata=_POSITIVE)
    lmbda: float = field(default=0.0, metadata=_UNIT)
    max_new_tokens_on_policy: int = field(default=128, metadata=_POSITIVE)
    token_selection: TokenSelectionSpec | None = None


@dataclass(kw_only=True)
class TrainingSpec:
    """Trainer settings, named as `transformers.TrainingArguments` names them."""

    max_steps: int = field(metadata=_POSITIVE)
    per_device_train_batch_size: int = field(default=4, metadata=_POSITIVE)
    gradient_accumulation_steps: int = field(default=1, metadata=_POSITIVE)
    learning_rate: float = field(default=5e-5, metadata=_POSITIVE)
    lr_scheduler_type: str = "cosine"
    warmup_ratio: float = field(default=0.0, metadata=_UNIT)
    weight_decay: float = field(default=0.0, metadata=_NON_NEGATIVE)
    logging_steps: int = field(default=10, metadata=_POSITIVE)
    eval_steps: int | None = field(default=None, metadata=_POSITIVE)
    save_steps: int = field(default=500, metadata=_POSITIVE)
    save_total_limit: int | None = field(default=2, metadata=_POSITIVE)
    bf16: bool = False
    gradient_checkpointing: bool = False
    report_to: list[str] = field(default_factory=lambda: ["none"])
    dataloader_num_workers: int = field(default=0, metadata=_NON_NEGATIVE)


@dataclass(kw_only=True)
class EvalSpec:
    """Speculative-decoding evaluation after training."""

    num_prompts: int = field(default=32, metadata=_POSITIVE)
    max_new_tokens: int = field(default=64, metadata=_POSITIVE)
    num_draft_tokens: int = field(default=5, metadata=_POSITIVE)


@dataclass(kw_only=True)
class Recipe:
    """One training run: which pair, which data, which objective, how long."""

    seed: int = 0
    output_dir: str
    target: ModelSpec
    draft: DraftSpec
    data: DataSpec
    teacher: TeacherSpec = field(default_factory=TeacherSpec)
    loss: LossSpec = field(default_factory=LossSpec)
    training: TrainingSpec
    eval: EvalSpec = field(default_factory=EvalSpec)

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
    if r.data.packing:
        errors.append("data.packing: packing is not supported (examples are padded per batch); set packing: false")
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
    ]
    missing = [
        f"{key}: {value} does not exist (relative paths are read from {os.getcwd()}); fix the path or create it first"
        for key, value in wanted
        if value and looks_local(value) and not Path(value).exists()
    ]
    if missing:
        raise RecipeError(missing)


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
    `null`, `2`, `5e-5` and `[a, b]` are typed); a misspelt key is an error naming the closest one."""
    data, errors = copy.deepcopy(data), []
    for item in overrides:
        path, sep, text = item.partition("=")
        if not sep or not path.strip():
            errors.append(f"--set {item!r}: write KEY=VALUE with a dotted key, e.g. training.max_steps=10")
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
    if overrides:
        if not isinstance(data, dict):
            raise RecipeError([f"expected a mapping of keys, got {_given(data)}"], source)
        try:
            data = apply_overrides(data, overrides)
        except RecipeError as e:
            raise RecipeError(e.errors, source) from None
    errors: list[str] = []
    recipe = _build(Recipe, data, "", errors)
    if recipe is not None and not errors:
        errors = _cross_checks(recipe)
    if errors:
        raise RecipeError(errors, source)
    return recipe


def save_recipe(recipe: Recipe, path: str | os.PathLike) -> Path:
    """Write `recipe` as YAML atomically (temp file + rename), so a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yaml.safe_dump(recipe.to_dict(), f, sort_keys=False)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path
