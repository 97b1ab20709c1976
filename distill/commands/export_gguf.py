"""`distill export-gguf DRAFT OUT.gguf [--outtype f16|bf16|q8_0]`: a draft as one GGUF file that llama.cpp
loads (`llama-speculative-simple -m TARGET.gguf -md OUT.gguf`), the reverse of `distill convert-gguf`.

Written with the `gguf` package's own writer (`gguf.GGUFWriter`), tensor name map
(`gguf.get_tensor_name_map(MODEL_ARCH.QWEN2, n)`) and quantizers (`gguf.quants.quantize`), laid out as
llama.cpp's `convert_hf_to_gguf.py` lays out a Qwen2 checkpoint (its `Qwen2Model`, `get_vocab_base`,
`_set_vocab_gpt2` and `prepare_tensors`, read in the llama.cpp source vendored in llama-cpp-python
0.3.36): the same keys, tensor names, token list, token types and tensor types. Not the converter itself:
it is a script outside any package (it needs the llama.cpp checkout and its `gguf-py`), it reads only a
folder of safetensors (a LoRA training output or a `.gguf` draft would need a merged copy on disk first),
and it guesses the pre-tokenizer by hashing a test string, where this reads the tokenizer's own
pre-tokenizer and refuses one llama.cpp's `qwen2` would split differently. On Qwen2.5-Coder-0.5B-Instruct the
f16, bf16 and q8_0 files hold the converter's tensors byte for byte (docs/engines.md).

- A LoRA adapter (a training output's `draft/` holding `adapter_config.json`) is merged into its base first
  (peft `merge_and_unload`); a training output folder resolves to its `draft/` (`distill.common.models`).
- Hyper-parameters: `qwen2.context_length`, `embedding_length`, `block_count`, `feed_forward_length`,
  `attention.head_count(_kv)`, `rope.freq_base`, `attention.layer_norm_rms_epsilon`.
- Tokenizer: `tokenizer.ggml.model` "gpt2", `pre` "qwen2", one token per embedding row (rows past the
  tokenizer are `[PADn]`, UNUSED), types (CONTROL for special or `<|...|>` tokens, USER_DEFINED for other
  added tokens, NORMAL), merges, bos/eos/padding ids, `add_bos_token` and the chat template.
- Tensors: 1-D tensors and norms stay F32; the rest in the chosen type (a tensor whose rows do not divide
  into Q8_0 blocks falls back to F16, as llama.cpp's converter does). A tied head writes no `output.weight`
  (llama.cpp's qwen2 then reads `token_embd`); an untied one is written.

What cannot be exported (another architecture, no tokenizer, a tokenizer llama.cpp would split differently,
an unknown --outtype, an existing OUT) is one line and exit 2, before anything is written; OUT is written
through a temporary file and renamed, so it is whole or absent.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill.common.io import atomic_write
from distill.common.models import GGUF_EXTRA, TOKENIZER_FILES, ModelLoadError, load_config, load_model, load_tokenizer, resolve
from distill.common.trim import draft_to_target, restore_full_head

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

OUTTYPES = ("f16", "bf16", "q8_0")
# model_type -> the GGUF architecture llama.cpp runs it as; others are refused with the converter named.
ARCHITECTURES = {"qwen2": "qwen2"}
# llama.cpp's token types (gguf.TokenType), spelled here so the vocabulary needs no gguf import.
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5
SPECIAL_LOOKING = ("<pad>", "<mask>", "<2mass>", "[@BOS@]")  # llama.cpp's does_token_look_special
ADAPTER_CONFIG = "adapter_config.json"
# gpt2-vocabulary pre-tokenizers for which llama.cpp adds BOS when the file says nothing (src/llama-vocab.cpp); qwen2 does not.
BOS_BY_DEFAULT = ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano")


@dataclass
class LlamaVocab:
    """The tokenizer as llama.cpp stores it in a GGUF (and compares it between a target and a draft)."""

    tokens: list[str]
    types: list[int]
    merges: list[str]
    bos: int | None
    eos: int | None
    pad: int | None
    add_bos: bool
    add_eos: bool
    chat_template: str | None
    model: str = "gpt2"
    pre: str = "qwen2"


@dataclass
class Export:
    """What `export_gguf` wrote: the file, its type, tensor types and sizes, and the time it took."""

    path: Path
    outtype: str
    tensors: dict[str, str] = field(default_factory=dict)  # GGUF tensor name -> GGML type
    vocab_size: int = 0
    tied: bool = False
    merged_adapter: bool = False
    bytes: int = 0
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for kind in self.tensors.values():
            counts[kind] = counts.get(kind, 0) + 1
        return {
            "path": str(self.path),
            "outtype": self.outtype,
            "tensor_types": counts,
            "vocab_size": self.vocab_size,
            "tied": self.tied,
            "merged_adapter": self.merged_adapter,
            "bytes": self.bytes,
            "seconds": self.seconds,
        }


def _require_gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise ModelLoadError(f"writing .gguf files needs the gguf package: {GGUF_EXTRA}") from None
    return gguf


def check_pre_tokenizer(tokenizer: PreTrainedTokenizerBase, where: str) -> None:
    """Refuse a tokenizer that llama.cpp's `tokenizer.ggml.pre = qwen2` would split differently: it must be
    a byte-level BPE whose pre-tokenizer is Qwen2's regex split (transformers' `PRETOKENIZE_REGEX`)."""
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(
            f"{where}: a slow (Python) tokenizer; llama.cpp needs the byte-level BPE of a tokenizer.json: save the target's fast tokenizer beside it"
        )
    spec = json.loads(backend.to_str())
    kind = (spec.get("model") or {}).get("type")
    steps = spec.get("pre_tokenizer") or {}
    steps = steps.get("pretokenizers", [steps]) if isinstance(steps, dict) else []
    regexes = [((s.get("pattern") or {}).get("Regex")) for s in steps if s.get("type") == "Split"]
    byte_level = any(s.get("type") == "ByteLevel" for s in steps)
    if kind != "BPE" or not byte_level or regexes != [PRETOKENIZE_REGEX]:
        raise ValueError(
            f"{where}: the tokenizer is not Qwen2's byte-level BPE (model {kind}, pre-tokenizer splits {regexes}, byte-level {byte_level}): "
            "llama.cpp's qwen2 pre-tokenizer would split text differently; export this model with llama.cpp's convert_hf_to_gguf.py"
        )


def _merges(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The BPE merges as "a b" strings (gguf-py's SpecialVocab writes them so; a space inside a part becomes U+0120)."""
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"].get("merges") or []
    out = []
    for merge in merges:
        if isinstance(merge, str):
            out.append(merge)
        else:
            out.append(" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in part) for part in merge))
    return out


def _looks_special(token: str) -> bool:
    return token in SPECIAL_LOOKING or (token.startswith("<|") and token.endswith("|>")) or (token.startswith("<｜") and token.endswith("｜>"))


def llama_vocab(tokenizer: PreTrainedTokenizerBase, rows: int, config: PretrainedConfig | None = None) -> LlamaVocab:
    """The token list, types and special ids llama.cpp's converter writes for `tokenizer` over `rows`
    embedding rows (its `get_vocab_base`): ids no text produces are `[PADn]` (UNUSED); added tokens are
    CONTROL when special or `<|...|>`-shaped, else USER_DEFINED; the rest NORMAL. BOS is the tokenizer's,
    else the config's (Qwen2.5: 151643, with add_bos_token false)."""
    vocab = tokenizer.get_vocab()
    if vocab and max(vocab.values()) >= rows:
        raise ValueError(f"the tokenizer has ids up to {max(vocab.values())} but the model has {rows} embedding rows: the draft does not fit this tokenizer")
    reverse = {i: t for t, i in vocab.items()}
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(rows):
        token = reverse.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        if token in added:
            entry = decoder.get(i)
            if entry is not None and not entry.normalized:  # llama.cpp assumes CONTROL / USER_DEFINED tokens pre-normalized
                token = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
            special = entry is not None and entry.special
            types.append(CONTROL if special or _looks_special(token) else USER_DEFINED)
        else:
            types.append(NORMAL)
        tokens.append(token)
    plain, full = tokenizer("a", add_special_tokens=False)["input_ids"], tokenizer("a")["input_ids"]
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else getattr(config, "bos_token_id", None)
    eos = tokenizer.eos_token_id
    add_bos = bos is not None and len(full) > len(plain) and full[0] == bos
    add_eos = eos is not None and len(full) > len(plain) and full[-1] == eos
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    return LlamaVocab(tokens, types, _merges(tokenizer), bos, eos, tokenizer.pad_token_id, add_bos, add_eos, template)


def _gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """A GGUF file's metadata values: with transformers' reader when it has one (about 4x faster than gguf's on a
    152k-token vocabulary: it reads only the arrays asked for in full), else with gguf's."""
    try:
        from transformers.integrations.gguf.reader import read_gguf_metadata
    except ImportError:
        reader = _require_gguf().GGUFReader(str(path))
        return {key: f.contents() for key, f in reader.fields.items()}
    return read_gguf_metadata(str(path), ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))[0]


