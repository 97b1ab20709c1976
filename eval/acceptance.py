"""`distill accept`: target-only decoding and speculative decoding with each draft on the same task
prompts, in one run: task quality for both, greedy identity, acceptance, TTFT, TPOT, throughput and
measured speedup (optionally for several k, next to the speedup predicted from the measured α).

    python eval/acceptance.py --target Qwen/Qwen2.5-7B-Instruct --draft Qwen/Qwen2.5-0.5B-Instruct \\
        --draft distilled=runs/kd --tasks gsm8k,mmlu,cnndm --dtype bfloat16 --ks 1,2,4,6,8

Every generate call is journalled to <output-dir>/records.jsonl as it finishes, with the run that
timed it (`distill.eval.journal`), so a stopped run started again with the same settings resumes where
it stopped, and a draft added to a finished run (or a retrained one) costs its own calls plus the
target-only calls of its prompts, timed again in the new run (`distill.eval.measurement`): a speedup
only divides timings of one run. The figures, their 95% intervals and the paired differences between
drafts come from `distill.eval.figures`; report.json, report.md and the PNG plots are written
atomically by `distill.eval.report`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from distill.arguments import default_device, parser, quiet_cpu_deepspeed
from distill.common import prompts
from distill.common.io import file_stamp
from distill.common.models import ModelLoadError, load_model, load_tokenizer, resolve
from distill.common.provenance import MachineLoad, environment, warn
from distill.common.trim import coverage, draft_to_target, prompt_extras, prompt_rows
from distill.common.vocab import check_tokenizers_agree
from distill.eval.figures import (
    SCHEMA_VERSION,
    acceptance,
    add_predictions,
    decomposition,
    intervals,
    outputs,
    paired_difference,
    quality,
    task_row,
    timed_pairs,
    timing,
)
from distill.eval.journal import Journal, Run, busiest
from distill.eval.measurement import ALONE, TARGET, Call, Decoding, calls_to_run, speculative_generate, target_generate
from distill.eval.report import write_outputs
from distill.eval.tasks import TASKS, TaskExample, get_task
from distill.speculative import SpeculativeDecoder
from distill.speculative.costs import Costs, CostSampler, best_k, measure_costs, resolve_backend, spread_evenly

DTYPES = ("float32", "bfloat16", "float16", "auto")
JOURNAL = "records.jsonl"


@dataclass(frozen=True)
class DraftSource:
    """A draft to evaluate: the name it is reported under and where it loads from."""

    name: str
    path: str


@dataclass
class Settings:
    """Everything that decides what an acceptance run measures (its fingerprint keys the journal)."""

    target: str
    drafts: list[DraftSource]
    tasks: list[str]
    data_files: dict[str, str] = field(default_factory=dict)
    num_samples: int | dict[str, int] | None = None  # one count for every task, or per task (the rest: each task's default)
    seed: int = 0
    max_new_tokens: int | None = None
    num_draft_tokens: int = 5
    ks: list[int] = field(default_factory=list)
    sweep_samples: int | None = None
    sweep_drafts: list[str] | None = None  # the drafts measured at every --ks (None: all of them); the rest at the main k only
    compare: list[tuple[str, str]] = field(default_factory=list)  # (draft, reference) paired differences besides each draft against the first
    schedule: str = "constant"
    temperature: float = 0.0
    top_p: float = 1.0
    batch_size: int = 1
    dtype: str = "float32"
    device: str = "cpu"
    num_fewshot: int = 0
    max_article_words: int | None = None
    cost_repeats: int = 20  # timed repeats of c, c₂ and v(k), spread over the run's generate calls (RunCosts)
    draft_alone: bool = False
    output_dir: str = "eval-output"
    fewshot_files: dict[str, str] = field(default_factory=dict)  # task -> the file its shots come from (mmlu: the dev split)
    templates: dict[str, list[str]] = field(default_factory=dict)  # task -> template names or files it is asked under (none: its own prompt)

    @property
    def do_sample(self) -> bool:
        return self.temperature > 0

    def samples(self, task: str) -> int:
        """The number of prompts `task` is asked: its own count, the one count for all, or the task's default."""
        if isinstance(self.num_samples, dict):
            return self.num_samples.get(task) or get_task(task).default_num_samples
        return self.num_samples or get_task(task).default_num_samples

    def new_tokens(self, label: str) -> int:
        """The generation length of a report row: --max-new-tokens, else its task's own."""
        return self.max_new_tokens or get_task(task_of(label)).max_new_tokens

    def variants(self) -> list[tuple[str, str, str]]:
        """(label, task, template) of each task under each template it is asked with, in task order: a task
        without --template is labelled by its name and asked its own prompt; under templates, `task@variant`."""
        out = []
        for task in self.tasks:
            names = self.templates.get(task)
            if not names:
                out.append((task, task, task))
            for name in names or []:
                out.append((f"{task}@{template_label(task, name)}", task, name))
        return out

    def swept(self, draft: str) -> bool:
        """Whether `draft` is measured at every k of --ks (on the sweep's prompts), not at the main k only."""
        return self.sweep_drafts is None or draft in self.sweep_drafts

    @property
    def labels(self) -> list[str]:
        """The report's task rows: one per task and template (`variants`)."""
        return [label for label, _, _ in self.variants()]

    def fingerprint(self) -> str:
        """A hash of the settings that change every measurement (not where the output goes, nor which
        drafts: each draft's calls carry `draft_stamp`), and of the local files behind them, so an
        edited data file is measured afresh while a draft added to a finished run costs its calls only.
        The prompt counts, templates and shot files are left out: they decide which prompts are asked,
        and each call's key carries a hash of its prompts (`plan`), so a larger count or another
        template reuses the calls of the prompts already measured."""
        calls_only = (
            "drafts",
            "draft_alone",
            "ks",
            "sweep_samples",
            "sweep_drafts",
            "compare",
            "num_samples",
            "templates",
            "fewshot_files",
        )  # each call keyed by its prompts, system, k
        keyed = {k: v for k, v in asdict(self).items() if k not in ("output_dir", "cost_repeats", *calls_only)}
        sources = [self.target, *self.data_files.values()]
        keyed["files"] = {src: file_stamp(Path(src)) for src in sources if Path(src).exists()}
        return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]

    def draft_stamp(self, name: str) -> str:
        """A hash of one draft's path and files: a retrained or replaced draft is measured afresh."""
        path = next(d.path for d in self.drafts if d.name == name)
        stamp = [path, file_stamp(Path(path)) if Path(path).exists() else None]
        return hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:12]


