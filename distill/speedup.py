"""The speedup model of speculative decoding, the measurements behind it, and `distill bench`.

DESIGN.md (Leviathan et al., 2023): E[tokens per round] = (1 - α^(k+1)) / (1 - α) and
speedup ≈ E / (k·c + v(k)), with c = draft step / target step and v(k) = target verify of k+1
tokens / one target step. This module measures c and v(k) for a pair on the current device,
predicts the speedup, picks k, and runs the real verification loop with a draft whose proposals
the target accepts at a controlled rate (`SyntheticDraft`), so the acceptance → speedup curve can
be measured for any model shape (random weights of Qwen2.5-7B / 0.5B shape) without training.
Every measurement times the loop the decoder runs (`--backend`: eager, or static caches with
CUDA graphs), target-only baseline included.

    distill bench                                            # tiny pair built on the spot (CPU)
    distill bench --target T --draft D --ks 1..8 --json bench.json
    distill bench --model-config-target recipes/model_configs/qwen2.5-7b-instruct.json \\
        --model-config-draft recipes/model_configs/qwen2.5-0.5b-instruct.json \\
        --synthetic-acceptance 0.5,0.7,0.9 --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel, Qwen2Config

from distill.docs import markdown_table, write_section
from distill.machine_load import MachineLoad, describe, warn
from distill.provenance import versions
from distill.models import ModelLoadError, load_model, load_tokenizer
from distill.vocab import check_special_ids_agree, check_tokenizers_agree
from distill.speculative import SpecStats, SpeculativeDecoder
from distill.speculative.loop import SpecLoop, target_only_generate
from distill.speculative.static import BACKENDS, graphs_available, measure_costs_static, static_problem
from distill.tiny import make_examples, random_pair

# ---------------------------------------------------------------------------------------------
# The formula


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """Tokens one round emits on average when each draft token is accepted with probability
    `alpha` independently: 1 + α + … + α^k = (1 - α^(k+1)) / (1 - α); k + 1 at α = 1."""
    _check_alpha(alpha)
    if k < 0:
        raise ValueError(f"k (draft tokens per round) must be >= 0, got {k}")
    return float(sum(alpha**i for i in range(k + 1)))


def predicted_speedup(alpha: float, k: int, c: float, v_k: float) -> float:
    """Speedup over target-only decoding: E[tokens per round] / (k·c + v(k)) (DESIGN.md)."""
    if c < 0:
        raise ValueError(f"c (draft step / target step) must be >= 0, got {c}")
    if v_k <= 0:
        raise ValueError(f"v(k) (verify time / target step) must be > 0, got {v_k}")
    return expected_tokens_per_round(alpha, k) / (k * c + v_k)


def fit_alpha(position_proposed: Sequence[int], position_accepted: Sequence[int]) -> float:
    """Maximum-likelihood α of the i.i.d. acceptance model from the decoder's per-position counts.

    A round accepting n of k drafts is n successes and (n < k) one failure, so α = successes over
    positions tested; position j is tested when j-1 was accepted (min() bounds it for short rounds)."""
    successes = sum(position_accepted)
    tested = sum(position_proposed[:1]) + sum(min(a, p) for a, p in zip(position_accepted[:-1], position_proposed[1:]))
    return successes / tested if tested else 0.0


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha (acceptance rate) must be in [0, 1], got {alpha}")


# ---------------------------------------------------------------------------------------------
# Measured costs


@dataclass
class Costs:
    """Measured step costs of a pair: c = draft step / target step, v[k] = verify(k+1 tokens) / target step."""

    target_step_s: float
    draft_step_s: float
    c: float
    v: dict[int, float]
    device: str
    dtype: str
    prompt_len: int = 0
    repeats: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the keys of v become strings)."""
        out = asdict(self)
        out["v"] = {str(k): v for k, v in self.v.items()}
        return out


def best_k(alpha: float, costs: Costs, k_max: int = 8) -> int:
    """The k ≤ k_max among those measured in `costs` that maximises the predicted speedup at `alpha`."""
    ks = sorted(k for k in costs.v if k <= k_max)
    if not ks:
        raise ValueError(f"costs has no v(k) for k <= {k_max} (measured: {sorted(costs.v)}): measure_costs(ks=range(1, {k_max} + 1))")
    return max(ks, key=lambda k: predicted_speedup(alpha, k, costs.c, costs.v[k]))


