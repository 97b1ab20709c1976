"""The two acceptance rules of speculative decoding: greedy matching and lossless rejection
sampling (Leviathan et al., 2023; Chen et al., 2023), plus the logit warping both models share.

Sampling takes its uniforms as a tensor instead of a generator, so the same rule runs eagerly,
inside a CUDA graph and inside a torch.compile graph (the loop draws the uniforms outside them)."""

from __future__ import annotations

import torch


def warp(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """Probabilities after temperature and nucleus (top-p) filtering, as `generate` applies them."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p; the first token always stays.
        drop = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of `probs` [..., V] (any non-negative weights) by inverting its CDF at the
    uniforms `u` [...] in [0, 1): token i is drawn with probability probs_i / sum(probs)."""
    cdf = probs.cumsum(-1)
    point = (u * cdf[..., -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, point, right=True).squeeze(-1).clamp_max(probs.shape[-1] - 1)


def greedy_accept(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept the longest prefix of `draft_tokens` [B, k] that the target's argmax agrees with.

    `target_logits` [B, k+1, V] are the target's logits after the last emitted token and after
    each draft token. Returns (n accepted per row [B], the target's own next token [B])."""
    target_tokens = target_logits.argmax(-1)
    n = (draft_tokens == target_tokens[:, :-1]).int().cumprod(-1).sum(-1)
    return n, target_tokens.gather(1, n[:, None]).squeeze(1)


def rejection_accept(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless rejection sampling: keep draft token j with probability min(1, p_j/q_j); at the
    first rejection draw from norm(max(0, p - q)); if all k pass, draw a bonus token from p_{k+1}.

    draft_tokens [B, k] were drawn from q [B, k, V]; p [B, k+1, V] is the target's distribution;
    u [B, k+1] are uniforms (k acceptance tests, then the draw of the next token).
    Returns (n accepted per row [B], the next token [B]); the output follows p exactly."""
    k = draft_tokens.shape[1]
    idx = draft_tokens[..., None]
    p_d, q_d = p[:, :k].gather(-1, idx).squeeze(-1), q.gather(-1, idx).squeeze(-1)
    n = (u[:, :k] * q_d <= p_d).int().cumprod(-1).sum(-1)
    at_n = n[:, None, None].expand(-1, 1, p.shape[-1])
    p_n = p.gather(1, at_n).squeeze(1)
    q_n = torch.cat([q, q.new_zeros(q.shape[0], 1, q.shape[-1])], 1).gather(1, at_n).squeeze(1)  # q = 0 past k: bonus
    residual = (p_n - q_n).clamp_min(0.0)
    # A rejection implies p < q at the draft token, so mass remains; this guards only rounding.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)
    return n, sample(residual, u[:, k])
