"""A draft whose output layer keeps K of the target's token ids: a trimmed vocabulary (FR-Spec, VocabTrim,
EAGLE-3's draft-to-target map). The input embedding stays whole; only the LM head is cut to K rows.

Row i of a trimmed head scores the target id `draft_to_target[i]` (a non-persistent buffer on the model,
so it follows `.to(device)`); the decoder (`distill.speculative.loop`) maps its proposals through it and
gives every other id probability 0, the training losses (`distill.training.losses`) compare the draft with
the target on the kept ids. A trimmed draft folder holds:

- `model.safetensors`: every weight, the input embedding whole, `lm_head.weight` with K rows (untied);
- `config.json`: the draft's config (vocab_size = its embedding rows) plus `draft_vocab_size: K`;
- `vocab_map.json`: `draft_to_target` and how the set was chosen (the files counted, the coverage);
- `full_lm_head.safetensors`: the untouched full head the rows were cut from (tensor `weight`), so the
  full-vocabulary export (`restore_full_head`: trained kept rows at their ids, original rows elsewhere)
  needs nothing else.

transformers alone refuses such a folder (the head's shape is not vocab_size: a load error, never a silent
random head); `distill.common.models.load_model` loads it through `attach_trimmed_head`.

The kept set: the K ids most frequent in some text tokenized with the draft's tokenizer (`count_tokens`),
special and chat-template tokens always kept (`always_kept`), ties to the lower id, ids never seen filled
in id order (`select_ids`); rows are stored in ascending id order.

While decoding, the set is widened per call by the prompt's own tokens (`PromptRows`, installed by the
decoder): answers copy names and numbers from their question, tokens no count of other text ranks high.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from distill.common.io import atomic_write, read_jsonl, to_json

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MAP_FILE = "vocab_map.json"
FULL_HEAD_FILE = "full_lm_head.safetensors"
CONFIG_KEY = "draft_vocab_size"
BUFFER = "draft_to_target"
# JSONL fields counted by default: the response-like ones (the draft proposes response tokens).
# A row's `response_ids` (the seq-KD generation cache) is counted as ids; `messages`, by its assistant turns.
DEFAULT_FIELDS = ("response", "answer", "completion", "output", "text", "content")
TRIMMED_LOSSES = ("renormalise", "other_bucket")
# Spare head rows a trimmed draft fills with each request's prompt tokens outside its set while decoding (`PromptRows`).
PROMPT_ROWS = 128


class VocabTrimError(ValueError):
    """A trimming request or a trimmed folder that cannot be used; the message names the problem and the fix."""


@dataclass
class TrimState:
    """What a trimmed draft carries besides its K-row head: where its full head is (a CPU tensor for a draft
    trimmed in memory, the folder's file for one loaded), whether the head has an extra "other" row (the
    other-bucket loss trains one; it is dropped when saved) and how the set was chosen."""

    full_head: torch.Tensor | None = None
    full_head_file: Path | None = None
    other_row: bool = False
    info: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# The model side


def _base(model: Any) -> Any:
    """The transformers model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") and hasattr(model, "peft_config") else model


def draft_to_target(model: Any) -> torch.Tensor | None:
    """The [K] map (head row -> target id) of a trimmed draft, on its device; None for a full-vocabulary one."""
    return getattr(_base(model), BUFFER, None) if model is not None else None


def trim_state(model: Any) -> TrimState | None:
    return getattr(_base(model), "vocab_trim", None)


def _check_ids(ids: torch.Tensor, rows: int) -> None:
    if ids.dim() != 1 or ids.numel() == 0:
        raise VocabTrimError(f"the kept ids must be a non-empty list, got shape {list(ids.shape)}")
    if int(ids.min()) < 0 or int(ids.max()) >= rows:
        raise VocabTrimError(f"kept ids must lie in [0, {rows}) (the head's rows); got {int(ids.min())}..{int(ids.max())}")
    if ids.unique().numel() != ids.numel():
        raise VocabTrimError("kept ids repeat: each target id may have one row")


