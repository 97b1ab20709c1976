"""What the GPU loop needs beyond the models: which models static caches can serve, CUDA graphs
captured once per step and replayed, device-side timing, and the cost of the static steps.

The loop (`distill.speculative.loop`) keeps every step free of host synchronisation and of
tensors allocated per call, so on CUDA each round's draft steps and verify step are replayed as
two CUDA graphs (one per k); off CUDA the same steps run eagerly, which is how the CPU tests
check them."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

from distill.speculative.cache import StaticSide

if TYPE_CHECKING:
    from distill.speedup import Costs

BACKENDS = ("eager", "static", "compiled", "auto")
_ATTENTION = ("sdpa", "eager")


def graphs_available(device: torch.device) -> bool:
    """CUDA graphs need a CUDA device; everywhere else the static loop runs its steps eagerly."""
    return device.type == "cuda" and torch.cuda.is_available()


def layer_kinds(model: PreTrainedModel) -> set[str]:
    """The attention kinds of the model's layers ("full_attention", "sliding_attention", ...)."""
    return set(getattr(model.config.get_text_config(), "layer_types", None) or ["full_attention"])


def static_problem(model: PreTrainedModel, role: str) -> str | None:
    """Why the static cache cannot serve `model` (the `role` it plays), with the fix; None if it can."""
    kinds = layer_kinds(model)
    if kinds != {"full_attention"}:
        return (f"the static backend needs full attention in every layer, but the {role} has {sorted(kinds)}: "
                "use backend='eager' (sliding-window layers)")
    attn = getattr(model.config, "_attn_implementation", None) or "eager"
    if attn not in _ATTENTION:
        return (f"the static backend passes an explicit attention mask, which {attn!r} attention does not take: "
                f"load the {role} with attn_implementation='sdpa' or use backend='eager'")
    return None


def check_static_model(model: PreTrainedModel, role: str) -> None:
    """Raise ValueError when the static cache cannot serve `model`."""
    problem = static_problem(model, role)
    if problem:
        raise ValueError(problem)


class Graphs:
    """Runs step functions as CUDA graphs captured on first use (one per key), or eagerly off CUDA.

    A step function reads and writes only tensors that outlive it and returns nothing, so graphs
    can share one memory pool. Warm-up runs once outside the capture (cuBLAS and allocator
    initialisation); `state()` lists the tensors it mutates, restored after warm-up (called only to capture)."""

    def __init__(self, device: torch.device, enabled: bool):
        self.device, self.enabled = device, enabled
        self.graphs: dict = {}
        self.pool = torch.cuda.graph_pool_handle() if enabled else None
        self.keys: set = set()  # every step run, graphed or not

    def run(self, key, step: Callable[[], None], state: Callable[[], list[torch.Tensor]]) -> None:
        self.keys.add(key)
        if not self.enabled:
            step()
            return
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = self._capture(step, state())
        graph.replay()

    def _capture(self, step: Callable[[], None], state: list[torch.Tensor]) -> torch.cuda.CUDAGraph:
        saved = [t.clone() for t in state]
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        for t, s in zip(state, saved):
            t.copy_(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            step()  # recorded, not run: the state is untouched until replay
        return graph


class Clock:
    """Time marks on the device's timeline (CUDA events, read after the round's sync; perf_counter
    elsewhere), so timing a round adds no synchronisation."""

    def __init__(self, device: torch.device):
        self.cuda, self.marks = device.type == "cuda", []
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            self.marks.append(torch.cuda.Event(enable_timing=True))
            self.marks[-1].record()
        else:
            self.marks.append(time.perf_counter())

    def seconds(self, i: int, j: int) -> float:
        a, b = self.marks[i], self.marks[j]
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a


@torch.inference_mode()
def measure_costs_static(target: PreTrainedModel, draft: PreTrainedModel, ks: Iterable[int] = range(1, 9),
                         prompt_len: int = 128, repeats: int = 20, warmup: int = 3, seed: int = 0,
                         graphs: bool | None = None) -> Costs:
    """c and v(k) of the static loop's own steps on a warm cache of `prompt_len` tokens: a one-token
    draft step, a one-token target step and the target's (k+1)-token verify, each replayed as a
    CUDA graph where available (`graphs`: default on CUDA); medians of `repeats` interleaved timings
    after `warmup` rounds (the first of which captures)."""
    from distill.speedup import Costs

    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1 or prompt_len < 1 or repeats < 1 or warmup < 1:
        raise ValueError(f"need ks >= 1, prompt_len, repeats and warmup >= 1, got {ks}, {prompt_len}, {repeats}, {warmup}")
    device = next(target.parameters()).device
    enabled = graphs_available(device) if graphs is None else graphs
    check_static_model(target, "target")
    check_static_model(draft, "draft")
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

    jobs = [("target", sides["target"], 1), ("draft", sides["draft"], 1)] + [(k, sides["target"], k + 1) for k in ks]
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
    return Costs(target_step_s=t, draft_step_s=d, c=d / t, v={k: med[k] / t for k in ks}, device=str(device),
                 dtype=str(next(target.parameters()).dtype).removeprefix("torch."), prompt_len=prompt_len, repeats=repeats)