def parse_drafts(values: Iterable[str]) -> list[DraftSource]:
    """`--draft` values (repeatable, comma-separated, `name=path` or a bare path named after itself)."""
    drafts = []
    for value in values:
        for item in filter(None, (part.strip() for part in value.split(","))):
            name, sep, path = item.partition("=")
            if not sep:
                name, path = item, item
            if not name or not path:
                raise ValueError(f"--draft {item!r}: write NAME=PATH or a bare Hub id / path")
            drafts.append(DraftSource(name.strip(), path.strip()))
    if not drafts:
        raise ValueError("give at least one --draft (a Hub id, a path, or NAME=PATH)")
    names = [d.name for d in drafts]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"--draft names {duplicates} are given twice; name each draft with NAME=PATH")
    return drafts


def _task_files(values: Iterable[str], tasks: Sequence[str], flag: str, example: str, kind: str, only: str | None = None) -> dict[str, str]:
    """`FLAG task=path` values: each task among `tasks` (and `only`, when one task alone takes the flag), each file existing."""
    files = {}
    for value in values:
        task, sep, path = value.partition("=")
        if not sep or not path:
            raise ValueError(f"{flag} {value!r}: write TASK=PATH, e.g. {example}")
        if only is not None and task != only:
            raise ValueError(f"{flag} {value!r}: only {only} takes shots; write {only}=PATH")
        if task not in tasks:
            raise ValueError(f"{flag} {value!r}: task {task!r} is not among --tasks {list(tasks)}")
        if not Path(path).is_file():
            raise FileNotFoundError(f"{flag} {value!r}: {path} does not exist; pass {kind}")
        files[task] = path
    return files


def parse_data_files(values: Iterable[str], tasks: Sequence[str]) -> dict[str, str]:
    """`--data-file task=path` values; each task must be one of `tasks` and each file must exist."""
    return _task_files(values, tasks, "--data-file", "gsm8k=data/gsm8k_test.jsonl", "an existing JSONL/JSON/Parquet file")


def parse_num_samples(text: str | None, tasks: Sequence[str]) -> dict[str, int]:
    """`--num-samples`: one count for every task (`30`), or counts per task (`gsm8k=30,mmlu=200`; a task
    not named keeps its default). Empty: every task its default."""
    if text is None or not str(text).strip():
        return {}
    text = str(text).strip()
    fix = "write a positive integer for every task (30) or TASK=N,... (gsm8k=30,mmlu=200,cnndm=40)"
    if "=" not in text:
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"--num-samples {text!r}: {fix}")
        return dict.fromkeys(tasks, int(text))
    counts = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        task, sep, n = (part.strip() for part in item.partition("="))
        if not sep or not n.isdigit() or int(n) < 1:
            raise ValueError(f"--num-samples {text!r}: {item!r} is not TASK=N; {fix}")
        if task not in tasks:
            raise ValueError(f"--num-samples {text!r}: task {task!r} is not among --tasks {list(tasks)}")
        counts[task] = int(n)
    return counts


def parse_fewshot_files(values: Iterable[str], tasks: Sequence[str]) -> dict[str, str]:
    """`--fewshot-file mmlu=PATH` values: the file each task's shots come from (MMLU only: its dev split)."""
    return _task_files(values, tasks, "--fewshot-file", "mmlu=../shared/data/mmlu/dev.jsonl", "the dev split's JSONL/JSON/Parquet file", only="mmlu")


TEMPLATE_GROUPS = {
    "default": lambda task: (task,),
    "train": lambda task: prompts.TRAINING_TEMPLATES.get(task, ()),
    "held-out": lambda task: prompts.HELD_OUT_TEMPLATES.get(task, ()),
}


def _template_names(task: str, item: str, value: str) -> tuple[str, ...]:
    """The templates `item` of a `--template` value names for `task`: a group, a name (whole or without
    its `TASK-` prefix), or a file holding a template with a {question} field."""
    if item in TEMPLATE_GROUPS:
        return tuple(TEMPLATE_GROUPS[item](task))
    for name in (item, f"{task}-{item}"):
        if name in prompts.TEMPLATES and (name == task or name.startswith(f"{task}-")):
            return (name,)
    if Path(item).is_file():
        text = Path(item).read_text(encoding="utf-8")
        if prompts.template_problem(text, task):
            need = "a {question} field where the text goes" + (" ({subject} only for mmlu)" if "{subject}" in text else "")
            raise ValueError(f"--template {value!r}: the file {item} is no {task} template: it needs {need}")
        return (item,)
    own = [n for n in prompts.TEMPLATES if n == task or n.startswith(f"{task}-")]
    raise ValueError(
        f"--template {value!r}: {item!r} is no {task} template, group or file; choose from {', '.join(own)} "
        f"(or without the '{task}-' prefix), the groups {', '.join(TEMPLATE_GROUPS)}, or a file holding a template with a {{question}} field"
    )


