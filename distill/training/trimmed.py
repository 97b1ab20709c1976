"""Training a draft with a trimmed head (recipe key draft.vocab, distill.common.trim): the kept set chosen
from the training responses (or draft.vocab.count_from), the loss arguments that compare it with the
target on that set (loss.trimmed_vocab), and what its evaluation adds: the teacher's mass outside the set.

renormalise (the default) and other_bucket measured the same within seed noise on the tiny pair, four seeds
at K = 64 and 80 (docs/benchmarks.md, "Trimmed vocabulary"); renormalise needs no extra head row."""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from distill.common import trim

logger = logging.getLogger(__name__)


def response_counts(dataset: Any, vocab: int) -> torch.Tensor:
    """How often each id is a response token (labels != -100) of a tokenized dataset: the tokens the draft
    is trained to propose (the target's own under sequence-level KD)."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for labels in dataset["labels"]:
        ids = torch.tensor([t for t in labels if 0 <= t < vocab], dtype=torch.long)
        counts += torch.bincount(ids, minlength=vocab)
    return counts


def trim_draft(model: Any, spec: Any, mode: str, tokenizer: PreTrainedTokenizerBase, train_dataset: Any) -> Any:
    """Cut the draft's head (in place, under a peft wrapper too) to `spec.size` ids counted in
    `spec.count_from`, or in the training responses; `mode` other_bucket adds its extra row."""
    if trim.draft_to_target(model) is not None:
        raise ValueError("draft.vocab: the draft is already trimmed; start from the original draft, or unset draft.vocab to train this one")
    vocab = len(tokenizer)
    if spec.size > vocab:
        raise ValueError(f"draft.vocab.size: {spec.size} exceeds the tokenizer's {vocab} tokens; keep at most {vocab}")
    if spec.count_from:
        counts, source = trim.count_tokens(tokenizer, spec.count_from), {"count_from": list(spec.count_from)}
    else:
        counts, source = response_counts(train_dataset, vocab), {"count_from": "training responses"}
    if int(counts.sum()) == 0:
        raise ValueError("draft.vocab: no token to count (no response token in the training data); set draft.vocab.count_from")
    ids, info = trim.choose_ids(tokenizer, spec.size, counts)
    trim.trim_head(model, ids, other_row=mode == "other_bucket", info={**source, **info, "trained_with": mode})
    logger.warning(
        "trimmed the draft's head to %d of %d ids: %.2f%% of the counted tokens (%d) are kept",
        spec.size,
        vocab,
        100 * info["coverage_of_counted_text"],
        info["counted_tokens"],
    )
    return model


def loss_kwargs(model: PreTrainedModel, mode: str) -> dict[str, Any]:
    """The `distill.training.losses` arguments of a trimmed draft ({} for a full-vocabulary one)."""
    ids = trim.draft_to_target(model)
    if ids is None:
        return {}
    state = trim.trim_state(model)
    if mode == "other_bucket" and not (state and state.other_row):
        raise ValueError(
            "loss.trimmed_vocab other_bucket: this draft was trimmed without the other row; set draft.vocab (trim it in this run) or use renormalise"
        )
    if mode != "other_bucket" and state and state.other_row:
        raise ValueError("the draft's head has an other row, trained with loss.trimmed_vocab other_bucket: keep that setting")
    return {"draft_to_target": ids, "trimmed_vocab": mode}


@torch.no_grad()
def outside_mass(signal: dict[str, torch.Tensor], mask: torch.Tensor, ids: torch.Tensor, vocab: int, chunk: int) -> torch.Tensor:
    """[sum over the masked positions of the teacher's probability outside the kept ids, count]: exact from
    dense logits; from a top-k teacher, its tail counted as outside (an upper bound)."""
    rows, cols = mask.nonzero(as_tuple=True)
    inside = torch.zeros(vocab, dtype=torch.bool, device=mask.device)
    inside[ids.to(mask.device)] = True
    total = torch.zeros(2, dtype=torch.float64, device=mask.device)
    for c in range(0, len(rows), chunk):
        sel = (rows[c : c + chunk], cols[c : c + chunk])
        if "teacher_logits" in signal:
            p = torch.softmax(signal["teacher_logits"][sel][:, :vocab].float(), -1)
            kept = p[:, inside].sum(-1)
        else:
            p = signal["teacher_topk_logprobs"][sel].float().exp()
            kept = (p * inside[signal["teacher_topk_ids"][sel]]).sum(-1)
        total += torch.stack([(1 - kept).clamp(min=0).double().sum(), torch.tensor(float(len(sel[0])), dtype=torch.float64, device=total.device)])
    return total