def _plain_head(model: Any) -> torch.nn.Linear:
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        raise VocabTrimError(
            f"the draft's output layer is {type(head).__name__}{' with a bias' if getattr(head, 'bias', None) is not None else ''}: only a plain linear head (Qwen2) can be trimmed"
        )
    return head


def _install(model: Any, weight: torch.Tensor, ids: torch.Tensor, requires_grad: bool) -> None:
    """Set a new bias-free head of `weight`'s rows, the map buffer and the config key (K = len(ids))."""
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        head.weight.copy_(weight)
    head.weight.requires_grad_(requires_grad)
    model.config.tie_word_embeddings = False  # the input embedding stays whole; the head is its own tensor now
    setattr(model.config, CONFIG_KEY, int(ids.numel()))
    model.set_output_embeddings(head)
    model.register_buffer(BUFFER, ids.to(device=weight.device, dtype=torch.long), persistent=False)


def trim_head(model: PreTrainedModel, keep_ids: Sequence[int] | torch.Tensor, *, other_row: bool = False, keep_full: bool = True, info: dict | None = None):
    """Cut `model`'s LM head (in place) to the rows of `keep_ids` (target ids, stored in ascending order),
    untying it from the input embedding first. `other_row` appends one more row (the mean of the dropped
    ones) that the other-bucket loss trains as "any other token"; it never reaches a saved folder.
    `keep_full` keeps a CPU copy of the full head for the full-vocabulary export. Returns the (peft-unwrapped) model."""
    model = _base(model)
    if draft_to_target(model) is not None:
        raise VocabTrimError("the draft is already trimmed: trim its full-vocabulary export or the original draft instead")
    head = _plain_head(model)
    full = head.weight.detach()
    ids = torch.as_tensor(keep_ids, dtype=torch.long).flatten().sort().values
    _check_ids(ids, full.shape[0])
    weight = full[ids.to(full.device)]
    if other_row:
        dropped = torch.ones(full.shape[0], dtype=torch.bool, device=full.device)
        dropped[ids.to(full.device)] = False
        extra = full[dropped].float().mean(0, keepdim=True) if dropped.any() else torch.zeros_like(weight[:1], dtype=torch.float32)
        weight = torch.cat([weight, extra.to(weight.dtype)])
    full_copy = full.to("cpu", copy=True) if keep_full else None
    _install(model, weight, ids, head.weight.requires_grad)
    model.vocab_trim = TrimState(full_head=full_copy, other_row=other_row, info=dict(info or {}))
    return model


def trimmed_copy(model: PreTrainedModel, keep_ids: Sequence[int] | torch.Tensor) -> PreTrainedModel:
    """A trimmed draft sharing every weight but the head with `model` (which stays as it is): for sweeps
    over K that should not hold a copy of the draft per K. Its full head is `model`'s own, not a copy."""
    shared = {id(p): p for p in model.parameters()}
    full = _plain_head(_base(model)).weight.detach()
    trimmed = trim_head(copy.deepcopy(model, memo=shared), keep_ids, keep_full=False)
    trimmed.vocab_trim.full_head = full
    return trimmed


def decode_head_rows(model: Any) -> torch.Tensor:
    """The head's K decoding rows (an other-bucket row, if any, left out)."""
    ids = draft_to_target(model)
    return _base(model).get_output_embeddings().weight[: ids.numel()]


def full_head(model: Any) -> torch.Tensor:
    """The full head the trimmed one was cut from ([V, H]; on the CPU, or shared with the source of a `trimmed_copy`)."""
    state = trim_state(model)
    if state is not None and state.full_head is not None:
        return state.full_head
    if state is not None and state.full_head_file is not None and state.full_head_file.is_file():
        from safetensors.torch import load_file

        return load_file(str(state.full_head_file))["weight"]
    raise VocabTrimError("this trimmed draft carries no full head (no full_lm_head.safetensors): re-trim the original draft to export its full vocabulary")


