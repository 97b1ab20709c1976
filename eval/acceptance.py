"""`distill accept`: target-only decoding and speculative decoding with each draft on the same task
prompts, in one run: task quality for both, greedy identity, acceptance, TTFT, TPOT, throughput and
measured speedup (optionally for several k, next to the speedup predicted from the measured α).

    python eval/acceptance.py --target Qwen/Qwen2.5-7B-Instruct --draft Qwen/Qwen2.5-0.5B-Instruct \\
        --draft distilled=runs/kd --tasks gsm8k,mmlu,cnndm --dtype bfloat16 --ks 1,2,4,6,8

Every generate call is journalled to <output-dir>/records.jsonl as it finishes, so a stopped run
started again with the same settings resumes where it stopped, and a draft added to a finished run
(or a retrained one) costs only its own calls. report.json, report.md and the PNG plots are rebuilt
from that journal and written atomically.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation.streamers import BaseStreamer

from distill.arguments import default_device, parser, quiet_cpu_deepspeed
from distill.common.models import ModelLoadError, load_model, load_tokenizer, resolve
from distill.common.provenance import MachineLoad, versions, warn
from distill.common.vocab import check_tokenizers_agree
from distill.eval.report import write_outputs
from distill.eval.tasks import TASKS, Task, TaskExample, get_task
from distill.speculative import SpeculativeDecoder
from distill.speculative.costs import Costs, best_k, fit_alpha, measure_costs, predicted_speedup

DTYPES = ("float32", "bfloat16", "float16", "auto")
JOURNAL = "records.jsonl"
ALONE = "alone:"  # journal system of a draft decoding by itself (its own task quality)


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
    num_samples: int | None = None
    seed: int = 0
    max_new_tokens: int | None = None
    num_draft_tokens: int = 5
    ks: list[int] = field(default_factory=list)
    sweep_samples: int | None = None
    schedule: str = "constant"
    temperature: float = 0.0
    top_p: float = 1.0
    batch_size: int = 1
    dtype: str = "float32"
    device: str = "cpu"
    num_fewshot: int = 0
    max_article_words: int | None = None
    cost_repeats: int = 20
    draft_alone: bool = False
    output_dir: str = "eval-output"

    @property
    def do_sample(self) -> bool:
        return self.temperature > 0

    def fingerprint(self) -> str:
        """A hash of the settings that change every measurement (not where the output goes, nor which
        drafts: each draft's calls carry `draft_stamp`), and of the local files behind them, so an
        edited data file is measured afresh while a draft added to a finished run costs its calls only."""
        calls_only = ("drafts", "draft_alone", "ks", "sweep_samples")  # these add or leave out calls, each keyed by its system and k
        keyed = {k: v for k, v in asdict(self).items() if k not in ("output_dir", "cost_repeats", *calls_only)}
        sources = [self.target, *self.data_files.values()]
        keyed["files"] = {src: _stamp(Path(src)) for src in sources if Path(src).exists()}
        return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]

    def draft_stamp(self, name: str) -> str:
        """A hash of one draft's path and files: a retrained or replaced draft is measured afresh."""
        path = next(d.path for d in self.drafts if d.name == name)
        stamp = [path, _stamp(Path(path)) if Path(path).exists() else None]
        return hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:12]


HASHED_BYTES = 64 << 20  # files up to this size are stamped by content, larger ones (weights) by size and time


def _stamp(path: Path) -> list:
    """The content hash of each small file (a data file or config copied or remounted keeps its stamp),
    and size and modification time of each large one, for a local file or every file under a folder."""
    files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file())

    def one(f: Path) -> tuple:
        size = f.stat().st_size
        return (size, hashlib.sha256(f.read_bytes()).hexdigest()) if size <= HASHED_BYTES else (size, f.stat().st_mtime_ns)

    return [(str(f.relative_to(path)) if f != path else f.name, *one(f)) for f in files]


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


