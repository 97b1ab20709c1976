"""`distill publish`: turn a training output into a draft folder that loads with transformers
(`assistant_model=`), vLLM (`draft_model`) and SGLang (`STANDALONE`), with a model card that holds
the measured acceptance. Written into a temporary folder, checked by reloading, then swapped into
place (`distill.common.io.atomic_folder`). The card is templates/model_card.md filled by jinja2."""

from __future__ import annotations

import copy
import json
import logging
import re
import shutil
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import torch
import yaml
from huggingface_hub import HfApi, ModelCard, ModelCardData, get_token, snapshot_download
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from distill.commands.engines import as_records, check_folder, summary
from distill.commands.export_gguf import OUTTYPES, export_gguf, serve_command
from distill.common.io import atomic_folder, atomic_write, write_json
from distill.common.models import load_config, load_model, load_tokenizer, resolve
from distill.common.provenance import versions
from distill.common.trim import PROMPT_ROWS, draft_to_target, restore_full_head, save_trim_files, trim_state
from distill.common.vocab import check_tokenizers_agree

log = logging.getLogger(__name__)

# Every file a Hugging Face tokenizer may consist of; copied verbatim from the target so the draft
# folder carries the target's own tokenizer (in the format its transformers version wrote).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
ADAPTER_CONFIG = "adapter_config.json"
REPORT_FIELDS = ("acceptance_rate", "mean_accepted_length", "quality", "target_quality", "quality_metric", "greedy_identity")
# Report schemas this version reads: 1 (one "speedup", whole calls, runs not recorded) and 2 (runs, both speedups, intervals).
REPORT_SCHEMAS = (1, 2)
SPEEDUP_FIELD = {1: "speedup", 2: "end_to_end_speedup"}
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# The model card's prose and layout (package data, so it ships with a non-editable install); the values come from _card_values.
MODEL_CARD_TEMPLATE = resources.files("distill.commands") / "templates" / "model_card.md"
DEFAULT_NUM_DRAFT_TOKENS = 5  # the card's vLLM/SGLang draft length when the eval report records none
FULL_VOCAB = "full-vocab"  # a trimmed draft's full-vocabulary export, for transformers, vLLM, SGLang and llama.cpp


@dataclass
class _Source:
    """Where the draft comes from and what the run recorded about it."""

    draft_dir: Path
    target: str
    target_revision: str | None = None
    recipe_text: str | None = None
    recipe: dict[str, Any] = field(default_factory=dict)
    run_info: dict[str, Any] | None = None


@dataclass
class _Draft:
    """The draft as it will be written, beside the target's tokenizer and vocabulary it was checked against."""

    model: PreTrainedModel
    base_model: str | None  # the base of a LoRA adapter; None for a full model
    target_tokenizer: PreTrainedTokenizerBase
    vocab_size: int
    target_vocab: int
    padded: list[int] = field(default_factory=list)
    serving: dict[str, Any] = field(default_factory=dict)  # the GGUF written and each engine's verdict (_serving)
    full: PreTrainedModel | None = None  # a trimmed draft's full-vocabulary export (FULL_VOCAB/); `model` is the trimmed one


