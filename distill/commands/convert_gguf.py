"""`distill convert-gguf FILE.gguf OUT/`: dequantise a GGUF once into a Hugging Face folder that
`AutoModelForCausalLM.from_pretrained` loads in seconds instead of a minute of dequantising."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from distill.common.io import atomic_folder, write_json
from distill.common.models import ModelLoadError, load_model, load_tokenizer, resolve


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def convert_gguf(gguf_file: str | os.PathLike, out: str | os.PathLike, dtype: str = "float32") -> Path:
    """Dequantise `gguf_file` once into the HF folder `out` (safetensors, tokenizer with its chat
    template, generation config with Qwen's eos/pad), checked by reloading it and comparing logits.
    The folder is built beside `out` and renamed into place, so `out` is whole or absent."""
    import torch
    from transformers import GenerationConfig

    if dtype not in ("float32", "bfloat16"):
        raise ModelLoadError(f"--dtype {dtype!r}: choose float32 (exact dequantised weights) or bfloat16 (half the disk)")
    out = Path(out)
    if out.exists():
        raise ModelLoadError(f"{out}: already exists; remove it or choose another OUT folder")
    source = resolve(gguf_file)
    if source.kind != "gguf":
        raise ModelLoadError(f"{gguf_file}: not a .gguf file")
    started = time.time()
    tokenizer = load_tokenizer(source.path)
    model = load_model(source.path, dtype=dtype, device="cpu")
    eos = model.generation_config.eos_token_id if model.generation_config.eos_token_id is not None else tokenizer.eos_token_id
    pad = model.generation_config.pad_token_id if model.generation_config.pad_token_id is not None else tokenizer.pad_token_id
    model.generation_config = GenerationConfig(bos_token_id=model.config.bos_token_id, eos_token_id=eos, pad_token_id=pad)
    with atomic_folder(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        ids = torch.arange(min(16, len(tokenizer))).unsqueeze(0)
        with torch.no_grad():
            want = model(input_ids=ids).logits
            have = load_model(tmp, dtype=dtype, device="cpu")(input_ids=ids).logits
        if not torch.equal(want, have):
            raise ModelLoadError(
                f"{tmp}: the written weights give other logits than the GGUF (max |diff| {(want - have).abs().max():.3g}); nothing was written"
            )
        info = {
            "source": str(Path(source.path).resolve()),
            "source_bytes": Path(source.path).stat().st_size,
            "source_sha256": _sha256(Path(source.path)),
            "dtype": dtype,
            "seconds": round(time.time() - started, 1),
        }
        write_json(tmp / "conversion.json", info)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """`distill convert-gguf FILE.gguf OUT/ [--dtype float32|bfloat16]`: a GGUF as a Hugging Face folder."""
    from distill.arguments import parser

    args = parser("convert-gguf").parse_args(argv)
    try:
        started = time.time()
        out = convert_gguf(args.gguf, args.out, args.dtype)
    except (ValueError, FileNotFoundError) as err:
        print(f"distill convert-gguf: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out} in {time.time() - started:.0f} s: load it with AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