def parse_templates(values: Iterable[str], tasks: Sequence[str]) -> dict[str, list[str]]:
    """`--template` values (repeatable): `TASK=ITEM,...` asks TASK under each item, a bare `ITEM,...` asks
    every task so (groups only: default, train, held-out). The report labels each `task@variant`
    (`gsm8k@default`, `gsm8k@boxed`, a file by its name without suffix)."""
    chosen: dict[str, list[str]] = {}
    for value in values:
        task, sep, items = value.partition("=")
        if not sep:
            task, items = "", value
        elif task not in tasks:
            raise ValueError(f"--template {value!r}: task {task!r} is not among --tasks {list(tasks)}")
        parts = [part.strip() for part in items.split(",") if part.strip()]
        if not parts:
            raise ValueError(f"--template {value!r}: name at least one template, e.g. gsm8k=default,held-out")
        if not sep and (bad := [p for p in parts if p not in TEMPLATE_GROUPS]):
            raise ValueError(f"--template {value!r}: {bad[0]!r} names no group; without TASK= use {', '.join(TEMPLATE_GROUPS)}, or write TASK=NAME")
        for one in [task] if sep else tasks:
            names = chosen.setdefault(one, [])
            for part in parts:
                names += [n for n in _template_names(one, part, value) if n not in names]
    for task, names in chosen.items():
        labels = [template_label(task, n) for n in names]
        if len(set(labels)) < len(labels):
            raise ValueError(f"--template: two templates of {task} would be reported under one label ({labels}); rename a template file")
    return chosen


def template_label(task: str, template: str) -> str:
    """How the report names `task` asked under `template`: a registry name by its variant (`default`,
    `boxed`), a template file by its name without suffix."""
    return prompts.variant(task, template) if template in prompts.TEMPLATES else Path(template).stem


def task_of(label: str) -> str:
    """The task a report label (`gsm8k` or `gsm8k@boxed`) measures."""
    return label.partition("@")[0]


def parse_pairs(text: str | None) -> list[tuple[str, str]]:
    """`--compare DRAFT:REFERENCE,...`: the extra paired differences, each of two different drafts."""
    pairs = []
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        draft, sep, ref = (s.strip() for s in item.partition(":"))
        if not (sep and draft and ref) or draft == ref:
            raise ValueError(f"--compare {item!r}: write DRAFT:REFERENCE with two different draft names, e.g. mix:gsm8k")
        pairs.append((draft, ref))
    return pairs


def parse_ints(text: str, flag: str) -> list[int]:
    """A comma-separated list of positive integers (`--ks 1,2,4`)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated integers such as 1,2,4,6,8") from None
    if not values or min(values) < 1:
        raise ValueError(f"{flag} {text!r}: every value must be an integer >= 1")
    return sorted(set(values))


def _load_tokenizer(path: str, role: str) -> PreTrainedTokenizerBase:
    try:
        return load_tokenizer(path, what=f"{role} tokenizer")
    except ModelLoadError as err:
        raise ModelLoadError(f"{err} (a draft folder must carry its tokenizer: training saves the target's beside it)") from None


def _load_model(path: str, dtype: str | torch.dtype, device: str, role: str) -> PreTrainedModel:
    return load_model(path, dtype=dtype, device=device, what=role)


def _plain_generation_config(model: PreTrainedModel, eos: list[int], pad: int) -> dict[str, Any]:
    """Give the target a generation config without checkpoint extras (Qwen's repetition_penalty,
    top_k, do_sample), so its own decoding follows the rule the speculative decoder applies.
    Returns what was dropped, for the report."""
    old = model.generation_config.to_diff_dict()
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=model.generation_config.bos_token_id)
    return {k: v for k, v in old.items() if k not in ("eos_token_id", "pad_token_id", "bos_token_id", "transformers_version")}


def _same_model(a: str, b: str) -> bool:
    """Whether two model references name one checkpoint (then the loaded target serves as the draft too)."""
    return a == b or (Path(a).exists() and Path(b).exists() and Path(a).resolve() == Path(b).resolve())


def _context(model: PreTrainedModel) -> int:
    return getattr(model.config.get_text_config(), "max_position_embeddings", None) or 1 << 30


def _environment(settings: Settings, device: torch.device, command: str) -> dict[str, Any]:
    """The one environment record plus what decides this run's numbers: TF32, dtype, seed, the command."""
    return {
        **environment(device),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "dtype": settings.dtype,
        "seed": settings.seed,
        "command": command,
    }


def _batches(examples: list[TaskExample], size: int) -> list[list[int]]:
    """Example indices grouped `size` at a time, in task order."""
    return [list(range(i, min(i + size, len(examples)))) for i in range(0, len(examples), size)]


def _check(settings: Settings) -> None:
    """Refuse settings that cannot run, before anything loads."""
    for name in settings.tasks:
        get_task(name)
    for flag, value in (
        ("--num-draft-tokens", settings.num_draft_tokens),
        ("--batch-size", settings.batch_size),
        ("--max-new-tokens", settings.max_new_tokens),
        ("--sweep-samples", settings.sweep_samples),
        *(("--num-samples", n) for n in (settings.num_samples.values() if isinstance(settings.num_samples, dict) else [settings.num_samples])),
        ("--cost-repeats", settings.cost_repeats),
    ):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    if settings.temperature < 0 or not 0 < settings.top_p <= 1:
        raise ValueError(f"--temperature must be >= 0 (0 = greedy) and --top-p in (0, 1]; got {settings.temperature}, {settings.top_p}")
    if settings.dtype not in DTYPES:
        raise ValueError(f"--dtype {settings.dtype!r}: choose one of {DTYPES}")
    names = [d.name for d in settings.drafts]
    if unknown := [n for n in settings.sweep_drafts or [] if n not in names]:
        raise ValueError(f"--sweep-drafts names {unknown[0]!r}, which is no --draft; choose among {names}")
    if unknown := [n for pair in settings.compare for n in pair if n not in names]:
        raise ValueError(f"--compare names {unknown[0]!r}, which is no --draft; choose among {names}")