def resolve_backend(backend: str, *models: PreTrainedModel) -> str:
    """The loop `SpeculativeDecoder(backend=...)` runs for greedy decoding of these models here:
    "auto" is "static" (static caches, CUDA graphs) on CUDA when the models allow it, else "eager"."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if backend == "compiled":
        raise ValueError("the speedup model times the eager and static loops' steps, not compiled drafts: "
                         "use backend='static' or 'eager' here (scripts/bench_decode.py times backend='compiled')")
    if backend != "auto":
        return backend
    fits = not any(static_problem(m, "model") for m in models)
    return "static" if fits and graphs_available(_device(models[0])) else "eager"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _context(model: PreTrainedModel) -> int:
    return getattr(model.config.get_text_config(), "max_position_embeddings", None) or 1 << 30


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@torch.inference_mode()
def measure_costs(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    ks: Iterable[int] = range(1, 9),
    prompt_len: int = 128,
    repeats: int = 20,
    warmup: int = 3,
    seed: int = 0,
    backend: str = "auto",
) -> Costs:
    """Time one-token steps of both models and the target's (k+1)-token verify on a warm KV cache
    of `prompt_len` tokens, as the decoder's loop (`backend`, see `resolve_backend`) calls them;
    medians over `repeats` interleaved runs after `warmup` (CUDA synchronised around each call)."""
    if resolve_backend(backend, target, draft) == "static":
        return measure_costs_static(target, draft, ks=ks, prompt_len=prompt_len, repeats=repeats, warmup=max(1, warmup), seed=seed)
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must be draft lengths >= 1, got {ks}")
    if prompt_len < 1 or repeats < 1:
        raise ValueError(f"prompt_len and repeats must be >= 1, got {prompt_len} and {repeats}")
    context = min(_context(target), _context(draft))
    if prompt_len + ks[-1] + 1 > context:
        raise ValueError(f"prompt_len {prompt_len} + k {ks[-1]} + 1 exceeds the models' context of {context}: lower prompt_len")
    device = _device(target)
    if _device(draft) != device:
        raise ValueError(f"target is on {device} but draft on {_device(draft)}: move both to one device")
    vocab = min(target.get_input_embeddings().num_embeddings, draft.get_input_embeddings().num_embeddings)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (1, prompt_len), generator=gen).to(device)
    tokens = torch.randint(0, vocab, (1, ks[-1] + 1), generator=gen).to(device)
    caches = {}
    for name, model in (("target", target), ("draft", draft)):
        caches[name] = DynamicCache(config=model.config)
        model(input_ids=prompt, cache=caches[name], use_cache=True, logits_to_keep=1)

    def timed(model: PreTrainedModel, cache: DynamicCache, n: int) -> float:
        _sync(device)
        start = time.perf_counter()
        model(input_ids=tokens[:, :n], cache=cache, use_cache=True, logits_to_keep=n)
        _sync(device)
        elapsed = time.perf_counter() - start
        cache.crop(-n)  # back to prompt_len: every call sees the same warm cache
        return elapsed

    jobs = [("target", target, 1), ("draft", draft, 1)] + [(k, target, k + 1) for k in ks]
    times: dict[Any, list[float]] = {name: [] for name, _, _ in jobs}
    for r in range(warmup + repeats):
        for name, model, n in jobs:
            elapsed = timed(model, caches["draft" if name == "draft" else "target"], n)
            if r >= warmup:
                times[name].append(elapsed)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    t, d = med["target"], med["draft"]
    return Costs(target_step_s=t, draft_step_s=d, c=d / t, v={k: med[k] / t for k in ks}, device=str(device),
                 dtype=_dtype_name(target.dtype), prompt_len=prompt_len, repeats=repeats)


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
        self.register_buffer("truth", truth.to(_device(draft)), persistent=False)
        self.register_buffer("table", torch.empty_like(self.truth), persistent=False)  # every row's proposal per position
        self.register_buffer("proposals", torch.empty_like(self.truth), persistent=False)  # the rows of the current batch
        self.set_alpha(alpha)

    def set_alpha(self, alpha: float) -> None:
        """Re-set the acceptance rate in place (same draws: a higher α only adds hits), so one decoder
        and its captured graphs serve a whole sweep over α."""
        _check_alpha(alpha)
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
        return _device(self.draft)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.draft.get_input_embeddings()

    def get_output_embeddings(self) -> torch.nn.Module | None:
        return self.draft.get_output_embeddings()

    def forward(self, input_ids: torch.LongTensor, position_ids: torch.LongTensor | None = None,
                cache_position: torch.LongTensor | None = None, **kwargs):
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
    _sync(device)
    start = time.perf_counter()
    cache = DynamicCache(config=target.config)
    token = target(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)
    _sync(device)
    ttft = time.perf_counter() - start
    new = [token]
    for _ in range(max_new_tokens - 1):
        token = target(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)
        new.append(token)
    sequence = torch.cat([input_ids, *new], 1)
    _sync(device)
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


def target_baseline(target: PreTrainedModel, prompts: Sequence[torch.Tensor], max_new_tokens: int, repeats: int = 1,
                    backend: str = "auto") -> TargetBaseline:
    """Greedy target-only decoding of every prompt (EOS ignored) after a warm-up at the timed shape,
    medians over `repeats`: the plain cached loop ("eager") or the static loop's graphed step ("static")."""
    if max_new_tokens < 1 or repeats < 1:
        raise ValueError(f"max_new_tokens and repeats must be >= 1, got {max_new_tokens} and {repeats}")
    prompts = _as_prompts(prompts, _device(target))
    kind = resolve_backend(backend, target)
    if kind == "static":
        loop = SpecLoop(target, None, 0, context=_context(target))

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


