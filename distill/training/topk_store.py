"""The target's top-k log-probs kept while it generates its own responses (sequence-level KD).

The logits a greedy target computes at generation step j are its distribution over response token
j: exactly what the teacher cache stores at that position. Keeping their top-k during generation
spares `distill cache-teacher` a second forward pass over every response. One safetensors file per
generated batch sits in `<generation_cache>.topk/`, written atomically before the batch's records
are appended to the generation cache, keyed by a hash of each prompt's token ids.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from distill.common.io import atomic_write


def prompt_key(prompt_ids: Sequence[int]) -> str:
    """The store's key of one prompt: a hash of its token ids (as generated, after truncation)."""
    return hashlib.sha256(torch.tensor(list(prompt_ids), dtype=torch.int64).numpy().tobytes()).hexdigest()[:32]


def store_dir(generation_cache: str | os.PathLike) -> Path:
    """Where the top-k of a generation cache's responses live."""
    return Path(f"{os.fspath(generation_cache)}.topk")


class KeepTopK:
    """A `generate` logits processor that keeps each step's top-k log-probs (softmax over the first
    `vocab_size` rows, the real vocabulary) and changes nothing. Greedy generation with no penalty
    adds no processor before it, so what it sees are the model's raw logits; only [B, k] per step
    is kept, never [B, V]."""

    def __init__(self, k: int, vocab_size: int):
        self.k, self.vocab_size = k, vocab_size
        self.ids: list[torch.Tensor] = []
        self.logps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        values, top = torch.log_softmax(scores[:, : self.vocab_size].float(), dim=-1).topk(self.k, dim=-1)
        self.ids.append(top.cpu())
        self.logps.append(values.cpu())
        return scores

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, steps, k] ids and float32 log-probs."""
        return torch.stack(self.ids, 1), torch.stack(self.logps, 1)


def write_batch(
    directory: Path, keys: Sequence[str], tokens: Sequence[torch.Tensor], ids: Sequence[torch.Tensor], logps: Sequence[torch.Tensor], vocab_size: int
) -> Path:
    """One generated batch: per prompt its response `tokens` [n] and their top-k `ids`/`logps` [n, k]
    (n steps each, EOS included when it came). Atomic: the file is whole or absent."""
    directory.mkdir(parents=True, exist_ok=True)
    offsets = [0]
    for t in tokens:
        offsets.append(offsets[-1] + len(t))
    tensors = {
        "tokens": torch.cat([t.to(torch.int32) for t in tokens]),
        "topk_ids": torch.cat([i.to(torch.int32) for i in ids]),
        "topk_logprobs": torch.cat([lp.float() for lp in logps]),
        "offsets": torch.tensor(offsets, dtype=torch.int64),
    }
    name = hashlib.sha256("|".join(keys).encode()).hexdigest()[:16]
    path = directory / f"batch-{name}.safetensors"
    metadata = {"keys": json.dumps(list(keys)), "top_k": str(tensors["topk_ids"].shape[-1]), "vocab_size": str(vocab_size)}
    return atomic_write(path, partial(save_file, {k: v.contiguous() for k, v in tensors.items()}, metadata=metadata))


class TopKStore:
    """Read access to the kept top-k: `get(prompt_ids)` gives the response tokens and their top-k rows."""

    def __init__(self, directory: str | os.PathLike, vocab_size: int):
        self.directory = Path(directory)
        self.index: dict[str, tuple[Path, int]] = {}
        self.top_k: int | None = None
        for path in sorted(self.directory.glob("batch-*.safetensors")) if self.directory.is_dir() else []:
            try:
                with safe_open(str(path), framework="pt") as f:
                    meta = f.metadata()
            except SafetensorError:
                continue  # torn by a crash before the rename cannot happen; anything unreadable is recomputed
            if int(meta["vocab_size"]) != vocab_size:
                continue
            k = int(meta["top_k"])
            self.top_k = k if self.top_k is None else min(self.top_k, k)
            for row, key in enumerate(json.loads(meta["keys"])):
                self.index[key] = (path, row)

    def __len__(self) -> int:
        return len(self.index)

    def get(self, prompt_ids: Sequence[int], k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(tokens [n], topk_ids [n, k], topk_logprobs [n, k]) kept for this prompt, None when absent
        or kept with fewer than `k` entries."""
        found = self.index.get(prompt_key(prompt_ids))
        if found is None or self.top_k is None or self.top_k < k:
            return None
        path, row = found
        with safe_open(str(path), framework="pt") as f:
            lo, hi = f.get_slice("offsets")[row : row + 2].tolist()
            return (f.get_slice("tokens")[lo:hi].long(), f.get_slice("topk_ids")[lo:hi, :k].long(), f.get_slice("topk_logprobs")[lo:hi, :k].float())
