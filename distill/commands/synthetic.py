"""A draft whose proposals the target accepts at a controlled rate, and the runs that measure the
acceptance → speedup curve with it.

`SyntheticDraft` wraps a real draft (so a step costs what the real draft's step costs) and
proposes the target's own greedy token with probability α per position, so the real verification
loop can be timed at any acceptance for any model shape (random weights of Qwen2.5-7B / 0.5B
shape) without training. `run_synthetic` and `synthetic_sweep` time it against target-only
decoding through the same loop (`backend`: eager, or static caches with CUDA graphs) and set the
measured speedup beside the one the cost model (`distill.speculative.costs`) predicts.
`distill bench` (`distill.commands.bench`) reports them."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache, PreTrainedModel

from distill.speculative import SpecStats, SpeculativeDecoder
from distill.speculative.costs import (
    Costs,
    check_alpha,
    context_length,
    expected_tokens_per_round,
    fit_alpha,
    measure_costs,
    model_device,
    resolve_backend,
    synchronize,
)
from distill.speculative.loop import SpecLoop, target_only_generate

# ---------------------------------------------------------------------------------------------
# A draft with controlled acceptance


class SyntheticDraft(torch.nn.Module):
    """A real draft whose greedy proposals the target accepts at a controlled rate `alpha`.

    Runs the wrapped draft's forward (so a step costs what the real draft's step costs), then
    replaces its logits: the proposal for position q is the target's own greedy token there with
    probability `alpha`, independently per position (a seeded draw per row and position, fixed at
    construction), and a different token otherwise. `target_continuations` holds, per row, the
    target's full greedy sequence (prompt + output, unpadded). Query positions come from
    `position_ids`, else `cache_position`, else the cache length (pass tensors under CUDA graphs).
    Greedy decoding only: under sampling, one-hot proposals are accepted at the target's
    probability of them, not at alpha. The batch's rows are the continuations' rows (all of them,
    or those chosen with `use_rows`) and must stay in the batch: decode one prompt per call or
    ignore EOS (eos_token_id=[]), since the wrapper follows rows by index."""

    def __init__(self, draft: PreTrainedModel, target_continuations: Sequence[torch.Tensor] | torch.Tensor, alpha: float, seed: int = 0):
        super().__init__()
        rows = [torch.as_tensor(c).reshape(-1).long().cpu() for c in target_continuations]
        if not rows or min(len(r) for r in rows) < 2:
            raise ValueError("target_continuations must hold, per row, the target's greedy sequence (at least 2 tokens)")
        truth = torch.stack([torch.cat([r, r[-1:].expand(max(map(len, rows)) - len(r))]) for r in rows])
        self.draft, self._rows = draft, None
        self._draws = torch.rand(truth.shape, generator=torch.Generator().manual_seed(seed))  # one per row and position
        self.register_buffer("truth", truth.to(model_device(draft)), persistent=False)
        self.register_buffer("table", torch.empty_like(self.truth), persistent=False)  # every row's proposal per position
        self.register_buffer("proposals", torch.empty_like(self.truth), persistent=False)  # the rows of the current batch
        self.set_alpha(alpha)

    def set_alpha(self, alpha: float) -> None:
        """Re-set the acceptance rate in place (same draws: a higher α only adds hits), so one decoder
        and its captured graphs serve a whole sweep over α."""
        check_alpha(alpha)
        self.alpha = alpha
        width = self.draft.config.get_text_config().vocab_size  # the draft's logits; a target token past it cannot be proposed
        truth, hit = self.truth, self._draws.to(self.truth.device) < alpha
        wrong = torch.where(truth >= width, 0, torch.where(truth > 0, truth - 1, 1))
        self.table.copy_(torch.where(hit & (truth < width), truth, wrong))
        self.use_rows(range(len(truth)) if self._rows is None else self._rows)

    def use_rows(self, rows: Iterable[int]) -> None:
        """Let the next batch's rows be these continuations (e.g. [i] to decode prompt i alone). For
        an unchanged batch size the copy is in place, so a captured CUDA graph stays valid."""
        self._rows = list(rows)
        picked = self.table[torch.as_tensor(self._rows, dtype=torch.long, device=self.table.device)]
        if picked.shape == self.proposals.shape:
            self.proposals.copy_(picked)
        else:
            self.proposals = picked

    @property
    def config(self):
        return self.draft.config

    @property
    def generation_config(self):
        return self.draft.generation_config

    @property
    def dtype(self) -> torch.dtype:
        return self.draft.dtype

    @property
    def device(self) -> torch.device:
        return model_device(self.draft)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.draft.get_input_embeddings()

    def get_output_embeddings(self) -> torch.nn.Module | None:
        return self.draft.get_output_embeddings()

    def forward(self, input_ids: torch.LongTensor, position_ids: torch.LongTensor | None = None, cache_position: torch.LongTensor | None = None, **kwargs):
        """The wrapped draft's output with logits one-hot at the synthetic proposal of each kept position."""
        batch, length = input_ids.shape
        if batch != self.proposals.shape[0]:
            raise ValueError(
                f"SyntheticDraft holds {self.proposals.shape[0]} rows but got a batch of {batch}: pick the batch's "
                "continuations with use_rows(), and pass eos_token_id=[] so that no row leaves the batch early (EOS)."
            )
        given = {name: value for name, value in (("position_ids", position_ids), ("cache_position", cache_position)) if value is not None}
        start = 0
        if not given:  # positions follow the cache: read its length before the forward appends
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            start = cache.get_seq_length() if cache is not None else 0
        out = self.draft(input_ids=input_ids, **given, **kwargs)
        keep = out.logits.shape[1]
        if position_ids is not None:
            pos = position_ids[:, -keep:].expand(batch, -1)
        elif cache_position is not None:
            pos = cache_position[-keep:][None].expand(batch, -1)
        else:
            pos = torch.arange(start + length - keep, start + length, device=input_ids.device)[None].expand(batch, -1)
        nxt = (pos + 1).clamp(max=self.proposals.shape[1] - 1)
        tokens = self.proposals.gather(1, nxt)
        out.logits = torch.zeros_like(out.logits).scatter_(-1, tokens[..., None], 1.0)
        return out


