"""One loader for every model, tokenizer and config the toolkit reads.

A reference is a Hub id, a Hugging Face folder, a training output folder (its `draft/` is
loaded) or a `.gguf` file (llama.cpp weights, dequantised on load; needs the `gguf` extra).
What cannot be loaded (a missing path, a torn safetensors file, a config that is not JSON, a
truncated GGUF) is a `ModelLoadError`: one line naming the file and what is wrong, which the
commands print with exit status 2. `distill convert-gguf` (distill.commands.convert_gguf) turns a
GGUF into a folder that `AutoModelForCausalLM.from_pretrained` loads in seconds.

Nothing heavy is imported at module level, so a command's `--help` stays fast.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

GGUF_MAGIC = b"GGUF"
GGUF_EXTRA = "pip install 'distill[gguf]' (or: pip install gguf)"
# Qwen2.5-Instruct's stop and pad ids: a GGUF carries them in its metadata; a converted folder writes them explicitly.
QWEN_EOS, QWEN_PAD = 151645, 151643
CONFIG_FILES = ("config.json", "adapter_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # a tokenizer-only folder (load_tokenizer)
T = TypeVar("T")


class ModelLoadError(ValueError):
    """A model, tokenizer or config that cannot be loaded; the message names the file and the fix."""


def looks_local(name: str) -> bool:
    """A path rather than a Hub id ("namespace/name"): absolute, relative with ./ ../ or ~, deeper
    than one slash, or a file suffix (.gguf, .jsonl, ...)."""
    return (
        name.startswith(("/", ".", "~")) or name.count("/") > 1 or Path(name).suffix.lower() in (".gguf", ".jsonl", ".json", ".parquet", ".safetensors", ".bin")
    )


@dataclass(frozen=True)
class ModelSource:
    """Where a reference points: `kind` is "hub", "folder" or "gguf"; `path` the Hub id, the folder or the .gguf file."""

    ref: str
    kind: str
    path: str

    @property
    def location(self) -> str:
        """What `from_pretrained` takes first: the id, the folder, or the folder holding the GGUF."""
        return str(Path(self.path).parent) if self.kind == "gguf" else self.path

    def kwargs(self, revision: str | None = None) -> dict[str, Any]:
        """The extra `from_pretrained` arguments: the GGUF file name, or the Hub revision."""
        if self.kind == "gguf":
            return {"gguf_file": Path(self.path).name}
        return {"revision": revision} if self.kind == "hub" and revision else {}


def resolve(ref: str | os.PathLike, *, also: Sequence[str] = ()) -> ModelSource:
    """Classify `ref`; a training output folder resolves to its `draft/`. A local-looking path that
    does not exist, a folder with no model in it (nor any of the files `also` names) or a GGUF
    without its magic bytes is refused here, before anything loads (a missing folder would
    otherwise reach the Hub client as a bad repo id)."""
    text = os.fspath(ref)
    path = Path(text).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"{text}: no such GGUF file; fetch it (e.g. ../shared/tools/fetch-real-qwen) or fix the path")
        _check_gguf_magic(path)
        return ModelSource(text, "gguf", str(path))
    if path.is_dir():
        if any((path / f).is_file() for f in CONFIG_FILES):
            return ModelSource(text, "folder", str(path))
        if any((path / "draft" / f).is_file() for f in CONFIG_FILES):
            return ModelSource(text, "folder", str(path / "draft"))
        if any((path / f).is_file() for f in also):
            return ModelSource(text, "folder", str(path))
        raise ModelLoadError(
            f"{text}: the folder holds no model (no config.json, adapter_config.json or draft/ with one); "
            "point at a model folder, a training output_dir or a .gguf file"
        )
    if path.is_file():
        raise ModelLoadError(f"{text}: is a file, not a model folder, a Hub id or a .gguf file")
    if looks_local(text):
        raise ModelLoadError(f"{text}: no such file or folder (relative paths are read from {os.getcwd()}); fix the path")
    return ModelSource(text, "hub", text)


def _check_gguf_magic(path: Path) -> None:
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise ModelLoadError(f"{path}: not a GGUF file (it starts with {head!r}, not {GGUF_MAGIC!r}); fetch it again or fix the path")


def _require_gguf() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ModelLoadError(f"reading .gguf files needs the gguf package: {GGUF_EXTRA}") from None


def _one_line(err: BaseException, limit: int = 300) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _guarded(source: ModelSource, what: str, load: Callable[[], T]) -> T:
    """Run `load`, turning what a broken or missing file raises into one ModelLoadError line."""
    from safetensors import SafetensorError

    if source.kind == "gguf":
        _require_gguf()
    try:
        return load()
    except ModelLoadError:
        raise
    except (OSError, ValueError, SafetensorError, KeyError, IndexError, EOFError, struct.error) as err:
        message = _one_line(err)
        if source.kind == "gguf":
            unsupported = "is not supported" in message
            hint = "this architecture cannot be dequantised by transformers" if unsupported else "the file may be truncated or corrupt: fetch it again"
            raise ModelLoadError(f"{source.path}: cannot read the {what} from this GGUF ({message}); {hint}") from None
        if source.kind == "hub":
            raise ModelLoadError(f"{source.ref}: cannot load the {what} (not a local path, and the Hub gave: {message})") from None
        torn = _unreadable_weights(Path(source.path)) if isinstance(err, SafetensorError) else None
        if torn is not None:
            raise ModelLoadError(f"{torn}: the {what}'s weights are unreadable ({message}): the file is truncated or damaged; copy or save it again") from None
        if "trust_remote_code" in str(err):  # the folder ships code to run: name the switch, which the clipped message may cut
            raise ModelLoadError(
                f"{source.path}: the {what} loads only by running the code its folder ships ({message}); pass trust_remote_code=True "
                "(in a recipe, trust_remote_code: true under target or draft) only if you trust that code"
            ) from None
        raise ModelLoadError(f"{source.path}: cannot load the {what} ({message}); check the folder's files or rewrite them") from None


def _unreadable_weights(folder: Path) -> Path | None:
    """The first safetensors file in `folder` whose header cannot be read."""
    from safetensors import SafetensorError, safe_open

    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except (SafetensorError, OSError):
            return path
    return None


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device | str | None = None) -> torch.dtype | str:
    """A dtype name as `from_pretrained` takes it; "auto" means float32 on CPU (bf16 there is inexact)
    and the checkpoint's own dtype on an accelerator; None means the checkpoint's own dtype everywhere."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        return "auto"
    if dtype == "auto":
        on_cpu = torch.device(device).type == "cpu" if device is not None else not torch.cuda.is_available()
        return torch.float32 if on_cpu else "auto"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"unknown dtype {dtype!r}: use one of float32, bfloat16, float16, auto")
    return getattr(torch, dtype)


