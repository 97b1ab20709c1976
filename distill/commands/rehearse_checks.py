"""The rehearsal's checks: what each `distill rehearse` step verifies, read from what the step wrote.

Every `check_*` function appends one line to `checks` for each property that holds and raises
RehearsalError naming the first that does not: the real tokenizer and stand-in shapes, the training
data's template, masking and stops, finite losses and ZeRO-2 losses equal to the plain run's, a
teacher cache over real ids only, greedy identity (acceptance, the published draft under
`assistant_model=`, the bundled SpeculativeDecoder), generation stopping at <|im_end|>, no padding id
ever emitted or proposed, published configs and model cards, and a draft with another tokenizer refused.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from distill.common.io import read_jsonl
from distill.common.models import load_model, load_tokenizer
from distill.common.vocab import cut_at_eos

REAL_VOCAB = 151_665  # len(tokenizer) of Qwen2.5-Instruct
TARGET_VOCAB, DRAFT_VOCAB = 152_064, 151_936  # config vocab_size of the 7B target and of the 0.5B/1.5B drafts
IM_END, ENDOFTEXT = 151_645, 151_643
SYSTEM_PROMPT = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
# Greedy decoding with the sampling extras of the checkpoint's generation_config.json switched off.
GREEDY = {"do_sample": False, "repetition_penalty": 1.0, "top_k": None, "top_p": None, "temperature": None}


class RehearsalError(RuntimeError):
    """A rehearsal step failed or a check a user relies on did not hold."""


def check(condition: bool, what: str, checks: list[str]) -> None:
    """Record `what` as checked, or stop the rehearsal saying it does not hold."""
    if not condition:
        raise RehearsalError(f"check failed: {what}")
    checks.append(what)


def check_ids(rows: Sequence[Sequence[int]], where: str, checks: list[str], max_new_tokens: int | None = None) -> None:
    """Every id is a real token (< 151,665); with `max_new_tokens`, every row that ended early ended
    at <|im_end|>, nothing follows it, and at least one row did stop (so stopping was exercised)."""
    bad = sorted({t for row in rows for t in row if t >= REAL_VOCAB})
    check(not bad, f"{where}: no id >= {REAL_VOCAB} emitted" + (f" (found {bad[:5]})" if bad else ""), checks)
    if max_new_tokens is None:
        return
    short = [list(row) for row in rows if len(row) < max_new_tokens]
    ok = bool(short) and all(row[-1] == IM_END and IM_END not in row[:-1] for row in short)
    check(ok, f"{where}: generation stops at <|im_end|> ({len(short)}/{len(rows)} rows stopped early)", checks)


# --------------------------------------------------------------------------------------------- stand-ins and data


def check_tokenizer(tok: Any, checks: list[str]) -> None:
    """The tokenizer is the real Qwen2.5-Instruct one: 151,665 tokens, <|im_end|> as eos, <|endoftext|> as pad."""
    check(
        len(tok) == REAL_VOCAB and tok.eos_token_id == IM_END and tok.pad_token_id == ENDOFTEXT,
        f"real tokenizer: {len(tok):,} tokens, eos <|im_end|> {tok.eos_token_id}, pad <|endoftext|> {tok.pad_token_id}",
        checks,
    )


def check_standin(name: str, folder: Path, real: dict[str, Any], checks: list[str]) -> None:
    """The stand-in written to `folder` keeps the real config's vocab_size, tying and head ratio, the shapes the paths depend on."""
    cfg = json.loads((folder / "config.json").read_text())
    same = all(cfg[k] == real[k] for k in ("vocab_size", "tie_word_embeddings"))
    ratio = cfg["num_attention_heads"] / cfg["num_key_value_heads"] == real["num_attention_heads"] / real["num_key_value_heads"]
    check(
        same and ratio,
        f"{name} stand-in: vocab_size {cfg['vocab_size']:,}, tied {cfg['tie_word_embeddings']}, "
        f"heads {cfg['num_attention_heads']}/{cfg['num_key_value_heads']} as the real ratio, hidden {cfg['hidden_size']}, "
        f"{cfg['num_hidden_layers']} layer(s)",
        checks,
    )