def pad_vocab(model: PreTrainedModel, vocab_size: int, real_vocab: int) -> list[int]:
    """Grow the embedding and LM head to `vocab_size` rows that can never be predicted; return their ids.

    vLLM's `draft_model` method refuses a draft whose `config.vocab_size` differs from the target's
    (Qwen2.5-0.5B has 151,936 rows, 7B 152,064, the tokenizer 151,665). The new rows must leave the
    draft's behaviour unchanged. A linear head without bias cannot make a logit -inf, and zero rows
    are not safe: their logit is 0, which wins whenever every real logit is negative. Instead:

    1. Every new LM-head row (and bias entry, if any) is the mean of the `real_vocab` rows the
       tokenizer can produce. Its logit is then exactly the mean of the real logits, h·mean(w) =
       mean(h·w), which is below the largest real logit unless all real logits are equal (and a
       tie goes to the lower, real id in torch.argmax). So no padded id is ever the greedy choice,
       the way vLLM (default `draft_sample_method` greedy) and transformers draft. Under sampling,
       Jensen gives exp(mean l) <= mean exp(l), so each padded id is at most as likely as the
       average real token (p <= 1/real_vocab) and in practice ~exp(mean - max), negligible.
       (In bf16 the rounding of the mean row moves its logit by ~2^-8 relative, far below the gap
       between the top logit and the mean logit.)
    2. The new ids go into `generation_config.suppress_tokens`, which transformers' `generate`
       honours, also when the draft runs as `assistant_model=` (the assistant's generation config
       fills what the caller left unset): their logits become -inf and the softmax over the original
       rows is exactly the unpadded draft's, so greedy and sampled outputs are identical.
    3. The logits of the original rows are untouched (same weights, same hidden states).

    Speculative decoding stays lossless either way: the target's rejection step, not the draft,
    fixes the output distribution; the padding can only cost acceptance, and by (1) it cannot.
    With tied embeddings (Qwen2.5-0.5B/1.5B) the input rows are the same tensor; the tokenizer
    never produces those ids, so their input embedding is never read in practice."""
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    old = inputs.weight.shape[0]
    if real_vocab > old:
        raise ValueError(f"the draft's embedding has {old} rows but the tokenizer has {real_vocab} tokens: the draft does not fit this tokenizer")
    if vocab_size < old:
        raise ValueError(
            f"--pad-vocab-to-target: the draft has more embedding rows ({old}) than the target's vocab_size ({vocab_size}); padding cannot shrink a vocabulary"
        )
    if vocab_size == old:
        return []
    model.resize_token_embeddings(vocab_size, mean_resizing=False)
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    with torch.no_grad():
        for module in {id(m): m for m in (inputs, outputs) if m is not None}.values():
            w = module.weight
            w[old:] = w[:real_vocab].float().mean(0).to(w.dtype)
            bias = getattr(module, "bias", None)
            if bias is not None:
                bias[old:] = bias[:real_vocab].float().mean().to(bias.dtype)
    ids = list(range(old, vocab_size))
    gen = model.generation_config
    gen.suppress_tokens = sorted(set(gen.suppress_tokens or []) | set(ids))
    return ids


def suppress_padding_ids(model: PreTrainedModel, real_vocab: int, vocab_size: int) -> None:
    """List every embedding row no text produces (ids >= the tokenizer's length: the checkpoint's
    own padding, e.g. 151,665..151,935 of Qwen2.5-0.5B, and any added by `pad_vocab`) in
    `generation_config.suppress_tokens`, so the draft never proposes one as `assistant_model=`
    (transformers applies the assistant's own suppress_tokens to its candidates)."""
    gen = model.generation_config
    gen.suppress_tokens = sorted(set(gen.suppress_tokens or []) | set(range(real_vocab, vocab_size))) or None


def load_eval_report(path: str | Path) -> tuple[dict[str, Any], Path]:
    """Read an evaluation JSON (a file, or the newest report in a folder) and check its schema."""
    path = Path(path)
    if path.is_dir():
        reports = []
        for candidate in path.glob("*.json"):
            try:
                if isinstance(json.loads(candidate.read_text()).get("drafts"), dict):
                    reports.append(candidate)
            except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
                continue
        if not reports:
            raise ValueError(f"--eval-report: no evaluation JSON (with a 'drafts' entry) in {path}; run `distill accept` first")
        path = max(reports, key=lambda p: p.stat().st_mtime)
    try:
        report = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"--eval-report: {path} is not valid JSON ({err})") from err
    drafts = report.get("drafts") if isinstance(report, dict) else None
    version = report.get("schema_version", 1) if isinstance(report, dict) else 1
    if version not in REPORT_SCHEMAS:
        raise ValueError(f"--eval-report: {path} has report schema {version}; this distill reads schemas {list(REPORT_SCHEMAS)}: upgrade distill to publish it")
    if not isinstance(drafts, dict) or not drafts:
        raise ValueError(f"--eval-report: {path} has no 'drafts' mapping; expected the JSON `distill accept` writes")
    for name, entry in drafts.items():
        tasks = entry.get("tasks") if isinstance(entry, dict) else None
        if not isinstance(tasks, dict) or not tasks:
            raise ValueError(f"--eval-report: draft {name!r} in {path} has no 'tasks' mapping")
        for task, row in tasks.items():
            missing = [k for k in (*REPORT_FIELDS, SPEEDUP_FIELD[version]) if k not in row]
            if missing:
                raise ValueError(f"--eval-report: {path}, draft {name!r}, task {task!r} lacks {', '.join(missing)}")
    return report, path


