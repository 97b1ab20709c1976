"""The cost model of speculative decoding: the speedup formula, and c and v(k) measured on the
loop the decoder runs.

DESIGN.md (Leviathan et al., 2023): E[tokens per round] = (1 - α^(k+1)) / (1 - α) and
speedup ≈ E / (k·c + v(k)), with c = draft step / target step and v(k) = target verify of k+1
tokens / one target step. The loop's first draft step of a round reads two tokens (the last two
emitted), so a measured round costs c₂ + (k-1)·c + v(k), c₂ that two-token step over a target step
(`Costs.round_cost`). `measure_costs` times c, c₂ and v(k) for a pair on the current device, as
the eager loop calls the models or (`measure_costs_static`) as the static loop replays its steps;
`best_k` picks k. The synthetic draft built on this (`distill.commands.synthetic`) and `distill bench`
(`distill.commands.bench`) sit above the decoder; nothing here imports them."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from distill.common.trim import ensure_prompt_rows
from distill.speculative.cache import StaticSide
from distill.speculative.static import BACKENDS, Graphs, check_static_model, graphs_available, static_problem

# ---------------------------------------------------------------------------------------------
# The formula


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """Tokens one round emits on average when each draft token is accepted with probability
    `alpha` independently: 1 + α + … + α^k = (1 - α^(k+1)) / (1 - α); k + 1 at α = 1."""
    check_alpha(alpha)
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


def check_alpha(alpha: float) -> None:
    """Raise ValueError unless `alpha` is an acceptance rate, in [0, 1]."""
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
    target_step_spread: float | None = None  # interquartile range of the repeats over their median
    draft_step_spread: float | None = None
    real_tokens: bool = False  # stepped real prompt tokens (else seeded random ids)
    c_first: float | None = None  # c₂: the round's first draft step (two tokens) / target step; None: not measured, read as c

    def round_cost(self, k: int) -> float:
        """One round of k drafts in target steps: the two-token first draft step, k-1 one-token
        steps and the verify, c₂ + (k-1)·c + v(k) (k·c + v(k) where c₂ was not measured)."""
        first = self.c if self.c_first is None else self.c_first
        return first + (k - 1) * self.c + self.v[k]

    def speedup(self, alpha: float, k: int) -> float:
        """The speedup these costs predict at acceptance `alpha`: E[tokens per round] / round_cost(k)."""
        return expected_tokens_per_round(alpha, k) / self.round_cost(k)

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
    return max(ks, key=lambda k: costs.speedup(alpha, k))


def resolve_backend(backend: str, *models: PreTrainedModel) -> str:
    """The loop `SpeculativeDecoder(backend=...)` runs for greedy decoding of these models here:
    "auto" is "static" (static caches, CUDA graphs) on CUDA when the models allow it, else "eager"."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if backend == "compiled":
        raise ValueError(
            "the speedup model times the eager and static loops' steps, not compiled drafts: "
            "use backend='static' or 'eager' here (scripts/bench_decode.py times backend='compiled')"
        )
    if backend != "auto":
        return backend
    fits = not any(static_problem(m, "model") for m in models)
    return "static" if fits and graphs_available(model_device(models[0])) else "eager"


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA), so a host clock around a call times the call."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's (first) parameters."""
    return next(model.parameters()).device


def context_length(model: PreTrainedModel) -> int:
    """The model's context (max_position_embeddings; unbounded when its config has none)."""
    return getattr(model.config.get_text_config(), "max_position_embeddings", None) or 1 << 30


def dtype_name(dtype: torch.dtype) -> str:
    """'bfloat16' for torch.bfloat16."""
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
    prompt_ids: Sequence[int] | None = None,
) -> Costs:
    """Time one-token steps of both models, the draft's two-token first step of a round and the
    target's (k+1)-token verify on a warm KV cache
    of `prompt_len` tokens (or of the real `prompt_ids`, whose last k+1 tokens are the ones stepped),
    as the decoder's loop (`backend`, see `resolve_backend`) calls them; medians over `repeats`
    interleaved runs after `warmup` (CUDA synchronised around each call)."""
    if resolve_backend(backend, target, draft) == "static":
        return measure_costs_static(target, draft, ks=ks, prompt_len=prompt_len, repeats=repeats, warmup=max(1, warmup), seed=seed)
    return measure_costs_many(target, {"draft": draft}, ks, prompt_len, repeats, warmup, seed, prompt_ids)["draft"]