def _plain(model: PreTrainedModel, source: ModelSource) -> PreTrainedModel:
    """A GGUF-loaded model as an ordinary one: dequantised weights already, so drop the quantizer
    that makes `save_pretrained` refuse it ("quantized with gguf and is not serializable")."""
    if source.kind == "gguf":
        model.hf_quantizer = None
        model.is_quantized = False  # else Trainer refuses it as "quantized with None" (a LoRA on a .gguf draft)
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config._name_or_path = source.path
    return model


def load_model(
    ref: str | os.PathLike,
    *,
    dtype: str | torch.dtype | None = "auto",
    device: torch.device | str | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    what: str = "model",
) -> PreTrainedModel:
    """A causal LM from any reference (see `resolve`), in `dtype`, on `device`, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    source = resolve(ref)
    torch_dtype = resolve_dtype(dtype, device)

    options = {"device_map": str(device)} if device is not None else {}
    if source.kind != "gguf" and (device is None or torch.device(device).type == "cpu"):
        # Read the weights into the process's own memory: a checkpoint already in the dtype asked for would
        # stay memory-mapped, and the kernel may drop those file-backed pages whenever it reclaims memory
        # (DAMON pageout, memory pressure), each re-read stalling decoding. The real pair's bf16 draft, loaded
        # mapped, measured c = 0.67 against 0.46 for the same architecture converted from float32.
        options["disable_mmap"] = True

    def load() -> PreTrainedModel:
        if source.kind == "folder" and _trimmed(source.path):
            return _load_trimmed(source.location, torch_dtype, trust_remote_code, options)
        return AutoModelForCausalLM.from_pretrained(
            source.location, dtype=torch_dtype, trust_remote_code=trust_remote_code, **options, **source.kwargs(revision)
        )

    return _plain(_guarded(source, what, load), source).eval()


def _trimmed(folder: str) -> bool:
    from distill.common.trim import is_trimmed_folder

    return is_trimmed_folder(folder)


def _load_trimmed(folder: str, dtype: Any, trust_remote_code: bool, options: dict[str, Any]) -> PreTrainedModel:
    """A draft whose LM head keeps K rows (distill.common.trim): transformers loads the rest (the head's
    size mismatch ignored, its report silenced), then the K-row head and the map are set and checked."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from distill.common.trim import attach_trimmed_head

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, trust_remote_code=trust_remote_code, ignore_mismatched_sizes=True, **options)
    finally:
        hf_logging.set_verbosity(verbosity)
    return attach_trimmed_head(model, folder)


def load_tokenizer(ref: str | os.PathLike, *, revision: str | None = None, trust_remote_code: bool = False, what: str = "tokenizer") -> PreTrainedTokenizerBase:
    """The tokenizer of any reference, padding with EOS when it defines no pad token."""
    from transformers import AutoTokenizer

    source = resolve(ref, also=TOKENIZER_FILES)
    tokenizer = _guarded(source, what, lambda: AutoTokenizer.from_pretrained(source.location, trust_remote_code=trust_remote_code, **source.kwargs(revision)))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_config(ref: str | os.PathLike, *, revision: str | None = None, trust_remote_code: bool = False) -> PretrainedConfig:
    """The model config of any reference (a GGUF's is read from its metadata)."""
    from transformers import AutoConfig

    source = resolve(ref)
    return _guarded(source, "config", lambda: AutoConfig.from_pretrained(source.location, trust_remote_code=trust_remote_code, **source.kwargs(revision)))


def load_target(
    name_or_path: str, revision: str | None = None, dtype: str = "auto", device: torch.device | str | None = None, trust_remote_code: bool = False
) -> PreTrainedModel:
    """The target model, frozen, from any reference `load_model` reads (`revision` pins a Hub commit)."""
    model = load_model(name_or_path, dtype=dtype, device=device, revision=revision, trust_remote_code=trust_remote_code, what="target")
    model.eval()
    model.requires_grad_(False)  # the target is never trained
    return model


def load_target_tokenizer(spec: Any) -> PreTrainedTokenizerBase:
    """The target's tokenizer from a recipe's target spec (padding with eos when it defines no pad token)."""
    return load_tokenizer(spec.name_or_path, revision=spec.revision, trust_remote_code=spec.trust_remote_code, what="target tokenizer")
