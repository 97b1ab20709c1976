"""Selective distillation (AdaSPEC; Hu et al., "Selective Knowledge Distillation for Efficient
Speculative Decoders", NeurIPS 2025): train the draft only on the tokens it can learn.

A *reference* draft, distilled first with plain KD, shows how low the loss of each token can go at
the draft's size. Per batch, the tokens where the reference's loss fell furthest below the current
draft's (largest draft − reference) are the learnable ones; the loss is taken on the top
`keep_fraction` of the batch's response tokens only, and the rest, which a small draft would spend
its capacity on without ever matching, are left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from distill.training import losses

LogitsAt = Callable[[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]


@torch.no_grad()
def token_losses(
    name: str,
    logits_at: LogitsAt,
    signal: dict[str, torch.Tensor],
    mask: torch.Tensor,
    *,
    vocab_size: int,
    temperature: float = 1.0,
    beta: float = 0.5,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """[B, T] float32: the divergence of each masked token (0 elsewhere) between a model's logits,
    given `chunk_size` positions at a time by `logits_at((rows, cols))`, and the teacher `signal`
    (dense `teacher_logits` or cached `teacher_topk_ids`/`teacher_topk_logprobs`, each [B, T, ·])."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows, cols = mask.nonzero(as_tuple=True)
    for c in range(0, len(rows), chunk_size):
        sel = (rows[c : c + chunk_size], cols[c : c + chunk_size])
        teacher = {key: signal[key][sel] for key in ("teacher_logits", "teacher_topk_ids", "teacher_topk_logprobs") if key in signal}
        out[sel] = losses.token_divergence(name, logits_at(sel), temperature=temperature, beta=beta, vocab_size=vocab_size, **teacher).float()
    return out


def select_tokens(draft_loss: torch.Tensor, reference_loss: torch.Tensor, mask: torch.Tensor, keep_fraction: float) -> torch.Tensor:
    """The mask of the ceil(keep_fraction × n) tokens, of the n in `mask`, with the largest
    draft_loss − reference_loss (ties: the earlier position first). Nothing outside `mask` (prompt,
    padding) is ever selected; keep_fraction 1 keeps `mask` as it is."""
    if not 0 < keep_fraction <= 1:
        raise ValueError(f"keep_fraction={keep_fraction} must be in (0, 1]")
    flat = mask.reshape(-1)
    positions = flat.nonzero().squeeze(-1)
    keep = math.ceil(keep_fraction * len(positions))
    gap = (draft_loss.reshape(-1) - reference_loss.reshape(-1))[positions]
    order = torch.sort(gap, descending=True, stable=True).indices[:keep]
    selected = torch.zeros_like(flat)
    selected[positions[order]] = True
    return selected.reshape(mask.shape)


def logits_at(model: torch.nn.Module, inputs: dict[str, torch.Tensor], fused: bool) -> LogitsAt:
    """A function giving `model`'s logits at chosen positions of the batch: from its hidden states and
    LM head, chunk by chunk (`fused`), or from its full logits (a head that only exists in its own
    forward, as under ZeRO-3)."""
    with torch.no_grad():
        if fused:
            causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
            hidden = causal_lm.base_model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False).last_hidden_state
            weight = causal_lm.get_output_embeddings().weight
            return lambda sel: hidden[sel] @ weight.T
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False).logits
        return lambda sel: logits[sel]


class TokenSelection:
    """AdaSPEC for a trainer: the frozen reference draft and the fraction to keep. `select` gives a
    batch's loss mask; `kept` counts what was kept since the last `take_stats`."""

    def __init__(self, reference: torch.nn.Module, keep_fraction: float, fused: bool):
        self.reference, self.keep_fraction, self.fused = reference, keep_fraction, fused
        self._kept = torch.zeros(2, dtype=torch.float64)

    def select(
        self, draft_logits_at: LogitsAt, inputs: dict[str, torch.Tensor], signal: dict[str, torch.Tensor], mask: torch.Tensor, loss_spec: Any, vocab_size: int
    ) -> torch.Tensor:
        """The subset of `mask` the loss is taken on in this batch."""
        options = dict(vocab_size=vocab_size, temperature=loss_spec.temperature, beta=loss_spec.beta, chunk_size=loss_spec.chunk_size)
        draft = token_losses(loss_spec.divergence, draft_logits_at, signal, mask, **options)
        reference = token_losses(loss_spec.divergence, logits_at(self.reference, inputs, self.fused), signal, mask, **options)
        selected = select_tokens(draft, reference, mask, self.keep_fraction)
        self._kept += torch.tensor([float(selected.sum()), float(mask.sum())], dtype=torch.float64)
        return selected

    def take_stats(self) -> float | None:
        """The share of response tokens kept since the last call (None when none were seen)."""
        kept, seen = self._kept.tolist()
        self._kept.zero_()
        return kept / seen if seen else None