def restore_full_head(model: PreTrainedModel) -> PreTrainedModel:
    """Turn a trimmed draft (in place) back into a plain full-vocabulary model: the full head with the kept
    (trained) rows at their target ids and the original rows everywhere else. Returns the model."""
    model = _base(model)
    ids = draft_to_target(model)
    if ids is None:
        raise VocabTrimError("the draft is not trimmed: there is nothing to restore")
    rows = decode_head_rows(model).detach()
    weight = full_head(model).to(device=rows.device, dtype=rows.dtype).clone()
    if weight.shape[1] != rows.shape[1]:
        raise VocabTrimError(f"the stored full head has hidden size {weight.shape[1]}, the draft {rows.shape[1]}: it belongs to another model")
    weight[ids] = rows
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        head.weight.copy_(weight)
    model.set_output_embeddings(head)
    del model._buffers[BUFFER]
    if hasattr(model.config, CONFIG_KEY):
        delattr(model.config, CONFIG_KEY)
    model.vocab_trim = None
    return model


def save_trim_files(model: PreTrainedModel, folder: str | os.PathLike) -> None:
    """Beside what `save_pretrained` wrote into `folder`: the map, the full head, and (other-bucket training)
    the head cut back to its K decoding rows."""
    folder = Path(folder)
    ids, state = draft_to_target(model), trim_state(model) or TrimState()
    if ids is None:
        raise VocabTrimError("the draft is not trimmed: it has no map to save")
    full = full_head(model)
    payload = {"format": 1, CONFIG_KEY: int(ids.numel()), "full_vocab_size": int(full.shape[0]), **state.info, BUFFER: ids.tolist()}
    atomic_write(folder / MAP_FILE, to_json(payload))
    target = folder / FULL_HEAD_FILE
    if state.full_head is None and state.full_head_file is not None and state.full_head_file.resolve() == target.resolve():
        pass  # saving over the folder it was loaded from: the file is already there
    else:
        from safetensors.torch import save_file

        atomic_write(target, lambda tmp: save_file({"weight": full.contiguous()}, tmp, metadata={"format": "pt"}))
    _cut_saved_head(folder, int(ids.numel()))


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return sorted({folder / f for f in json.loads(index.read_text())["weight_map"].values()})
    return sorted(p for p in folder.glob("*.safetensors") if p.name != FULL_HEAD_FILE)


def _cut_saved_head(folder: Path, rows: int) -> None:
    """Rewrite the saved `lm_head.weight` to its first `rows` rows when it has more (the other-bucket row)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    for path in _weight_files(folder):
        with safe_open(str(path), framework="pt") as f:
            if "lm_head.weight" not in f.keys() or f.get_slice("lm_head.weight").get_shape()[0] == rows:
                continue
            metadata = f.metadata()
        tensors = load_file(str(path))
        tensors["lm_head.weight"] = tensors["lm_head.weight"][:rows].contiguous()
        atomic_write(path, lambda tmp, t=tensors, m=metadata: save_file(t, tmp, metadata=m))


def is_trimmed_folder(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a trimmed draft (its config.json has draft_vocab_size)."""
    config = Path(folder) / "config.json"
    try:
        return CONFIG_KEY in json.loads(config.read_text())
    except (OSError, ValueError, TypeError):
        return False


def read_map(folder: str | os.PathLike) -> tuple[list[int], dict[str, Any]]:
    """The map and the rest of vocab_map.json of a trimmed folder."""
    path = Path(folder) / MAP_FILE
    try:
        payload = json.loads(path.read_text())
        ids = payload.pop(BUFFER)
    except FileNotFoundError:
        raise VocabTrimError(f"{path}: missing; a trimmed draft folder needs its map (written by `distill trim-vocab` or training)") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise VocabTrimError(f"{path}: unreadable ({err}); write the trimmed draft again") from None
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise VocabTrimError(f"{path}: {BUFFER} must be a list of token ids")
    return ids, payload