def _with_interval(row: dict[str, Any], name: str, fmt: str, suffix: str = "") -> str:
    """A report figure with its 95% interval when the report has one (schema 2), else the figure alone; – when absent."""
    iv = (row.get("intervals") or {}).get(name)
    if isinstance(iv, dict):
        return f"{format(iv['value'], fmt)}{suffix} [{format(iv['low'], fmt)}, {format(iv['high'], fmt)}]"
    return "–" if row.get(name) is None else f"{format(row[name], fmt)}{suffix}"


def acceptance_table(report: dict[str, Any], highlight: set[str] = frozenset()) -> str:
    """The Markdown table of one evaluation: a row per draft × task, each figure with its 95% interval
    (schema 2 reports); drafts whose path is in `highlight` are bold."""
    version = report.get("schema_version", 1)
    lines = [
        "| Draft | Task | Acceptance rate [95% CI] | Mean accepted length | Decode speedup [95% CI] | End-to-end speedup [95% CI] | Quality | Target quality | Greedy identity |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, entry in report["drafts"].items():
        path = entry.get("path")
        shown = f"**{name}**" if path and (path in highlight or str(Path(path).absolute()) in highlight) else name
        for task, r in entry["tasks"].items():
            end_to_end = _with_interval(r, SPEEDUP_FIELD[version], ".2f", "×")
            lines.append(
                f"| {shown} | {task} | {_with_interval(r, 'acceptance_rate', '.3f')} | {r['mean_accepted_length']:.2f} | {_with_interval(r, 'decode_speedup', '.2f', '×')} "
                f"| {end_to_end} | {r['quality']:.3f} ({r['quality_metric']}) | {r['target_quality']:.3f} | {'n/a (sampling)' if r['greedy_identity'] is None else format(r['greedy_identity'], '.1%')} |"
            )
    return "\n".join(lines)


def _timing_runs(report: dict[str, Any]) -> str:
    """The line naming the run(s) each speed figure was timed in (schema 1 reports recorded none)."""
    runs = report.get("runs")
    if not runs:
        return "Speeds: a schema-1 report, whose timing runs were not recorded (speedup = whole calls, TTFT included)."
    named = "; ".join(f"`{run_id}` started {r.get('started')} on {r.get('device_name')}, {r.get('torch_threads')} threads" for run_id, r in runs.items())
    return f"Speeds timed in run(s) {named}: each speculative call paired with the target-only call of its own run."


def publish(
    out: str | Path,
    *,
    run_dir: str | Path | None = None,
    draft: str | Path | None = None,
    target: str | None = None,
    target_revision: str | None = None,
    eval_report: str | Path | None = None,
    keep_adapter: bool = False,
    pad_vocab_to_target: bool = False,
    license: str = "apache-2.0",
    force: bool = False,
    push_to_hub: str | None = None,
    public: bool = False,
    gguf: str | None = None,
) -> Path:
    """Write the ready draft folder `out` from a training output (`run_dir`) or a `draft` + `target` pair;
    `gguf` (f16, bf16 or q8_0): also the draft as `draft-<gguf>.gguf` for llama.cpp (distill export-gguf).

    Nothing appears at `out` unless every step succeeded (the folder is built beside it and swapped in);
    without `push_to_hub` nothing leaves the machine."""
    out = Path(out).absolute()
    if gguf is not None and gguf not in OUTTYPES:
        raise ValueError(f"--gguf-outtype {gguf!r}: choose one of {', '.join(OUTTYPES)}")
    _check_request(out, eval_report, keep_adapter=keep_adapter, pad_vocab_to_target=pad_vocab_to_target, force=force, push_to_hub=push_to_hub, public=public)
    source = _resolve_source(run_dir, draft, target, target_revision)
    if out == source.draft_dir or out in source.draft_dir.parents:
        raise ValueError(f"--out {out} would replace the draft it is built from ({source.draft_dir}); choose another folder")
    prepared = _prepare_draft(source, keep_adapter, pad_vocab_to_target)
    with atomic_folder(out) as tmp:  # whole or absent: an existing `out` is exchanged only once `tmp` is complete
        log.info("writing %s", tmp)
        _write_draft_folder(
            tmp,
            source,
            prepared,
            eval_report,
            keep_adapter=keep_adapter,
            license=license,
            repo=push_to_hub or str(out),
            name=(push_to_hub or out.name).split("/")[-1],
            gguf=gguf,
        )
    log.info("wrote %s", out)
    if push_to_hub:
        url = push_folder(out, push_to_hub, private=not public)
        log.info("uploaded to %s", url)
    return out


def _check_request(
    out: Path, eval_report: str | Path | None, *, keep_adapter: bool, pad_vocab_to_target: bool, force: bool, push_to_hub: str | None, public: bool
) -> None:
    """Refuse contradictory flags, an occupied `out` without --force and a missing token or report before any model loads."""
    if keep_adapter and pad_vocab_to_target:
        raise ValueError("--pad-vocab-to-target changes the base weights, so it cannot keep an adapter: drop --keep-adapter (the LoRA is merged)")
    if public and not push_to_hub:
        raise ValueError("--public only applies with --push-to-hub REPO")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file; pass a folder path")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise FileExistsError(f"--out {out} is not empty; pass --force to replace it")
    if push_to_hub and get_token() is None:
        raise ValueError("--push-to-hub needs a Hugging Face token with write access: set HF_TOKEN (or run `hf auth login`)")
    if eval_report is not None and not Path(eval_report).exists():
        raise FileNotFoundError(f"--eval-report {eval_report} does not exist")


def _prepare_draft(source: _Source, keep_adapter: bool, pad_vocab_to_target: bool) -> _Draft:
    """Load the draft, check it against the target's tokenizer, and pad its vocabulary if asked, so what is written fits the target."""
    log.info("target tokenizer and config: %s", source.target)
    target_tok = load_tokenizer(source.target, revision=source.target_revision, what="target tokenizer")
    target_vocab = load_config(source.target, revision=source.target_revision).get_text_config().vocab_size
    if any((source.draft_dir / f).is_file() for f in TOKENIZER_FILES):
        check_tokenizers_agree(target_tok, load_tokenizer(source.draft_dir, what="draft tokenizer"))

    model, base_model = _load_draft(source.draft_dir, keep_adapter)
    trimmed = None
    if draft_to_target(model) is not None:  # the folder serves distill's decoder; FULL_VOCAB/ (padded if asked) every engine
        if keep_adapter:
            raise ValueError("--keep-adapter: a trimmed draft is published merged (its head is not an adapter's); drop the flag")
        trimmed, model = model, restore_full_head(copy.deepcopy(model))
    draft_rows = model.get_input_embeddings().weight.shape[0]
    if draft_rows < len(target_tok):
        raise ValueError(
            f"the draft's embedding has {draft_rows} rows but the target tokenizer has {len(target_tok)} tokens: it is not a draft for {source.target}"
        )
    padded = pad_vocab(model, target_vocab, len(target_tok)) if pad_vocab_to_target else []
    if padded:
        log.info("padded the vocabulary from %d to %d rows (ids %d..%d never predicted)", draft_rows, target_vocab, padded[0], padded[-1])
    draft_vocab = model.get_input_embeddings().weight.shape[0]
    suppress_padding_ids(model, len(target_tok), draft_vocab)
    if draft_vocab != target_vocab:
        log.warning(
            "vocab_size %d differs from the target's %d: vLLM's draft_model method and transformers' plain assistant_model= "
            "refuse it; publish with --pad-vocab-to-target",
            draft_vocab,
            target_vocab,
        )
    if trimmed is not None:
        return _Draft(trimmed, base_model, target_tok, draft_vocab, target_vocab, padded, full=model)
    return _Draft(model, base_model, target_tok, draft_vocab, target_vocab, padded)


def _write_draft_folder(
    folder: Path,
    source: _Source,
    draft: _Draft,
    eval_report: str | Path | None,
    *,
    keep_adapter: bool,
    license: str,
    repo: str,
    name: str,
    gguf: str | None = None,
) -> None:
    """Fill the (temporary) folder: weights, tokenizer, reload check, then the report, recipe, run info, card and publish info."""
    draft.model.save_pretrained(folder)  # safetensors: transformers 5 writes nothing else, peft by default
    if draft.full is not None:
        save_trim_files(draft.model, folder)
    if not keep_adapter:
        _write_portable_config(folder)
    _copy_tokenizer(source.target, source.target_revision, folder, draft.target_tokenizer)
    _verify(folder, draft.model, draft.target_tokenizer, draft.model.get_input_embeddings().weight.shape[0])
    if draft.full is not None:
        _write_full_vocab(folder / FULL_VOCAB, source, draft)
    report = report_path = None
    if eval_report is not None:
        report, report_path = load_eval_report(eval_report)
        shutil.copy2(report_path, folder / "eval_report.json")
    draft.serving = _serving(folder / FULL_VOCAB if draft.full is not None else folder, source, gguf, repo, name, _num_draft_tokens(report))
    if source.recipe_text is not None:
        atomic_write(folder / "recipe.yaml", source.recipe_text)
    if source.run_info is not None:
        write_json(folder / "run_info.json", source.run_info)
    card = _model_card(source, draft, report, report_path, license=license, repo=repo, name=name, adapter=keep_adapter)
    atomic_write(folder / "README.md", str(card))
    write_json(folder / "publish_info.json", {**_publish_info(source, eval_report, draft.padded, keep_adapter), **draft.serving})


def _write_full_vocab(folder: Path, source: _Source, draft: _Draft) -> None:
    """A trimmed draft's full-vocabulary export: a plain model (kept rows as trained, the others the original's), checked by reloading."""
    folder.mkdir()
    draft.full.save_pretrained(folder)
    _write_portable_config(folder)
    _copy_tokenizer(source.target, source.target_revision, folder, draft.target_tokenizer)
    _verify(folder, draft.full, draft.target_tokenizer, draft.vocab_size)


def _trimmed_card(draft: _Draft, repo: str) -> dict[str, Any] | None:
    """The card's trimmed-vocabulary section: how many rows were kept, from what, and where the full-vocabulary export is."""
    if draft.full is None:
        return None
    state = trim_state(draft.model)
    info = state.info if state is not None else {}
    source = info.get("from") or info.get("count_from")
    source = ", ".join(f"`{s}`" for s in source) if isinstance(source, list) else source
    cov = info.get("coverage_of_counted_text")
    return {
        "kept": int(draft_to_target(draft.model).numel()),
        "rows": draft.model.get_input_embeddings().weight.shape[0],
        "source": source or "the text it was cut with",
        "coverage": f"{cov:.2%}" if isinstance(cov, float) else "an unrecorded share",
        "folder": FULL_VOCAB,
        "path": f"{repo}/{FULL_VOCAB}",
        "prompt_rows": PROMPT_ROWS,
    }


def _serving(folder: Path, source: _Source, gguf: str | None, repo: str, name: str, k: int) -> dict[str, Any]:
    """Write the draft as `draft-<gguf>.gguf` when asked (distill export-gguf), then check the folder against each serving
    engine's rule (distill.commands.engines) and log which it satisfies: publish_info.json and the card record both."""
    written = path = None
    if gguf is not None:
        path = folder / f"draft-{gguf}.gguf"
        written = export_gguf(folder, path, gguf, name=name).summary()
        written["path"] = path.name
        log.info("wrote %s (%s, %.1f MB)", path.name, gguf, written["bytes"] / 1e6)
    checks = check_folder(folder, source.target, revision=source.target_revision, gguf=path, repo=repo, k=k)
    log.info("engines: %s", summary(checks))
    for check in checks:
        log.info("  %-12s %s: %s", check.engine, "yes" if check.ok else "no", check.reason)
    return {"gguf": written, "engines": as_records(checks)}


def push_folder(folder: str | Path, repo_id: str, private: bool = True) -> str:
    """Create the Hub model repo (private unless asked; an existing repo keeps its visibility) and upload `folder`."""
    api = HfApi()
    url = api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=str(folder), commit_message="Upload draft model with distill publish")
    return str(url)


