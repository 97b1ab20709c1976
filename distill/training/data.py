"""Datasets -> chat-templated, tokenized examples with response-only loss masks.

Prompts come from a Hub dataset or a local file through an adapter (GSM8K, MMLU, CNN/DailyMail,
chat `messages`, prompt/response columns). Responses come from the dataset or, for
sequence-level KD, from the target itself: generated once, cached as JSONL, resumable.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from distill.common.datafiles import read_rows
from distill.common.io import DataFileError, atomic_write, write_json
from distill.common.prompts import TEMPLATES, apply_template, format_mmlu_question, truncate_words
from distill.common.splits import CNNDM_TRAIN_ROWS, positions
from distill.common.vocab import cut_at_eos, tokenizer_fingerprint
from distill.training import topk_store
from distill.training.recipe import DataSpec

IGNORE_INDEX = -100
LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
Messages = list[dict[str, str]]


# --------------------------------------------------------------------------- adapters


def _user(text: str) -> Messages:
    return [{"role": "user", "content": text}]


def _text(row: dict, name: str) -> str:
    """`row[name]`, which must be text."""
    value = row[name]
    if not isinstance(value, str):
        raise ValueError(f"{name!r} is a {type(value).__name__}, not text")
    return value


def _gsm8k(row: dict) -> tuple[Messages, str | None]:
    return _user(_text(row, "question")), _text(row, "answer")


def _mmlu(row: dict) -> tuple[Messages, str | None]:
    letters = "ABCDEFGHIJ"
    _text(row, "question")
    if not isinstance(row["choices"], list) or not all(isinstance(c, str) for c in row["choices"]):
        raise ValueError(f"mmlu 'choices' must be a list of texts, got {row['choices']!r:.120}")
    choices = list(row["choices"])
    if len(choices) > len(letters):
        raise ValueError(f"mmlu row has {len(choices)} choices; at most {len(letters)} are supported")
    answer = row["answer"]
    if isinstance(answer, str) and answer in letters[: len(choices)]:
        answer = letters.index(answer)
    if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(choices):
        raise ValueError(f"mmlu answer must be a choice index or letter, got {answer!r} for {len(choices)} choices (out of range)")
    options = "\n".join(f"{letters[i]}. {c}" for i, c in enumerate(choices))
    prompt = f"{row['question']}\n\n{options}\n\nAnswer with the letter of the correct option."
    return _user(prompt), f"The answer is {letters[answer]}."


def _cnndm(row: dict) -> tuple[Messages, str | None]:
    return _user(f"Summarize the following article.\n\n{_text(row, 'article')}"), _text(row, "highlights")


def _messages(row: dict) -> tuple[Messages, str | None]:
    messages = row["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"'messages' must be a non-empty list of {{role, content}} turns, got {messages!r}")
    for turn in messages:
        if not isinstance(turn, dict) or not isinstance(turn.get("role"), str) or not isinstance(turn.get("content"), str):
            raise ValueError(f"each turn in 'messages' needs string 'role' and 'content', got {turn!r}")
    turns = [{"role": t["role"], "content": t["content"]} for t in messages]
    if turns[-1]["role"] == "assistant":
        if len(turns) == 1:
            raise ValueError("a 'messages' row holds only an assistant turn: there is no prompt")
        return turns[:-1], turns[-1]["content"]
    return turns, None


def _prompt_response(row: dict) -> tuple[Messages, str | None]:
    if row.get("response") is not None:
        _text(row, "response")
    return _user(_text(row, "prompt")), row.get("response")


# name -> (columns that must be present, row function). Auto-detection tries them in this order
# (mmlu before gsm8k: both have question/answer; cnndm before cnndm_train, which is never detected:
# it is cnndm reading only the rows distill.common.splits leaves to training).
ADAPTERS: dict[str, tuple[tuple[str, ...], Callable[[dict], tuple[Messages, str | None]]]] = {
    "messages": (("messages",), _messages),
    "mmlu": (("question", "choices", "answer"), _mmlu),
    "gsm8k": (("question", "answer"), _gsm8k),
    "cnndm": (("article", "highlights"), _cnndm),
    "cnndm_train": (("article", "highlights"), _cnndm),
    "prompt_response": (("prompt",), _prompt_response),
}


def template_fields(adapter: str, row: dict, max_article_words: int | None = None) -> dict[str, str] | None:
    """What a template wraps for a row of a task adapter, as `distill accept` asks it: the GSM8K question,
    the MMLU question with its lettered options and "Answer:" (and its subject), the CNN/DM article cut
    to `max_article_words`; None for the chat adapters (their last user turn is wrapped)."""
    if adapter == "gsm8k":
        return {"question": row["question"]}
    if adapter == "mmlu":
        fields = {"question": format_mmlu_question(row["question"], row["choices"])}
        if isinstance(row.get("subject"), str):
            fields["subject"] = row["subject"].replace("_", " ")
        return fields
    if adapter in ("cnndm", "cnndm_train"):
        return {"question": truncate_words(row["article"], max_article_words)}
    return None


def detect_adapter(columns: Iterable[str]) -> str:
    """The first adapter whose required columns are all present; a ValueError listing the columns if none fits."""
    columns = list(columns)
    for name, (required, _) in ADAPTERS.items():
        if set(required) <= set(columns):
            return name
    expected = "; ".join(f"{name}: {', '.join(req)}" for name, (req, _) in ADAPTERS.items())
    raise ValueError(
        f"cannot tell which adapter fits a dataset with columns {columns}. Expected columns per adapter: "
        f"{expected} (prompt_response also reads an optional 'response'). Rename the columns or set data.adapter."
    )


# --------------------------------------------------------------------------- loading


def _load_rows(dataset: str, split: str, subset: str | None) -> tuple[Sequence[dict], Callable[[int], str], list[str]]:
    """The rows of a Hub id or a local .jsonl/.json/.parquet file, where each row is (`FILE:LINE`, or
    the Hub split's row number), and the columns. A line that is not JSON is a DataFileError naming it."""
    suffix = Path(dataset).suffix.lower()
    if suffix in LOCAL_FORMATS:
        if not os.path.isfile(dataset):
            raise FileNotFoundError(f"dataset file not found: {dataset}; fix data.dataset / data.eval_split in the recipe")
        if os.path.getsize(dataset) == 0:
            raise ValueError(f"dataset file {dataset} is empty: there is nothing to train or evaluate on; point the recipe at a file with rows")
        if split != "train":
            raise ValueError(
                f"a local file has a single split, 'train'; got split={split!r} for {dataset}. Point the dataset (or data.eval_split) at another file instead."
            )
        located = read_rows(dataset, allow_empty=True)
        if not located:
            raise ValueError(f"dataset {dataset} has no rows: there is nothing to train or evaluate on; point the recipe at data with rows")
        rows = [row for _, row in located]
        return rows, [where for where, _ in located].__getitem__, list(dict.fromkeys(key for row in rows for key in row))
    if os.path.isfile(dataset):
        raise ValueError(f"unsupported dataset file {dataset}: use one of {', '.join(LOCAL_FORMATS)}")
    from datasets import load_dataset

    ds = load_dataset(dataset, subset, split=split)
    return ds, lambda i: f"{dataset} ({split}) row {i + 1}", list(ds.column_names)


def _identity(adapter: str, row: dict, messages: Messages) -> str:
    """What makes two rows one prompt (`exclude`): the task's text (the MMLU question with its options,
    the whole article) or the last user turn, whitespace normalised."""
    fields = template_fields(adapter, row)
    text = fields["question"] if fields else next(t["content"] for t in reversed(messages) if t["role"] == "user")
    return " ".join(text.split())


def load_examples(
    dataset: str,
    adapter: str | None = None,
    split: str = "train",
    num_samples: int | None = None,
    seed: int = 0,
    subset: str | None = None,
    prompt_template: str | None = None,
    *,
    prompt_templates: Sequence[str] = (),
    max_article_words: int | None = None,
    exclude: Sequence[str] = (),
) -> list[dict]:
    """Prompt/response examples `{"messages": [...], "response": str | None}` from a dataset.

    `num_samples` draws that many rows at random (seeded, as `datasets.Dataset.shuffle` draws them);
    None keeps every row in order. `prompt_template`, or several `prompt_templates` taken in turn over
    the drawn rows (see `distill.common.prompts.apply_template`), asks each prompt: a task adapter's
    text (`template_fields`) inside it, else the last user turn. `max_article_words` cuts CNN/DM articles.
    `exclude`: files whose prompts (`_identity`, read with the same adapter) are dropped before drawing.
    `cnndm_train` reads only the rows distill.common.splits gives training. A bad row of a local file
    is a DataFileError `FILE:LINE: problem` (every row is checked); of a Hub dataset, of the drawn rows."""
    rows, where, columns = _load_rows(dataset, split, subset)
    if adapter is None:
        adapter = detect_adapter(columns)
    if adapter not in ADAPTERS:
        raise ValueError(f"unknown adapter {adapter!r}; choose one of {', '.join(ADAPTERS)}")
    required, to_example = ADAPTERS[adapter]
    missing = [c for c in required if c not in columns]
    if missing:
        raise ValueError(
            f"adapter {adapter!r} needs columns {missing}, but {dataset} has {columns}: "
            f"set data.adapter to the one its rows are written for ({', '.join(ADAPTERS)}), or rename the columns"
        )
    if len(rows) == 0:
        raise ValueError(f"dataset {dataset} has no rows: there is nothing to train or evaluate on; point the recipe at data with rows")
    for column in required:
        values = rows[column] if not isinstance(rows, list) else [row.get(column) for row in rows]
        empty = [i for i, value in enumerate(values) if value is None]
        if empty:
            raise DataFileError(
                f"{where(empty[0])}: {len(empty)} rows of {dataset} have no {column!r} (missing or null), which adapter {adapter!r} needs; "
                f"the first is row {empty[0] + 1}: fill those rows in or drop them"
            )

    def example(i: int) -> tuple[Messages, str | None]:
        try:
            messages, response = to_example(rows[i])
        except (ValueError, TypeError, KeyError) as err:
            raise DataFileError(f"{where(i)}: {err}") from None
        if max_article_words is not None and adapter in ("cnndm", "cnndm_train"):
            messages = _user(f"Summarize the following article.\n\n{truncate_words(rows[i]['article'], max_article_words)}")
        return messages, response

    if isinstance(rows, list):  # a local file: every row checked
        for i in range(len(rows)):
            example(i)
    candidates = list(range(len(rows)))
    if adapter == "cnndm_train":
        candidates = positions(CNNDM_TRAIN_ROWS, len(rows))
        if not candidates:
            raise ValueError(
                f"{dataset} has {len(rows)} rows; cnndm_train reads rows {CNNDM_TRAIN_ROWS.start}-{CNNDM_TRAIN_ROWS.stop - 1} "
                "(the shared CNN/DM file's training rows, distill.common.splits): point it at that file"
            )
    if exclude:
        held = {identity for path in exclude for identity in _identities(path, adapter)}
        candidates = [i for i in candidates if _identity(adapter, rows[i], example(i)[0]) not in held]
    if num_samples is not None and num_samples < len(candidates):
        candidates = [candidates[j] for j in np.random.default_rng(seed).permutation(len(candidates))[:num_samples]]
    templates = list(prompt_templates) or ([prompt_template] if prompt_template is not None else [])
    examples = []
    for k, i in enumerate(candidates):
        messages, response = example(i)
        if templates:
            messages = _templated(adapter, rows[i], messages, templates[k % len(templates)], max_article_words, where(i))
        examples.append({"messages": messages, "response": response})
    return examples


def _templated(adapter: str, row: dict, messages: Messages, template: str, max_article_words: int | None, where: str) -> Messages:
    """The prompt asked under `template`: a task row's text (`template_fields`) as a one-turn chat, else
    the last user turn of `messages` rewritten."""
    fields = template_fields(adapter, row, max_article_words)
    if fields is not None:
        text = fields.pop("question")
        if "{subject}" in TEMPLATES.get(template, template) and "subject" not in fields:
            raise DataFileError(
                f"{where}: template {template!r} asks for {{subject}}, which this row does not have; add a 'subject' field or choose another template"
            )
        return _user(apply_template(template, text, **fields))
    messages = list(messages)
    last = max(i for i, turn in enumerate(messages) if turn["role"] == "user")
    messages[last] = {**messages[last], "content": apply_template(template, messages[last]["content"])}
    return messages


def _identities(path: str, adapter: str) -> set[str]:
    """The prompts of an evaluation file (`exclude`), read with `adapter` (cnndm_train: as cnndm, every
    row); a bad row of it is a DataFileError `FILE:LINE: problem` like any data file's."""
    adapter = "cnndm" if adapter == "cnndm_train" else adapter
    rows, _, _ = _load_rows(path, "train", None)
    return {_identity(adapter, row, ex["messages"]) for row, ex in zip(rows, load_examples(path, adapter))}


def source_counts(spec: DataSpec) -> list[int]:
    """How many of `data.num_samples` prompts each of `data.sources` gives: by share, rounded by largest remainder."""
    total = sum(source.share for source in spec.sources)
    quota = [spec.num_samples * source.share / total for source in spec.sources]
    counts = [int(q) for q in quota]
    for i in sorted(range(len(quota)), key=lambda i: counts[i] - quota[i])[: spec.num_samples - sum(counts)]:
        counts[i] += 1
    return counts


# --------------------------------------------------------------------------- tokenization


def _prompt_ids(tokenizer, messages: Messages) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])