def attach_trimmed_head(model: PreTrainedModel, folder: str | os.PathLike) -> PreTrainedModel:
    """After transformers loaded a trimmed folder with its head's size mismatch ignored: check that the head
    is the only weight whose shape differed, then set the K-row head read from the folder and the map."""
    from safetensors import safe_open

    folder = Path(folder)
    ids, info = read_map(folder)
    k = getattr(model.config, CONFIG_KEY)
    if len(ids) != k:
        raise VocabTrimError(f"{folder}: config.json says {CONFIG_KEY} {k} but {MAP_FILE} maps {len(ids)} rows; write the trimmed draft again")
    rows = model.get_input_embeddings().weight.shape[0]
    _check_ids(torch.tensor(ids), rows)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    head = None
    for path in _weight_files(folder):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                shape = tuple(f.get_slice(name).get_shape())
                if name == "lm_head.weight":
                    head = f.get_tensor(name)
                elif name in expected and shape != expected[name]:
                    raise VocabTrimError(
                        f"{path}: {name} has shape {list(shape)}, the config gives {list(expected[name])}: the folder's weights do not fit its config"
                    )
    hidden = model.get_input_embeddings().weight.shape[1]
    if head is None or tuple(head.shape) != (k, hidden):
        got = "none" if head is None else list(head.shape)
        raise VocabTrimError(f"{folder}: lm_head.weight should have {k} rows of {hidden} (the kept vocabulary), got {got}; write the trimmed draft again")
    old = model.get_output_embeddings().weight
    # Trainable as every loaded weight is. A frozen head also cost the decoder dearly: torch's matmul then ran the
    # first draft step's [B, 1, H] slice as a bmm that copies all K rows (+60 ms a round at K = 32k, bf16).
    _install(model, head.to(device=old.device, dtype=old.dtype), torch.tensor(ids), old.requires_grad)
    file = folder / FULL_HEAD_FILE
    model.vocab_trim = TrimState(
        full_head_file=file if file.is_file() else None, info={k: v for k, v in info.items() if k not in ("format", CONFIG_KEY, "full_vocab_size")}
    )
    return model


# --------------------------------------------------------------------------------------------
# Prompt rows: the request's own tokens, added to the kept set while decoding


class PromptRows(torch.nn.Module):
    """A trimmed head with `capacity` spare rows that each request fills (`fill`) with its prompt's tokens
    outside the kept set, their rows gathered from the full head: an answer that copies a name from the
    question can still be proposed. It scores K + capacity rows, unused spare rows at -inf (probability 0);
    `map` [K + capacity] gives each row's target id (unused rows point at id 0). Its one parameter is the
    K-row head's own `weight`, so the state dict, saving and the full-vocabulary export are unchanged."""

    def __init__(self, head: torch.nn.Module, ids: torch.Tensor, full: torch.Tensor, capacity: int):
        super().__init__()
        self.weight, self.kept = head.weight, ids.numel()
        device, dtype = self.weight.device, self.weight.dtype
        self.full = full  # [V, H], where the caller keeps it (a copy per request would cost more than the rows)
        self.in_set = torch.zeros(full.shape[0], dtype=torch.bool)
        self.in_set[ids.cpu()] = True
        self.register_buffer("rows", torch.zeros(capacity, self.weight.shape[1], device=device, dtype=dtype), persistent=False)
        self.register_buffer("bias", torch.full((capacity,), float("-inf"), device=device, dtype=dtype), persistent=False)
        self.register_buffer("map", torch.cat([ids.to(device), torch.zeros(capacity, dtype=torch.long, device=device)]), persistent=False)

    @property
    def capacity(self) -> int:
        return self.rows.shape[0]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        kept = torch.nn.functional.linear(hidden, self.weight[: self.kept])
        return torch.cat([kept, torch.nn.functional.linear(hidden, self.rows) + self.bias], -1)

    def fill(self, prompt_ids: torch.Tensor, vocab: int) -> torch.Tensor:
        """Set the spare rows (in place: buffers of fixed address, so graphs stay valid) to `prompt_extras`
        of `prompt_ids` (every id a request's prompts hold) below `vocab`; returns the ids added."""
        extra = prompt_extras(prompt_ids, self.in_set, min(vocab, self.full.shape[0]), self.capacity)
        n = extra.numel()
        self.rows.zero_()
        self.rows[:n] = self.full[extra.to(self.full.device)].to(device=self.rows.device, dtype=self.rows.dtype)
        self.bias.fill_(float("-inf"))
        self.bias[:n] = 0
        self.map[self.kept :].zero_()
        self.map[self.kept : self.kept + n] = extra.to(self.map.device)
        return extra