def parse_data_files(values: Iterable[str], tasks: Sequence[str]) -> dict[str, str]:
    """`--data-file task=path` values; each task must be one of `tasks` and each file must exist."""
    files = {}
    for value in values:
        task, sep, path = value.partition("=")
        if not sep or not path:
            raise ValueError(f"--data-file {value!r}: write TASK=PATH, e.g. gsm8k=data/gsm8k_test.jsonl")
        if task not in tasks:
            raise ValueError(f"--data-file {value!r}: task {task!r} is not among --tasks {list(tasks)}")
        if not Path(path).is_file():
            raise FileNotFoundError(f"--data-file {value!r}: {path} does not exist; pass an existing JSONL/JSON/Parquet file")
        files[task] = path
    return files


def parse_ints(text: str, flag: str) -> list[int]:
    """A comma-separated list of positive integers (`--ks 1,2,4`)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated integers such as 1,2,4,6,8") from None
    if not values or min(values) < 1:
        raise ValueError(f"{flag} {text!r}: every value must be an integer >= 1")
    return sorted(set(values))


# ---------------------------------------------------------------------------------------------
# Decoding one batch, timed


class _FirstTokenClock(BaseStreamer):
    """Notes when `generate` hands over its first new token (its second `put`; the first is the prompt)."""

    def __init__(self) -> None:
        self.puts, self.first = 0, None

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def trim(tokens: list[int], eos: set[int]) -> list[int]:
    """New tokens up to and including the first EOS (what follows is padding)."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Decoding:
    """How the run decodes: greedy or sampled, and the stop/pad ids both decoders use."""

    max_new_tokens: int
    do_sample: bool
    temperature: float
    top_p: float
    eos: list[int]
    pad: int


def target_generate(target: PreTrainedModel, batch: dict[str, torch.Tensor], dec: Decoding, seed: int) -> dict[str, Any]:
    """Target-only `generate` on one batch: new tokens per row, wall time and time to first token."""
    kwargs: dict[str, Any] = {"do_sample": dec.do_sample}
    if dec.do_sample:
        kwargs.update(temperature=dec.temperature, top_p=dec.top_p, top_k=0)
        torch.manual_seed(seed)
    device = batch["input_ids"].device
    clock = _FirstTokenClock()
    _sync(device)
    start = time.perf_counter()
    out = target.generate(**batch, max_new_tokens=dec.max_new_tokens, eos_token_id=dec.eos, pad_token_id=dec.pad, streamer=clock, **kwargs)
    _sync(device)
    wall = time.perf_counter() - start
    new = out[:, batch["input_ids"].shape[1] :].tolist()
    return {"new": [trim(row, set(dec.eos)) for row in new], "wall_s": wall, "ttft_s": (clock.first or time.perf_counter()) - start}


def speculative_generate(decoder: SpeculativeDecoder, batch: dict[str, torch.Tensor], dec: Decoding, seed: int) -> dict[str, Any]:
    """Speculative decoding of one batch: new tokens per row, wall time, TTFT and the decoder's stats."""
    out = decoder.generate(
        batch["input_ids"],
        batch["attention_mask"],
        max_new_tokens=dec.max_new_tokens,
        do_sample=dec.do_sample,
        temperature=dec.temperature if dec.do_sample else 1.0,
        top_p=dec.top_p,
        eos_token_id=dec.eos,
        pad_token_id=dec.pad,
        seed=seed,
    )
    new = out.sequences[:, batch["input_ids"].shape[1] :].tolist()
    return {"new": [trim(row, set(dec.eos)) for row in new], "wall_s": out.stats.wall_s, "ttft_s": out.stats.ttft_s, "stats": out.stats.to_dict()}


# ---------------------------------------------------------------------------------------------
# Aggregating journalled records into the report's figures


def _timing(records: list[dict]) -> dict[str, float]:
    """TTFT (mean per call), TPOT (decode time over tokens after the first, per row), tokens/s, totals."""
    wall = sum(r["wall_s"] for r in records)
    tokens = sum(len(row) for r in records for row in r["new"])
    decode_s = decode_tokens = 0.0
    for r in records:
        per_row = sum(len(row) for row in r["new"]) / len(r["new"])
        if per_row > 1:
            decode_s += r["wall_s"] - r["ttft_s"]
            decode_tokens += per_row - 1
    return {
        "ttft_s": statistics.fmean(r["ttft_s"] for r in records) if records else 0.0,
        "tpot_s": decode_s / decode_tokens if decode_tokens else 0.0,
        "tokens_per_s": tokens / wall if wall else 0.0,
        "wall_s": wall,
        "new_tokens": tokens,
    }