def check_training_data(rows: Sequence[dict[str, Any]], tok: Any, cut: int, max_length: int, checks: list[str]) -> None:
    """Training examples carry the Instruct template, mask the prompt, and end at <|im_end|> unless cut at `cut` new tokens or `max_length`."""
    texts = [tok.decode(r["input_ids"]) for r in rows]
    check(
        all(t.startswith(SYSTEM_PROMPT + "<|im_start|>user\n") for t in texts),
        "training prompts carry the Instruct template and its default system prompt",
        checks,
    )
    starts = [r["labels"].index(next(x for x in r["labels"] if x != -100)) for r in rows]
    check(
        all(tok.decode(r["input_ids"][:s]).endswith("<|im_start|>assistant\n") for r, s in zip(rows, starts)),
        "the loss starts right after `<|im_start|>assistant\\n` (prompt masked)",
        checks,
    )
    check(
        all(r["labels"][-1] == IM_END or sum(x != -100 for x in r["labels"]) >= cut or len(r["input_ids"]) >= max_length for r in rows),
        f"every response ends with <|im_end|> (151645) in the labels, or runs to the {cut}-token generation limit verbatim",
        checks,
    )


# --------------------------------------------------------------------------------------------- training


def _train_loss(run_dir: Path) -> float:
    """The train loss a run recorded in its run_info.json."""
    return json.loads((run_dir / "run_info.json").read_text())["metrics"]["train_loss"]


def check_run(runs: Path, run: str, checks: list[str], lora: bool = False, same_as: str | None = None) -> None:
    """Run `runs/run` trained: a finite loss, a held-out eval, a full saved draft with the real vocab_size;
    with `same_as`, it ran under DeepSpeed and its loss is within 1% of that plain run's."""
    out = runs / run
    info = json.loads((out / "run_info.json").read_text())
    loss = info["metrics"].get("train_loss")
    check(loss is not None and 0 < loss < float("inf"), f"finite train loss {loss:.4g}", checks)
    check(
        "eval_expected_acceptance" in info["metrics"],
        f"held-out eval ran (expected acceptance {info['metrics'].get('eval_expected_acceptance', 0):.3g})",
        checks,
    )
    cfg = json.loads((out / "draft" / "config.json").read_text())
    if lora:
        check(not (out / "draft" / "adapter_config.json").exists(), "LoRA merged on save (a full model in draft/)", checks)
    check(cfg["vocab_size"] == DRAFT_VOCAB, f"saved draft keeps vocab_size {cfg['vocab_size']:,}", checks)
    if same_as is not None:
        check(info["deepspeed"] is True, "ran under DeepSpeed (ZeRO-2)", checks)
        losses = [_train_loss(runs / r) for r in (run, same_as)]
        check(abs(losses[0] - losses[1]) <= 1e-2 * abs(losses[1]), f"train loss {losses[0]:.6g} within 1% of the plain run's {losses[1]:.6g}", checks)


def check_cache(cache_dir: Path, expected: int, checks: list[str]) -> None:
    """cache-teacher: the target answered all `expected` prompts, and its top-k cache holds real ids only, as a sub-distribution."""
    from distill.training.teacher import TeacherCache

    gens = read_jsonl(cache_dir / "chat-generations.jsonl")
    check(
        len(gens) == expected and all(g["messages"][-1]["role"] == "assistant" for g in gens),
        f"seq-KD: the target answered all {len(gens)} prompts",
        checks,
    )
    cache = TeacherCache(cache_dir / "teacher-top32/train")
    _, ids, lps = cache.example(0)
    check(
        cache.manifest["vocab_size"] == REAL_VOCAB and int(ids.max()) < REAL_VOCAB,
        f"top-{cache.top_k} cache over the real vocabulary only (max id {int(ids.max())} < {REAL_VOCAB})",
        checks,
    )
    check(bool(torch.all(lps.exp().sum(-1) <= 1 + 1e-4)), "cached log-probs are a sub-distribution", checks)


# --------------------------------------------------------------------------------------------- evaluation


def gsm8k_chats(gsm8k_dir: Path, n: int) -> list[list[dict[str, str]]]:
    """The first `n` GSM8K test questions as chat messages, the prompts every generation check uses."""
    from distill.eval.tasks import gsm8k

    return [ex.messages for ex in gsm8k.load(gsm8k_dir / "test.jsonl", num_samples=n)]