def tokenize_example(tokenizer, messages: Messages, response: str, max_prompt_length: int, max_length: int, response_ids: Sequence[int] | None = None) -> dict:
    """Chat-templated prompt + response + EOS, with labels -100 on the prompt so only the response is learnt.

    The prompt keeps its last `max_prompt_length` tokens (the end is what the response follows);
    the whole sequence is then cut to `max_length`. `response_ids`, the tokens a target generated
    (EOS included when it stopped), are used as they are instead of re-tokenizing the text: the
    sequence is then exactly what the target produced, and its kept logits line up with it."""
    if response is None and response_ids is None:
        raise ValueError("example has no response: use data.response_source: target to generate one")
    if max_prompt_length >= max_length:
        raise ValueError(f"max_prompt_length ({max_prompt_length}) must be < max_length ({max_length})")
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos_token; the response could never end")
    prompt = _prompt_ids(tokenizer, messages)[-max_prompt_length:]
    if response_ids is not None:
        answer = list(response_ids)
    else:
        answer = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    answer = answer[: max_length - len(prompt)]
    input_ids = prompt + answer
    return {
        "input_ids": input_ids,
        "attention_mask": [1] * len(input_ids),
        "labels": [IGNORE_INDEX] * len(prompt) + answer,
    }


@dataclass
class DataCollatorForDistill:
    """Right-pads `input_ids` (pad token), `attention_mask` (0) and `labels` (-100) into tensors.

    Other keys are stacked as they are (e.g. an example index), so they must be scalars or equal-length lists."""

    tokenizer: Any

    def __call__(self, features: Sequence[dict]) -> dict[str, torch.Tensor]:
        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            raise ValueError("the tokenizer has no pad_token; set tokenizer.pad_token (Qwen2.5 uses <|endoftext|>)")
        length = max(len(f["input_ids"]) for f in features)
        pads = {"input_ids": pad_id, "attention_mask": 0, "labels": IGNORE_INDEX}
        batch = {key: torch.tensor([list(f[key]) + [value] * (length - len(f[key])) for f in features], dtype=torch.long) for key, value in pads.items()}
        for key in features[0].keys() - pads.keys():
            batch[key] = torch.tensor([f[key] for f in features])
        return batch