# ---------------------------------------------------------------------------------------------
# Target-only baseline and the synthetic runs


@dataclass
class TargetBaseline:
    """Target-only greedy decoding of each prompt: the reference sequences ([1, prompt + new]) and
    their times (median over repeats); `backend` the loop used, and `decode` (ids -> (sequence,
    wall_s, ttft_s)) that loop, warm, so synthetic runs can re-time it next to their own."""

    sequences: list[torch.LongTensor]
    wall_s: list[float]
    ttft_s: list[float]
    backend: str = "eager"
    decode: Callable[[torch.LongTensor], tuple[torch.LongTensor, float, float]] | None = field(default=None, repr=False)


@torch.inference_mode()
def greedy_decode(target: PreTrainedModel, input_ids: torch.LongTensor, max_new_tokens: int) -> tuple[torch.LongTensor, float, float]:
    """Target-only greedy decoding with a KV cache, one forward per token as the eager decoder calls
    the target, EOS ignored (exactly `max_new_tokens`). Returns (sequence, wall_s, ttft_s)."""
    device = input_ids.device
    synchronize(device)
    start = time.perf_counter()
    cache = DynamicCache(config=target.config)
    token = target(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)
    synchronize(device)
    ttft = time.perf_counter() - start
    new = [token]
    for _ in range(max_new_tokens - 1):
        token = target(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)
        new.append(token)
    sequence = torch.cat([input_ids, *new], 1)
    synchronize(device)
    return sequence, time.perf_counter() - start, ttft


def _as_prompts(prompts: Sequence[torch.Tensor], device: torch.device) -> list[torch.LongTensor]:
    out = []
    for p in prompts:
        p = torch.as_tensor(p).long()
        p = p[None] if p.dim() == 1 else p
        if p.dim() != 2 or p.shape[0] != 1 or p.shape[1] == 0:
            raise ValueError(f"each prompt must be a non-empty [length] or [1, length] tensor of ids, got shape {tuple(p.shape)}")
        out.append(p.to(device))
    if not out:
        raise ValueError("no prompts given")
    return out