def check_acceptance(accept_dir: Path, target_dir: str, gsm8k_dir: Path, max_new: int, checks: list[str]) -> None:
    """eval/acceptance.py: real ids and stops in every generation, greedy identity for every draft, GSM8K prompts in the Instruct template."""
    report = json.loads((accept_dir / "report.json").read_text())
    calls = [r for r in read_jsonl(accept_dir / "records.jsonl")[1:] if "key" in r]  # the journal's generate calls, not its run lines
    check_ids([row for r in calls for row in r["new"]], "GSM8K generations (target-only and speculative)", checks, max_new)
    for name, entry in report["drafts"].items():
        row = entry["tasks"]["gsm8k"]
        check(row["greedy_identity"] == 1.0, f"{name}: greedy identity {row['greedy_identity']:.0%} (acceptance {row['acceptance_rate']:.1%})", checks)
    tok = load_tokenizer(target_dir)
    text = tok.apply_chat_template(gsm8k_chats(gsm8k_dir, 1)[0], add_generation_prompt=True, tokenize=False)
    check(text.startswith(SYSTEM_PROMPT) and text.endswith("<|im_start|>assistant\n"), "GSM8K prompts carry the Instruct template", checks)


def check_bench(bench_json: Path, checks: list[str]) -> None:
    """`distill bench` measured a positive target cost c and a positive draft cost v(k) for every k."""
    costs = json.loads(bench_json.read_text())["costs"]
    check(costs["c"] > 0 and all(v > 0 for v in costs["v"].values()), f"c = {costs['c']:.3g}, v(k) {costs['v']}", checks)


# --------------------------------------------------------------------------------------------- greedy identity


def _encode(tok: Any, chat: list[dict[str, str]]) -> dict[str, torch.Tensor]:
    """`chat` in the Instruct template with the assistant's turn opened, as model inputs."""
    return tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)


def _new_ids(model: Any, enc: dict[str, torch.Tensor], **kwargs: Any) -> list[int]:
    """The ids `model.generate` adds after the prompt `enc`."""
    return model.generate(**enc, **kwargs)[0, enc["input_ids"].shape[1] :].tolist()


@contextlib.contextmanager
def recording_candidates(proposed: list[int]) -> Iterator[None]:
    """Within the block, every candidate id transformers' assisted generation takes from the
    assistant is appended to `proposed` (the wrapped `get_candidates` is restored after)."""
    from transformers.generation import candidate_generator as cg

    classes = (cg.AssistedCandidateGenerator, cg.AssistedCandidateGeneratorDifferentTokenizers)
    originals = [cls.__dict__["get_candidates"] for cls in classes]

    def wrap(original: Callable) -> Callable:
        """`original` that also records the candidate ids it returns."""

        def get_candidates(self: Any, input_ids: torch.LongTensor, **kwargs: Any) -> Any:
            """The wrapped generator's candidates, their new ids recorded."""
            ids, logits = original(self, input_ids, **kwargs)
            proposed.extend(ids[:, input_ids.shape[1] :].flatten().tolist())
            return ids, logits

        return get_candidates

    for cls, original in zip(classes, originals):
        cls.get_candidates = wrap(original)
    try:
        yield
    finally:
        for cls, original in zip(classes, originals):
            cls.get_candidates = original


def _check_model_card(card: str, target: Any, draft: Any, enc: dict[str, torch.Tensor], padded: bool, checks: list[str]) -> None:
    """The model card's snippet works as written: plain `assistant_model=` when padded to the target's
    vocab_size, else tokenizer= and assistant_tokenizer=, since transformers refuses unequal sizes."""
    if padded:
        check("assistant_tokenizer" not in card, "the model card's snippet is the plain assistant_model=draft", checks)
        return
    try:
        target.generate(**enc, assistant_model=draft, max_new_tokens=2)
    except ValueError as err:
        refused = "different tokenizers" in str(err)
    else:
        refused = False
    check(
        refused and "assistant_tokenizer=tokenizer" in card,
        "plain assistant_model= refuses unequal vocab sizes (transformers), so the model card's snippet passes tokenizer= and assistant_tokenizer=",
        checks,
    )