def load_examples(settings: Settings) -> dict[str, list[TaskExample]]:
    """Each task's examples under each of its templates (keyed by report label, `Settings.variants`),
    from its local file when one is given, else from the Hub; a bad row is a DataFileError `FILE:LINE: problem`."""
    examples = {}
    for label, name, template in settings.variants():
        task, opts = get_task(name), {}
        if name == "mmlu" and settings.num_fewshot:
            opts["num_fewshot"] = settings.num_fewshot
            opts["fewshot_file"] = settings.fewshot_files.get(name)
        if name == "cnndm" and settings.max_article_words is not None:
            opts["max_article_words"] = settings.max_article_words
        opts["template"] = template if template in prompts.TEMPLATES else Path(template).read_text(encoding="utf-8")
        examples[label] = task.load(data_file=settings.data_files.get(name), num_samples=settings.samples(name), seed=settings.seed, **opts)
    return examples


def _tokenizers(settings: Settings) -> tuple[PreTrainedTokenizerBase, str, dict[str, str]]:
    """The target's tokenizer (left padding) and resolved paths; every draft's tokenizer must agree with it."""
    target_path = resolve(settings.target).path
    tokenizer = _load_tokenizer(target_path, "target")
    if not tokenizer.chat_template:
        raise ValueError(f"the target tokenizer of {settings.target!r} has no chat template; use an instruct model's tokenizer")
    tokenizer.padding_side = "left"
    draft_paths = {d.name: resolve(d.path).path for d in settings.drafts}
    for d in settings.drafts:
        try:
            check_tokenizers_agree(tokenizer, _load_tokenizer(draft_paths[d.name], f"draft {d.name!r}"))
        except ValueError as err:
            raise ValueError(f"draft {d.name!r} ({d.path}): {err}") from None
    return tokenizer, target_path, draft_paths


def _stop_ids(target: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], int]:
    """EOS ids (the checkpoint's generation config, else the tokenizer's) and the pad id."""
    gen = target.generation_config
    eos = gen.eos_token_id if gen.eos_token_id is not None else tokenizer.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    pad = gen.pad_token_id if gen.pad_token_id is not None else tokenizer.pad_token_id
    return eos, pad if pad is not None else (eos[0] if eos else 0)


def _check_context(encoded: dict[str, list[list[int]]], examples: dict[str, list[TaskExample]], max_new: dict[str, int], k_max: int, context: int) -> None:
    """Refuse a prompt that cannot be decoded within the models' context."""
    for name, rows in encoded.items():
        longest = max(range(len(rows)), key=lambda i: len(rows[i]))
        need = len(rows[longest]) + max_new[name] + k_max + 1
        if need > context:
            raise ValueError(
                f"{name} prompt {examples[name][longest].id} has {len(rows[longest])} tokens; with {max_new[name]} new "
                f"tokens and k={k_max} it needs {need} positions but the models hold {context}: lower --max-new-tokens"
                + (" or --max-article-words" if task_of(name) == "cnndm" else "")
            )


@dataclass
class Loaded:
    """What a run decodes with: the models, one decoder per (draft, k), the stop ids, the tokenized prompts."""

    target: PreTrainedModel
    drafts: dict[str, PreTrainedModel]
    decoders: dict[tuple[str, int], SpeculativeDecoder]
    decoding: dict[str, Decoding]
    encoded: dict[str, list[list[int]]]
    context: int
    dropped: dict[str, Any]


def _load(
    settings: Settings, tokenizer: PreTrainedTokenizerBase, target_path: str, draft_paths: dict[str, str], examples: dict[str, list[TaskExample]]
) -> Loaded:
    """Tokenize the prompts, load target and drafts, and build a decoder per (draft, k); refuse prompts that do not fit."""
    encoded = {
        name: [
            tokenizer(tokenizer.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]
            for ex in exs
        ]
        for name, exs in examples.items()
    }
    target = _load_model(target_path, settings.dtype, settings.device, "target")
    drafts = {
        d.name: target
        if _same_model(draft_paths[d.name], target_path)
        else _load_model(draft_paths[d.name], target.dtype, settings.device, f"draft {d.name!r}")
        for d in settings.drafts
    }
    eos, pad = _stop_ids(target, tokenizer)
    dropped = _plain_generation_config(target, eos, pad)
    if settings.draft_alone:  # each draft decodes alone too, by the same rule as the target
        for name, model in drafts.items():
            if draft_to_target(model) is not None:
                raise ValueError(
                    f"--draft-alone: draft {name!r} has a trimmed head, which transformers' generate cannot decode with; "
                    "evaluate its full-vocabulary export alone (distill publish writes it as full-vocab/)"
                )
            if model is not target:
                _plain_generation_config(model, eos, pad)
    ks_all = sorted(set(settings.ks) | {settings.num_draft_tokens})
    context = min([_context(target)] + [_context(m) for m in drafts.values()])
    max_new = {name: settings.new_tokens(name) for name in settings.labels}
    _check_context(encoded, examples, max_new, max(ks_all), context)
    decoders = {
        (d, k): SpeculativeDecoder(target, model, num_draft_tokens=k, schedule=settings.schedule, tokenizer=tokenizer, draft_tokenizer=tokenizer)
        for d, model in drafts.items()
        for k in ks_all
    }
    decoding = {name: Decoding(max_new[name], settings.do_sample, settings.temperature, settings.top_p, eos, pad) for name in settings.labels}
    return Loaded(target, drafts, decoders, decoding, encoded, context, dropped)