def prompt_extras(prompt_ids: torch.Tensor, in_set: torch.Tensor, vocab: int, capacity: int) -> torch.Tensor:
    """The ids a request's prompts add to a kept set (`in_set`: [V] bool): those below `vocab` outside the
    set, the `capacity` most frequent in the prompts (ties to the lower id), ascending."""
    ids = prompt_ids.flatten().cpu()
    counts = torch.bincount(ids[(ids >= 0) & (ids < vocab)], minlength=in_set.numel())[: in_set.numel()]
    counts[in_set] = 0
    order = torch.sort(-counts, stable=True).indices[: min(capacity, int((counts > 0).sum()))]
    return order.sort().values


def prompt_rows(model: Any) -> PromptRows | None:
    """The draft's prompt rows, if `add_prompt_rows` gave it some."""
    head = _base(model).get_output_embeddings() if model is not None else None
    return head if isinstance(head, PromptRows) else None


def add_prompt_rows(model: Any, capacity: int = PROMPT_ROWS) -> PromptRows | None:
    """Give a trimmed draft `capacity` prompt rows for decoding (its head replaced, in place, by a
    `PromptRows` around the same K-row weight; again with another capacity, rebuilt). None, and the draft
    untouched, when it is not trimmed, `capacity` is 0 or it carries no full head to take rows from."""
    base = _base(model) if model is not None else None
    ids = draft_to_target(base)
    if ids is None:
        return None
    head = base.get_output_embeddings()
    if isinstance(head, PromptRows):
        if head.capacity == capacity:
            return head
        base.set_output_embeddings(_plain_linear(head.weight))
        head = base.get_output_embeddings()
    if capacity <= 0:
        return None
    try:
        full = full_head(base)
    except VocabTrimError:
        return None
    rows = PromptRows(head, ids, full, capacity)
    base.set_output_embeddings(rows)
    return rows


def ensure_prompt_rows(model: Any) -> PromptRows | None:
    """The prompt rows decoding will use: those the draft has, else the default `PROMPT_ROWS` added, so that
    a cost measured before any decoder was built times the head the decoder runs."""
    return prompt_rows(model) or add_prompt_rows(model)


def _plain_linear(weight: torch.nn.Parameter) -> torch.nn.Linear:
    """A bias-free Linear around an existing weight (no copy)."""
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    head.weight = weight
    return head