def check_published(folder: Path, target_dir: str, gsm8k_dir: Path, padded: bool, max_new: int, checks: list[str]) -> None:
    """scripts/publish.py's folder: its vocab_size, it loads, its model card's snippet works, and as
    `assistant_model=` it gives the target's greedy output, stops, and never proposes a padding id."""
    cfg = json.loads((folder / "config.json").read_text())
    want = TARGET_VOCAB if padded else DRAFT_VOCAB
    check(cfg["vocab_size"] == want, f"config.json vocab_size {cfg['vocab_size']:,}" + (" = the target's (vLLM draft_model)" if padded else ""), checks)
    draft = load_model(folder, dtype=None)
    target = load_model(target_dir, dtype=None)
    check(isinstance(draft, PreTrainedModel), "loads with AutoModelForCausalLM", checks)
    tok = load_tokenizer(folder)
    prompts = [_encode(tok, chat) for chat in gsm8k_chats(gsm8k_dir, 2)]
    extra = {} if padded else {"tokenizer": tok, "assistant_tokenizer": tok}
    ref = [_new_ids(target, enc, max_new_tokens=max_new, **GREEDY) for enc in prompts]
    proposed: list[int] = []
    with recording_candidates(proposed):
        spec = [_new_ids(target, enc, assistant_model=draft, max_new_tokens=max_new, **GREEDY, **extra) for enc in prompts]
    _check_model_card((folder / "README.md").read_text(), target, draft, prompts[-1], padded, checks)
    how = "assistant_model=draft" if padded else "assistant_model=draft with tokenizer= and assistant_tokenizer= (vocab sizes differ)"
    check(spec == ref, f"`target.generate({how})` gives the target's own greedy output", checks)
    check_ids(spec, "assistant_model= output", checks, max_new)
    bad = sorted({t for t in proposed if t >= REAL_VOCAB})
    check(
        bool(proposed) and not bad,
        f"as assistant_model the published draft proposed {len(proposed)} ids, none >= {REAL_VOCAB}" + (f" (proposed {bad[:5]})" if bad else ""),
        checks,
    )


def check_decoder(target_dir: str, draft_dir: Path, gsm8k_dir: Path, max_new: int, checks: list[str]) -> None:
    """The bundled SpeculativeDecoder with the trained draft and the real template: greedy identity
    with target.generate, stops at <|im_end|>, and the draft (adversarial padding rows) fed only real ids."""
    from distill.speculative import SpeculativeDecoder

    target = load_model(target_dir, dtype=None)
    draft = load_model(draft_dir, dtype=torch.float32)
    tok = load_tokenizer(target_dir)
    fed: list[int] = []
    draft.get_input_embeddings().register_forward_hook(lambda m, inp, out: fed.extend(inp[0].flatten().tolist()))
    decoder = SpeculativeDecoder(target, draft, num_draft_tokens=4, tokenizer=tok, draft_tokenizer=tok)
    ref, spec = [], []
    for chat in gsm8k_chats(gsm8k_dir, 2):
        enc = _encode(tok, chat)
        n = enc["input_ids"].shape[1]
        ref.append(_new_ids(target, enc, max_new_tokens=max_new, eos_token_id=IM_END, pad_token_id=ENDOFTEXT, **GREEDY))
        out = decoder.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=max_new, eos_token_id=IM_END, pad_token_id=ENDOFTEXT)
        spec.append(cut_at_eos(out.sequences[0, n:].tolist(), {IM_END}))
    check(spec == [cut_at_eos(r, {IM_END}) for r in ref], "SpeculativeDecoder greedy output equals target.generate (2 GSM8K chats)", checks)
    check_ids(spec, "SpeculativeDecoder output", checks, max_new)
    check(max(fed) < REAL_VOCAB, f"the draft (adversarial padding rows) never proposed an id >= {REAL_VOCAB} ({len(fed)} ids fed to it)", checks)


# --------------------------------------------------------------------------------------------- refusals


def check_refused(name: str, run: subprocess.CompletedProcess, checks: list[str]) -> None:
    """Command `name`, given a draft with another tokenizer, failed saying "tokenizers disagree"."""
    said = (run.stdout + run.stderr)[-3000:]
    check(run.returncode != 0 and "tokenizers disagree" in said, f'{name} refuses a draft with another tokenizer ("tokenizers disagree")', checks)