def prompt_stamp(examples: Sequence[TaskExample], max_new_tokens: int) -> str:
    """A hash of what a batch asked: its prompts (their chat messages) and how many tokens an answer may
    take. Part of each call's key, so a call is reused only for the very prompts it answered at that
    length (a task's own length may change), whatever count, template or shot file asked them."""
    asked = [[ex.messages for ex in examples], max_new_tokens]
    return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:12]


def plan(settings: Settings, examples: dict[str, list[TaskExample]]) -> list[list[Call]]:
    """Every call the settings ask for, batch by batch: target-only first, then each draft at k0 and (for
    sweep batches) at the other k, then each draft alone; interleaved so all see the same machine state.
    A call's key is `task|batch|system|k|prompts` (and the draft's stamp): the task, not its report label, so the
    prompts of `gsm8k` are the prompts of `gsm8k@default` when templates are added to a finished run."""
    k0 = settings.num_draft_tokens
    sweep_ks = [k for k in sorted(set(settings.ks)) if k != k0]
    stamps = {d.name: settings.draft_stamp(d.name) for d in settings.drafts}
    batches = []
    for name in settings.labels:
        for b, idx in enumerate(_batches(examples[name], settings.batch_size)):
            in_sweep = settings.sweep_samples is None or idx[0] < settings.sweep_samples
            jobs = [(TARGET, None)] + [(d.name, k) for d in settings.drafts for k in [k0] + (sweep_ks if in_sweep and settings.swept(d.name) else [])]
            jobs += [(ALONE + d.name, None) for d in settings.drafts] if settings.draft_alone else []
            asked = prompt_stamp([examples[name][i] for i in idx], settings.new_tokens(name))
            batches.append(
                [
                    Call(
                        f"{task_of(name)}|{b}|{who}|{k}|{asked}" + ("" if who == TARGET else f"|{stamps[who.removeprefix(ALONE)]}"), name, b, tuple(idx), who, k
                    )
                    for who, k in jobs
                ]
            )
    return batches


def _execute(
    settings: Settings, loaded: Loaded, calls: list[Call], journal: Journal, tokenizer: PreTrainedTokenizerBase, costs: RunCosts, load: MachineLoad
) -> None:
    """Warm up, then make `calls` in order, journalling each as it finishes (with the run's machine load so far,
    which a stopped run leaves as its record) and timing the cost repeats due after it."""
    device = torch.device(settings.device)

    def tensors(name: str, idx: Sequence[int]) -> dict[str, torch.Tensor]:
        return tokenizer.pad({"input_ids": [loaded.encoded[name][i] for i in idx]}, return_tensors="pt").to(device)

    if not calls:
        return
    first = settings.labels[0]
    warm_up, dec = tensors(first, [0]), loaded.decoding[first]
    warm = Decoding(min(4, dec.max_new_tokens), dec.do_sample, dec.temperature, dec.top_p, dec.eos, dec.pad)
    target_generate(loaded.target, warm_up, warm, settings.seed)  # kernels, allocator and caches, outside the timed calls
    for decoder in loaded.decoders.values():
        speculative_generate(decoder, warm_up, warm, settings.seed)
    for i, call in enumerate(tqdm(calls, desc="accept", unit="call", dynamic_ncols=True)):
        batch, seed = tensors(call.task, call.examples), settings.seed + call.batch
        if call.system == TARGET or call.system.startswith(ALONE):
            model = loaded.target if call.system == TARGET else loaded.drafts[call.system.removeprefix(ALONE)]
            result = target_generate(model, batch, loaded.decoding[call.task], seed)
        else:
            result = speculative_generate(loaded.decoders[(call.system, call.k)], batch, loaded.decoding[call.task], seed)
        record = {"task": call.task, "batch": call.batch, "examples": list(call.examples), "system": call.system, "k": call.k, **result}
        journal.add(call.key, {**record, "machine_load": load.report()})
        costs.after_call(i)