# --------------------------------------------------------------------------- tokenizers


# --------------------------------------------------------------------------- sequence-level KD


def _key(messages: Messages) -> str:
    return hashlib.sha256(json.dumps(messages, ensure_ascii=False, sort_keys=True).encode("utf-8")).hexdigest()


def _read_records(path: Path) -> dict[str, dict]:
    """key -> record from a generations JSONL; a torn last line (a crash mid-write) is skipped."""
    records = {}
    if not path.exists():
        return records
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            records[rec["key"]] = rec
    return records


def _drop_torn_tail(path: Path) -> None:
    """Cut a half-written last line off an append-only JSONL, so the next append starts on a fresh line."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def _tokenizer_identity(tokenizer) -> dict:
    """What a generation cache pins of the tokenizer: its vocabulary and its chat template."""
    return {"tokenizer": tokenizer_fingerprint(tokenizer), "chat_template": hashlib.sha256(str(tokenizer.chat_template).encode("utf-8")).hexdigest()}


def _manifest_diffs(old: dict, new: dict) -> list[str]:
    """`key: cached X, now Y` for each entry of `new` (but versions) that `old` records otherwise."""
    return [f"{k}: cached {old.get(k)!r}, now {v!r}" for k, v in new.items() if k != "versions" and old.get(k) != v]


def _manifest(model, tokenizer, settings: dict) -> dict:
    import transformers

    from distill import __version__

    return {
        "model": getattr(model.config, "_name_or_path", "") or type(model).__name__,
        "model_revision": getattr(model.config, "_commit_hash", None),
        "model_dtype": str(model.dtype),
        **_tokenizer_identity(tokenizer),
        "generation": settings,
        "versions": {"distill": __version__, "torch": torch.__version__, "transformers": transformers.__version__},
    }


def _check_manifest(path: Path, cache_path: Path, manifest: dict) -> None:
    """Refuse to extend a cache made by another model, tokenizer or generation setting."""
    if not path.exists():
        if cache_path.exists() or _partials(cache_path) or topk_store.store_dir(cache_path).exists():
            raise ValueError(
                f"generation cache {cache_path} has no manifest {path}; delete the cache (and {topk_store.store_dir(cache_path).name}) or choose another path"
            )
        write_json(path, manifest)
        return
    diffs = _manifest_diffs(json.loads(path.read_text(encoding="utf-8")), manifest)
    if diffs:
        raise ValueError(
            f"generation cache {cache_path} was made with other settings ({'; '.join(diffs)}). "
            "Delete it (and its .manifest.json) or set data.generation_cache to a new path."
        )


def _generation_kwargs(tokenizer, model, max_new_tokens: int, do_sample: bool, temperature: float) -> dict:
    """Explicit settings, so the model's own generation_config (Qwen2.5-Instruct samples with
    repetition_penalty 1.05) cannot change what "greedy" means."""
    eos = model.generation_config.eos_token_id
    kwargs = {
        "max_new_tokens": max_new_tokens,
        "do_sample": do_sample,
        "repetition_penalty": 1.0,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": eos if eos is not None else tokenizer.eos_token_id,
    }
    if do_sample:
        kwargs |= {"temperature": temperature, "top_p": 1.0, "top_k": 0}
    return kwargs


def _generation_settings(max_new_tokens: int, max_prompt_length: int | None, do_sample: bool = False, temperature: float = 1.0, seed: int = 0) -> dict:
    """What a generation cache's manifest pins besides model and tokenizer."""
    return {
        "max_new_tokens": max_new_tokens,
        "max_prompt_length": max_prompt_length,
        "do_sample": do_sample,
        "temperature": temperature if do_sample else None,
        "seed": seed if do_sample else None,
    }


