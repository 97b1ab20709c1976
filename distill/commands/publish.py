"""`distill publish`: turn a training output into a draft folder that loads with transformers
(`assistant_model=`), vLLM (`draft_model`) and SGLang (`STANDALONE`), with a model card that holds
the measured acceptance. Written into a temporary folder, checked by reloading, then renamed."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from huggingface_hub import HfApi, ModelCard, ModelCardData, get_token, snapshot_download
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from distill.common.models import load_config, load_model, load_tokenizer, resolve, share_permissions
from distill.common.provenance import versions
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
REPORT_FIELDS = ("acceptance_rate", "mean_accepted_length", "speedup", "quality", "target_quality", "quality_metric", "greedy_identity")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclass
class _Source:
    """Where the draft comes from and what the run recorded about it."""

    draft_dir: Path
    target: str
    target_revision: str | None = None
    recipe_text: str | None = None
    recipe: dict[str, Any] = field(default_factory=dict)
    run_info: dict[str, Any] | None = None


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
    if not isinstance(drafts, dict) or not drafts:
        raise ValueError(f"--eval-report: {path} has no 'drafts' mapping; expected the JSON `distill accept` writes")
    for name, entry in drafts.items():
        tasks = entry.get("tasks") if isinstance(entry, dict) else None
        if not isinstance(tasks, dict) or not tasks:
            raise ValueError(f"--eval-report: draft {name!r} in {path} has no 'tasks' mapping")
        for task, row in tasks.items():
            missing = [k for k in REPORT_FIELDS if k not in row]
            if missing:
                raise ValueError(f"--eval-report: {path}, draft {name!r}, task {task!r} lacks {', '.join(missing)}")
    return report, path


def acceptance_table(report: dict[str, Any], highlight: set[str] = frozenset()) -> str:
    """The Markdown table of one evaluation: a row per draft × task; drafts whose path is in `highlight` are bold."""
    lines = [
        "| Draft | Task | Acceptance rate | Mean accepted length | Speedup | Quality | Target quality | Greedy identity |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, entry in report["drafts"].items():
        path = entry.get("path")
        shown = f"**{name}**" if path and (path in highlight or str(Path(path).absolute()) in highlight) else name
        for task, r in entry["tasks"].items():
            lines.append(
                f"| {shown} | {task} | {r['acceptance_rate']:.1%} | {r['mean_accepted_length']:.2f} | {r['speedup']:.2f}× "
                f"| {r['quality']:.3f} ({r['quality_metric']}) | {r['target_quality']:.3f} | {'n/a (sampling)' if r['greedy_identity'] is None else format(r['greedy_identity'], '.1%')} |"
            )
    return "\n".join(lines)


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
) -> Path:
    """Write the ready draft folder `out` from a training output (`run_dir`) or a `draft` + `target` pair.

    Nothing appears at `out` unless every step succeeded (the folder is built beside it and renamed);
    without `push_to_hub` nothing leaves the machine."""
    out = Path(out).absolute()
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
    source = _resolve_source(run_dir, draft, target, target_revision)
    if out == source.draft_dir or out in source.draft_dir.parents:
        raise ValueError(f"--out {out} would replace the draft it is built from ({source.draft_dir}); choose another folder")

    log.info("target tokenizer and config: %s", source.target)
    target_tok = load_tokenizer(source.target, revision=source.target_revision, what="target tokenizer")
    target_vocab = load_config(source.target, revision=source.target_revision).get_text_config().vocab_size
    if any((source.draft_dir / f).is_file() for f in TOKENIZER_FILES):
        check_tokenizers_agree(target_tok, load_tokenizer(source.draft_dir, what="draft tokenizer"))

    model, base_model = _load_draft(source.draft_dir, keep_adapter)
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

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        log.info("writing %s", tmp)
        model.save_pretrained(tmp)  # safetensors: transformers 5 writes nothing else, peft by default
        if not keep_adapter:
            _write_portable_config(tmp)
        _copy_tokenizer(source.target, source.target_revision, tmp, target_tok)
        _verify(tmp, model, target_tok, draft_vocab)
        report = report_path = None
        if eval_report is not None:
            report, report_path = load_eval_report(eval_report)
            shutil.copy2(report_path, tmp / "eval_report.json")
        if source.recipe_text is not None:
            (tmp / "recipe.yaml").write_text(source.recipe_text)
        if source.run_info is not None:
            (tmp / "run_info.json").write_text(json.dumps(source.run_info, indent=2) + "\n")
        card = _model_card(
            source,
            model,
            base_model,
            report,
            report_path,
            padded,
            draft_vocab,
            target_vocab,
            license=license,
            repo=push_to_hub or str(out),
            name=(push_to_hub or out.name).split("/")[-1],
            adapter=keep_adapter,
        )
        card.save(tmp / "README.md")
        (tmp / "publish_info.json").write_text(json.dumps(_publish_info(source, eval_report, padded, keep_adapter), indent=2) + "\n")
        share_permissions(tmp)  # mkdtemp made it 0700 and the weights 0600: a published folder is for others to read
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("wrote %s", out)
    if push_to_hub:
        url = push_folder(out, push_to_hub, private=not public)
        log.info("uploaded to %s", url)
    return out


def push_folder(folder: str | Path, repo_id: str, private: bool = True) -> str:
    """Create the Hub model repo (private unless asked; an existing repo keeps its visibility) and upload `folder`."""
    api = HfApi()
    url = api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=str(folder), commit_message="Upload draft model with distill publish")
    return str(url)


def _resolve_source(run_dir: str | Path | None, draft: str | Path | None, target: str | None, target_revision: str | None) -> _Source:
    if (run_dir is None) == (draft is None):
        raise ValueError("pass either a training output folder (RUN) or --draft PATH with --target, not both and not neither")
    recipe_text, recipe, run_info = None, {}, None
    if run_dir is not None:
        run = Path(run_dir)
        draft_dir = run / "draft"
        if not draft_dir.is_dir():
            raise FileNotFoundError(f"{run} has no draft/ folder: pass the output_dir of a finished `distill train` run, or --draft PATH")
        if (run / "recipe.yaml").is_file():
            recipe_text = (run / "recipe.yaml").read_text()
            recipe = yaml.safe_load(recipe_text) or {}
        if (run / "run_info.json").is_file():
            run_info = json.loads((run / "run_info.json").read_text())
    else:
        draft_dir = Path(draft)
        if not draft_dir.is_dir():
            raise FileNotFoundError(f"--draft {draft_dir} is not a folder holding a model or a peft adapter")
    recipe_target = recipe.get("target") or {}
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
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


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


def _num_draft_tokens(report: dict[str, Any] | None, recipe: dict[str, Any]) -> int:
    for k in ((report or {}).get("settings") or {}).get("num_draft_tokens"), (recipe.get("eval") or {}).get("num_draft_tokens"):
        if isinstance(k, int) and k > 0:
            return k
    return 5


def _model_card(
    source: _Source,
    model: PreTrainedModel,
    base_model: str | None,
    report: dict[str, Any] | None,
    report_path: Path | None,
    padded: list[int],
    draft_vocab: int,
    target_vocab: int,
    *,
    license: str,
    repo: str,
    name: str,
    adapter: bool,
) -> ModelCard:
    """README.md: Hub metadata, what the draft is for, the acceptance table, usage, the recipe."""
    recipe = source.recipe
    candidates = [base_model, (recipe.get("draft") or {}).get("name_or_path")]
    base_model = next((c for c in candidates if c), None)
    dataset = (recipe.get("data") or {}).get("dataset")
    data = ModelCardData(
        base_model=next((h for c in candidates if (h := _hub_id(c))), None),
        library_name="peft" if adapter else "transformers",
        license=license,
        pipeline_tag="text-generation",
        datasets=[d] if (d := _hub_id(dataset)) else None,
        tags=["speculative-decoding", "draft-model", "distillation", "distill", model.config.model_type] + (["lora"] if adapter else []),
    )
    target, k = source.target, _num_draft_tokens(report, recipe)
    loss = recipe.get("loss") or {}
    n_params = sum(p.numel() for p in model.parameters())
    parts = [
        f"# {name}",
        f"A draft model for speculative decoding under **{target}**, trained with distill on the target's "
        f"own distribution. Speculative decoding is lossless: "
        f"the output is the target's; the draft only decides how fast it comes.",
        "",
        f"- Target: `{target}`" + (f" (revision `{source.target_revision}`)" if source.target_revision else ""),
        f"- Base model: `{base_model}`" if base_model else "- Base model: trained from scratch",
        f"- Architecture: `{type(model).__name__}`, {n_params:,} parameters, vocab_size {draft_vocab}"
        + (" (LoRA adapter: merge it for vLLM/SGLang, `distill publish` without `--keep-adapter`)" if adapter else ""),
        f"- Training data: `{dataset}`" if dataset else "- Training data: not recorded",
    ]
    if loss:
        parts.append(
            f"- Objective: {loss.get('divergence', 'forward_kl')} (temperature {loss.get('temperature', 1.0)}, ce_weight {loss.get('ce_weight', 0.0)}, on-policy fraction {loss.get('lmbda', 0.0)})"
        )
    parts += ["", "## Acceptance", ""]
    if report is None:
        parts.append("No evaluation report was given: run `distill accept` and publish again with `--eval-report`.")
    else:
        parts.append(f"Measured by `distill accept` against `{report.get('target', target)}` (report `{report_path.name}`, copied as `eval_report.json`).")
        for label, key in (("Settings", "settings"), ("Environment", "environment")):
            items = {k: v for k, v in (report.get(key) or {}).items() if isinstance(v, (str, int, float, bool))}
            if items:
                parts.append(f"{label}: " + ", ".join(f"{k}={v}" for k, v in items.items()) + ".")
        highlight = {str(source.draft_dir), str(source.draft_dir.parent), repo}
        parts += [
            "",
            acceptance_table(report, highlight),
            "",
            "Acceptance rate: share of proposed tokens the target accepts. Mean accepted length: tokens gained per "
            "target forward. Speedup: wall-clock against target-only decoding. Greedy identity: share of prompts "
            "whose speculative output equals the target's own greedy output.",
        ]
    # transformers takes an assistant of another vocab_size only with both tokenizers (universal assisted decoding).
    assistant_extra = "" if draft_vocab == target_vocab else ", tokenizer=tokenizer, assistant_tokenizer=tokenizer"
    transformers_snippet = f"""```python
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{target}")
target = AutoModelForCausalLM.from_pretrained("{target}", dtype="auto", device_map="auto")
draft = AutoModelForCausalLM.from_pretrained("{repo}", dtype="auto", device_map="auto")
messages = [{{"role": "user", "content": "What is 17 * 23?"}}]
inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True).to(target.device)
out = target.generate(**inputs, assistant_model=draft, max_new_tokens=256{assistant_extra})
print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
```"""
    parts += ["", "## Usage", "", "### transformers (`assistant_model=`)", "", transformers_snippet, ""]
    if adapter:
        parts.append("vLLM and SGLang take a full draft model: publish without `--keep-adapter` to merge the LoRA.")
    else:
        spec = json.dumps({"method": "draft_model", "model": repo, "num_speculative_tokens": k})
        parts += [
            "### vLLM",
            "",
            "```bash",
            f"vllm serve {target} \\\n  --speculative-config '{spec}'",
            "```",
            "",
            "### SGLang",
            "",
            "```bash",
            f"python -m sglang.launch_server --model-path {target} \\\n  --speculative-algorithm STANDALONE "
            f"--speculative-draft-model-path {repo} \\\n  --speculative-num-steps {k} --speculative-eagle-topk 1 "
            f"--speculative-num-draft-tokens {k + 1}",
            "```",
        ]
        if draft_vocab != target_vocab:
            parts += [
                "",
                f"Note: this draft's vocab_size ({draft_vocab}) differs from the target's ({target_vocab}); "
                "vLLM's `draft_model` check refuses that. Republish with `--pad-vocab-to-target`.",
            ]
    if padded:
        parts += [
            "",
            "## Vocabulary padding",
            "",
            f"The embedding and LM head were padded from {padded[0]} to {target_vocab} rows so that `vocab_size` matches the "
            f"target's, as vLLM's `draft_model` method requires. Ids {padded[0]}–{padded[-1]} are never produced by the "
            "tokenizer; their LM-head rows are the mean of the real rows, so their logit is the mean real logit (never "
            "the argmax, never likelier than an average real token), and `generation_config.suppress_tokens` lists them "
            "so transformers gives them zero probability. Outputs on the real vocabulary are unchanged.",
        ]
    parts += ["", "## Recipe", ""]
    parts += ["```yaml", source.recipe_text.rstrip(), "```"] if source.recipe_text else ["No recipe was recorded with this draft."]
    if source.run_info is not None:
        parts += ["", "## Training run", "", "```json", json.dumps(source.run_info, indent=2), "```"]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(parts) + "\n")


def _publish_info(source: _Source, eval_report: str | Path | None, padded: list[int], adapter: bool) -> dict[str, Any]:
    return {
        "draft_source": str(source.draft_dir),
        "target": source.target,
        "target_revision": source.target_revision,
        "eval_report": str(Path(eval_report).absolute()) if eval_report else None,
        "adapter": adapter,
        "padded_ids": [padded[0], padded[-1]] if padded else None,
        "versions": versions(("distill", "torch", "transformers", "peft", "huggingface_hub")),
    }


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one renameat2(RENAME_EXCHANGE) call; False where the system has none (not Linux, old kernel or filesystem)."""
    if not sys.platform.startswith("linux"):
        return False
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    at_fdcwd, rename_exchange = -100, 2
    return renameat2 is not None and renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished folder to `out`. An existing `out` (empty, or --force) is swapped with it
    in one atomic exchange, so a killed run leaves `out` either old or whole and new; where no
    exchange exists it is moved aside first (a kill between the two renames leaves it beside `out`)."""
    if not out.exists():
        os.replace(tmp, out)
        return
    if _exchange(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)  # now the old folder
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    os.replace(out, aside / out.name)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(aside / out.name, out)
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


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
        )
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"distill publish: error: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