class RunCosts:
    """Every draft's c, c₂ and v(k), the target timed once with all drafts alternated. On the eager loop
    the `cost_repeats` repeats are spread evenly over the run's generate calls, so the costs see the
    machine in the states the calls they predict saw (a shared CPU's speed drifts over an hour); the
    static loop's (CUDA) are timed at the end. The stepped tokens are real: the first prompt and half
    of the target's own answer to it as the warm cache (the loop's mean context), then the answer's next k+1."""

    def __init__(self, settings: Settings, loaded: Loaded, journal: Journal, batches: list[list[Call]], calls: int):
        self.settings, self.loaded, self.journal, self.first = settings, loaded, journal, batches[0][0]
        self.k_max = max(set(settings.ks) | {settings.num_draft_tokens})
        self.static = resolve_backend("auto", loaded.target) == "static"
        self.due, self.owed = spread_evenly(settings.cost_repeats, calls), 0
        self.sampler: CostSampler | None = None

    def _ids(self) -> list[int] | None:
        """The tokens to step, once the first prompt's target-only answer is journalled."""
        record = self.journal.latest(self.first.key)
        if record is None:
            return None
        prompt, answer = self.loaded.encoded[self.first.task][self.first.examples[0]], record["new"][0]
        ids = (prompt + answer)[: min(self.loaded.context, len(prompt) + len(answer) // 2 + self.k_max + 1)]
        if len(ids) < len(prompt) + self.k_max + 1:  # a short answer: step random ids after the real prompt
            ids = prompt[: self.loaded.context - self.k_max - 1] + [0] * (self.k_max + 1)
        return ids

    def _sample(self, repeats: int) -> None:
        self.owed += repeats
        if self.sampler is None and (ids := self._ids()) is not None:
            self.sampler = CostSampler(self.loaded.target, self.loaded.drafts, ks=range(1, self.k_max + 1), prompt_ids=ids)
        if self.sampler is not None and self.owed:
            self.sampler.sample(self.owed)
            self.owed = 0

    @property
    def timing(self) -> str:
        """When the repeats were timed, for the report's settings."""
        if self.static or not self.due:
            return "back to back at the end of the run" + (" (static loop)" if self.static else "")
        return f"spread evenly over the run's {len(self.due)} generate calls"

    def after_call(self, i: int) -> None:
        """Time the repeats due after the run's i-th generate call (eager loop)."""
        if not self.static:
            self._sample(self.due[i])

    def finish(self) -> dict[str, Costs]:
        """The costs: the spread repeats (any still owed timed now), or the static loop's timed now."""
        if self.static:
            prompt_len = len(self._ids() or []) - self.k_max - 1
            return {
                name: measure_costs(self.loaded.target, model, ks=range(1, self.k_max + 1), prompt_len=prompt_len, repeats=self.settings.cost_repeats)
                for name, model in self.loaded.drafts.items()
            }
        self._sample(0 if self.due else self.settings.cost_repeats)  # no calls in this run: all repeats now
        assert self.sampler is not None  # every call is journalled by now, the first prompt's target-only answer too
        return self.sampler.costs()


def run(settings: Settings, command: str = "") -> dict[str, Any]:
    """Measure everything `settings` asks for and write report.json, report.md and the plots."""
    _check(settings)
    # Data and tokenizers first: every cheap check fails before a model loads.
    examples = load_examples(settings)
    tokenizer, target_path, draft_paths = _tokenizers(settings)
    loaded = _load(settings, tokenizer, target_path, draft_paths, examples)
    batches = plan(settings, examples)
    journal = Journal(Path(settings.output_dir) / JOURNAL, settings.fingerprint())
    journal.begin(Run.begin(settings.device, command))
    todo = calls_to_run(batches, journal)
    if reused := sum(len(calls) for calls in batches) - len(todo):
        print(f"distill accept: {reused} generate calls reused from {journal.path}; this run ({journal.run.run_id}) makes {len(todo)}", file=sys.stderr)
    load = MachineLoad().start()
    run_costs = RunCosts(settings, loaded, journal, batches, len(todo))
    _execute(settings, loaded, todo, journal, tokenizer, run_costs, load)
    costs = run_costs.finish()
    journal.end(load.stop().report())
    report = build_report(settings, examples, journal, batches, tokenizer, _environment(settings, torch.device(settings.device), command), draft_paths)
    _add_mismatches(report, settings, examples, journal, batches, loaded)
    _add_coverage(report, journal, batches, loaded)
    for name, entry in report["drafts"].items():
        add_predictions(entry, costs[name], settings.num_draft_tokens)
        entry["best_k"] = best_k(entry["alpha"], costs[name], k_max=max(costs[name].v))
    report["settings"].update(
        cost_prompt_len=costs[next(iter(costs))].prompt_len,
        cost_timing=run_costs.timing,
        target_generation_config_ignored=loaded.dropped,
    )
    report["machine_load"] = busiest(report["runs"].values()) or journal.run.machine_load  # the busiest run behind its timings
    write_outputs(report, settings.output_dir)
    warn(report["machine_load"], "distill accept")
    return report


def _add_mismatches(
    report: dict[str, Any], settings: Settings, examples: dict[str, list[TaskExample]], journal: Journal, batches: list[list[Call]], loaded: Loaded
) -> None:
    """Each greedy mismatch: where it starts and how close the target's choice was."""
    if settings.do_sample:
        return
    device = torch.device(settings.device)
    for d, entry in report["drafts"].items():
        for name, row in entry["tasks"].items():
            ids = {ex.id: i for i, ex in enumerate(examples[name])}
            base = outputs(journal.latest(c.key) for calls in batches for c in calls if c.task == name and c.system == TARGET)
            spec = outputs(journal.latest(c.key) for calls in batches for c in calls if c.task == name and c.system == d and c.k == settings.num_draft_tokens)
            row["mismatches"] = [
                {"example": e, **first_difference(loaded.target, loaded.encoded[name][ids[e]], base[ids[e]], spec[ids[e]], device)}
                for e in row["differing_examples"]
            ]


def _add_coverage(report: dict[str, Any], journal: Journal, batches: list[list[Call]], loaded: Loaded) -> None:
    """Each trimmed draft's kept rows and, per task, the share of the target-only output tokens (its answers
    to these held-out prompts) inside its set: a token outside it is one the draft can never propose. With
    prompt rows, also the share inside the set widened, call by call, as the decoder widens it."""
    maps = {d: ids.cpu() for d in report["drafts"] if (ids := draft_to_target(loaded.drafts[d])) is not None}
    if not maps:
        return
    vocab = loaded.target.get_output_embeddings().weight.shape[0]
    answers = {}  # task -> [(the call's prompt ids, the target's answer tokens)], read once for every draft
    for name in report["target_only"]:
        for call in (c for calls in batches for c in calls if c.task == name and c.system == TARGET):
            prompts = torch.tensor([t for e in call.examples for t in loaded.encoded[name][e]], dtype=torch.long)
            answers.setdefault(name, []).append((prompts, [t for row in outputs([journal.latest(call.key)]).values() for t in row]))
    counts = {name: torch.bincount(torch.tensor([t for _, a in calls for t in a], dtype=torch.long), minlength=vocab) for name, calls in answers.items()}
    for d, ids in maps.items():
        entry = {"kept": len(ids), "coverage": {name: coverage(c, ids) for name, c in counts.items()}}
        if (rows := prompt_rows(loaded.drafts[d])) is not None:
            in_set = torch.zeros(vocab, dtype=torch.bool)
            in_set[ids] = True
            shares = {name: _widened_share(calls, in_set, rows.capacity) for name, calls in answers.items()}
            entry.update(prompt_rows=rows.capacity, coverage_with_prompt_rows=shares)
        report["drafts"][d]["vocab"] = entry


def _widened_share(calls: list[tuple[torch.Tensor, list[int]]], in_set: torch.Tensor, capacity: int) -> float:
    """The share of the answers' tokens inside the kept set widened per call by its prompts' `prompt_extras`."""
    inside = total = 0
    for prompt_ids, answer in calls:
        allowed = in_set.clone()
        allowed[prompt_extras(prompt_ids, in_set, in_set.numel(), capacity)] = True
        inside += int(allowed[torch.tensor(answer, dtype=torch.long)].sum()) if answer else 0
        total += len(answer)
    return inside / total if total else 0.0


@torch.no_grad()
def first_difference(target: PreTrainedModel, prompt: list[int], expected: list[int], got: list[int], device: torch.device) -> dict[str, Any]:
    """Where a speculative output first leaves the target-only one, and the target's margin between
    its two best logits there: a margin near 0 is a near-tie that rounding (bfloat16) can flip."""
    position = next((j for j, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    ids = torch.tensor([prompt + expected[:position]], device=device)
    top2 = target(input_ids=ids).logits[0, -1].float().topk(2)
    return {
        "position": position,
        "target_token": expected[position] if position < len(expected) else None,
        "speculative_token": got[position] if position < len(got) else None,
        "target_top2_margin": float(top2.values[0] - top2.values[1]),
    }


def build_report(
    settings: Settings,
    examples: dict[str, list[TaskExample]],
    journal: Journal,
    batches: list[list[Call]],
    tokenizer: PreTrainedTokenizerBase,
    environment: dict[str, Any],
    draft_paths: dict[str, str],
) -> dict[str, Any]:
    """The report's measured figures from the journal: per task target-only and each draft, the k
    sweep pooled over tasks, paired differences between drafts, and the runs behind every timing."""
    k0 = settings.num_draft_tokens
    calls = [c for group in batches for c in group]
    target_keys = {(c.task, c.batch): c.key for c in calls if c.system == TARGET}

    def of(task: str | None, who: str, k: int | None, sweep_only: bool = False) -> list[Call]:
        chosen = [c for c in calls if (task is None or c.task == task) and c.system == who and c.k == k]
        return [c for c in chosen if not sweep_only or settings.sweep_samples is None or c.examples[0] < settings.sweep_samples]

    def texts(task: str, records: Iterable[dict]) -> list[str]:
        tokens = outputs(records)
        return [tokenizer.decode(tokens[i], skip_special_tokens=True) for i in range(len(examples[task]))]

    target_only, base_tokens = {}, {}
    for name in settings.labels:
        recs = [journal.latest(c.key) for c in of(name, TARGET, None)]
        base_tokens[name] = outputs(recs)
        q = quality(get_task(task_of(name)), texts(name, recs), examples[name], seed=settings.seed)
        target_only[name] = {**q, **timing(recs), "num_prompts": len(examples[name])}

    drafts, used_runs, per_task = {}, set(), {}
    for d in settings.drafts:
        tasks = {}
        for name in settings.labels:
            task = get_task(task_of(name))
            records, pairs, runs = timed_pairs(journal, of(name, d.name, k0), target_keys)
            per_task[(d.name, name)] = (records, pairs if len(pairs) == len(records) else [])
            used_runs.update(runs)
            row = task_row(
                task,
                examples[name],
                records,
                pairs,
                base_tokens[name],
                target_only[name]["per_example_quality"],
                texts(name, records),
                not settings.do_sample,
                k0,
                settings.seed,
            )
            tasks[name] = {**row, "runs": runs, "target_quality": target_only[name]["quality"]}
            if settings.draft_alone:
                alone = [journal.latest(c.key) for c in of(name, ALONE + d.name, None)]
                aq = quality(task, texts(name, alone), examples[name])
                tasks[name].update(draft_alone_quality=aq["quality"], draft_alone_metrics=aq["metrics"], draft_alone_tokens_per_s=timing(alone)["tokens_per_s"])
        pooled = [journal.latest(c.key) for c in of(None, d.name, k0)]
        sweep = _sweep(settings, journal, of, target_keys)(d.name)
        used_runs.update(run for point in sweep for run in point["runs"])
        drafts[d.name] = {"path": d.path, "resolved_path": draft_paths[d.name], "alpha": acceptance(pooled)["alpha"], "tasks": tasks, "sweep": sweep}
    return {
        "schema_version": SCHEMA_VERSION,
        "target": settings.target,
        "environment": environment,
        "runs": {run_id: journal.run_with_load(run_id) for run_id in sorted(used_runs)},
        "settings": {
            **{k: v for k, v in asdict(settings).items() if k not in ("drafts", "target")},
            "drafts": {d.name: d.path for d in settings.drafts},
            "mode": "sampling" if settings.do_sample else "greedy",
            "max_new_tokens_per_task": {name: settings.new_tokens(name) for name in settings.labels},
            "templates_per_task": {label: template for label, _, template in settings.variants()},
            "alpha_estimator": "maximum likelihood of i.i.d. per-token acceptance (fit_alpha)",
            "interval": "95% percentile bootstrap over prompts (calls), paired for differences",
        },
        "target_only": target_only,
        "drafts": drafts,
        "comparisons": _comparisons(settings, per_task),
    }


def _sweep(settings: Settings, journal: Journal, of: Any, target_keys: dict[tuple[str, int], str]) -> Any:
    """A function giving one draft's figures at each k, pooled over tasks on the sweep's prompts."""

    def sweep(draft: str) -> list[dict[str, Any]]:
        points = []
        if not settings.swept(draft):
            return points
        for k in sorted(set(settings.ks) | {settings.num_draft_tokens}):
            records, pairs, runs = timed_pairs(journal, of(None, draft, k, sweep_only=True), target_keys)
            acc = acceptance(records)
            t, s = timing([p[0] for p in pairs]), timing([p[1] for p in pairs])
            whole = pairs if len(pairs) == len(records) else []
            points.append(
                {
                    "k": k,
                    "end_to_end_speedup": t["wall_s"] / s["wall_s"] if pairs and s["wall_s"] else None,
                    "decode_speedup": t["tpot_s"] / s["tpot_s"] if pairs and s["tpot_s"] else None,
                    "alpha": acc["alpha"],
                    "acceptance_rate": acc["acceptance_rate"],
                    "per_position_acceptance": acc["per_position_acceptance"],
                    "tokens_per_target_forward": acc["tokens_per_target_forward"],
                    "wall_s": s["wall_s"],
                    "target_wall_s": t["wall_s"],
                    "num_prompts": sum(len(r["examples"]) for r in records),
                    "runs": runs,
                    "intervals": intervals(records, whole, seed=settings.seed),
                    "decomposition": decomposition(pairs, k, acc["alpha"]),
                }
            )
        return points

    return sweep


def _comparisons(settings: Settings, per_task: dict[tuple[str, str], tuple[list[dict], list[tuple[dict, dict]]]]) -> list[dict[str, Any]]:
    """Each draft against the first one named, then the --compare pairs, task by task, on the same prompts: the paired difference."""
    names = [d.name for d in settings.drafts]
    pairs = [(other, names[0]) for other in names[1:]]
    pairs += [pair for pair in settings.compare if pair not in pairs]
    return [
        {"task": task, "reference": ref, "draft": draft, **paired_difference(per_task[(ref, task)], per_task[(draft, task)], seed=settings.seed)}
        for draft, ref in pairs
        for task in settings.labels
    ]


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Validated settings from parsed command-line arguments."""
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise ValueError(f"--tasks is empty; choose from {sorted(TASKS)}")
    for name in tasks:
        get_task(name)
    return Settings(
        target=args.target,
        drafts=parse_drafts(args.draft),
        tasks=tasks,
        data_files=parse_data_files(args.data_file, tasks),
        num_samples=parse_num_samples(args.num_samples, tasks),
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        num_draft_tokens=args.num_draft_tokens,
        ks=parse_ints(args.ks, "--ks") if args.ks else [],
        sweep_samples=args.sweep_samples,
        sweep_drafts=[n.strip() for n in args.sweep_drafts.split(",") if n.strip()] if args.sweep_drafts else None,
        compare=parse_pairs(args.compare),
        schedule=args.schedule,
        temperature=args.temperature,
        top_p=args.top_p,
        batch_size=args.batch_size,
        dtype=args.dtype,
        device=default_device(args.device),
        num_fewshot=args.num_fewshot,
        max_article_words=args.max_article_words,
        cost_repeats=args.cost_repeats,
        draft_alone=args.draft_alone,
        output_dir=args.output_dir,
        fewshot_files=parse_fewshot_files(args.fewshot_file, tasks),
        templates=parse_templates(args.template, tasks),
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of `distill accept` and `python eval/acceptance.py`; returns the exit status."""
    args = parser("accept").parse_args(argv)
    command = shlex.join(["distill", "accept", *argv]) if argv is not None else shlex.join([sys.argv[0], *sys.argv[1:]])
    try:
        report = run(settings_from_args(args), command)
    except (ValueError, FileNotFoundError) as err:
        print(f"distill accept: error: {err}", file=sys.stderr)
        return 2
    print(Path(args.output_dir, "report.md").read_text())
    for c in report["comparisons"]:
        acc = c["acceptance_rate"]
        verdict = "a gain outside noise" if acc["outside_noise"] and acc["value"] > 0 else "a loss outside noise" if acc["outside_noise"] else "within noise"
        print(
            f"distill accept: {c['draft']} − {c['reference']} on {c['task']}: acceptance {acc['value']:+.3f} "
            f"[{acc['low']:+.3f}, {acc['high']:+.3f}] (95%, paired over {acc['prompts']} prompts): {verdict}"
        )
    broken = [
        f"{name}/{task} ({row['greedy_identity']:.1%})"
        for name, d in report["drafts"].items()
        for task, row in d["tasks"].items()
        if row["greedy_identity"] not in (None, 1.0)
    ]
    if broken and args.dtype == "float32":
        print(
            f"distill accept: greedy speculative output differs from target-only output in float32: {', '.join(broken)}; see differing_examples in report.json",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    quiet_cpu_deepspeed()
    raise SystemExit(main())