def cached_responses(examples: Sequence[dict], spec: DataSpec, tokenizer) -> list[dict]:
    """The target's responses read from a finished `data.generation_cache`, without the target:
    training from a teacher cache (teacher.mode: cache) after `distill cache-teacher` wrote both.
    A cache made with another tokenizer or settings, or missing a prompt, is refused."""
    cache_path = Path(spec.generation_cache)
    manifest_path = Path(f"{cache_path}.manifest.json")
    rerun = "run `distill cache-teacher RECIPE` first (it generates the responses, then caches the teacher), or set teacher.mode: online"
    if not cache_path.is_file() or not manifest_path.is_file():
        raise ValueError(
            f"data.response_source is 'target' and the target is not loaded to generate (teacher.mode: cache, or ZeRO-3 partitions it), "
            f"but the generation cache {cache_path} is not finished: {rerun}"
        )
    want = {**_tokenizer_identity(tokenizer), "generation": _generation_settings(spec.generation_max_new_tokens, spec.max_prompt_length)}
    diffs = _manifest_diffs(json.loads(manifest_path.read_text(encoding="utf-8")), want)
    if diffs:
        raise ValueError(f"generation cache {cache_path} was made with other settings ({'; '.join(diffs)}): delete it (and its .manifest.json) and {rerun}")
    records = _read_records(cache_path)
    missing = sum(_key(ex["messages"]) not in records for ex in examples)
    if missing:
        raise ValueError(f"generation cache {cache_path} lacks {missing} of {len(examples)} prompts of this recipe's data: {rerun}")
    return _responses(examples, records)