def target_baseline(target: PreTrainedModel, prompts: Sequence[torch.Tensor], max_new_tokens: int, repeats: int = 1, backend: str = "auto") -> TargetBaseline:
    """Greedy target-only decoding of every prompt (EOS ignored) after a warm-up at the timed shape,
    medians over `repeats`: the plain cached loop ("eager") or the static loop's graphed step ("static")."""
    if max_new_tokens < 1 or repeats < 1:
        raise ValueError(f"max_new_tokens and repeats must be >= 1, got {max_new_tokens} and {repeats}")
    prompts = _as_prompts(prompts, model_device(target))
    kind = resolve_backend(backend, target)
    if kind == "static":
        loop = SpecLoop(target, None, 0, context=context_length(target))

        def decode(ids: torch.LongTensor) -> tuple[torch.LongTensor, float, float]:
            out = target_only_generate(target, ids, max_new_tokens, loop=loop)
            return out.sequences, out.stats.wall_s, out.stats.ttft_s
    else:

        def decode(ids: torch.LongTensor) -> tuple[torch.LongTensor, float, float]:
            return greedy_decode(target, ids, max_new_tokens)

    decode(prompts[0])  # warm-up (and capture)
    sequences, walls, ttfts = [], [], []
    for ids in prompts:
        runs = [decode(ids) for _ in range(repeats)]
        sequences.append(runs[0][0])
        walls.append(statistics.median(r[1] for r in runs))
        ttfts.append(statistics.median(r[2] for r in runs))
    return TargetBaseline(sequences, walls, ttfts, kind, decode)


def merge_stats(stats: Sequence[SpecStats]) -> SpecStats:
    """Counts of several single-prompt runs summed into one SpecStats."""
    total = SpecStats()
    for s in stats:
        for name in (
            "proposed",
            "accepted",
            "new_tokens",
            "rounds",
            "target_forwards",
            "draft_forwards",
            "sequence_forwards",
            "num_sequences",
            "ttft_s",
            "wall_s",
        ):
            setattr(total, name, getattr(total, name) + getattr(s, name))
        grow = len(s.position_proposed) - len(total.position_proposed)
        total.position_proposed += [0] * max(0, grow)
        total.position_accepted += [0] * max(0, grow)
        for j, (p, a) in enumerate(zip(s.position_proposed, s.position_accepted)):
            total.position_proposed[j] += p
            total.position_accepted[j] += a
    return total


def _synthetic_runs(
    target, draft, alphas, k, prompts, max_new_tokens, costs: Costs, baseline: TargetBaseline, repeats: int, seed: int, backend: str
) -> list[dict[str, Any]]:
    """One decoder for draft length k (warmed up, and captured, once) run at every α in turn. Each
    prompt's target-only time is re-taken right before its speculative runs (when the baseline can
    decode), so drift of the machine's speed (shared CPUs, clocks) cancels out of the ratio."""
    if len(baseline.sequences) != len(prompts):
        raise ValueError(f"baseline has {len(baseline.sequences)} sequences for {len(prompts)} prompts: build it from the same prompts")
    if k not in costs.v:
        raise ValueError(f"costs has no v({k}) (measured: {sorted(costs.v)}): measure_costs with ks including {k}")
    synthetic = SyntheticDraft(draft, [seq[0] for seq in baseline.sequences], alphas[0], seed=seed)
    decoder = SpeculativeDecoder(target, synthetic, num_draft_tokens=k, backend=backend)
    kind = resolve_backend(backend, target, synthetic)
    synthetic.use_rows([0])
    # Warm-up; the static loop also captures its graphs, for buffers sized by the timed length.
    warm = max_new_tokens if kind == "static" else min(max_new_tokens, 2 * k + 2)
    decoder.generate(prompts[0], max_new_tokens=warm, eos_token_id=[])
    base_wall, base_ttft = list(baseline.wall_s), list(baseline.ttft_s)
    runs: dict[float, list] = {alpha: [] for alpha in alphas}
    for i, ids in enumerate(prompts):
        if baseline.decode is not None:
            timed = [baseline.decode(ids) for _ in range(repeats)]
            base_wall[i], base_ttft[i] = statistics.median(t[1] for t in timed), statistics.median(t[2] for t in timed)
        synthetic.use_rows([i])
        for alpha in alphas:
            synthetic.set_alpha(alpha)
            runs[alpha].append([decoder.generate(ids, max_new_tokens=max_new_tokens, eos_token_id=[]) for _ in range(repeats)])
    results = []
    for alpha in alphas:
        total = merge_stats([prompt_runs[0].stats for prompt_runs in runs[alpha]])
        walls = [statistics.median(r.stats.wall_s for r in prompt_runs) for prompt_runs in runs[alpha]]
        ttfts = [statistics.median(r.stats.ttft_s for r in prompt_runs) for prompt_runs in runs[alpha]]
        identical = sum(prompt_runs[0].sequences.tolist() == seq.tolist() for prompt_runs, seq in zip(runs[alpha], baseline.sequences))
        measured_alpha = fit_alpha(total.position_proposed, total.position_accepted)
        base_s, spec_s = sum(base_wall), sum(walls)
        base_decode, spec_decode = base_s - sum(base_ttft), spec_s - sum(ttfts)
        results.append(
            {
                "alpha": alpha,
                "k": k,
                "backend": kind,
                "baseline_backend": baseline.backend,
                "num_prompts": len(prompts),
                "max_new_tokens": max_new_tokens,
                "measured_alpha": measured_alpha,
                "acceptance_rate": total.acceptance_rate,
                "mean_accepted_length": total.mean_accepted_length,
                "expected_accepted_length": expected_tokens_per_round(alpha, k) - 1.0,
                "per_position_acceptance": total.per_position_acceptance,
                "tokens_per_target_forward": total.tokens_per_target_forward,
                "rounds": total.rounds,
                "target_s": base_s,
                "speculative_s": spec_s,
                "speedup": base_s / spec_s,
                "decode_speedup": base_decode / spec_decode if spec_decode > 0 else 0.0,
                "predicted_speedup": costs.speedup(measured_alpha, k),
                "predicted_speedup_nominal": costs.speedup(alpha, k),
                "c": costs.c,
                "v_k": costs.v[k],
                "greedy_identity": identical / len(prompts),
            }
        )
    return results