def _acceptance(records: list[dict]) -> dict[str, Any]:
    """Acceptance figures summed over the calls' stats."""
    total = {key: sum(r["stats"][key] for r in records) for key in ("proposed", "accepted", "new_tokens", "sequence_forwards", "rounds")}
    depth = max((len(r["stats"]["position_proposed"]) for r in records), default=0)
    proposed, accepted = [0] * depth, [0] * depth
    for r in records:
        for j, (p, a) in enumerate(zip(r["stats"]["position_proposed"], r["stats"]["position_accepted"])):
            proposed[j] += p
            accepted[j] += a
    return {
        "acceptance_rate": total["accepted"] / total["proposed"] if total["proposed"] else 0.0,
        "mean_accepted_length": total["accepted"] / proposed[0] if proposed and proposed[0] else 0.0,
        "tokens_per_target_forward": total["new_tokens"] / total["sequence_forwards"] if total["sequence_forwards"] else 0.0,
        "per_position_acceptance": [a / p if p else 0.0 for a, p in zip(accepted, proposed)],
        "alpha": fit_alpha(proposed, accepted),
        "proposed": total["proposed"],
        "accepted": total["accepted"],
        "rounds": total["rounds"],
        "target_forwards": total["sequence_forwards"],
        "position_proposed": proposed,
        "position_accepted": accepted,
    }


def _quality(task: Task, texts: list[str], examples: list[TaskExample]) -> dict[str, Any]:
    """The task's metrics averaged over its examples; `quality` is the primary one."""
    per_example = [task.scores(text, ex) for text, ex in zip(texts, examples)]
    metrics = {name: statistics.fmean(s[name] for s in per_example) for name in per_example[0]}
    return {"quality": metrics[task.metric_name], "quality_metric": task.metric_name, "metrics": metrics}


# ---------------------------------------------------------------------------------------------
# The run


class Journal:
    """Append-only JSONL of finished generate calls, keyed; reloaded when the settings match,
    started afresh (the old one moved aside, not lost) when they do not."""

    def __init__(self, path: Path, fingerprint: str):
        self.path, self.records = path, {}
        if path.exists():
            lines = path.read_text().splitlines()
            try:
                head = json.loads(lines[0]) if lines else {}
            except json.JSONDecodeError:
                head = {}
            if head.get("fingerprint") != fingerprint:
                kept = path.with_name(f"{path.stem}.{head.get('fingerprint', 'unknown')}{path.suffix}")
                path.replace(kept)
                print(
                    f"distill accept: {path} holds a run with other settings or files; starting afresh (the old journal kept as {kept.name})", file=sys.stderr
                )
            else:
                for line in lines[1:]:
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:  # a line cut short by a crash: redo that call
                        continue
                    self.records[record["key"]] = record
        if not self.records:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"fingerprint": fingerprint}) + "\n")

    def get(self, key: str) -> dict | None:
        return self.records.get(key)

    def add(self, key: str, record: dict) -> dict:
        record = {"key": key, **record}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.records[key] = record
        return record


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