def _responses(examples: Sequence[dict], records: dict[str, dict]) -> list[dict]:
    """Each example with the cached generation for its prompt as its response (and its token ids,
    which caches written before they were recorded lack)."""
    out = []
    for ex in examples:
        record = records[_key(ex["messages"])]
        out.append({"messages": ex["messages"], "response": record["messages"][-1]["content"], "response_ids": record.get("response_ids")})
    return out


def _partials(cache_path: Path) -> list[Path]:
    """The append-only files generation writes before the cache: one, or one per process."""
    return [p for p in (Path(f"{cache_path}.partial"), *sorted(cache_path.parent.glob(f"{cache_path.name}.partial.*"))) if p.exists()]


def _cache_of(partial: Path) -> Path:
    """The generation cache a partial file belongs to (`X.partial` or `X.partial.<rank>` -> X)."""
    name = partial.name
    return partial.with_name(name[: name.index(".partial")])


def _answer(
    model,
    tokenizer,
    todo: dict[str, Messages],
    partial: Path,
    records: dict[str, dict],
    max_new_tokens: int,
    batch_size: int,
    max_prompt_length: int | None,
    do_sample: bool,
    temperature: float,
    seed: int,
    desc: str,
    keep_topk: int | None = None,
) -> None:
    """Generate the target's answer to every prompt in `todo`, appending each finished batch to `partial` (fsynced) and `records`.

    With `keep_topk` (greedy only), each step's raw logits are kept as top-k log-probs in the
    `distill.training.topk_store` beside the cache, written before the batch's records."""
    ids = {key: _prompt_ids(tokenizer, messages) for key, messages in todo.items()}
    if max_prompt_length is not None:
        ids = {key: prompt[-max_prompt_length:] for key, prompt in ids.items()}
    order = sorted(todo, key=lambda k: len(ids[k]), reverse=True)  # similar lengths share a batch
    kwargs = _generation_kwargs(tokenizer, model, max_new_tokens, do_sample, temperature)
    keep = keep_topk if keep_topk and not do_sample else None
    eos = {kwargs["eos_token_id"]} if isinstance(kwargs["eos_token_id"], int) else set(kwargs["eos_token_id"])
    store = topk_store.store_dir(_cache_of(partial))
    model.eval()
    partial.parent.mkdir(parents=True, exist_ok=True)
    _drop_torn_tail(partial)
    with open(partial, "a", encoding="utf-8") as out, tqdm(total=len(order), desc=desc, unit="prompt") as bar:
        for start in range(0, len(order), batch_size):
            keys = order[start : start + batch_size]
            width = max(len(ids[k]) for k in keys)
            input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(ids[k])) + ids[k] for k in keys])
            attention_mask = torch.tensor([[0] * (width - len(ids[k])) + [1] * len(ids[k]) for k in keys])
            if do_sample:
                torch.manual_seed(seed + start)
            recorder = topk_store.KeepTopK(keep, len(tokenizer)) if keep else None
            with torch.inference_mode():
                sequences = model.generate(
                    input_ids=input_ids.to(model.device),
                    attention_mask=attention_mask.to(model.device),
                    logits_processor=[recorder] if recorder else None,
                    **kwargs,
                )
            new = [cut_at_eos(row.tolist(), eos) for row in sequences[:, width:].cpu()]
            if recorder:
                top_ids, top_lps = recorder.stacked()
                topk_store.write_batch(
                    store,
                    [topk_store.prompt_key(ids[k]) for k in keys],
                    [torch.tensor(n) for n in new],
                    [top_ids[i, : len(n)].cpu() for i, n in enumerate(new)],
                    [top_lps[i, : len(n)].cpu() for i, n in enumerate(new)],
                    len(tokenizer),
                )
            texts = tokenizer.batch_decode(new, skip_special_tokens=True)
            for key, text, tokens in zip(keys, texts, new):
                records[key] = {"key": key, "messages": todo[key] + [{"role": "assistant", "content": text}], "response_ids": tokens}
                out.write(json.dumps(records[key], ensure_ascii=False) + "\n")
            out.flush()
            os.fsync(out.fileno())
            bar.update(len(keys))


