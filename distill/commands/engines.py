"""Which serving engines take a draft beside its target: each engine's own refusal rule, reproduced offline
on the folder's config, tokenizer and (for llama.cpp) GGUF vocabulary, so `distill publish` can say which
engines a published folder satisfies before anyone starts a server. docs/engines.md is the table.

Each check returns an `EngineCheck(engine, ok, reason, rule, command)`: `rule` names the engine version and
source whose rule is reproduced, `command` how to serve the pair with it.

- transformers `assistant_model=` (the installed version; GenerationMixin._validate_generation_mode): an
  assistant of the target's vocab_size is taken as is; another vocab_size only with `tokenizer=` and
  `assistant_tokenizer=` (universal assisted decoding, slower: it re-tokenizes text each round). Checked
  here too: the tokenizers agree, or the target would verify ids that mean other text.
- vLLM `method: draft_model` (SpeculativeConfig.verify_equal_vocab_size_if_draft_model): the draft's
  config vocab_size must equal the target's; a full model (no LoRA adapter), of an architecture in vLLM's
  registry. vLLM decodes draft ids with the target's tokenizer and does not compare them; checked here.
  vLLM 0.32.0 skips the check only under `use_heterogeneous_vocab` (a token intersection, greedy drafting only);
  `distill publish --pad-vocab-to-target` makes the plain pair instead.
- SGLang `--speculative-algorithm STANDALONE` (sglang PR #23838, standalone_worker.py): equal vocab_size
  and equal `tokenizer.get_vocab()` (TRL's DistillationTrainer raises on the same mismatch, trl PR #6457).
- llama.cpp `-md` (common/speculative.cpp `common_speculative_are_compatible`, llama.cpp vendored in
  llama-cpp-python 0.3.36): the same vocab type, the same add_bos (and BOS id when added), add_eos (and EOS
  id), vocabularies differing by at most 128 tokens, equal token texts from id 5 on. Read from the GGUF
  files when there are some, else from what `distill export-gguf` would write (llama.cpp's converter layout).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill.commands.export_gguf import ADAPTER_CONFIG, LlamaVocab, check_pre_tokenizer, llama_vocab, read_llama_vocab
from distill.common.models import load_config, load_tokenizer, resolve
from distill.common.provenance import package_version
from distill.common.vocab import tokenizer_fingerprint

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

VLLM_RULE = "vLLM 0.32.0 (run here, its CPU build) and main at 002e77c: vllm/config/speculative.py SpeculativeConfig.verify_equal_vocab_size_if_draft_model (skipped only under use_heterogeneous_vocab, greedy drafting only)"
SGLANG_RULE = "SGLang with PR #23838 (merged 2026-04): python/sglang/srt/speculative/standalone_worker.py, equal vocab_size and tokenizer.get_vocab()"
LLAMACPP_RULE = "llama.cpp vendored in llama-cpp-python 0.3.36: common/speculative.cpp common_speculative_are_compatible"
# Architectures of vLLM's model registry (vllm/model_executor/models/registry.py) this check knows.
VLLM_ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")
LLAMACPP_MAX_VOCAB_DIFFERENCE = 128  # SPEC_VOCAB_MAX_SIZE_DIFFERENCE
LLAMACPP_FIRST_CHECKED_ID = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID
ENGINES = ("transformers", "vLLM", "SGLang", "llama.cpp")


@dataclass(frozen=True)
class EngineCheck:
    """One engine's verdict on a draft beside its target."""

    engine: str
    ok: bool
    reason: str
    rule: str
    command: str


@dataclass
class Side:
    """What the engines' rules read of one model: its config, its tokenizer and its llama.cpp vocabulary."""

    ref: str
    vocab_size: int
    architectures: list[str]
    adapter: bool
    tokenizer: PreTrainedTokenizerBase | None
    llama: LlamaVocab | None = None
    llama_error: str | None = None  # why llama.cpp has no vocabulary for it (no GGUF form)


def _llama_side(tokenizer: PreTrainedTokenizerBase | None, rows: int, config: Any, where: str) -> tuple[LlamaVocab | None, str | None]:
    """The vocabulary `distill export-gguf` (llama.cpp's converter layout) would write, or why there is none."""
    if tokenizer is None:
        return None, f"{where} has no tokenizer"
    if getattr(config, "model_type", None) != "qwen2":
        return None, f"{where} is {getattr(config, 'model_type', None)!r}, not qwen2: distill export-gguf writes qwen2 only"
    try:
        check_pre_tokenizer(tokenizer, where)
        return llama_vocab(tokenizer, rows, config), None
    except ValueError as err:
        return None, str(err)


