"""The teacher signal: the frozen target run online beside the student, or its top-k log-probs
cached once to safetensors shards (`distill cache-teacher RECIPE`) so a large target runs once
and drafts train many times.

Positions follow the causal shift: position t holds the distribution that predicts token t + 1,
and counts when `labels[t + 1] != -100` (see `response_mask`). Only the shared real vocabulary
(ids < len(tokenizer)) is scored or cached: the target's embedding padding rows are dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from distill.common.io import atomic_write, write_json
from distill.common.models import load_target, load_target_tokenizer
from distill.common.provenance import versions
from distill.common.vocab import tokenizer_fingerprint
from distill.training.data import build_eval_dataset, build_train_dataset, check_context, generate_share
from distill.training.topk_store import TopKStore, store_dir

CACHE_FORMAT = 1
MANIFEST = "manifest.json"
SHARD_PATTERN = "shard-{:05d}.safetensors"
MAX_OPEN_SHARDS = 64
CACHE_DTYPES = {"float32": torch.float32, "float16": torch.float16}
# Cache fields that must equal the run's for the cache to be used (the rest is provenance).
_IDENTITY_KEYS = ("format", "target", "revision", "tokenizer_fingerprint", "vocab_size", "dataset_fingerprint", "num_examples")


class CacheMismatchError(ValueError):
    """A teacher cache that was built for another target, tokenizer, dataset or top-k."""


# --------------------------------------------------------------------------------------------
# Online teacher


def freeze(model: torch.nn.Module) -> torch.nn.Module:
    """Eval mode and no gradients: the teacher is never trained."""
    model.eval()
    model.requires_grad_(False)
    return model


def prepare_teacher(model: PreTrainedModel, accelerator: Any) -> torch.nn.Module:
    """Place the frozen teacher for training as TRL's GKD/Distillation trainers do: sharded by
    DeepSpeed ZeRO-3 inference when the run uses ZeRO-3 (replicated under ZeRO-1/2), else
    `accelerator.prepare_model(..., evaluation_mode=True)` on the student's device."""
    freeze(model)
    if getattr(accelerator.state, "deepspeed_plugin", None) is not None:
        from trl.models import prepare_deepspeed

        return freeze(prepare_deepspeed(model, accelerator))
    return freeze(accelerator.prepare_model(model, evaluation_mode=True))