def _read_all(cache_path: Path) -> dict[str, dict]:
    records = _read_records(cache_path)
    for partial in _partials(cache_path):
        records |= _read_records(partial)
    return records


def generate_responses(
    model,
    tokenizer,
    examples: Sequence[dict],
    max_new_tokens: int,
    cache_path: str | os.PathLike,
    batch_size: int = 8,
    max_prompt_length: int | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    seed: int = 0,
    keep_topk: int | None = None,
) -> list[dict]:
    """Sequence-level KD: the target answers every prompt once (greedy unless `do_sample`), cached at `cache_path`.

    Finished batches are appended to `<cache_path>.partial`, so a rerun skips what is done; the
    complete JSONL (one chat `messages` line per prompt, the generation as the last turn, readable
    by the `messages` adapter) is written atomically, and `<cache_path>.manifest.json` pins model,
    tokenizer and settings. The per-process partials of `generate_share` are merged in. In a
    distributed run call it on the main process first. `keep_topk` keeps the target's top-k
    log-probs of each greedy step (`distill.training.topk_store`), so the teacher cache needs no second pass."""
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad_token, needed to batch prompts; set tokenizer.pad_token")
    cache_path = Path(cache_path)
    settings = _generation_settings(max_new_tokens, max_prompt_length, do_sample, temperature, seed)
    _check_manifest(Path(f"{cache_path}.manifest.json"), cache_path, _manifest(model, tokenizer, settings))
    records = _read_all(cache_path)
    keyed = {_key(ex["messages"]): ex["messages"] for ex in examples}
    todo = {key: messages for key, messages in keyed.items() if key not in records}
    if todo:
        _answer(
            model,
            tokenizer,
            todo,
            Path(f"{cache_path}.partial"),
            records,
            max_new_tokens,
            batch_size,
            max_prompt_length,
            do_sample,
            temperature,
            seed,
            "seq-KD generation",
            keep_topk,
        )
    if todo or _partials(cache_path) or not cache_path.exists():
        order = list(dict.fromkeys([*keyed, *records]))  # examples' order first
        atomic_write(cache_path, "".join(json.dumps(records[k], ensure_ascii=False) + "\n" for k in order))
        for partial in _partials(cache_path):
            partial.unlink()
    return _responses(examples, records)


