"""Whether a draft and a target speak the same vocabulary, the real vocabulary they share, and where a generated row ends.

Qwen2.5-7B pads its embedding to 152,064 rows and 0.5B/1.5B to 151,936 while the tokenizer has
151,665 tokens: different embedding sizes are fine, different tokenizers are not."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Sequence

from transformers import PreTrainedModel, PreTrainedTokenizerBase


def _specials(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    return sorted(set(map(str, tokenizer.all_special_tokens)))


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """SHA-256 of the vocabulary (token -> id) and the special tokens: equal iff ids mean the same text.

    `unk_token` is left out on purpose: transformers 5 loads the same files with a different
    default for it depending on whether a config.json sits beside them (a LoRA folder has none)."""
    payload = json.dumps([sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]), _specials(tokenizer)], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def check_tokenizers_agree(tok_a: PreTrainedTokenizerBase, tok_b: PreTrainedTokenizerBase, names: tuple[str, str] = ("target", "draft")) -> None:
    """Raise ValueError saying which tokens differ unless both tokenizers map ids to the same tokens.

    Embedding padding (152,064 vs 151,936 rows) is not a difference: only the tokenizers are compared."""
    if tokenizer_fingerprint(tok_a) == tokenizer_fingerprint(tok_b):
        return
    a, b = tok_a.get_vocab(), tok_b.get_vocab()
    problems = []
    only_a, only_b = sorted(a.keys() - b.keys(), key=a.get), sorted(b.keys() - a.keys(), key=b.get)
    moved = sorted((t for t in a.keys() & b.keys() if a[t] != b[t]), key=a.get)
    if only_a:
        problems.append(f"{len(only_a)} tokens only in the {names[0]}'s ({only_a[:5]})")
    if only_b:
        problems.append(f"{len(only_b)} tokens only in the {names[1]}'s ({only_b[:5]})")
    if moved:
        problems.append(f"{len(moved)} tokens with different ids (e.g. {[(t, a[t], b[t]) for t in moved[:5]]})")
    sa, sb = set(_specials(tok_a)), set(_specials(tok_b))
    if sa != sb:
        problems.append(f"special tokens {sorted(sa - sb)} vs {sorted(sb - sa)}")
    raise ValueError(
        f"the {names[0]} and {names[1]} tokenizers disagree: {'; '.join(problems)}. "
        "Distillation and speculative decoding need one shared tokenizer (e.g. two models of the Qwen2.5 family)."
    )


def check_special_ids_agree(target: PreTrainedModel, draft: PreTrainedModel) -> None:
    """Without tokenizers, the configs' EOS/BOS/PAD ids are the evidence: refuse a disagreement."""
    for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
        t, d = getattr(target.config, name, None), getattr(draft.config, name, None)
        if t is not None and d is not None and t != d:
            raise ValueError(
                f"target and draft configs disagree on {name} ({t} vs {d}): their tokenizers differ. Use a draft that shares the target's tokenizer."
            )


def shared_vocab_size(target: PreTrainedModel, draft: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None = None) -> int:
    """The rows both models can score: the tokenizer's length when known, else the smaller embedding."""
    rows = min(target.config.get_text_config().vocab_size, draft.config.get_text_config().vocab_size)
    return min(rows, len(tokenizer)) if tokenizer is not None else rows


def cut_at_eos(tokens: Sequence[int], eos: Collection[int]) -> list[int]:
    """Generated tokens up to and including the first end-of-sequence id (what follows is padding);
    all of them when generation never stopped."""
    for i, token in enumerate(tokens):
        if token in eos:
            return list(tokens[: i + 1])
    return list(tokens)