def _resolve_source(run_dir: str | Path | None, draft: str | Path | None, target: str | None, target_revision: str | None) -> _Source:
    """The draft folder, its target and what the run recorded (recipe.yaml, run_info.json) from RUN or --draft/--target."""
    if (run_dir is None) == (draft is None):
        raise ValueError("pass either a training output folder (RUN) or --draft PATH with --target, not both and not neither")
    recipe_text, recipe, run_info = None, {}, None
    if run_dir is not None:
        run = Path(run_dir)
        draft_dir = run / "draft"
        if not draft_dir.is_dir():
            raise FileNotFoundError(f"{run} has no draft/ folder: pass the output_dir of a finished `distill train` run, or --draft PATH")
        if (run / "recipe.yaml").is_file():
            # Plain YAML, not load_recipe: the card reads a few fields, and a recipe.yaml from an older
            # run (an `eval:` section, since removed, or any other retired key) must still publish.
            recipe_text = (run / "recipe.yaml").read_text(encoding="utf-8")
            recipe = yaml.safe_load(recipe_text)
            recipe = recipe if isinstance(recipe, dict) else {}
        if (run / "run_info.json").is_file():
            run_info = json.loads((run / "run_info.json").read_text())
    else:
        draft_dir = Path(draft)
        if not draft_dir.is_dir():
            raise FileNotFoundError(f"--draft {draft_dir} is not a folder holding a model or a peft adapter")
    recipe_target = _section(recipe, "target")
    target = target or recipe_target.get("name_or_path")
    if not target:
        raise ValueError("no target model: pass --target PATH_OR_ID (the recipe names none)")
    revision = target_revision or (recipe_target.get("revision") if target == recipe_target.get("name_or_path") else None)
    return _Source(draft_dir.absolute(), target, revision, recipe_text, recipe, run_info)