def generate_share(spec: DataSpec, tokenizer, model, state: Any, seed: int = 0, keep_topk: int | None = None) -> None:
    """Sequence-level KD split across the processes of a distributed run (`state`: accelerate's
    PartialState): each answers its share of the recipe's train and eval prompts into its own
    `<generation_cache>.partial.<rank>`, so no process waits on one doing all the generation (which
    would outlast the collective timeout); the datasets then built on the main process first merge
    the shares into the cache. Nothing to do in a single process, or when the dataset has the responses."""
    if spec.response_source != "target" or model is None or state.num_processes == 1:
        return
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad_token, needed to batch prompts; set tokenizer.pad_token")
    cache_path = Path(spec.generation_cache)
    if state.is_main_process:
        settings = _generation_settings(spec.generation_max_new_tokens, spec.max_prompt_length)
        _check_manifest(Path(f"{cache_path}.manifest.json"), cache_path, _manifest(model, tokenizer, settings))
    state.wait_for_everyone()
    examples = _recipe_examples(spec, seed, "train") + _recipe_examples(spec, seed, "eval")
    keyed = {_key(ex["messages"]): ex["messages"] for ex in examples}
    mine = {key: messages for key, messages in keyed.items() if int(key[:8], 16) % state.num_processes == state.process_index}
    partial = Path(f"{cache_path}.partial.{state.process_index}")
    records = _read_records(cache_path) | _read_records(partial)
    todo = {key: messages for key, messages in mine.items() if key not in records}
    if todo:
        _answer(
            model,
            tokenizer,
            todo,
            partial,
            records,
            spec.generation_max_new_tokens,
            spec.generation_batch_size,
            spec.max_prompt_length,
            False,
            1.0,
            0,
            f"seq-KD generation, process {state.process_index + 1} of {state.num_processes}",
            keep_topk,
        )
    state.wait_for_everyone()


