"""What the GPU loop needs beyond the models: which models static caches can serve, CUDA graphs
captured once per step and replayed, and device-side timing (`distill.speculative.costs` times the
static steps).

The loop (`distill.speculative.loop`) keeps every step free of host synchronisation and of
tensors allocated per call, so on CUDA each round's draft steps and verify step are replayed as
two CUDA graphs (one per k); off CUDA the same steps run eagerly, which is how the CPU tests
check them."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel

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
        return f"the static backend needs full attention in every layer, but the {role} has {sorted(kinds)}: use backend='eager' (sliding-window layers)"
    attn = getattr(model.config, "_attn_implementation", None) or "eager"
    if attn not in _ATTENTION:
        return (
            f"the static backend passes an explicit attention mask, which {attn!r} attention does not take: "
            f"load the {role} with attn_implementation='sdpa' or use backend='eager'"
        )
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