def _merge(stats: Sequence[SpecStats]) -> SpecStats:
    """Counts of several single-prompt runs summed into one SpecStats."""
    total = SpecStats()
    for s in stats:
        for name in ("proposed", "accepted", "new_tokens", "rounds", "target_forwards", "draft_forwards",
                     "sequence_forwards", "num_sequences", "ttft_s", "wall_s"):
            setattr(total, name, getattr(total, name) + getattr(s, name))
        grow = len(s.position_proposed) - len(total.position_proposed)
        total.position_proposed += [0] * max(0, grow)
        total.position_accepted += [0] * max(0, grow)
        for j, (p, a) in enumerate(zip(s.position_proposed, s.position_accepted)):
            total.position_proposed[j] += p
            total.position_accepted[j] += a
    return total


def _synthetic_runs(target, draft, alphas, k, prompts, max_new_tokens, costs: Costs, baseline: TargetBaseline,
                    repeats: int, seed: int, backend: str) -> list[dict[str, Any]]:
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
        total = _merge([prompt_runs[0].stats for prompt_runs in runs[alpha]])
        walls = [statistics.median(r.stats.wall_s for r in prompt_runs) for prompt_runs in runs[alpha]]
        ttfts = [statistics.median(r.stats.ttft_s for r in prompt_runs) for prompt_runs in runs[alpha]]
        identical = sum(prompt_runs[0].sequences.tolist() == seq.tolist() for prompt_runs, seq in zip(runs[alpha], baseline.sequences))
        measured_alpha = fit_alpha(total.position_proposed, total.position_accepted)
        base_s, spec_s = sum(base_wall), sum(walls)
        base_decode, spec_decode = base_s - sum(base_ttft), spec_s - sum(ttfts)
        results.append({
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
            "predicted_speedup": predicted_speedup(measured_alpha, k, costs.c, costs.v[k]),
            "predicted_speedup_nominal": predicted_speedup(alpha, k, costs.c, costs.v[k]),
            "c": costs.c,
            "v_k": costs.v[k],
            "greedy_identity": identical / len(prompts),
        })
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
    prompts = _as_prompts(prompts, _device(target))
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
    prompts = _as_prompts(prompts, _device(target))
    if costs is None:
        costs = measure_costs(target, draft, ks=ks, prompt_len=int(statistics.median(p.shape[1] for p in prompts)), backend=backend)
    baseline = target_baseline(target, prompts, max_new_tokens, repeats, backend=backend)
    results = []
    for k in tqdm(ks, desc="synthetic runs", unit="k", dynamic_ncols=True):
        results += _synthetic_runs(target, draft, list(alphas), k, prompts, max_new_tokens, costs, baseline, repeats, seed, backend)
    return sorted(results, key=lambda r: (alphas.index(r["alpha"]), r["k"]))