# --------------------------------------------------------------------------- datasets


def _with_responses(examples: list[dict], spec: DataSpec, tokenizer, target, keep_topk: int | None = None) -> list[dict]:
    if spec.response_source == "target":
        if not spec.generation_cache:
            raise ValueError("data.response_source is 'target': set data.generation_cache to a .jsonl path")
        if target is None:
            return cached_responses(examples, spec, tokenizer)
        return generate_responses(
            target,
            tokenizer,
            examples,
            spec.generation_max_new_tokens,
            spec.generation_cache,
            batch_size=spec.generation_batch_size,
            max_prompt_length=spec.max_prompt_length,
            keep_topk=keep_topk,
        )
    missing = sum(ex["response"] is None for ex in examples)
    if missing:
        raise ValueError(
            f"{missing} of {len(examples)} examples have no response in the dataset; set data.response_source: target to have the target generate them"
        )
    return examples


def _tokenized(examples: list[dict], spec: DataSpec, tokenizer):
    from datasets import Dataset

    rows = [
        tokenize_example(tokenizer, ex["messages"], ex["response"], spec.max_prompt_length, spec.max_length, ex.get("response_ids"))
        for ex in tqdm(examples, desc="tokenizing", unit="example")
    ]
    return Dataset.from_list(rows)


def check_context(spec: DataSpec, model: Any, name: str) -> None:
    """Refuse a `data.max_length` longer than `model`'s context: RoPE runs past the trained
    positions without an error, so the loss would be silently wrong."""
    context = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if context is not None and spec.max_length > context:
        raise ValueError(
            f"data.max_length {spec.max_length} exceeds the {name}'s context of {context} positions: set data.max_length (and max_prompt_length) to at most {context}"
        )


def build_train_dataset(spec: DataSpec, tokenizer, target=None, seed: int = 0, keep_topk: int | None = None):
    """Tokenized training set (`input_ids`, `attention_mask`, `labels`) for `spec`: load, answer
    (dataset or target generations), chat-template and mask. `target` is needed when
    `response_source` is 'target' (and `keep_topk` then keeps its top-k log-probs while it answers)."""
    return _tokenized(_with_responses(_recipe_examples(spec, seed, "train"), spec, tokenizer, target, keep_topk), spec, tokenizer)


def build_eval_dataset(spec: DataSpec, tokenizer, target=None, seed: int = 0, keep_topk: int | None = None):
    """Held-out set from `spec.eval_split` (a split of the dataset, or a local file), `eval_samples`
    rows, tokenized like the training set; None when no eval split is set."""
    if spec.eval_split is None:
        return None
    return _tokenized(_with_responses(_recipe_examples(spec, seed, "eval"), spec, tokenizer, target, keep_topk), spec, tokenizer)


def _recipe_examples(spec: DataSpec, seed: int, which: str) -> list[dict]:
    """The recipe's training rows (of data.dataset, or of each of data.sources its count, source after
    source), or its held-out rows (`eval_split`: a split of the dataset or a local file; none: [])."""
    if which == "train" and spec.sources:
        return [
            ex
            for source, n in zip(spec.sources, source_counts(spec))
            for ex in load_examples(
                source.dataset,
                source.adapter,
                source.split,
                n,
                seed,
                subset=source.subset,
                prompt_templates=source.templates,
                max_article_words=source.max_article_words,
                exclude=source.exclude,
            )
        ]
    if which == "train":
        return load_examples(spec.dataset, spec.adapter, spec.split, spec.num_samples, seed, subset=spec.subset, prompt_template=spec.prompt_template)
    if spec.eval_split is None:
        return []
    if Path(spec.eval_split).suffix.lower() in LOCAL_FORMATS:
        source, split = spec.eval_split, "train"
    else:
        source, split = spec.dataset, spec.eval_split
    return load_examples(source, spec.adapter, split, spec.eval_samples, seed, subset=spec.subset, prompt_template=spec.prompt_template)
