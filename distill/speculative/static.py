"""The GPU verification loop: preallocated KV caches and each round replayed as CUDA graphs.

Both models write into transformers' `StaticCache` tensors at slots the loop names, with one
length per model kept as a device scalar. Every round has the same shapes for a given k: the
draft always starts from two pending tokens (the one before the last emitted token is recomputed,
which costs a memory-bound draft nothing), and the verify step itself moves both lengths back
past the rejected proposals. So the draft's k steps are one graph and the target's verify plus
acceptance is another, captured once per k, and the only host synchronisation of a round is the
one read of the accepted count and the emitted tokens. Greedy decoding only; off CUDA the same
steps run eagerly, which is how the CPU tests check the loop against the eager decoder.

With `compile_draft` (the decoder's backend="compiled", the fast path off CUDA) the draft's k
steps are one `torch.compile` graph instead: a small draft's forward is mostly Python and
dispatch overhead, which the compiled graph removes. The target stays as it is, so the emitted
tokens are computed exactly as in the static loop; compiled numerics can change only what the
draft proposes, never what is emitted."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel, StaticCache

from distill.speculative.sampling import greedy_accept
from distill.speculative.schedule import make_schedule
from distill.speculative.stats import SpecStats

if TYPE_CHECKING:
    from distill.speculative.decoder import SpecOutput, SpeculativeDecoder
    from distill.speedup import Costs

BACKENDS = ("eager", "static", "compiled", "auto")
_ATTENTION = ("sdpa", "eager")


def graphs_available(device: torch.device) -> bool:
    """CUDA graphs need a CUDA device; everywhere else the static loop runs its steps eagerly."""
    return device.type == "cuda" and torch.cuda.is_available()


def static_problem(model: PreTrainedModel, role: str) -> str | None:
    """Why the static cache cannot serve `model` (the `role` it plays), with the fix; None if it can."""
    cfg = model.config.get_text_config()
    kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
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


class SlotCache(StaticCache):
    """transformers' StaticCache written at `slots` (set by the loop before each forward) instead of
    at a length of its own, so all layers share one device-side length that graphs can move."""

    slots: torch.Tensor

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        layer = self.layers[layer_idx]
        layer.keys.index_copy_(2, self.slots, key_states)
        layer.values.index_copy_(2, self.slots, value_states)
        return layer.keys, layer.values


class _Side:
    """One model with its preallocated cache, its filled length (a device scalar) and the masks of
    left-padded prompts; `forward` only reads and writes tensors of fixed address."""

    def __init__(self, model, batch: int, capacity: int, valid: torch.Tensor, offset: torch.Tensor, rows: int | None = None):
        cfg = model.config.get_text_config()
        device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.model, self.rows, self.valid, self.offset = model, rows, valid, offset
        self.cache = SlotCache(config=cfg, max_cache_len=capacity)
        self.cache.early_initialization(batch, cfg.num_key_value_heads, head_dim, dtype, device)
        self.length = torch.zeros((), dtype=torch.long, device=device)
        self.columns = torch.arange(capacity, device=device)
        self.masked = torch.finfo(dtype).min

    def forward(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        """Logits of the last `keep` positions after writing `ids` [B, q] at the next q slots."""
        slots = self.length + torch.arange(ids.shape[1], device=ids.device)
        self.cache.slots = slots
        # A query sees earlier slots that hold real tokens, and always itself (so no row of the
        # mask is empty for left-padding queries, which would turn into NaNs).
        seen = (self.columns[None, None] <= slots[None, :, None]) & self.valid[:, None]
        seen |= self.columns[None, None] == slots[None, :, None]
        mask = torch.zeros(seen.shape, dtype=self.cache.layers[0].keys.dtype, device=ids.device)
        mask.masked_fill_(~seen, self.masked)
        if self.rows is not None:  # ids past a smaller draft's embedding (padding rows): feed 0 instead
            ids = ids.masked_fill(ids >= self.rows, 0)
        out = self.model(input_ids=ids, attention_mask={"full_attention": mask[:, None]},
                         position_ids=(slots[None] - self.offset[:, None]).clamp_min(0),
                         cache=self.cache, use_cache=True, logits_to_keep=keep)
        self.length += ids.shape[1]
        return out.logits


class _Graphs:
    """Runs step functions as CUDA graphs captured on first use (one per key), or eagerly off CUDA.

    A step function reads and writes only tensors that outlive it and returns nothing, so graphs
    can share one memory pool. Warm-up runs once outside the capture (cuBLAS and allocator
    initialisation); `state` lists the tensors it mutates, restored after warm-up."""

    def __init__(self, device: torch.device, enabled: bool):
        self.device, self.enabled = device, enabled
        self.graphs: dict = {}
        self.pool = torch.cuda.graph_pool_handle() if enabled else None
        self.keys: set = set()  # every step run, graphed or not

    def run(self, key, step: Callable[[], None], state: list[torch.Tensor]) -> None:
        self.keys.add(key)
        if not self.enabled:
            step()
            return
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = self._capture(step, state)
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


class _Clock:
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


class StaticLoop:
    """Greedy speculative decoding with static caches and graphed rounds (see the module docstring).

    `draft=None` (with k = 0) decodes with the target alone through the same graphed step, the
    fair baseline for the graphed loop's speedup. Buffers and graphs are kept between calls of
    the same batch size whose length fits; a larger call reallocates them."""

    def __init__(self, target: PreTrainedModel, draft: PreTrainedModel | None, num_draft_tokens: int,
                 schedule: str = "constant", vocab_size: int | None = None, draft_rows: int | None = None,
                 context: int = 1 << 30, graphs: bool | None = None, compile_draft: bool = False):
        check_static_model(target, "target")
        if draft is not None:
            check_static_model(draft, "draft")
        elif num_draft_tokens != 0:
            raise ValueError("a StaticLoop without a draft decodes with the target alone: pass num_draft_tokens=0")
        self.target, self.draft = target, draft
        self.device = next(target.parameters()).device
        self.num_draft_tokens, self.schedule_name = num_draft_tokens, schedule
        self.vocab_size = vocab_size or target.config.get_text_config().vocab_size
        self.draft_rows, self.context = draft_rows, context
        self.graphs_enabled = graphs_available(self.device) and not compile_draft if graphs is None else graphs
        if self.graphs_enabled and not graphs_available(self.device):
            raise ValueError(f"CUDA graphs need a CUDA device, but the models are on {self.device}: pass graphs=False")
        if self.graphs_enabled and compile_draft:
            raise ValueError("compile_draft replaces the CUDA graphs of the draft steps: pass graphs=False with it")
        # One graph per k (k is a Python int, so dynamo specialises on it); compiled on first use.
        self._draft_fn = torch.compile(self._draft_steps, fullgraph=True, dynamic=False) if compile_draft else self._draft_steps
        self._shape: tuple[int, int, int] | None = None
        self._retired = 0  # graphs captured by buffers since replaced

    @property
    def captures(self) -> int:
        """CUDA graphs captured so far, over all buffers (0 off CUDA): a call that raised it paid for capture."""
        return self._retired + (len(self.runner.graphs) if self._shape is not None else 0)

    @property
    def steps(self) -> set:
        """Keys ("draft" | "verify", k) of the steps the current buffers have run."""
        return set(self.runner.keys) if self._shape is not None else set()

    @classmethod
    def for_decoder(cls, decoder: SpeculativeDecoder) -> StaticLoop:
        """The static loop for a SpeculativeDecoder's pair and settings."""
        rows = decoder.draft_rows if decoder.draft_rows < decoder.target_vocab else None
        compiled = decoder.backend == "compiled"
        return cls(decoder.target, decoder.draft, decoder.num_draft_tokens, decoder.schedule_name,
                   decoder.vocab_size, rows, decoder.context, graphs=False if compiled else None, compile_draft=compiled)

    # --- buffers ---------------------------------------------------------------------------

    def _allocate(self, batch: int, capacity: int, k_cap: int) -> None:
        """(Re)build caches and round buffers unless the current ones fit; drop stale graphs."""
        if self._shape is not None and self._shape[0] == batch and self._shape[1] >= capacity and self._shape[2] >= k_cap:
            return
        self._retired = self.captures
        capacity = -(-capacity // 256) * 256  # headroom, so calls of similar length share buffers and graphs
        dev = self.device
        self.valid = torch.ones(batch, capacity, dtype=torch.bool, device=dev)
        self.offset = torch.zeros(batch, dtype=torch.long, device=dev)
        self.active = torch.ones(batch, dtype=torch.bool, device=dev)
        self.tokens = torch.zeros(batch, k_cap + 1, dtype=torch.long, device=dev)  # [last emitted, proposals...]
        self.pending = torch.zeros(batch, 2, dtype=torch.long, device=dev)  # the draft's next input
        self.result = torch.zeros(batch, k_cap + 3, dtype=torch.long, device=dev)  # [n, m, emitted...]
        self.tside = _Side(self.target, batch, capacity, self.valid, self.offset)
        self.dside = None if self.draft is None else _Side(self.draft, batch, capacity, self.valid, self.offset, self.draft_rows)
        self.runner = _Graphs(dev, self.graphs_enabled)
        self._shape = (batch, capacity, k_cap)

    def _state(self) -> list[torch.Tensor]:
        sides = [self.tside] + ([self.dside] if self.dside is not None else [])
        return [s.length for s in sides] + [self.tokens, self.pending, self.result]

    # --- the two graphed steps -------------------------------------------------------------

    def _draft_steps(self, k: int) -> None:
        """k greedy draft steps from the two pending tokens; proposals land in tokens[:, 1:k+1]."""
        ids = self.pending
        for j in range(1, k + 1):
            logits = self.dside.forward(ids, keep=1)[:, -1, : self.vocab_size]
            self.tokens[:, j] = logits.argmax(-1)
            ids = self.tokens[:, j : j + 1]

    def _verify(self, k: int) -> None:
        """Target forward over [last, proposals], greedy acceptance, and the state of the next round:
        both lengths moved back past rejected proposals, next pending tokens and last token set."""
        batch = self.tokens.shape[0]
        logits = self.tside.forward(self.tokens[:, : k + 1], keep=k + 1)
        proposals = self.tokens[:, 1 : k + 1]
        n, nxt = greedy_accept(proposals, logits)
        m = torch.where(self.active, n, k).min()  # rows advance together by the shortest accepted block
        at_m = m.view(1, 1).expand(batch, 1)
        emitted = torch.cat([proposals, nxt[:, None]], 1)
        # Each row's token at m: its accepted draft where it accepted more than m, else the target's own.
        y = torch.where(n > m, emitted.gather(1, at_m).squeeze(1), nxt)
        emitted.scatter_(1, at_m, y[:, None])
        before_y = torch.cat([self.tokens[:, :1], emitted], 1).gather(1, at_m)
        self.tside.length -= k - m
        if self.dside is not None:
            self.dside.length -= k - m
        self.pending.copy_(torch.cat([before_y, y[:, None]], 1))
        self.tokens[:, 0] = y
        self.result[:, 0] = n
        self.result[:, 1] = m
        self.result[:, 2 : k + 3] = emitted

    def _round(self, k: int) -> tuple[list[list[int]], float, float]:
        """One round: [n, m, emitted...] per row (read in the round's one host sync), and the
        seconds the draft steps and the verify took."""
        clock = _Clock(self.device)
        if k:
            self.runner.run(("draft", k), lambda: self._draft_fn(k), self._state())
        clock.mark()
        self.runner.run(("verify", k), lambda: self._verify(k), self._state())
        clock.mark()
        result = self.result[:, : k + 3].tolist()
        return result, clock.seconds(0, 1), clock.seconds(1, 2)

    # --- the loop --------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 eos: list[int], pad: int, start: float | None = None) -> SpecOutput:
        """Greedy generation of checked inputs (see SpeculativeDecoder.generate); `start` is when the
        call began, for TTFT and wall time."""
        from distill.speculative.decoder import SpecOutput

        start = time.perf_counter() if start is None else start
        batch, prompt_len = input_ids.shape
        schedule = make_schedule(self.schedule_name, self.num_draft_tokens)
        k_cap = max(self.num_draft_tokens, getattr(schedule, "k_max", 0))
        self._allocate(batch, prompt_len + max_new_tokens + k_cap + 2, k_cap)
        self.valid.fill_(True)
        self.valid[:, :prompt_len] = attention_mask.bool()
        self.offset.copy_(prompt_len - attention_mask.sum(-1))
        self.active.fill_(True)
        self.tside.length.zero_()
        if self.dside is not None:
            self.dside.length.zero_()
        stats = SpecStats(num_sequences=batch)
        eos_set = set(eos)
        cuda = self.device.type == "cuda"

        last = self.tside.forward(input_ids, keep=1)[:, -1].argmax(-1)
        first = last.tolist()
        stats.sequence_forwards += batch
        stats.target_forwards = 1
        out = [[t] for t in first]
        lengths = [1 if t in eos_set else max_new_tokens for t in first]
        stats.ttft_s = time.perf_counter() - start
        self.tokens[:, 0] = last
        if self.dside is not None:
            if prompt_len > 1:
                self.dside.forward(input_ids[:, :-1], keep=1)
                stats.draft_forwards += 1
            self.pending.copy_(torch.stack([input_ids[:, -1], last], 1))
        done = 1
        rows = [i for i in range(batch) if lengths[i] > done]
        if len(rows) < batch:
            self.active[[i for i in range(batch) if lengths[i] <= done]] = False

        while rows and done < max_new_tokens:
            remaining = min(max_new_tokens - done, self.context - prompt_len - done)
            if remaining <= 0:
                break
            # A round near the end runs the schedule's k (its graphs exist) but emits at most
            # `room` drafts: exactly what a round of k = room emits, and the loop ends after it.
            k = schedule.next_k()
            room = min(k, remaining - 1)
            result, draft_s, verify_s = self._round(k)
            m = min(result[0][1], room)
            n_list = [min(result[i][0], room) for i in rows]
            for n_i in n_list:
                schedule.update(room, n_i, draft_s, verify_s)
            stats.record_round(room, n_list)
            stats.sequence_forwards += len(rows)
            stats.target_forwards += 1
            stats.draft_forwards += k
            finished = []
            for i in rows:
                block = result[i][2 : m + 3]
                ends = [j for j, t in enumerate(block) if t in eos_set]
                if ends:
                    block = block[: ends[0] + 1]
                    lengths[i] = done + len(block)
                    finished.append(i)
                out[i] += block
            done += m + 1
            if finished:
                self.active[finished] = False
                rows = [i for i in rows if i not in finished]

        lengths = [min(n, done) for n in lengths]
        stats.new_tokens = sum(lengths)
        width = max(lengths)
        new = torch.tensor([row[:n] + [pad] * (width - n) for row, n in zip(out, lengths)], dtype=torch.long, device=self.device)
        if cuda:
            torch.cuda.synchronize(self.device)
        stats.wall_s = time.perf_counter() - start
        return SpecOutput(torch.cat([input_ids, new], 1), stats)


def target_only_generate(target: PreTrainedModel, input_ids: torch.LongTensor, max_new_tokens: int,
                         eos_token_id: int | list[int] | None = None, pad_token_id: int = 0,
                         loop: StaticLoop | None = None) -> SpecOutput:
    """Greedy decoding with the target alone through the static loop's graphed step (k = 0): the
    baseline against which the graphed speculative loop's speedup is measured. Pass `loop` (built
    with `StaticLoop(target, None, 0)`) to reuse its captured graph across calls."""
    loop = loop or StaticLoop(target, None, 0, context=getattr(target.config.get_text_config(), "max_position_embeddings", 1 << 30))
    eos = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    input_ids = input_ids.to(loop.device)
    return loop.generate(input_ids, torch.ones_like(input_ids), max_new_tokens, eos, pad_token_id)


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
    valid = torch.ones(1, capacity, dtype=torch.bool, device=device)
    offset = torch.zeros(1, dtype=torch.long, device=device)
    sides = {"target": _Side(target, 1, capacity, valid, offset), "draft": _Side(draft, 1, capacity, valid, offset)}
    for side in sides.values():
        side.forward(prompt, keep=1)
    runner = _Graphs(device, enabled)
    sink = torch.zeros(1, dtype=torch.long, device=device)

    def step(side: _Side, n: int) -> Callable[[], None]:
        def run() -> None:
            sink.copy_(side.forward(tokens[:, :n], keep=n)[:, -1].argmax(-1))
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
            runner.run(name, fn, state)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    t, d = med["target"], med["draft"]
    return Costs(target_step_s=t, draft_step_s=d, c=d / t, v={k: med[k] / t for k in ks}, device=str(device),
                 dtype=str(next(target.parameters()).dtype).removeprefix("torch."), prompt_len=prompt_len, repeats=repeats)