def _cpu_name() -> str:
    """The CPU model (Linux /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _environment(settings: Settings, device: torch.device, command: str) -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        **versions(),
        "cuda": torch.version.cuda,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name(),
        "num_threads": torch.get_num_threads(),
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
        ("--num-samples", settings.num_samples),
        ("--cost-repeats", settings.cost_repeats),
    ):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    if settings.temperature < 0 or not 0 < settings.top_p <= 1:
        raise ValueError(f"--temperature must be >= 0 (0 = greedy) and --top-p in (0, 1]; got {settings.temperature}, {settings.top_p}")
    if settings.dtype not in DTYPES:
        raise ValueError(f"--dtype {settings.dtype!r}: choose one of {DTYPES}")


def load_examples(settings: Settings) -> dict[str, list[TaskExample]]:
    """Each task's examples, from its local file when one is given, else from the Hub."""
    examples = {}
    for name in settings.tasks:
        task, opts = get_task(name), {}
        if name == "mmlu" and settings.num_fewshot:
            opts["num_fewshot"] = settings.num_fewshot
        if name == "cnndm" and settings.max_article_words is not None:
            opts["max_article_words"] = settings.max_article_words
        examples[name] = task.load(
            data_file=settings.data_files.get(name), num_samples=settings.num_samples or task.default_num_samples, seed=settings.seed, **opts
        )
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
                + (" or --max-article-words" if name == "cnndm" else "")
            )


def run(settings: Settings, command: str = "") -> dict[str, Any]:
    """Measure everything `settings` asks for and write report.json, report.md and the plots."""
    _check(settings)
    # Data and tokenizers first: every cheap check fails before a model loads.
    examples = load_examples(settings)
    tokenizer, target_path, draft_paths = _tokenizers(settings)
    encoded = {
        name: [
            tokenizer(tokenizer.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]
            for ex in exs
        ]
        for name, exs in examples.items()
    }

    device = torch.device(settings.device)
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
        for model in drafts.values():
            if model is not target:
                _plain_generation_config(model, eos, pad)

    k0 = settings.num_draft_tokens
    ks_all = sorted(set(settings.ks) | {k0})
    sweep_ks = [k for k in ks_all if k != k0]
    context = min([_context(target)] + [_context(m) for m in drafts.values()])
    max_new = {name: settings.max_new_tokens or get_task(name).max_new_tokens for name in settings.tasks}
    _check_context(encoded, examples, max_new, max(ks_all), context)
    decoders = {
        (d, k): SpeculativeDecoder(target, model, num_draft_tokens=k, schedule=settings.schedule, tokenizer=tokenizer, draft_tokenizer=tokenizer)
        for d, model in drafts.items()
        for k in ks_all
    }
    decoding = {name: Decoding(max_new[name], settings.do_sample, settings.temperature, settings.top_p, eos, pad) for name in settings.tasks}

    def tensors(name: str, idx: list[int]) -> dict[str, torch.Tensor]:
        return tokenizer.pad({"input_ids": [encoded[name][i] for i in idx]}, return_tensors="pt").to(device)

    # Per batch: target-only, then each draft at k0, then (for sweep batches) at the other k; interleaved, so every
    # system sees the same machine state.
    plan = []
    for name in settings.tasks:
        for b, idx in enumerate(_batches(examples[name], settings.batch_size)):
            in_sweep = settings.sweep_samples is None or idx[0] < settings.sweep_samples
            jobs = [("target", None)] + [(d, k) for d in drafts for k in [k0] + (sweep_ks if in_sweep else [])]
            jobs += [(ALONE + d, None) for d in drafts] if settings.draft_alone else []
            plan += [(name, b, idx, who, k) for who, k in jobs]

    journal = Journal(Path(settings.output_dir) / JOURNAL, settings.fingerprint())
    stamps = {d.name: settings.draft_stamp(d.name) for d in settings.drafts}
    keys = [f"{name}|{b}|{who}|{k}" + ("" if who == "target" else f"|{stamps[who.removeprefix(ALONE)]}") for name, b, idx, who, k in plan]
    if done := sum(journal.get(key) is not None for key in keys):
        print(f"distill accept: resuming, {done} of {len(plan)} generate calls already in {journal.path}", file=sys.stderr)
    load = MachineLoad().start()
    warm_up = tensors(settings.tasks[0], [0])  # kernels, allocator and caches, outside the timed calls
    warm = Decoding(min(4, max_new[settings.tasks[0]]), settings.do_sample, settings.temperature, settings.top_p, eos, pad)
    target_generate(target, warm_up, warm, settings.seed)
    for decoder in decoders.values():
        speculative_generate(decoder, warm_up, warm, settings.seed)

    for key, (name, b, idx, who, k) in zip(keys, tqdm(plan, desc="accept", unit="call", dynamic_ncols=True)):
        if journal.get(key) is None:
            batch, seed = tensors(name, idx), settings.seed + b
            if who == "target" or who.startswith(ALONE):
                result = target_generate(target if who == "target" else drafts[who[len(ALONE) :]], batch, decoding[name], seed)
            else:
                result = speculative_generate(decoders[(who, k)], batch, decoding[name], seed)
            journal.add(key, {"task": name, "batch": b, "examples": idx, "system": who, "k": k, **result})

    records = {key: journal.get(key) for key in keys}  # this run's calls (a journal may hold other drafts' too)
    report = build_report(settings, examples, records, tokenizer, _environment(settings, device, command), draft_paths)
    if not settings.do_sample:  # each greedy mismatch: where it starts and how close the target's choice was
        for d, entry in report["drafts"].items():
            for name, row in entry["tasks"].items():
                ids = {ex.id: i for i, ex in enumerate(examples[name])}
                base = _outputs(r for r in records.values() if r["task"] == name and r["system"] == "target")
                spec = _outputs(r for r in records.values() if r["task"] == name and r["system"] == d and r["k"] == k0)
                row["mismatches"] = [
                    {"example": e, **first_difference(target, encoded[name][ids[e]], base[ids[e]], spec[ids[e]], device)} for e in row["differing_examples"]
                ]
    # c and v(k) at the median prompt length of this run, for the predicted speedup next to the measured one.
    prompt_len = int(statistics.median(len(r) for rows in encoded.values() for r in rows))
    prompt_len = max(1, min(prompt_len, context - max(ks_all) - 2))
    for name, model in tqdm(drafts.items(), desc="costs", unit="draft", dynamic_ncols=True):
        costs = measure_costs(target, model, ks=range(1, max(ks_all) + 1), prompt_len=prompt_len, repeats=settings.cost_repeats)
        add_predictions(report["drafts"][name], costs, settings)
    report["settings"].update(cost_prompt_len=prompt_len, target_generation_config_ignored=dropped)
    report["machine_load"] = load.stop().report()
    write_outputs(report, settings.output_dir)
    warn(report["machine_load"], "distill accept")
    return report