def expand_logits(logits: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """[..., K(+1)] logits of a trimmed head as [..., vocab] logits: -inf at every id outside the set (so
    probability 0 there, as the decoder treats them)."""
    out = logits.new_full((*logits.shape[:-1], vocab), float("-inf"))
    out[..., ids.to(logits.device)] = logits[..., : ids.numel()]
    return out


# --------------------------------------------------------------------------------------------
# Choosing the set


def always_kept(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids a trimmed head always keeps: the special and added tokens, and every token the chat template
    writes around an empty conversation (role names, separators, the default system prompt)."""
    ids = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    if getattr(tokenizer, "chat_template", None):
        chats = [
            ([{"role": "system", "content": ""}, {"role": "user", "content": ""}, {"role": "assistant", "content": ""}], False),
            ([{"role": "user", "content": ""}], True),
        ]
        for messages, prompt in chats:
            try:
                out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=prompt)
            except Exception:  # a template that refuses these turns: its special tokens are kept all the same
                continue
            ids.update(out["input_ids"] if isinstance(out, Mapping) else out)
    return sorted(i for i in ids if isinstance(i, int) and 0 <= i < len(tokenizer))


def _row_items(row: dict, fields: Sequence[str]) -> Iterable[str | list[int]]:
    ids = row.get("response_ids")
    if isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids):
        yield ids
        return
    messages = row.get("messages")
    if isinstance(messages, list):
        turns = [m for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str)]
        answers = [m["content"] for m in turns if m.get("role") == "assistant"] or [m["content"] for m in turns]
        yield from answers
    for name in fields:
        value = row.get(name)
        if isinstance(value, str):
            yield value


def read_token_sources(path: str | os.PathLike, fields: Sequence[str] = DEFAULT_FIELDS) -> list[str | list[int]]:
    """The texts (or token-id lists) of one file: a .jsonl file's `fields` of each row (its `response_ids`
    as ids, its `messages` by their assistant turns), any other file as plain text in blocks of lines."""
    path = Path(path)
    if not path.is_file():
        raise VocabTrimError(f"{path}: no such file; give JSONL or plain-text files to count tokens in")
    if path.suffix.lower() == ".jsonl":
        return [item for row in read_jsonl(path) for item in _row_items(row, fields) if item]
    text = path.read_text(encoding="utf-8", errors="replace")
    lines, blocks = text.splitlines(keepends=True), []
    for start in range(0, len(lines), 256):
        blocks.append("".join(lines[start : start + 256]))
    return [b for b in blocks if b]


def count_tokens(
    tokenizer: PreTrainedTokenizerBase, paths: Sequence[str | os.PathLike], fields: Sequence[str] = DEFAULT_FIELDS, vocab: int | None = None
) -> torch.Tensor:
    """How often each id occurs in the files, tokenized with `tokenizer` (no special tokens added): a
    [vocab] int64 tensor (vocab: the tokenizer's length). A file that yields no token is refused."""
    vocab = vocab or len(tokenizer)
    counts = torch.zeros(vocab, dtype=torch.long)
    for path in paths:
        items = read_token_sources(path, fields)
        texts = [t for t in items if isinstance(t, str)]
        ids = [i for t in items if isinstance(t, list) for i in t]
        for start in range(0, len(texts), 512):
            for row in tokenizer(texts[start : start + 512], add_special_tokens=False)["input_ids"]:
                ids.extend(row)
        if not ids:
            where = (
                f"none of the fields {', '.join(fields)}, response_ids or messages holds text" if Path(path).suffix.lower() == ".jsonl" else "it holds no text"
            )
            raise VocabTrimError(f"{path}: no tokens to count ({where}); give a file with text in it")
        t = torch.tensor(ids, dtype=torch.long)
        counts += torch.bincount(t[(t >= 0) & (t < vocab)], minlength=vocab)
    return counts


def select_ids(counts: torch.Tensor, size: int, forced: Iterable[int] = (), vocab: int | None = None) -> torch.Tensor:
    """The `size` ids to keep, ascending: every `forced` id, then the most frequent others (ties to the lower
    id; ids never counted come last, in id order). `vocab` bounds the ids (default: len(counts))."""
    vocab = vocab or counts.numel()
    if not 0 < size <= vocab:
        raise VocabTrimError(f"a kept vocabulary of {size} tokens: it must be between 1 and the vocabulary's {vocab} tokens")
    forced = sorted({int(i) for i in forced if 0 <= int(i) < vocab})
    if size < len(forced):
        raise VocabTrimError(
            f"a kept vocabulary of {size} tokens is smaller than the {len(forced)} special and chat-template tokens always kept: keep at least {len(forced)}"
        )
    order = torch.sort(-counts[:vocab], stable=True).indices
    taken = torch.zeros(vocab, dtype=torch.bool)
    taken[forced] = True
    rest = order[~taken[order]][: size - len(forced)]
    taken[rest] = True
    return taken.nonzero().squeeze(-1)


def coverage(counts: torch.Tensor, ids: torch.Tensor) -> float:
    """The share of the counted tokens that the kept `ids` cover."""
    total = int(counts.sum())
    return float(counts[ids].sum()) / total if total else 0.0


def choose_ids(tokenizer: PreTrainedTokenizerBase, size: int, counts: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """The kept ids for `size` from token `counts`, and what vocab_map.json records about the choice."""
    forced = always_kept(tokenizer)
    ids = select_ids(counts, size, forced, vocab=len(tokenizer))
    return ids, {"counted_tokens": int(counts.sum()), "coverage_of_counted_text": coverage(counts, ids), "always_kept": len(forced)}
