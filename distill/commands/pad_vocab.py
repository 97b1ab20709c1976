"""`distill pad-vocab MODEL OUT --vocab-size N`: a copy of a model whose embedding and LM head are grown to N
rows that can never be its greedy choice.

Qwen2.5-7B pads its vocabulary to 152,064 rows, the 0.5B and 1.5B to 151,936 (the tokenizer has 151,665
tokens), and vLLM and SGLang refuse a draft whose `vocab_size` differs from the target's. A smaller target
padded as the 7B is lets that case be served and measured on a machine that cannot hold the 7B. The new
rows are filled as `distill publish --pad-vocab-to-target` fills a draft's (`publish.pad_vocab`: each
new row is the mean of the real rows, so its logit is the mean of the real logits, below the largest one;
their ids are listed in `generation_config.suppress_tokens`), so the copy's greedy output is the model's own.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from distill.commands.publish import pad_vocab
from distill.common.io import atomic_folder
from distill.common.models import ModelLoadError, load_model, load_tokenizer


def pad_copy(model_ref: str, out: str | Path, vocab_size: int) -> list[int]:
    """Write `model_ref` grown to `vocab_size` rows (weights in their stored dtype) and its tokenizer to `out`
    (whole or absent); return the new ids."""
    if Path(out).exists():
        raise ValueError(f"{out} exists; pick another folder or remove it")
    tokenizer = load_tokenizer(model_ref)
    model = load_model(model_ref)
    new = pad_vocab(model, vocab_size, len(tokenizer))
    if not new:
        raise ValueError(f"{model_ref} already has {vocab_size} rows: nothing to pad")
    with atomic_folder(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return new


def main(argv: Sequence[str] | None = None) -> int:
    """`distill pad-vocab MODEL OUT --vocab-size N`."""
    from distill.arguments import parser

    args = parser("pad-vocab").parse_args(argv)
    started = time.time()
    try:
        new = pad_copy(args.model, args.out, args.vocab_size)
    except (ValueError, FileNotFoundError, ModelLoadError) as err:
        print(f"distill pad-vocab: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(
        f"wrote {args.out} in {time.time() - started:.0f} s: {args.vocab_size} rows, ids {new[0]}..{new[-1]} new (never the greedy choice, suppressed in generate)"
    )
    return 0