def _outputs(records: Iterable[dict]) -> dict[int, list[int]]:
    """Example index -> the new tokens decoded for it, over journalled generate calls."""
    return {i: row for r in records for i, row in zip(r["examples"], r["new"])}


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
    records: dict[str, dict],
    tokenizer: PreTrainedTokenizerBase,
    environment: dict[str, Any],
    draft_paths: dict[str, str],
) -> dict[str, Any]:
    """The report's measured figures (schema in INTERFACES.md) from the journalled records."""
    k0 = settings.num_draft_tokens

    def select(task: str, who: str, k: int | None, sweep_only: bool = False) -> list[dict]:
        chosen = [r for r in records.values() if r["task"] == task and r["system"] == who and r["k"] == k]
        if sweep_only:
            chosen = [r for r in chosen if settings.sweep_samples is None or r["examples"][0] < settings.sweep_samples]
        return sorted(chosen, key=lambda r: r["batch"])

    target_only, base_tokens = {}, {}
    for name in settings.tasks:
        recs = select(name, "target", None)
        tokens = _outputs(recs)
        base_tokens[name] = tokens
        texts = [tokenizer.decode(tokens[i], skip_special_tokens=True) for i in range(len(examples[name]))]
        target_only[name] = {**_quality(get_task(name), texts, examples[name]), **_timing(recs), "num_prompts": len(examples[name])}

    drafts = {}
    for d in settings.drafts:
        tasks = {}
        for name in settings.tasks:
            recs = select(name, d.name, k0)
            tokens = _outputs(recs)
            n = len(examples[name])
            texts = [tokenizer.decode(tokens[i], skip_special_tokens=True) for i in range(n)]
            same = [tokens[i] == base_tokens[name][i] for i in range(n)]
            timing = _timing(recs)
            quality = _quality(get_task(name), texts, examples[name])
            tasks[name] = {
                **_acceptance(recs),
                "speedup": target_only[name]["wall_s"] / timing["wall_s"] if timing["wall_s"] else 0.0,
                **timing,
                "target_wall_s": target_only[name]["wall_s"],
                "quality": quality["quality"],
                "target_quality": target_only[name]["quality"],
                "quality_metric": quality["quality_metric"],
                "metrics": quality["metrics"],
                "greedy_identity": None if settings.do_sample else sum(same) / n,
                "identical_outputs": sum(same),
                "differing_examples": [examples[name][i].id for i in range(n) if not same[i]],
                "num_prompts": n,
            }
            if settings.draft_alone:
                alone = select(name, ALONE + d.name, None)
                alone_tokens = _outputs(alone)
                alone_quality = _quality(get_task(name), [tokenizer.decode(alone_tokens[i], skip_special_tokens=True) for i in range(n)], examples[name])
                tasks[name].update(
                    draft_alone_quality=alone_quality["quality"],
                    draft_alone_metrics=alone_quality["metrics"],
                    draft_alone_tokens_per_s=_timing(alone)["tokens_per_s"],
                )
        pooled = [r for r in records.values() if r["system"] == d.name and r["k"] == k0]
        sweep = []
        for k in sorted(set(settings.ks) | {k0}):
            spec = [r for name in settings.tasks for r in select(name, d.name, k, sweep_only=True)]
            base = [r for name in settings.tasks for r in select(name, "target", None, sweep_only=True)]
            spec_wall, base_wall = sum(r["wall_s"] for r in spec), sum(r["wall_s"] for r in base)
            acc = _acceptance(spec)
            sweep.append(
                {
                    "k": k,
                    "measured_speedup": base_wall / spec_wall if spec_wall else 0.0,
                    "alpha": acc["alpha"],
                    "acceptance_rate": acc["acceptance_rate"],
                    "tokens_per_target_forward": acc["tokens_per_target_forward"],
                    "wall_s": spec_wall,
                    "target_wall_s": base_wall,
                }
            )
        drafts[d.name] = {"path": d.path, "resolved_path": draft_paths[d.name], "alpha": _acceptance(pooled)["alpha"], "tasks": tasks, "sweep": sweep}

    return {
        "target": settings.target,
        "environment": environment,
        "settings": {
            **{k: v for k, v in asdict(settings).items() if k not in ("drafts", "target")},
            "drafts": {d.name: d.path for d in settings.drafts},
            "mode": "sampling" if settings.do_sample else "greedy",
            "max_new_tokens_per_task": {name: settings.max_new_tokens or get_task(name).max_new_tokens for name in settings.tasks},
            "alpha_estimator": "maximum likelihood of i.i.d. per-token acceptance (fit_alpha)",
        },
        "target_only": target_only,
        "drafts": drafts,
    }


def add_predictions(entry: dict[str, Any], costs: Costs, settings: Settings) -> None:
    """Add the measured costs, predicted speedup per task and per k, and the best k to one draft's entry."""
    k0 = settings.num_draft_tokens
    entry["costs"] = costs.to_dict()
    for row in entry["tasks"].values():
        row["predicted_speedup"] = predicted_speedup(row["alpha"], k0, costs.c, costs.v[k0])
    for point in entry["sweep"]:
        point["predicted_speedup"] = predicted_speedup(entry["alpha"], point["k"], costs.c, costs.v[point["k"]])
        point["predicted_speedup_own_alpha"] = predicted_speedup(point["alpha"], point["k"], costs.c, costs.v[point["k"]])
    entry["predicted_curve"] = [{"k": k, "predicted_speedup": predicted_speedup(entry["alpha"], k, costs.c, costs.v[k])} for k in sorted(costs.v)]
    entry["best_k"] = best_k(entry["alpha"], costs, k_max=max(costs.v))


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
        num_samples=args.num_samples,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        num_draft_tokens=args.num_draft_tokens,
        ks=parse_ints(args.ks, "--ks") if args.ks else [],
        sweep_samples=args.sweep_samples,
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