def _cost_tokens(
    target: PreTrainedModel, drafts: Sequence[PreTrainedModel], prompt_len: int, k_max: int, seed: int, prompt_ids: Sequence[int] | None
) -> torch.Tensor:
    """[1, prompt_len + k_max + 1] token ids: the real `prompt_ids` when given (the warm cache is all
    but their last k_max + 1, which are stepped), else seeded random ids below both vocabularies."""
    if prompt_ids is not None:
        if len(prompt_ids) < k_max + 2:
            raise ValueError(f"prompt_ids has {len(prompt_ids)} tokens; the costs of k = {k_max} need at least {k_max + 2}")
        return torch.tensor([list(prompt_ids)], dtype=torch.long)
    vocab = min(m.get_input_embeddings().num_embeddings for m in (target, *drafts))
    return torch.randint(0, vocab, (1, prompt_len + k_max + 1), generator=torch.Generator().manual_seed(seed))


def measure_costs_many(
    target: PreTrainedModel,
    drafts: dict[str, PreTrainedModel],
    ks: Iterable[int] = range(1, 9),
    prompt_len: int = 128,
    repeats: int = 20,
    warmup: int = 3,
    seed: int = 0,
    prompt_ids: Sequence[int] | None = None,
) -> dict[str, Costs]:
    """c, c₂ and v(k) of several drafts under one target on the eager loop, the target timed once
    (`CostSampler`, its `repeats` taken back to back)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    sampler = CostSampler(target, drafts, ks, prompt_len, warmup, seed, prompt_ids)
    sampler.sample(repeats)
    return sampler.costs()


class CostSampler:
    """c, c₂ and v(k) of several drafts under one target on the eager loop, timed one repeat at a time,
    so that a long evaluation can spread its repeats over the run and its costs see the machine in the
    states its timed calls saw. Each repeat times a target step, every draft's one- and two-token
    steps and each verify in turn (so all share the machine's state) on the same warm caches; c of
    each draft divides by the target step of the same repeat. Costs also carry the spread of the repeats
    (interquartile range over the median) of both steps."""

    @torch.inference_mode()
    def __init__(
        self,
        target: PreTrainedModel,
        drafts: dict[str, PreTrainedModel],
        ks: Iterable[int] = range(1, 9),
        prompt_len: int = 128,
        warmup: int = 3,
        seed: int = 0,
        prompt_ids: Sequence[int] | None = None,
    ):
        ks = sorted({int(k) for k in ks})
        if not ks or ks[0] < 1:
            raise ValueError(f"ks must be draft lengths >= 1, got {ks}")
        if prompt_len < 1:
            raise ValueError(f"prompt_len must be >= 1, got {prompt_len}")
        self.device = model_device(target)
        for name, model in drafts.items():
            ensure_prompt_rows(model)
            if model_device(model) != self.device:
                raise ValueError(f"target is on {self.device} but draft {name!r} on {model_device(model)}: move both to one device")
        ids = _cost_tokens(target, list(drafts.values()), prompt_len, ks[-1], seed, prompt_ids).to(self.device)
        prompt, self.tokens = ids[:, : -(ks[-1] + 1)], ids[:, -(ks[-1] + 1) :]
        context = min(context_length(m) for m in (target, *drafts.values()))
        if ids.shape[1] > context:
            raise ValueError(f"prompt_len {prompt.shape[1]} + k {ks[-1]} + 1 exceeds the models' context of {context}: lower prompt_len")
        self.target, self.drafts, self.ks, self.real_tokens = target, drafts, ks, prompt_ids is not None
        self.prompt_len = prompt.shape[1]
        self.models = {"target": target, **{("draft", name): model for name, model in drafts.items()}}
        self.caches = {}
        for key, model in self.models.items():
            self.caches[key] = DynamicCache(config=model.config)
            model(input_ids=prompt, cache=self.caches[key], use_cache=True, logits_to_keep=1)
        draft_keys = [key for key in self.models if key != "target"]
        self.jobs = [("target", "target", 1)] + [(key, key, 1) for key in draft_keys] + [(("first", key), key, 2) for key in draft_keys]
        self.jobs += [(k, "target", k + 1) for k in ks]
        self.times: dict[Any, list[float]] = {name: [] for name, _, _ in self.jobs}
        for _ in range(warmup):
            self._repeat(record=False)

    @property
    def repeats(self) -> int:
        """Repeats timed so far (after the warm-up)."""
        return len(self.times["target"])

    def _timed(self, key: Any, n: int) -> float:
        synchronize(self.device)
        start = time.perf_counter()
        self.models[key](input_ids=self.tokens[:, :n], cache=self.caches[key], use_cache=True, logits_to_keep=n)
        synchronize(self.device)
        elapsed = time.perf_counter() - start
        self.caches[key].crop(-n)  # back to the prompt: every call sees the same warm cache
        return elapsed

    @torch.inference_mode()
    def _repeat(self, record: bool = True) -> None:
        for name, key, n in self.jobs:
            elapsed = self._timed(key, n)
            if record:
                self.times[name].append(elapsed)

    def sample(self, repeats: int = 1) -> None:
        """Time `repeats` more repeats now."""
        for _ in range(repeats):
            self._repeat()

    def costs(self) -> dict[str, Costs]:
        """Each draft's costs from the repeats timed so far: the steps' medians, and c, c₂ and v(k) as
        medians of each repeat's own ratios to its target step, so a machine whose speed drifts between
        repeats (a shared CPU over an hour) moves no ratio."""
        if not self.repeats:
            raise ValueError("no repeats timed yet: call sample() first")
        target = self.times["target"]

        def ratio(name: Any) -> float:
            return statistics.median(x / t for x, t in zip(self.times[name], target))

        return {
            name: Costs(
                target_step_s=statistics.median(target),
                draft_step_s=statistics.median(self.times[("draft", name)]),
                c=ratio(("draft", name)),
                v={k: ratio(k) for k in self.ks},
                device=str(self.device),
                dtype=dtype_name(self.target.dtype),
                prompt_len=self.prompt_len,
                repeats=self.repeats,
                target_step_spread=spread(target),
                draft_step_spread=spread(self.times[("draft", name)]),
                real_tokens=self.real_tokens,
                c_first=ratio(("first", ("draft", name))),
            )
            for name in self.drafts
        }


def spread_evenly(total: int, slots: int) -> list[int]:
    """`total` repeats spread over `slots` moments as evenly as whole numbers allow (they sum to `total`)."""
    return [(i + 1) * total // slots - i * total // slots for i in range(slots)] if slots else []


def spread(times: Sequence[float]) -> float:
    """The interquartile range of repeated timings over their median: how much a median can be trusted."""
    q1, q2, q3 = statistics.quantiles(times, n=4) if len(times) > 1 else (times[0],) * 3
    return (q3 - q1) / q2 if q2 else 0.0


@torch.inference_mode()
def measure_costs_static(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    ks: Iterable[int] = range(1, 9),
    prompt_len: int = 128,
    repeats: int = 20,
    warmup: int = 3,
    seed: int = 0,
    graphs: bool | None = None,
) -> Costs:
    """c, c₂ and v(k) of the static loop's own steps on a warm cache of `prompt_len` tokens: a one-token
    and a two-token draft step, a one-token target step and the target's (k+1)-token verify, each replayed as a
    CUDA graph where available (`graphs`: default on CUDA); medians of `repeats` interleaved timings
    after `warmup` rounds (the first of which captures)."""
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1 or prompt_len < 1 or repeats < 1 or warmup < 1:
        raise ValueError(f"need ks >= 1, prompt_len, repeats and warmup >= 1, got {ks}, {prompt_len}, {repeats}, {warmup}")
    device = next(target.parameters()).device
    enabled = graphs_available(device) if graphs is None else graphs
    check_static_model(target, "target")
    check_static_model(draft, "draft")
    ensure_prompt_rows(draft)
    vocab = min(target.get_input_embeddings().num_embeddings, draft.get_input_embeddings().num_embeddings)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (1, prompt_len), generator=gen).to(device)
    tokens = torch.randint(0, vocab, (1, ks[-1] + 1), generator=gen).to(device)
    capacity = prompt_len + ks[-1] + 1
    sides = {"target": StaticSide(target, 1, capacity), "draft": StaticSide(draft, 1, capacity)}
    positions = torch.arange(capacity, device=device)[None]
    for side in sides.values():
        side.forward(prompt, positions[:, :prompt_len], keep=1)
    runner = Graphs(device, enabled)
    sink = torch.zeros(1, dtype=torch.long, device=device)

    def step(side: StaticSide, n: int) -> Callable[[], None]:
        def run() -> None:
            sink.copy_(side.forward(tokens[:, :n], positions[:, prompt_len : prompt_len + n], keep=n)[:, -1].argmax(-1))
            side.length -= n  # back to prompt_len: every replay sees the same warm cache

        return run

    jobs = [("target", sides["target"], 1), ("draft", sides["draft"], 1), ("first", sides["draft"], 2)] + [(k, sides["target"], k + 1) for k in ks]
    state = [s.length for s in sides.values()] + [sink]
    times: dict = {name: [] for name, _, _ in jobs}
    for r in range(warmup + repeats):
        for name, side, n in jobs:
            fn = step(side, n)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            runner.run(name, fn, lambda: state)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    t, d = med["target"], med["draft"]
    return Costs(
        target_step_s=t,
        draft_step_s=d,
        c=d / t,
        v={k: med[k] / t for k in ks},
        device=str(device),
        dtype=str(next(target.parameters()).dtype).removeprefix("torch."),
        prompt_len=prompt_len,
        repeats=repeats,
        c_first=med["first"] / t,
    )