def _load_draft(draft_dir: Path, keep_adapter: bool) -> tuple[PreTrainedModel, str | None]:
    """The draft in memory: a full model, or a peft adapter on its base (merged unless `keep_adapter`)."""
    if not (draft_dir / ADAPTER_CONFIG).is_file():
        if keep_adapter:
            raise ValueError(f"--keep-adapter: {draft_dir} holds a full model, not a peft adapter (no {ADAPTER_CONFIG}); drop the flag")
        if not (draft_dir / "config.json").is_file():
            raise FileNotFoundError(f"{draft_dir} holds neither a model (config.json) nor a peft adapter ({ADAPTER_CONFIG})")
        log.info("loading draft %s", draft_dir)
        return load_model(draft_dir, dtype=None, what="draft"), None
    from peft import PeftConfig, PeftModel

    config = PeftConfig.from_pretrained(draft_dir)
    log.info("loading LoRA adapter %s on %s", draft_dir, config.base_model_name_or_path)
    base = load_model(config.base_model_name_or_path, revision=config.revision, dtype=None, what="LoRA base model")
    model = PeftModel.from_pretrained(base, draft_dir)
    if not keep_adapter:
        model = model.merge_and_unload()
    return model.eval(), config.base_model_name_or_path


def _write_portable_config(folder: Path) -> None:
    """Add the transformers-4 spellings (`torch_dtype`, `rope_theta`, `rope_scaling`) beside the v5 ones, so a
    vLLM or SGLang pinned to transformers 4 reads the same dtype and RoPE base instead of silent defaults."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    if "dtype" in config:
        config.setdefault("torch_dtype", config["dtype"])
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        config.setdefault("rope_theta", rope["rope_theta"])
        if rope.get("rope_type", "default") != "default":
            config.setdefault("rope_scaling", {k: v for k, v in rope.items() if k != "rope_theta"})
    atomic_write(path, json.dumps(config, indent=2, sort_keys=True) + "\n")


def _copy_tokenizer(target: str, revision: str | None, dest: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    """Copy the target's tokenizer files verbatim (from its folder, or its Hub snapshot in the cache);
    a GGUF target carries none, so its loaded `tokenizer` is saved instead."""
    source = resolve(target)
    if source.kind == "gguf":
        tokenizer.save_pretrained(dest)
        return
    src = Path(source.path) if source.kind == "folder" else Path(snapshot_download(target, revision=revision, allow_patterns=list(TOKENIZER_FILES)))
    files = [f for f in TOKENIZER_FILES if (src / f).is_file()]
    if not files:
        raise FileNotFoundError(f"no tokenizer files in {src}: the target must ship its tokenizer")
    for f in files:
        shutil.copy2(src / f, dest / f)


@torch.no_grad()
def _verify(folder: Path, model: PreTrainedModel, target_tok: PreTrainedTokenizerBase, vocab_size: int) -> None:
    """Reload what was written and refuse it unless tokenizer, vocab_size and logits match the model in memory."""
    log.info("reloading %s to check it", folder)
    check_tokenizers_agree(target_tok, load_tokenizer(folder))
    reloaded = load_model(folder, dtype=None, what="written draft")
    got = reloaded.config.get_text_config().vocab_size
    if got != vocab_size:
        raise ValueError(f"the written config says vocab_size {got}, expected {vocab_size}")
    device = next(model.parameters()).device
    ids = torch.arange(min(16, len(target_tok)), device=device).unsqueeze(0)
    want, have = model(input_ids=ids).logits, reloaded.to(device)(input_ids=ids).logits
    if not torch.equal(want, have):
        raise ValueError(
            f"the reloaded draft's logits differ from the model in memory (max |diff| {(want - have).abs().max().item():.3g}): the folder was not published"
        )


def _hub_id(name: str | None) -> str | None:
    """`name` when it reads as a Hub repo id (not a local path), else None: Hub metadata takes only ids."""
    if not name or Path(name).exists() or not _HUB_ID.fullmatch(name):
        return None
    return name


def _num_draft_tokens(report: dict[str, Any] | None) -> int:
    """The draft length the eval report measured (its settings), so the serving commands match the numbers; else the default."""
    k = ((report or {}).get("settings") or {}).get("num_draft_tokens")
    return k if isinstance(k, int) and k > 0 else DEFAULT_NUM_DRAFT_TOKENS


def _section(recipe: dict[str, Any], key: str) -> dict[str, Any]:
    """One section of the recorded recipe as a mapping ({} when absent or not a mapping): old recipes still publish."""
    value = recipe.get(key)
    return value if isinstance(value, dict) else {}


def _model_card(
    source: _Source, draft: _Draft, report: dict[str, Any] | None, report_path: Path | None, *, license: str, repo: str, name: str, adapter: bool
) -> ModelCard:
    """README.md: Hub metadata, what the draft is for, the acceptance table, usage, the recipe (templates/model_card.md)."""
    data = _card_data(source, draft, license=license, adapter=adapter)
    return render_model_card(data, _card_values(source, draft, report, report_path, repo=repo, name=name, adapter=adapter))


def render_model_card(data: ModelCardData, values: dict[str, Any]) -> ModelCard:
    """Fill MODEL_CARD_TEMPLATE with the YAML header `data` and `values`; an undefined name raises instead of leaving a blank."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    template = env.from_string(MODEL_CARD_TEMPLATE.read_text(encoding="utf-8"))
    return ModelCard(template.render(card_data=data.to_yaml(), **values))


