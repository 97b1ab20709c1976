"""`distill trim-vocab DRAFT OUT --size K --from FILE...`: a draft whose LM head keeps only the K target
ids most frequent in the given text (tokenized with the draft's tokenizer; special and chat-template
tokens always kept). The input embedding stays whole; the head is untied and cut to K rows; the map
(head row -> target id) and the full head are saved beside it (distill.common.trim), and
`distill.common.models.load_model` loads the folder. Decoding with it stays lossless
(distill.speculative.loop); `distill publish` also writes its full-vocabulary export.

    distill trim-vocab runs/kd/draft runs/kd-32k --size 32768 --from runs/kd/generations.jsonl
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from distill.common.io import atomic_folder
from distill.common.models import TOKENIZER_FILES, ModelLoadError, load_config, load_model, load_tokenizer, resolve
from distill.common.trim import DEFAULT_FIELDS, VocabTrimError, choose_ids, count_tokens, is_trimmed_folder, save_trim_files, trim_head


def _check_out(out: Path, draft_dir: Path | None, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out}: is a file; give a folder path for OUT")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise FileExistsError(f"{out}: not empty; pass --force to replace it, or choose another OUT")
    if draft_dir is not None and (out.absolute() == draft_dir.absolute() or out.absolute() in draft_dir.absolute().parents):
        raise ValueError(f"{out}: would replace the draft it is cut from ({draft_dir}); choose another OUT")


def trim_vocab(
    draft: str | os.PathLike,
    out: str | os.PathLike,
    size: int,
    sources: Sequence[str | os.PathLike],
    fields: Sequence[str] = DEFAULT_FIELDS,
    force: bool = False,
) -> dict[str, Any]:
    """Write the trimmed draft folder `out` (whole or absent) and return what was done (ids kept, coverage, sizes).
    Every refusal (a ValueError naming the problem and the fix) comes before anything is written."""
    import torch

    out = Path(out)
    if size < 1:
        raise VocabTrimError(f"--size {size}: give the number of tokens the head keeps, at least 1")
    source = resolve(draft)
    folder = Path(source.path) if source.kind == "folder" else None
    _check_out(out, folder, force)
    if folder is not None and (folder / "adapter_config.json").is_file():
        raise VocabTrimError(f"{draft}: a LoRA adapter; merge it first (distill publish without --keep-adapter) and trim the merged draft")
    if folder is not None and is_trimmed_folder(folder):
        raise VocabTrimError(f"{draft}: already trimmed; trim the original draft (or its full-vocab/ export from distill publish)")
    fix = "save the target's tokenizer into the draft folder (training and distill publish do) and run again"
    if folder is not None and not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise VocabTrimError(f"{draft}: no tokenizer to count the text with (no {' or '.join(TOKENIZER_FILES)} in {folder}); {fix}")
    try:
        tokenizer = load_tokenizer(draft, what="draft tokenizer")
    except ModelLoadError as err:
        raise VocabTrimError(f"{draft}: no tokenizer to count the text with ({err}); {fix}") from None
    rows = load_config(draft).get_text_config().vocab_size
    vocab = min(len(tokenizer), rows)
    if size > vocab:
        raise VocabTrimError(f"--size {size}: larger than the draft's vocabulary of {vocab} tokens; give at most {vocab}")
    missing = [str(s) for s in sources if not Path(s).is_file()]
    if missing:
        raise VocabTrimError(f"--from {missing[0]}: no such file; give JSONL or plain-text files to count tokens in")
    counts = count_tokens(tokenizer, sources, fields, vocab=vocab)
    ids, info = choose_ids(tokenizer, size, counts)
    model = load_model(draft, dtype=None, device="cpu", what="draft")
    probe = torch.arange(min(16, vocab))[None]
    with torch.no_grad():
        want = model(input_ids=probe).logits[..., ids]
    full_rows, hidden = model.get_output_embeddings().weight.shape
    trim_head(model, ids, info={"from": [str(Path(s)) for s in sources], **info})
    with atomic_folder(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        save_trim_files(model, tmp)
        with torch.no_grad():
            have = load_model(tmp, dtype=None, device="cpu", what="trimmed draft")(input_ids=probe).logits
        if not torch.equal(want, have):
            raise VocabTrimError(
                f"the written draft's logits differ from the kept rows of the original (max |diff| {(want - have).abs().max():.3g}); nothing was written"
            )
    return {"out": str(out), "kept": size, "rows": full_rows, "hidden": hidden, **info, "files": [str(s) for s in sources]}


def main(argv: Sequence[str] | None = None) -> int:
    """`distill trim-vocab DRAFT OUT --size K --from FILE...`; a bad input is one line and exit 2."""
    from distill.arguments import parser

    args = parser("trim-vocab").parse_args(argv)
    fields = [f.strip() for f in args.fields.split(",") if f.strip()] if args.fields else DEFAULT_FIELDS
    try:
        done = trim_vocab(args.draft, args.out, args.size, args.sources, fields, force=args.force)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"distill trim-vocab: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(
        f"wrote {done['out']}: the LM head keeps {done['kept']:,} of {done['rows']:,} rows ({done['hidden']} x {done['kept']:,} = "
        f"{done['hidden'] * done['kept']:,} weights, was {done['hidden'] * done['rows']:,}); they cover {done['coverage_of_counted_text']:.2%} "
        f"of the {done['counted_tokens']:,} tokens counted in {len(done['files'])} file(s); {done['always_kept']} special and chat-template tokens always kept"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