def run_synthetic(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    alpha: float,
    k: int,
    prompts: Sequence[torch.Tensor],
    max_new_tokens: int,
    *,
    costs: Costs | None = None,
    baseline: TargetBaseline | None = None,
    repeats: int = 1,
    seed: int = 0,
    backend: str = "auto",
) -> dict[str, Any]:
    """Target-only vs speculative greedy decoding with `SyntheticDraft(draft, …, alpha)` on the
    same prompts (one at a time, EOS ignored, exactly `max_new_tokens` each), both through the
    `backend` loop: measured speedup, acceptance, tokens per target forward, the speedup predicted
    from the measured α and `costs` (measured here when not given), and the greedy identity rate."""
    prompts = _as_prompts(prompts, model_device(target))
    baseline = baseline or target_baseline(target, prompts, max_new_tokens, repeats, backend=backend)
    if costs is None:
        costs = measure_costs(target, draft, ks=[k], prompt_len=int(statistics.median(p.shape[1] for p in prompts)), backend=backend)
    return _synthetic_runs(target, draft, [alpha], k, prompts, max_new_tokens, costs, baseline, repeats, seed, backend)[0]


def synthetic_sweep(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    alphas: Sequence[float],
    ks: Sequence[int],
    prompts: Sequence[torch.Tensor],
    max_new_tokens: int,
    *,
    costs: Costs | None = None,
    repeats: int = 1,
    seed: int = 0,
    backend: str = "auto",
) -> list[dict[str, Any]]:
    """`run_synthetic` for every (α, k), sharing one target-only baseline, one cost measurement and,
    per k, one decoder (so a graphed loop captures once per k). Rows ordered by α, then k."""
    prompts = _as_prompts(prompts, model_device(target))
    if costs is None:
        costs = measure_costs(target, draft, ks=ks, prompt_len=int(statistics.median(p.shape[1] for p in prompts)), backend=backend)
    baseline = target_baseline(target, prompts, max_new_tokens, repeats, backend=backend)
    results = []
    for k in tqdm(ks, desc="synthetic runs", unit="k", dynamic_ncols=True):
        results += _synthetic_runs(target, draft, list(alphas), k, prompts, max_new_tokens, costs, baseline, repeats, seed, backend)
    return sorted(results, key=lambda r: (alphas.index(r["alpha"]), r["k"]))
