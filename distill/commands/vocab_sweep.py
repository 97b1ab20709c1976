"""`distill bench --vocab-sizes 8192,16384,32768,65536`: the draft's head cut to each K (distill.common.trim,
the K ids most frequent in --vocab-from), and per K the coverage (share of the tokens of the held-out
--coverage-from text inside the set), the cost ratio c with the trimmed head, α and the predicted speedup
at the best k, next to the full-vocabulary draft. The trimmed drafts share every weight but the head
with the draft, so the sweep holds one draft's body."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from distill.common.docs import Block, table
from distill.common.trim import choose_ids, count_tokens, coverage, draft_to_target, trimmed_copy
from distill.speculative.costs import Costs, best_k, measure_costs, measure_costs_many


def parse_sizes(text: str) -> list[int]:
    """'8192,16384' -> [8192, 16384]; ValueError naming the problem."""
    try:
        sizes = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise ValueError(f"--vocab-sizes {text!r}: give comma-separated token counts, e.g. 8192,16384,32768,65536") from None
    if not sizes or sizes[0] < 1:
        raise ValueError(f"--vocab-sizes {text!r}: every size must be at least 1")
    return sizes


def check_sweep(draft: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, sizes: Sequence[int], files: Sequence[str]) -> int:
    """Refuse what the sweep cannot do before anything is timed; returns the vocabulary the sets are cut from."""
    if tokenizer is None:
        raise ValueError("--vocab-sizes counts text with the draft's tokenizer: give a --draft folder that holds one (or use the built-in pair)")
    if draft_to_target(draft) is not None:
        raise ValueError("--vocab-sizes cuts a full-vocabulary draft: give the original draft, not a trimmed one")
    vocab = min(len(tokenizer), draft.get_output_embeddings().weight.shape[0])
    too_big = [k for k in sizes if k > vocab]
    if too_big:
        raise ValueError(f"--vocab-sizes {too_big[0]}: larger than the draft's vocabulary of {vocab} tokens")
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise ValueError(f"{missing[0]}: no such file; --vocab-from and --coverage-from take JSONL or plain-text files")
    return vocab


def vocab_sweep(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    sizes: Sequence[int],
    vocab_from: Sequence[str],
    coverage_from: str,
    *,
    ks: Sequence[int],
    prompt_len: int,
    repeats: int,
    seed: int,
    backend: str,
    alpha: float,
    measure_alpha: Callable[[PreTrainedModel], float] | None = None,
) -> list[dict[str, Any]]:
    """One row per draft (the full one first, then each K): coverage, c, α and the predicted speedup at its
    best k. α is measured per draft with `measure_alpha` when given, else the full draft's `alpha` times the
    coverage (a target token outside the set is never proposed)."""
    vocab = check_sweep(draft, tokenizer, sizes, [*vocab_from, coverage_from])
    rows = draft.get_output_embeddings().weight.shape[0]
    counts = count_tokens(tokenizer, vocab_from, vocab=vocab)
    held = count_tokens(tokenizer, [coverage_from], vocab=vocab)
    drafts: dict[str, PreTrainedModel] = {"full": draft}
    kept: dict[str, torch.Tensor | None] = {"full": None}
    for k in sizes:
        ids, _ = choose_ids(tokenizer, k, counts)
        drafts[f"K={k}"], kept[f"K={k}"] = trimmed_copy(draft, ids), ids
    if backend == "static":  # each static measurement captures its own steps
        costs = {name: measure_costs(target, d, ks=ks, prompt_len=prompt_len, repeats=repeats, seed=seed, backend="static") for name, d in drafts.items()}
    else:  # the target timed once, every draft alternated with it
        costs = measure_costs_many(target, drafts, ks=ks, prompt_len=prompt_len, repeats=repeats, seed=seed)
    hidden = draft.get_output_embeddings().weight.shape[1]
    out = []
    for name, model in drafts.items():
        ids = kept[name]
        cov = 1.0 if ids is None else coverage(held, ids)
        a = measure_alpha(model) if measure_alpha is not None else (alpha if ids is None else alpha * cov)
        c: Costs = costs[name]
        k = best_k(a, c, k_max=max(ks))
        out.append(
            {
                "draft": name,
                "vocab_size": rows if ids is None else ids.numel(),
                "head_weights": hidden * (rows if ids is None else ids.numel()),
                "coverage": cov,
                "coverage_of_counted_text": 1.0 if ids is None else coverage(counts, ids),
                "c": c.c,
                "draft_step_s": c.draft_step_s,
                "target_step_s": c.target_step_s,
                "alpha": a,
                "alpha_source": "measured" if measure_alpha is not None else ("given" if ids is None else "α of the full draft × coverage"),
                "best_k": k,
                "predicted_speedup": c.speedup(a, k),
            }
        )
    return out


def vocab_sweep_blocks(rows: Sequence[dict[str, Any]], vocab_from: Sequence[str], coverage_from: str) -> list[Block]:
    """The sweep's blocks of the bench report: what was kept and measured, then the table."""
    sources = ", ".join(f"`{s}`" for s in vocab_from)
    return [
        f"### Trimmed vocabulary: the head cut to the K ids most frequent in {sources}\n\n"
        f"Coverage: the share of the tokens of `{coverage_from}` inside the kept set. α: {rows[0]['alpha_source'] if rows else ''} "
        "for the full draft; per K as the α column says. Predicted speedup at each draft's best k, from its own c.",
        table(
            ["draft", "head rows", "head weights", "coverage (held-out)", "c", "α", "best k", "predicted speedup"],
            [
                [r["draft"], r["vocab_size"], f"{r['head_weights']:,}", f"{r['coverage']:.2%}", r["c"], r["alpha"], r["best_k"], r["predicted_speedup"]]
                for r in rows
            ],
        ),
    ]