# ---------------------------------------------------------------------------------------------
# `distill bench`


def tiny_pair(seed: int = 0) -> tuple[PreTrainedModel, PreTrainedModel, transformers.PreTrainedTokenizerFast]:
    """A ~14M-parameter target and a ~0.3M draft (random weights, untied heads) with their tokenizer,
    big enough on a CPU that a target step costs several draft steps."""
    return random_pair({"hidden_size": 512, "num_layers": 4, "num_heads": 8, "num_kv_heads": 2, "intermediate_size": 1536},
                       {"hidden_size": 64, "num_layers": 1, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 192}, seed)


def _parse_ks(text: str) -> list[int]:
    """'1..8' or '1,2,4' (or both: '1..4,6,8')."""
    ks: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            lo, _, hi = part.partition("..")
            ks.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ks {text!r}: use a range '1..8' or a list '1,2,4'") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"--ks {text!r}: give draft lengths >= 1")
    return sorted(ks)


def _parse_alphas(text: str) -> list[float]:
    try:
        alphas = [float(a) for a in text.split(",") if a.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give acceptance rates like 0.5,0.7,0.9") from None
    if not alphas or not all(0.0 <= a <= 1.0 for a in alphas):
        raise argparse.ArgumentTypeError(f"{text!r}: acceptance rates must lie in [0, 1]")
    return alphas


def _random_model(config_path: str, dtype: torch.dtype, device: str, seed: int) -> PreTrainedModel:
    """A random-weight model of the shape in a Qwen2Config JSON file, built directly on `device`."""
    path = Path(config_path)
    if not path.is_file():
        raise SystemExit(f"distill bench: model config {config_path!r} is not a file: give a Qwen2Config JSON (config.json)")
    config = Qwen2Config.from_json_file(path)
    if config.model_type != "qwen2":
        raise SystemExit(f"distill bench: {config_path} is a {config.model_type!r} config; give a Qwen2Config JSON")
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def _load(args: argparse.Namespace, dtype: torch.dtype):
    """(target, draft, tokenizer or None, names) from the command line, or the tiny pair."""
    sides = {"target": (args.target, args.model_config_target), "draft": (args.draft, args.model_config_draft)}
    for side, (path, cfg) in sides.items():
        if path and cfg:
            raise SystemExit(f"distill bench: give --{side} or --model-config-{side}, not both")
    given = {side: bool(path or cfg) for side, (path, cfg) in sides.items()}
    if given["target"] != given["draft"]:
        raise SystemExit("distill bench: give both a target and a draft (--target/--model-config-target and "
                         "--draft/--model-config-draft), or neither for the built-in tiny pair")
    if not given["target"]:
        target, draft, tok = tiny_pair(args.seed)
        names = {"target": "tiny Qwen2 (random weights)", "draft": "tiny Qwen2 (random weights)"}
        return target.to(args.device, dtype), draft.to(args.device, dtype), tok, names
    models, names = {}, {}
    for i, (side, (path, cfg)) in enumerate(sides.items()):
        if cfg:
            models[side] = _random_model(cfg, dtype, args.device, args.seed + i)
            names[side] = f"random weights of {Path(cfg).name}"
        else:
            models[side] = load_model(path, dtype=dtype, device=args.device, what=side)
            names[side] = path
    tokenizers = {}
    for side in ("target", "draft"):
        if sides[side][0]:
            try:
                tokenizers[side] = load_tokenizer(sides[side][0], what=f"{side} tokenizer")
            except ModelLoadError:
                pass  # no tokenizer files: prompts are random ids, and the configs' special ids are compared instead
    if len(tokenizers) == 2:
        check_tokenizers_agree(tokenizers["target"], tokenizers["draft"])  # as `distill accept` does
    else:
        check_special_ids_agree(models["target"], models["draft"])
    return models["target"], models["draft"], tokenizers.get("target"), names


def _measure_alpha(target, draft, tok, prompts, k: int, max_new_tokens: int, backend: str) -> float:
    """α of the real draft: the decoder over `prompts`, EOS honoured, fitted from per-position counts."""
    decoder = SpeculativeDecoder(target, draft, num_draft_tokens=k, tokenizer=tok, draft_tokenizer=tok, backend=backend)
    bar = tqdm(prompts, desc="α of the real draft", unit="prompt", dynamic_ncols=True)
    total = _merge([decoder.generate(ids, max_new_tokens=max_new_tokens).stats for ids in bar])
    return fit_alpha(total.position_proposed, total.position_accepted)


def _environment(device: str, dtype: torch.dtype) -> dict[str, Any]:
    dev = torch.device(device)
    return {
        **versions(),
        "cuda": torch.version.cuda,
        "device": device,
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else (platform.processor() or platform.machine()),
        "num_threads": torch.get_num_threads(),
        "dtype": _dtype_name(dtype),
    }


def _write_json(path: str, payload: dict[str, Any]) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=2)
    os.replace(tmp, target)


