"""Whether a draft and a target speak the same vocabulary, and the real vocabulary they share.

Qwen2.5-7B pads its embedding to 152,064 rows and 0.5B/1.5B to 151,936 while the tokenizer has
151,665 tokens: different embedding sizes are fine, different tokenizers are not."""

from __future__ import annotations

import hashlib
import json

from transformers import PreTrainedModel, PreTrainedTokenizerBase


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A short hash of the vocabulary and special tokens: equal fingerprints, same tokenizer."""
    payload = json.dumps([sorted(tokenizer.get_vocab().items()), tokenizer.all_special_tokens], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def check_tokenizers_agree(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase) -> None:
    """Raise ValueError naming the first tokens on which two tokenizers disagree."""
    tv, dv = target.get_vocab(), draft.get_vocab()
    if tv == dv and target.all_special_tokens == draft.all_special_tokens:
        return
    differ = sorted(
        (tok for tok in tv.keys() | dv.keys() if tv.get(tok) != dv.get(tok)),
        key=lambda t: min(tv.get(t, 1 << 60), dv.get(t, 1 << 60)),
    )
    shown = ", ".join(f"{t!r}: target id {tv.get(t)} vs draft id {dv.get(t)}" for t in differ[:5])
    specials = ""
    if target.all_special_tokens != draft.all_special_tokens:
        specials = f"; special tokens {target.all_special_tokens} vs {draft.all_special_tokens}"
    raise ValueError(
        f"draft and target tokenizers disagree on {len(differ)} tokens ({shown}){specials}. "
        "Speculative decoding needs the same tokenizer: use a draft of the target's family."
    )


def check_special_ids_agree(target: PreTrainedModel, draft: PreTrainedModel) -> None:
    """Without tokenizers, the configs' EOS/BOS/PAD ids are the evidence: refuse a disagreement."""
    for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
        t, d = getattr(target.config, name, None), getattr(draft.config, name, None)
        if t is not None and d is not None and t != d:
            raise ValueError(
                f"target and draft configs disagree on {name} ({t} vs {d}): their tokenizers differ. "
                "Use a draft that shares the target's tokenizer."
            )


def shared_vocab_size(target: PreTrainedModel, draft: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None = None) -> int:
    """The rows both models can score: the tokenizer's length when known, else the smaller embedding."""
    rows = min(target.config.get_text_config().vocab_size, draft.config.get_text_config().vocab_size)
    return min(rows, len(tokenizer)) if tokenizer is not None else rows