def _base_models(source: _Source, draft: _Draft) -> list[str | None]:
    """Where the draft started, best first: the LoRA base it was loaded on, then the recipe's draft model."""
    return [draft.base_model, _section(source.recipe, "draft").get("name_or_path")]


def _card_data(source: _Source, draft: _Draft, *, license: str, adapter: bool) -> ModelCardData:
    """The card's YAML header: Hub metadata takes repo ids only, so a local base model or dataset path is left out."""
    hub = [d for path, _ in _datasets(source.recipe) if (d := _hub_id(path))]
    return ModelCardData(
        base_model=next((h for c in _base_models(source, draft) if (h := _hub_id(c))), None),
        library_name="peft" if adapter else "transformers",
        license=license,
        pipeline_tag="text-generation",
        datasets=hub or None,
        tags=["speculative-decoding", "draft-model", "distillation", "distill", draft.model.config.model_type] + (["lora"] if adapter else []),
    )


def _card_values(
    source: _Source, draft: _Draft, report: dict[str, Any] | None, report_path: Path | None, *, repo: str, name: str, adapter: bool
) -> dict[str, Any]:
    """Every value the template shows, computed here so the template keeps only prose, layout and simple conditions."""
    k = _num_draft_tokens(report)
    gguf = draft.serving.get("gguf")  # the GGUF _serving wrote, if any
    return {
        "name": name,
        "target": source.target,
        "target_revision": source.target_revision,
        "base_model": next((c for c in _base_models(source, draft) if c), None),
        "architecture": type(draft.model).__name__,
        "parameters": f"{sum(p.numel() for p in draft.model.parameters()):,}",
        "draft_vocab": draft.vocab_size,
        "target_vocab": draft.target_vocab,
        "adapter": adapter,
        "dataset": ", ".join(f"`{path}`" + (f" (share {share:g})" if share is not None else "") for path, share in _datasets(source.recipe)) or None,
        "objective": _objective(_section(source.recipe, "loss")),
        "acceptance": _acceptance(source, report, report_path, repo),
        "repo": repo,
        # transformers takes an assistant of another vocab_size only with both tokenizers (universal assisted decoding).
        "assistant_extra": "" if draft.vocab_size == draft.target_vocab else ", tokenizer=tokenizer, assistant_tokenizer=tokenizer",
        "num_draft_tokens": k,
        "vllm_config": json.dumps({"method": "draft_model", "model": f"{repo}/{FULL_VOCAB}" if draft.full is not None else repo, "num_speculative_tokens": k}),
        "trimmed": _trimmed_card(draft, repo),
        "serve_path": f"{repo}/{FULL_VOCAB}" if draft.full is not None else repo,
        "subfolder": f', subfolder="{FULL_VOCAB}"' if draft.full is not None else "",
        "padding": {"first": draft.padded[0], "last": draft.padded[-1]} if draft.padded else None,
        "engines": [{**e, "reason": e["reason"].replace("|", "\\|"), "rule": e["rule"].replace("|", "\\|")} for e in draft.serving.get("engines", [])],
        "gguf": {**gguf, "command": serve_command("TARGET.gguf", gguf["path"], k)} if gguf else None,
        "recipe_text": source.recipe_text.rstrip() if source.recipe_text else None,
        "run_info": json.dumps(source.run_info, indent=2) if source.run_info is not None else None,
    }