def render_markdown(report: dict[str, Any]) -> str:
    """The bench report as Markdown: costs, predicted speedup per k and α with the best k, and
    (with synthetic acceptance) measured vs predicted speedup per (α, k)."""
    costs, env, settings = report["costs"], report["environment"], report["settings"]
    alphas, ks = report["alphas"], sorted(int(k) for k in costs["v"])
    pred = {(p["alpha"], p["k"]): p["predicted_speedup"] for p in report["predicted"]}
    best = {b["alpha"]: b for b in report["best_k"]}
    lines = [
        f"## distill bench: {report['names']['target']} / {report['names']['draft']}",
        "",
        f"`{settings['command']}` — {env['device_name']} ({env['device']}), {env['dtype']}, {report['backend']} loop, torch {env['torch']}, "
        f"transformers {env['transformers']}; costs on a warm cache of {costs['prompt_len']} tokens, median of {costs['repeats']}.",
        "",
        markdown_table(["target step ms", "draft step ms", "c = draft / target"],
                       [[costs["target_step_s"] * 1e3, costs["draft_step_s"] * 1e3, costs["c"]]]),
        "",
        f"Predicted speedup = E[tokens per round] / (k·c + v(k)); α {report['alpha_source']}.",
        "",
        markdown_table(["k", "v(k)"] + [f"α = {a:g}" for a in alphas],
                       [[k, costs["v"][str(k)]] + [pred[(a, k)] for a in alphas] for k in ks]
                       + [["best k", ""] + [f"{best[a]['best_k']} ({best[a]['predicted_speedup']:.2f}×)" for a in alphas]]),
    ]
    if report["synthetic"]:
        rows = [[r["alpha"], r["k"], r["measured_alpha"], r["acceptance_rate"], r["tokens_per_target_forward"], r["speedup"],
                 r["decode_speedup"], r["predicted_speedup"], f"{(r['decode_speedup'] / r['predicted_speedup'] - 1) * 100:+.1f}%",
                 f"{r['greedy_identity'] * 100:.0f}%"] for r in report["synthetic"]]
        first = report["synthetic"][0]
        lines += [
            "",
            f"Synthetic acceptance: the real verification loop with a draft that proposes the target's own token with "
            f"probability α per position ({first['num_prompts']} prompts × {first['max_new_tokens']} new tokens, greedy, "
            "EOS ignored). Decode speedup leaves out time to first token; predicted uses the measured α, c and v(k); "
            "error = decode speedup / predicted − 1.",
            "",
            markdown_table(["α", "k", "measured α", "acceptance rate", "tokens / target forward", "speedup", "decode speedup",
                            "predicted", "error", "greedy identity"], rows),
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`distill bench`: measure c and v(k), predict the speedup per k, pick k; optionally measure
    the acceptance → speedup curve with synthetic acceptance."""
    from distill.arguments import default_device, parser

    ap = parser("bench")
    args = ap.parse_args(argv)
    args.device = default_device(args.device)
    try:
        args.ks = _parse_ks(args.ks)
        args.alpha = _parse_alphas(args.alpha) if args.alpha else None
        args.synthetic_acceptance = _parse_alphas(args.synthetic_acceptance) if args.synthetic_acceptance else None
    except argparse.ArgumentTypeError as err:
        ap.error(str(err))
    for name in ("num_draft_tokens", "prompt_len", "num_prompts", "max_new_tokens", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.dtype == "auto":
        dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    else:
        dtype = getattr(torch, args.dtype)

    try:
        target, draft, tok, names = _load(args, dtype)
    except ValueError as err:
        print(f"distill bench: error: {err}", file=sys.stderr)
        return 2
    load = MachineLoad().start()
    context = min(_context(target), _context(draft))
    if args.prompt_len + args.max_new_tokens + max(args.ks) + 2 > context:
        ap.error(f"--prompt-len + --max-new-tokens + k exceeds the models' context of {context}: lower them")
    rows = [m.get_input_embeddings().num_embeddings for m in (target, draft)] + ([len(tok)] if tok is not None else [])
    vocab = min(rows)  # random-id prompts stay inside every vocabulary
    gen = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(0, vocab, (1, args.prompt_len), generator=gen) for _ in range(args.num_prompts)]

    backend = resolve_backend(args.backend, target, draft)
    costs = measure_costs(target, draft, ks=args.ks, prompt_len=args.prompt_len, repeats=args.repeats, seed=args.seed, backend=backend)
    if args.alpha:
        alphas, source = args.alpha, "given"
    elif args.synthetic_acceptance:
        alphas, source = args.synthetic_acceptance, "as set for the synthetic runs"
    else:
        if tok is not None:  # real text through the chat template
            chats = [[{"role": "user", "content": ex["prompt"]}] for ex in make_examples(args.num_prompts, seed=args.seed + 1234)]
            real = [tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")["input_ids"] for chat in chats]
        else:
            real = prompts
        real = [p.to(args.device) for p in real]
        k0 = args.num_draft_tokens
        alphas = [_measure_alpha(target, draft, tok, real, k0, args.max_new_tokens, backend)]
        kind = "chat prompts" if tok is not None else "random-id prompts"
        source = f"measured with the real draft (k = {k0}, {len(real)} {kind})"
    synthetic = []
    if args.synthetic_acceptance:
        synthetic = synthetic_sweep(target, draft, args.synthetic_acceptance, args.ks, prompts, args.max_new_tokens,
                                    costs=costs, seed=args.seed, backend=backend)

    report = {
        "names": names,
        "backend": backend,
        "environment": _environment(args.device, dtype),
        "machine_load": load.stop().report(),
        "settings": {**vars(args), "command": "distill bench " + " ".join(sys.argv[1:] if argv is None else argv)},
        "costs": costs.to_dict(),
        "alphas": alphas,
        "alpha_source": source,
        "predicted": [{"alpha": a, "k": k, "predicted_speedup": predicted_speedup(a, k, costs.c, costs.v[k])}
                      for a in alphas for k in args.ks],
        "best_k": [{"alpha": a, "best_k": (b := best_k(a, costs, k_max=max(args.ks))),
                    "predicted_speedup": predicted_speedup(a, b, costs.c, costs.v[b])} for a in alphas],
        "synthetic": synthetic,
    }
    md = render_markdown(report) + "\n\n" + describe(report["machine_load"])
    if not args.synthetic_acceptance and max(alphas) < 0.05:
        md += ("\n\nα ≈ 0: this draft shares next to nothing with the target (random weights?). "
               "Add --synthetic-acceptance 0.5,0.7,0.9 to measure the speedup curve at controlled acceptance.")
    if args.json:
        _write_json(args.json, report)
    if args.markdown:
        write_section(args.markdown, args.section, md)
    print(md)
    warn(report["machine_load"], "distill bench")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