def describe(ref: str | os.PathLike, *, revision: str | None = None, gguf: str | os.PathLike | None = None) -> Side:
    """A draft folder or a target (folder, Hub id or .gguf) as the rules read it. `gguf`: the draft's GGUF
    file, read for llama.cpp's check instead of the vocabulary it would have."""
    source = resolve(ref)
    adapter = source.kind == "folder" and (Path(source.path) / ADAPTER_CONFIG).is_file()
    if adapter:
        base = json.loads((Path(source.path) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
        config = load_config(base)
    else:
        config = load_config(source.path if source.kind == "folder" else source.ref, revision=revision)
    text = config.get_text_config()
    try:
        tokenizer = load_tokenizer(source.path if source.kind == "folder" else source.ref, revision=revision)
    except ValueError:
        tokenizer = None
    side = Side(os.fspath(ref), text.vocab_size, list(getattr(config, "architectures", None) or []), adapter, tokenizer)
    if source.kind == "gguf" or gguf is not None:
        side.llama = read_llama_vocab(gguf if gguf is not None else source.path)
    else:
        side.llama, side.llama_error = _llama_side(tokenizer, text.vocab_size, text, side.ref)
    return side


def _same_tokenizer(draft: Side, target: Side) -> str | None:
    """None when both tokenizers map ids to the same tokens (and specials), else what differs."""
    if draft.tokenizer is None or target.tokenizer is None:
        return "the draft has no tokenizer" if draft.tokenizer is None else "the target has no tokenizer"
    if tokenizer_fingerprint(draft.tokenizer) != tokenizer_fingerprint(target.tokenizer):
        return f"the draft's tokenizer ({len(draft.tokenizer)} tokens) differs from the target's ({len(target.tokenizer)})"
    return None


def check_transformers(draft: Side, target: Side) -> EngineCheck:
    """transformers' `generate(assistant_model=)` rule (the installed version)."""
    rule = f"transformers {package_version('transformers')}: GenerationMixin._validate_generation_mode (assistant_model)"
    plain = "target.generate(**inputs, assistant_model=draft)"
    if (problem := _same_tokenizer(draft, target)) is not None:
        return EngineCheck("transformers", False, f"{problem}: the target would verify ids that mean other text", rule, plain)
    if draft.vocab_size == target.vocab_size:
        return EngineCheck("transformers", True, f"same tokenizer, vocab_size {draft.vocab_size} = the target's: assistant_model= as is", rule, plain)
    return EngineCheck(
        "transformers",
        True,
        f"same tokenizer, vocab_size {draft.vocab_size} ≠ {target.vocab_size}: only with tokenizer= and assistant_tokenizer= (universal assisted "
        "decoding, which re-tokenizes text every round); --pad-vocab-to-target makes the plain call work",
        rule,
        "target.generate(**inputs, assistant_model=draft, tokenizer=tokenizer, assistant_tokenizer=tokenizer)",
    )


def _vocab_rule(draft: Side, target: Side, engine: str) -> str | None:
    if draft.adapter:
        return f"{draft.ref} is a LoRA adapter: {engine} loads a full draft model; publish without --keep-adapter"
    if draft.vocab_size != target.vocab_size:
        return f"vocab_size {draft.vocab_size} ≠ the target's {target.vocab_size}: {engine} refuses the pair; publish with --pad-vocab-to-target"
    return None


def check_vllm(draft: Side, target: Side, *, repo: str = "DRAFT", k: int = 3) -> EngineCheck:
    """vLLM's `draft_model` config and vocabulary checks."""
    command = f"vllm serve {target.ref} --speculative-config '" + json.dumps({"method": "draft_model", "model": repo, "num_speculative_tokens": k}) + "'"
    if (problem := _vocab_rule(draft, target, "vLLM")) is not None:
        return EngineCheck("vLLM", False, problem, VLLM_RULE, command)
    if not set(draft.architectures) & set(VLLM_ARCHITECTURES):
        return EngineCheck(
            "vLLM", False, f"architecture {draft.architectures} is not one of {list(VLLM_ARCHITECTURES)} checked in vLLM's registry", VLLM_RULE, command
        )
    if (problem := _same_tokenizer(draft, target)) is not None:
        return EngineCheck("vLLM", False, f"{problem}: vLLM decodes draft ids with the target's tokenizer without checking", VLLM_RULE, command)
    return EngineCheck("vLLM", True, f"full {draft.architectures[0]}, vocab_size {draft.vocab_size} = the target's, same tokenizer", VLLM_RULE, command)


def check_sglang(draft: Side, target: Side, *, repo: str = "DRAFT", k: int = 3) -> EngineCheck:
    """SGLang STANDALONE's vocabulary check."""
    command = (
        f"python -m sglang.launch_server --model-path {target.ref} --speculative-algorithm STANDALONE --speculative-draft-model-path {repo} "
        f"--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}"
    )
    if (problem := _vocab_rule(draft, target, "SGLang STANDALONE")) is not None:
        return EngineCheck("SGLang", False, problem, SGLANG_RULE, command)
    if draft.tokenizer is None or target.tokenizer is None or draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
        return EngineCheck("SGLang", False, "tokenizer.get_vocab() differs from the target's: SGLang STANDALONE refuses the pair", SGLANG_RULE, command)
    return EngineCheck("SGLang", True, f"vocab_size {draft.vocab_size} and get_vocab() equal to the target's", SGLANG_RULE, command)


def llamacpp_compatible(draft: LlamaVocab, target: LlamaVocab) -> str | None:
    """llama.cpp's common_speculative_are_compatible on two GGUF vocabularies: None when compatible, else why not."""
    if draft.model != target.model:
        return f"vocab type {draft.model!r} ≠ the target's {target.model!r}"
    if draft.add_bos != target.add_bos or (target.add_bos and draft.bos != target.bos):
        return f"add_bos_token {draft.add_bos} (BOS {draft.bos}) ≠ the target's {target.add_bos} (BOS {target.bos})"
    if draft.add_eos != target.add_eos or (target.add_eos and draft.eos != target.eos):
        return f"add_eos_token {draft.add_eos} (EOS {draft.eos}) ≠ the target's {target.add_eos} (EOS {target.eos})"
    difference = abs(len(draft.tokens) - len(target.tokens))
    if difference > LLAMACPP_MAX_VOCAB_DIFFERENCE:
        return f"{len(draft.tokens)} tokens vs the target's {len(target.tokens)}: {difference} apart, more than llama.cpp's {LLAMACPP_MAX_VOCAB_DIFFERENCE}"
    for i in range(LLAMACPP_FIRST_CHECKED_ID, min(len(draft.tokens), len(target.tokens))):
        if draft.tokens[i] != target.tokens[i]:
            return f"token {i} is {draft.tokens[i]!r} in the draft, {target.tokens[i]!r} in the target"
    return None


def check_llamacpp(draft: Side, target: Side, *, draft_gguf: str = "DRAFT.gguf", k: int = 3) -> EngineCheck:
    """llama.cpp's `-md` vocabulary check, on the GGUF vocabularies (read, or as export-gguf would write them)."""
    from distill.commands.export_gguf import serve_command

    target_gguf = target.ref if target.ref.endswith(".gguf") else "TARGET.gguf"
    command = serve_command(target_gguf, draft_gguf, k)
    if draft.llama is None:
        return EngineCheck("llama.cpp", False, f"no GGUF for the draft: {draft.llama_error}", LLAMACPP_RULE, command)
    if target.llama is None:
        return EngineCheck("llama.cpp", False, f"no GGUF vocabulary for the target: {target.llama_error}", LLAMACPP_RULE, command)
    if (problem := llamacpp_compatible(draft.llama, target.llama)) is not None:
        return EngineCheck("llama.cpp", False, f"{problem}: llama.cpp refuses the draft", LLAMACPP_RULE, command)
    n, m = len(draft.llama.tokens), len(target.llama.tokens)
    return EngineCheck(
        "llama.cpp",
        True,
        f"GGUF vocabularies compatible: {n} vs {m} tokens (≤ {LLAMACPP_MAX_VOCAB_DIFFERENCE} apart), texts equal from id {LLAMACPP_FIRST_CHECKED_ID}, "
        f"add_bos {draft.llama.add_bos}, EOS {draft.llama.eos}",
        LLAMACPP_RULE,
        command,
    )


def check_engines(draft: Side, target: Side, *, repo: str = "DRAFT", k: int = 3, draft_gguf: str = "DRAFT.gguf") -> list[EngineCheck]:
    """Every engine's verdict, in ENGINES order."""
    return [
        check_transformers(draft, target),
        check_vllm(draft, target, repo=repo, k=k),
        check_sglang(draft, target, repo=repo, k=k),
        check_llamacpp(draft, target, draft_gguf=draft_gguf, k=k),
    ]


def check_folder(
    folder: str | os.PathLike,
    target: str,
    *,
    revision: str | None = None,
    gguf: str | os.PathLike | None = None,
    repo: str | None = None,
    k: int = 3,
) -> list[EngineCheck]:
    """The engines a draft folder (e.g. one `distill publish` wrote) satisfies beside `target`; `gguf`: its GGUF file, if written."""
    draft_side = describe(folder, gguf=gguf)
    target_side = describe(target, revision=revision)
    draft_gguf = Path(gguf).name if gguf is not None else "DRAFT.gguf"
    return check_engines(draft_side, target_side, repo=repo or os.fspath(folder), k=k, draft_gguf=draft_gguf)


def summary(checks: list[EngineCheck]) -> str:
    """One line: which engines pass and which do not."""
    ok = [c.engine for c in checks if c.ok]
    bad = [c.engine for c in checks if not c.ok]
    return f"satisfies {', '.join(ok) or 'no engine'}" + (f"; not {', '.join(bad)}" if bad else "")


def as_records(checks: list[EngineCheck]) -> list[dict[str, Any]]:
    """The checks as JSON-ready dicts (publish_info.json)."""
    return [asdict(c) for c in checks]