def response_mask(labels: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: True where the logits at t predict a response token (labels[t + 1] != -100)."""
    mask = torch.zeros_like(labels, dtype=torch.bool)
    mask[:, :-1] = labels[:, 1:] != -100
    return mask


@torch.no_grad()
def teacher_logits(teacher: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The teacher's logits [B, T, V_t] for a batch, without building a graph."""
    return teacher(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def topk_logprobs(logits: torch.Tensor, k: int, vocab_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely ids and their log-probs (float32, sorted, descending), the softmax taken
    over the first `vocab_size` rows only (the real vocabulary; padding rows dropped)."""
    if vocab_size is not None:
        logits = logits[..., :vocab_size]
    if not 0 < k <= logits.shape[-1]:
        raise ValueError(f"top_k={k} must be between 1 and the vocabulary size {logits.shape[-1]}")
    values, ids = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
    return ids, values


# --------------------------------------------------------------------------------------------
# Offline cache: writing


def dataset_fingerprint(dataset: Sequence[dict] | Any) -> str:
    """A hash of every example's input_ids and labels: a cache is only valid for the exact
    tokenized dataset it was computed on (same order, template, truncation)."""
    digest = hashlib.sha256()
    for row in dataset:
        digest.update(torch.tensor(row["input_ids"], dtype=torch.int64).numpy().tobytes())
        digest.update(b"|")
        digest.update(torch.tensor(row["labels"], dtype=torch.int64).numpy().tobytes())
        digest.update(b";")
    return digest.hexdigest()[:32]


def _pad_batch(rows: list[dict], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad a list of tokenized rows into input_ids, attention_mask, labels."""
    length = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    att = torch.zeros((len(rows), length), dtype=torch.long)
    lab = torch.full((len(rows), length), -100, dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = torch.tensor(r["input_ids"])
        att[i, :n] = torch.tensor(r["attention_mask"]) if "attention_mask" in r else 1
        lab[i, :n] = torch.tensor(r["labels"])
    return ids, att, lab


def cache_identity(target: str, revision: str | None, tokenizer: PreTrainedTokenizerBase, dataset: Any) -> dict[str, Any]:
    """The fields that tie a cache to one target, tokenizer and tokenized dataset."""
    return {
        "format": CACHE_FORMAT,
        "target": str(target),
        "revision": revision,
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "vocab_size": len(tokenizer),
        "dataset_fingerprint": dataset_fingerprint(dataset),
        "num_examples": len(dataset),
    }


def _diff(found: dict[str, Any], wanted: dict[str, Any], keys: Sequence[str]) -> list[str]:
    return [f"{k}: cache has {found.get(k)!r}, run needs {wanted.get(k)!r}" for k in keys if found.get(k) != wanted.get(k)]


def write_cache(
    model: torch.nn.Module,
    dataset: Any,
    cache_dir: str | os.PathLike,
    identity: dict[str, Any],
    *,
    top_k: int,
    pad_token_id: int,
    batch_size: int = 8,
    shard_size: int = 256,
    dtype: str = "float32",
    provenance: dict[str, Any] | None = None,
    device: torch.device | str | None = None,
    process_index: int = 0,
    num_processes: int = 1,
    kept: TopKStore | None = None,
) -> Path:
    """Run the frozen target once over `dataset` and write its top-k log-probs on response
    positions as safetensors shards of `shard_size` examples, plus a manifest. Resumable: finished
    shards (written atomically) are skipped. With several processes, shard i goes to process
    i % num_processes; the caller runs `finish_cache` on the main process once all are done.
    Examples whose response the target generated with its top-k `kept` (`distill.training.topk_store`) take
    those rows as they are, with no forward pass."""
    if dtype not in CACHE_DTYPES:
        raise ValueError(f"cache dtype {dtype!r} unknown: use one of {sorted(CACHE_DTYPES)}")
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    n = len(dataset)
    num_shards = max(1, -(-n // shard_size))
    manifest = {
        **identity,
        "top_k": top_k,
        "dtype": dtype,
        "shard_size": shard_size,
        "num_shards": num_shards,
        "positions": "response",
        "complete": False,
        **(provenance or {}),
    }
    path = cache_dir / MANIFEST
    if path.exists():
        old = json.loads(path.read_text())
        problems = _diff(old, manifest, (*_IDENTITY_KEYS, "top_k", "dtype", "shard_size"))
        if problems:
            raise CacheMismatchError(
                f"{cache_dir} already holds a different teacher cache ({'; '.join(problems)}). Delete that directory or set teacher.cache_dir to a new one."
            )
    elif process_index == 0:
        write_json(path, manifest)

    device = torch.device(device) if device is not None else next(model.parameters()).device
    vocab_size = identity["vocab_size"]
    mine = [s for s in range(num_shards) if s % num_processes == process_index]
    todo = [s for s in mine if not (cache_dir / SHARD_PATTERN.format(s)).exists()]
    for s in todo:  # what a killed writer of this shard left: atomic_write's temp file
        for stale in cache_dir.glob(f".{SHARD_PATTERN.format(s)}.*.tmp"):
            stale.unlink()
    bar = tqdm(total=sum(min(n, (s + 1) * shard_size) - s * shard_size for s in todo), desc="caching teacher", unit="ex", disable=process_index != 0)
    reused = 0
    for s in todo:
        lo, hi = s * shard_size, min(n, (s + 1) * shard_size)
        positions, ids, logps, offsets = [], [], [], [0]
        for b in range(lo, hi, batch_size):
            rows = [dataset[i] for i in range(b, min(hi, b + batch_size))]
            found = [_kept_rows(kept, row, top_k) if kept is not None else None for row in rows]
            computed = iter(_forward_rows(model, [r for r, f in zip(rows, found) if f is None], pad_token_id, top_k, vocab_size, device))
            for f in found:
                pos, top_ids, top_lp = f if f is not None else next(computed)
                positions.append(pos.to(torch.int32))
                ids.append(top_ids.to(torch.int32))
                logps.append(top_lp.to(CACHE_DTYPES[dtype]))
                offsets.append(offsets[-1] + len(pos))
            reused += sum(f is not None for f in found)
            bar.update(len(rows))
        tensors = {
            "positions": torch.cat(positions),
            "topk_ids": torch.cat(ids).reshape(-1, top_k),
            "topk_logprobs": torch.cat(logps).reshape(-1, top_k),
            "offsets": torch.tensor(offsets, dtype=torch.int64),
            "example_index": torch.arange(lo, hi, dtype=torch.int64),
        }
        # One metadata key: safetensors writes its metadata map in a per-process random order, and a
        # rerun must give the same bytes as an uninterrupted run (the manifest holds top_k and the rest).
        atomic_write(cache_dir / SHARD_PATTERN.format(s), partial(save_file, {k: v.contiguous() for k, v in tensors.items()}, metadata={"shard": str(s)}))
    bar.close()
    if reused:
        print(f"teacher cache {cache_dir}: {reused} examples took the top-k the target kept while generating (no second forward pass)", file=sys.stderr)
    return cache_dir


def _forward_rows(
    model: torch.nn.Module, rows: list[dict], pad_token_id: int, top_k: int, vocab_size: int, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(response positions, top-k ids, top-k log-probs) of each row, on the CPU, from one forward pass of the batch."""
    if not rows:
        return []
    input_ids, attention_mask, labels = _pad_batch(rows, pad_token_id)
    logits = teacher_logits(model, input_ids.to(device), attention_mask.to(device))
    top_ids, top_lp = topk_logprobs(logits, top_k, vocab_size)
    mask = response_mask(labels).to(device)
    out = []
    for i in range(len(rows)):
        pos = mask[i].nonzero().squeeze(-1)
        out.append((pos.cpu(), top_ids[i, pos].cpu(), top_lp[i, pos].cpu()))
    return out


def _kept_rows(kept: TopKStore, row: dict, top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The row's teacher rows from the generation-time store, when its response is the kept one
    (same prompt ids, the same tokens for as long as the row keeps them); None otherwise."""
    labels = row["labels"]
    start = next((t for t, label in enumerate(labels) if label != -100), None)
    if start is None or start == 0:
        return None
    got = kept.get(row["input_ids"][:start], top_k)
    response = row["input_ids"][start:]
    if got is None or len(got[0]) < len(response) or got[0][: len(response)].tolist() != list(response):
        return None
    n = len(response)
    return torch.arange(start - 1, start - 1 + n), got[1][:n], got[2][:n]


def _file_record(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        return {"bytes": path.stat().st_size, "sha256": hashlib.file_digest(f, "sha256").hexdigest()}


def finish_cache(cache_dir: str | os.PathLike) -> dict[str, Any]:
    """Mark a cache complete once every shard is on disk (main process, after all writers),
    recording each shard's size and sha256 so a truncated or corrupted shard is refused later."""
    cache_dir = Path(cache_dir)
    manifest = json.loads((cache_dir / MANIFEST).read_text())
    missing = [s for s in range(manifest["num_shards"]) if not (cache_dir / SHARD_PATTERN.format(s)).exists()]
    if missing:
        raise RuntimeError(f"{cache_dir} is missing shards {missing}: rerun `distill cache-teacher` to fill them")
    manifest["shards"] = [_file_record(cache_dir / SHARD_PATTERN.format(s)) for s in range(manifest["num_shards"])]
    manifest["complete"] = True
    write_json(cache_dir / MANIFEST, manifest)
    return manifest


# --------------------------------------------------------------------------------------------
# Offline cache: reading


class TeacherCache:
    """Read access to a finished cache: per-example top-k rows, and [B, T, k] batches aligned with
    right-padded input_ids. Shards are opened lazily (memory-mapped), so dataloader workers can
    hold a copy."""

    def __init__(self, cache_dir: str | os.PathLike):
        self.cache_dir = Path(cache_dir)
        path = self.cache_dir / MANIFEST
        if not path.exists():
            raise FileNotFoundError(f"no teacher cache at {self.cache_dir} (no {MANIFEST}): run `distill cache-teacher RECIPE` first")
        try:
            self.manifest = json.loads(path.read_text())
        except ValueError as e:
            raise CacheMismatchError(f"{path} is not valid JSON ({e}): delete {self.cache_dir} and rerun `distill cache-teacher RECIPE`") from None
        if self.manifest.get("format") != CACHE_FORMAT:
            raise CacheMismatchError(f"{self.cache_dir} has cache format {self.manifest.get('format')}, this distill reads {CACHE_FORMAT}: rebuild it")
        missing = [s for s in range(self.manifest["num_shards"]) if not (self.cache_dir / SHARD_PATTERN.format(s)).exists()]
        if missing or not self.manifest.get("complete"):
            raise CacheMismatchError(
                f"teacher cache {self.cache_dir} is incomplete (missing shards {missing}): "
                "rerun `distill cache-teacher RECIPE`, which continues where it stopped"
            )
        self.top_k = int(self.manifest["top_k"])
        self.shard_size = int(self.manifest["shard_size"])
        self._handles: dict[int, Any] = {}
        self.verify()

    def verify(self) -> None:
        """Refuse a shard whose size or sha256 differs from what `finish_cache` recorded (one read
        of the cache, before training starts rather than hours into it)."""
        for s, recorded in enumerate(self.manifest.get("shards", [])):
            shard = self.cache_dir / SHARD_PATTERN.format(s)
            found = _file_record(shard) if shard.stat().st_size == recorded["bytes"] else {"bytes": shard.stat().st_size}
            if found != recorded:
                what = (
                    f"{found['bytes']} bytes, the manifest recorded {recorded['bytes']}"
                    if found["bytes"] != recorded["bytes"]
                    else "its sha256 differs from the manifest's"
                )
                raise CacheMismatchError(
                    f"teacher cache shard {shard} is corrupt ({what}): delete it and rerun `distill cache-teacher RECIPE`, "
                    "which recomputes only the missing shards"
                )

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handles": {}}

    def __len__(self) -> int:
        return int(self.manifest["num_examples"])

    def check(self, identity: dict[str, Any], top_k: int | None = None) -> None:
        """Refuse the cache unless it was built for this target, tokenizer and tokenized dataset,
        with at least `top_k` entries per position."""
        problems = _diff(self.manifest, identity, _IDENTITY_KEYS)
        if top_k is not None and top_k > self.top_k:
            problems.append(f"top_k: cache has {self.top_k}, run needs {top_k}")
        if problems:
            raise CacheMismatchError(
                f"teacher cache {self.cache_dir} does not match this run ({'; '.join(problems)}). "
                "Rebuild it with `distill cache-teacher RECIPE` (into a new teacher.cache_dir)."
            )

    def _shard(self, s: int) -> Any:
        if s not in self._handles:
            if len(self._handles) >= MAX_OPEN_SHARDS:  # keep the number of open files bounded
                self._handles.pop(next(iter(self._handles)))
            shard = self.cache_dir / SHARD_PATTERN.format(s)
            try:
                self._handles[s] = safe_open(str(shard), framework="pt")
            except SafetensorError as e:
                raise CacheMismatchError(f"teacher cache shard {shard} is unreadable ({e}): delete it and rerun `distill cache-teacher RECIPE`") from None
        return self._handles[s]

    def example(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(positions [n] long, topk_ids [n, k] long, topk_logprobs [n, k] float32) of one example."""
        if not 0 <= index < len(self):
            raise IndexError(f"example {index} is outside the cache's {len(self)} examples")
        s, j = divmod(index, self.shard_size)
        f = self._shard(s)
        lo, hi = f.get_slice("offsets")[j : j + 2].tolist()
        return (
            f.get_slice("positions")[lo:hi].long(),
            f.get_slice("topk_ids")[lo:hi].long(),
            f.get_slice("topk_logprobs")[lo:hi].float(),
        )

    def batch(self, indices: Sequence[int], seq_len: int, top_k: int | None = None) -> dict[str, torch.Tensor]:
        """Dense [B, seq_len, k] teacher ids/log-probs for a right-padded batch, and the [B, seq_len]
        mask of cached positions. Positions outside the mask hold a harmless valid distribution
        (uniform over k ids with half the mass in the tail)."""
        k = top_k or self.top_k
        ids = torch.arange(k).expand(len(indices), seq_len, k).clone()
        logps = torch.full((len(indices), seq_len, k), float(torch.log(torch.tensor(0.5 / k))))
        mask = torch.zeros(len(indices), seq_len, dtype=torch.bool)
        for b, index in enumerate(indices):
            pos, top_ids, top_lp = self.example(int(index))
            if len(pos) and int(pos.max()) >= seq_len:
                raise CacheMismatchError(f"cached positions of example {index} run past the batch length {seq_len}: the cache was built on other data")
            ids[b, pos] = top_ids[:, :k]
            logps[b, pos] = top_lp[:, :k]
            mask[b, pos] = True
        return {"teacher_topk_ids": ids, "teacher_topk_logprobs": logps, "teacher_mask": mask}


class CachedTeacherCollator:
    """Wrap a collator: each feature's `example_index` selects its cached teacher rows, added to the
    batch as `teacher_topk_ids`, `teacher_topk_logprobs` and `teacher_mask`."""

    def __init__(self, collator: Any, cache: TeacherCache, top_k: int | None = None):
        self.collator, self.cache, self.top_k = collator, cache, top_k

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if any("example_index" not in f for f in features):
            raise KeyError("features need an `example_index` column to look up the teacher cache")
        indices = [int(f["example_index"]) for f in features]
        batch = self.collator([{k: v for k, v in f.items() if k != "example_index"} for f in features])
        batch.update(self.cache.batch(indices, batch["input_ids"].shape[1], self.top_k))
        return batch


# --------------------------------------------------------------------------------------------
# `distill cache-teacher RECIPE`


def cache_dirs(cache_dir: str | os.PathLike) -> dict[str, Path]:
    """Where a recipe's train and held-out caches live under teacher.cache_dir."""
    return {"train": Path(cache_dir) / "train", "eval": Path(cache_dir) / "eval"}


def cache_teacher(
    recipe: Any, recipe_path: str | None = None, *, cache_dir: str | None = None, dtype: str = "float32", shard_size: int = 256
) -> dict[str, Path]:
    """Cache the recipe's target over its training data (and held-out data, when it has an
    eval_split) under teacher.cache_dir/{train,eval}. Runs under `accelerate launch` too: shards
    are split across processes."""
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    from distill.training.recipe import check_paths

    check_paths(recipe)
    cache_dir = cache_dir or recipe.teacher.cache_dir
    if not cache_dir:
        raise ValueError("the recipe has no teacher.cache_dir: set it (or pass --cache-dir) to say where the cache goes")
    state = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))  # `accelerate launch --cpu`: CPU processes (gloo)
    spec = recipe.target
    tokenizer = load_target_tokenizer(spec)
    model = load_target(spec.name_or_path, spec.revision, spec.dtype, device=state.device, trust_remote_code=spec.trust_remote_code)
    check_context(recipe.data, model, "target")
    provenance = {
        "recipe": recipe.to_dict(),
        "recipe_path": recipe_path,
        "commit_hash": getattr(model.config, "_commit_hash", None),
        "versions": versions(),
    }
    builders = {"train": build_train_dataset, "eval": build_eval_dataset}
    # seq-KD: the target's greedy answers, with the top-k of every step kept (the teacher rows at those positions)
    keep = recipe.teacher.top_k if recipe.data.response_source == "target" else None
    generate_share(recipe.data, tokenizer, model, state, recipe.seed, keep_topk=keep)  # every process answers its share first
    out = {}
    for name, build in builders.items():
        with state.main_process_first():
            dataset = build(recipe.data, tokenizer, target=model, seed=recipe.seed, keep_topk=keep)
        kept = TopKStore(store_dir(recipe.data.generation_cache), len(tokenizer)) if keep else None
        if dataset is None:
            continue
        where = cache_dirs(cache_dir)[name]
        identity = cache_identity(spec.name_or_path, spec.revision, tokenizer, dataset)
        write_cache(
            model,
            dataset,
            where,
            identity,
            top_k=recipe.teacher.top_k,
            pad_token_id=tokenizer.pad_token_id,
            batch_size=recipe.teacher.batch_size,
            shard_size=shard_size,
            dtype=dtype,
            provenance=provenance,
            device=state.device,
            process_index=state.process_index,
            num_processes=state.num_processes,
            kept=kept,
        )
        state.wait_for_everyone()
        if state.is_main_process:
            finish_cache(where)
        state.wait_for_everyone()
        out[name] = where
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """`distill cache-teacher RECIPE`: write the target's top-k log-prob cache a recipe trains from."""
    from distill.arguments import parser
    from distill.training.recipe import load_recipe

    args = parser("cache-teacher").parse_args(argv)
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        written = cache_teacher(recipe, args.recipe, cache_dir=args.cache_dir, dtype=args.dtype, shard_size=args.shard_size)
    except (ValueError, FileNotFoundError) as err:
        print(f"distill cache-teacher: error: {err}", file=sys.stderr)
        return 2
    for name, where in written.items():
        print(f"{name}: {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