def read_llama_vocab(path: str | os.PathLike) -> LlamaVocab:
    """The vocabulary fields of a GGUF file, as llama.cpp reads them (its defaults where a key is absent)."""
    _require_gguf()
    meta = _gguf_metadata(path)
    pre = meta.get("tokenizer.ggml.pre", "")
    return LlamaVocab(
        tokens=list(meta.get("tokenizer.ggml.tokens", [])),
        types=[int(t) for t in meta.get("tokenizer.ggml.token_type", [])],
        merges=list(meta.get("tokenizer.ggml.merges", [])),
        bos=meta.get("tokenizer.ggml.bos_token_id"),
        eos=meta.get("tokenizer.ggml.eos_token_id"),
        pad=meta.get("tokenizer.ggml.padding_token_id"),
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", pre in BOS_BY_DEFAULT)),
        add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        chat_template=meta.get("tokenizer.chat_template"),
        model=meta.get("tokenizer.ggml.model", ""),
        pre=pre,
    )


def _is_adapter(source_path: str) -> bool:
    return (Path(source_path) / ADAPTER_CONFIG).is_file()


def _draft_config(source: Any) -> tuple[PretrainedConfig, str | None]:
    """The draft's config (a LoRA adapter's base's) and, for an adapter, its base reference."""
    if source.kind == "folder" and _is_adapter(source.path):
        base = json.loads((Path(source.path) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
        if not base:
            raise ValueError(f"{source.path}/{ADAPTER_CONFIG} names no base_model_name_or_path: the LoRA cannot be merged")
        return load_config(base), base
    return load_config(source.ref if source.kind != "folder" else source.path), None


def _tokenizer_ref(source: Any, tokenizer: str | os.PathLike | None) -> str:
    """Where the tokenizer comes from: `tokenizer` when given, else the draft itself (a folder must hold its files)."""
    if tokenizer is not None:
        return os.fspath(tokenizer)
    if source.kind == "folder" and not any((Path(source.path) / f).is_file() for f in TOKENIZER_FILES):
        raise ValueError(
            f"{source.path}: holds no tokenizer ({' or '.join(TOKENIZER_FILES)}); a GGUF carries one: pass --tokenizer TARGET "
            "(the target's folder or Hub id), or publish the draft first (distill publish copies the target's tokenizer)"
        )
    return source.path if source.kind == "folder" else source.ref


def _load_merged(source: Any, base: str | None) -> PreTrainedModel:
    """The draft in float32 on the CPU; a LoRA adapter merged into its base (peft merge_and_unload)."""
    if base is None:
        return load_model(source.path if source.kind == "folder" else source.ref, dtype="float32", device="cpu", what="draft")
    try:
        from peft import PeftModel
    except ImportError:
        raise ValueError(f"{source.path} is a LoRA adapter: merging it needs peft (pip install 'distill[train]')") from None
    model = load_model(base, dtype="float32", device="cpu", what="LoRA base model")
    return PeftModel.from_pretrained(model, source.path).merge_and_unload().eval()


def _rope(config: PretrainedConfig) -> dict[str, Any]:
    rope = getattr(config, "rope_parameters", None) or {}
    if "rope_theta" not in rope and getattr(config, "rope_theta", None) is not None:
        rope = {**rope, "rope_theta": config.rope_theta}
    return rope


def _check_config(config: PretrainedConfig, where: str) -> str:
    """The GGUF architecture of `config`, or ValueError when llama.cpp's graph for it would compute another model."""
    model_type = getattr(config, "model_type", None)
    arch = ARCHITECTURES.get(model_type)
    if arch is None:
        names = ", ".join(getattr(config, "architectures", None) or []) or "unknown"
        raise ValueError(
            f"{where}: architecture {names} (model_type {model_type!r}) is not supported by distill export-gguf, which writes "
            f"{', '.join(ARCHITECTURES)} only; convert it with llama.cpp's convert_hf_to_gguf.py"
        )
    if getattr(config, "use_sliding_window", False):
        raise ValueError(f"{where}: use_sliding_window is on, which llama.cpp's qwen2 graph does not implement; export a model without it")
    rope_type = _rope(config).get("rope_type", "default")
    if rope_type not in ("default", "linear", "yarn"):
        raise ValueError(f"{where}: RoPE scaling {rope_type!r} has no qwen2 GGUF spelling here (default, linear and yarn do)")
    return arch


def _write_hparams(writer: Any, gguf: Any, config: PretrainedConfig, name: str, ftype: int) -> None:
    """The hyper-parameters llama.cpp's `TextModel.set_gguf_parameters` writes for a Qwen2 config."""
    writer.add_type("model")
    writer.add_name(name)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    rope = _rope(config)
    if rope.get("rope_type", "default") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    elif rope.get("rope_type") == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    head_dim = getattr(config, "head_dim", None)
    if head_dim and head_dim != config.hidden_size // config.num_attention_heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_file_type(ftype)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _write_vocab(writer: Any, vocab: LlamaVocab) -> None:
    """The tokenizer keys llama.cpp's `_set_vocab_gpt2` (and gguf-py's SpecialVocab) write."""
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    for key, token_id in (("bos", vocab.bos), ("eos", vocab.eos), ("pad", vocab.pad)):
        if token_id is not None:
            getattr(writer, f"add_{key}_token_id")(token_id)
    writer.add_add_bos_token(vocab.add_bos)
    if vocab.add_eos:
        writer.add_add_eos_token(True)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)


def _tensors(model: PreTrainedModel, gguf: Any, outtype: str) -> tuple[list[tuple[str, Any, Any]], bool]:
    """(GGUF name, data, GGML type) for every weight, named by gguf's tensor name map for qwen2; and whether the head is tied."""
    import torch

    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, config.num_hidden_layers)
    wanted = {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[outtype]
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    tied = head is not None and head.weight.data_ptr() == embed.weight.data_ptr()
    out = []
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight" and tied:
            continue  # llama.cpp's qwen2 reads token_embd when output.weight is absent
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"tensor {key} has no qwen2 GGUF name in gguf's tensor map: this is not a plain Qwen2ForCausalLM checkpoint")
        data = tensor.detach().to(device="cpu", dtype=torch.float32).numpy()
        qtype = gguf.GGMLQuantizationType.F32 if data.ndim <= 1 or name.endswith("_norm.weight") else wanted
        try:
            packed = gguf.quants.quantize(data, qtype)
        except gguf.QuantError:  # rows that do not divide into 32-value Q8_0 blocks: F16, as llama.cpp's converter does
            qtype = gguf.GGMLQuantizationType.F16
            packed = gguf.quants.quantize(data, qtype)
        out.append((name, packed, qtype))
    return out, tied