def _datasets(recipe: dict[str, Any]) -> list[tuple[str, float | None]]:
    """The recipe's training data: data.dataset alone, or each data.sources entry with its share of the mix."""
    data = _section(recipe, "data")
    if data.get("dataset"):
        return [(str(data["dataset"]), None)]
    sources = [src for src in data.get("sources") or [] if isinstance(src, dict) and src.get("dataset")]
    return [(str(src["dataset"]), float(src.get("share", 1.0))) for src in sources]


def _objective(loss: dict[str, Any]) -> dict[str, Any] | None:
    """The recipe's loss with the trainer's defaults filled in, for the card's Objective line; None when none was recorded."""
    if not loss:
        return None
    defaults = {"divergence": "forward_kl", "temperature": 1.0, "ce_weight": 0.0, "lmbda": 0.0}
    return {key: loss.get(key, default) for key, default in defaults.items()}


def _acceptance(source: _Source, report: dict[str, Any] | None, report_path: Path | None, repo: str) -> dict[str, Any] | None:
    """The card's acceptance section from the eval report (whose numbers, measured how, the table); None without a report."""
    if report is None:
        return None
    facts = []
    for label, key in (("Settings", "settings"), ("Environment", "environment")):
        items = {k: v for k, v in (report.get(key) or {}).items() if isinstance(v, (str, int, float, bool))}
        if items:
            facts.append(f"{label}: " + ", ".join(f"{k}={v}" for k, v in items.items()) + ".")
    facts.append(_timing_runs(report))
    highlight = {str(source.draft_dir), str(source.draft_dir.parent), repo}
    return {"target": report.get("target", source.target), "report_name": report_path.name, "facts": facts, "table": acceptance_table(report, highlight)}


def _publish_info(source: _Source, eval_report: str | Path | None, padded: list[int], adapter: bool) -> dict[str, Any]:
    """publish_info.json: where the folder came from and with which library versions, to reproduce it."""
    return {
        "draft_source": str(source.draft_dir),
        "target": source.target,
        "target_revision": source.target_revision,
        "eval_report": str(Path(eval_report).absolute()) if eval_report else None,
        "adapter": adapter,
        "padded_ids": [padded[0], padded[-1]] if padded else None,
        "versions": versions(("distill", "torch", "transformers", "peft", "huggingface_hub")),
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point of `distill publish` and scripts/publish.py; returns the exit status."""
    from distill.arguments import parser

    args = parser("publish").parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        out = publish(
            args.out,
            run_dir=args.run,
            draft=args.draft,
            target=args.target,
            target_revision=args.target_revision,
            eval_report=args.eval_report,
            keep_adapter=args.keep_adapter,
            pad_vocab_to_target=args.pad_vocab_to_target,
            license=args.license,
            force=args.force,
            push_to_hub=args.push_to_hub,
            public=args.public,
            gguf=(args.gguf_outtype or "f16") if (args.gguf or args.gguf_outtype) else None,
        )
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"distill publish: error: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