def export_gguf(
    draft: str | os.PathLike,
    out: str | os.PathLike,
    outtype: str = "f16",
    *,
    tokenizer: str | os.PathLike | None = None,
    force: bool = False,
    name: str | None = None,
) -> Export:
    """Write `draft` (a Hub id, folder, training output or LoRA adapter) as the GGUF file `out` in `outtype`
    (`tokenizer`: where the tokenizer comes from when the draft holds none; `name`: general.name).

    Every refusal (ValueError / ModelLoadError, one line) comes before anything is written."""
    started = time.time()
    if outtype not in OUTTYPES:
        raise ValueError(f"--outtype {outtype!r}: choose one of {', '.join(OUTTYPES)} (f16 is llama.cpp's converter default; q8_0 is half its size)")
    out = Path(out)
    if out.suffix.lower() != ".gguf":
        raise ValueError(f"{out}: the output must be a .gguf file name (e.g. draft-{outtype}.gguf)")
    if out.exists() and not force:
        raise ValueError(f"{out}: already exists; remove it, choose another name, or pass --force")
    gguf = _require_gguf()
    source = resolve(draft)
    config, base = _draft_config(source)
    arch = _check_config(config, source.path)
    tok_ref = _tokenizer_ref(source, tokenizer)
    tok = load_tokenizer(tok_ref, what="draft tokenizer")
    check_pre_tokenizer(tok, tok_ref)
    llama = llama_vocab(tok, config.vocab_size, config)  # refuses a tokenizer with more ids than the model has rows
    model = _load_merged(source, base)
    if draft_to_target(model) is not None:  # a trimmed head (distill trim-vocab): llama.cpp gets the full-vocabulary draft
        restore_full_head(model)
    rows = model.get_input_embeddings().weight.shape[0]
    head = model.get_output_embeddings()
    if head is not None and head.weight.shape[0] != rows:
        raise ValueError(
            f"{source.path}: the LM head has {head.weight.shape[0]} rows but the embedding {rows}: a trimmed-vocabulary head has no llama.cpp qwen2 form; "
            "export the draft with its full head"
        )
    if rows != len(llama.tokens):
        llama = llama_vocab(tok, rows, model.config)
    tensors, tied = _tensors(model, gguf, outtype)
    ftype = {"f16": gguf.LlamaFileType.MOSTLY_F16, "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype]
    if name is None:
        name = Path(source.path).name if source.kind != "hub" else source.ref.split("/")[-1]
        if source.kind == "folder" and name == "draft":
            name = Path(source.path).parent.name  # a training output: name it after the run

    def write(tmp: str) -> None:
        logging.getLogger("gguf.gguf_writer").setLevel(logging.WARNING)  # its INFO lines name the temporary file
        writer = gguf.GGUFWriter(tmp, arch)
        _write_hparams(writer, gguf, model.config, name, int(ftype))
        _write_vocab(writer, llama)
        for tensor_name, data, qtype in tensors:
            writer.add_tensor(tensor_name, data, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        _check_written(tmp, tensors, len(llama.tokens))

    atomic_write(out, write)
    return Export(
        path=out,
        outtype=outtype,
        tensors={n: q.name for n, _, q in tensors},
        vocab_size=len(llama.tokens),
        tied=tied,
        merged_adapter=base is not None,
        bytes=out.stat().st_size,
        seconds=round(time.time() - started, 1),
    )


def _check_written(path: str, tensors: Sequence[tuple[str, Any, Any]], n_tokens: int) -> None:
    """Read the file back with gguf's reader: every tensor with its type, and one token per embedding row."""
    gguf = _require_gguf()
    reader = gguf.GGUFReader(path)
    got = {t.name: t.tensor_type for t in reader.tensors}
    want = {n: q for n, _, q in tensors}
    if got != want:
        raise ValueError(f"{path}: the written tensors differ from those meant ({sorted(set(got) ^ set(want))[:5]}); nothing was written")
    if len(reader.fields["tokenizer.ggml.tokens"].data) != n_tokens:
        raise ValueError(f"{path}: the written token list is not {n_tokens} long; nothing was written")


def serve_command(target: str, draft: str | os.PathLike, k: int = 3) -> str:
    """The llama.cpp command that decodes `target` with this draft, `k` draft tokens every round, greedy."""
    return (
        f"llama-speculative-simple -m {target} -md {draft} --spec-type draft-simple --spec-draft-n-max {k} --spec-draft-n-min {k} "
        "--draft-p-min 0 --temp 0 -p PROMPT"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`distill export-gguf DRAFT OUT.gguf [--outtype f16|bf16|q8_0] [--tokenizer REF] [--force]`."""
    from distill.arguments import parser

    args = parser("export-gguf").parse_args(argv)
    try:
        result = export_gguf(args.draft, args.out, args.outtype, tokenizer=args.tokenizer, force=args.force)
    except (ValueError, FileNotFoundError) as err:  # ModelLoadError is a ValueError
        print(f"distill export-gguf: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    s = result.summary()
    types = ", ".join(f"{n} {kind}" for kind, n in sorted(s["tensor_types"].items()))
    print(
        f"wrote {result.path} ({result.outtype}: {types}; {result.vocab_size} tokens; {result.bytes / 1e6:.1f} MB; "
        f"{'LoRA merged, ' if result.merged_adapter else ''}{result.seconds:.0f} s): {serve_command('TARGET.gguf', result.path)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
