"""The draft -> verify -> accept loop, in which every row of a batch keeps its own accepted length.

A round: the draft proposes k tokens from two pending tokens (the one before the last emitted
token is recomputed, so every row's draft input has the same shape); the target scores the last
emitted token and the k proposals in one forward; the acceptance rule keeps each row's accepted
prefix n_b and adds one token of the target's own. Each row emits n_b + 1 tokens; its rejected
slots become holes in both caches (`distill.speculative.cache`), and the next round's positions
continue per row. Models with sliding-window layers cannot take holes (a window counts slots), so
for them rows advance together by the shortest accepted block (lockstep), which stays lossless.

The draft steps and the verify step read and write only tensors the loop owns, with no host
synchronisation, so on CUDA with static caches each is replayed as a CUDA graph (one per k), and
with `compile_draft` the draft steps are one torch.compile graph. Sampling draws its uniforms
outside them; the one host sync of a round reads what the verify step wrote."""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import PreTrainedModel

from distill.common.clock import Clock
from distill.common.trim import draft_to_target, prompt_rows
from distill.speculative.cache import DynamicSide, StaticSide
from distill.speculative.sampling import greedy_accept, rejection_accept, sample, warp
from distill.speculative.schedule import make_schedule
from distill.speculative.static import Graphs, check_static_model, graphs_available
from distill.speculative.stats import SpecOutput, SpecStats


class SpecLoop:
    """Speculative decoding of checked inputs over `cache` = "dynamic" (DynamicCache, any model) or
    "static" (preallocated caches; CUDA graphs on CUDA unless `graphs=False`; the draft's k steps as
    a torch.compile graph with `compile_draft`). `draft=None` with k = 0 decodes with the target
    alone through the same steps, the fair baseline of the graphed loop. Static buffers and graphs
    are kept between calls of the same batch size whose length fits."""

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel | None,
        num_draft_tokens: int,
        schedule: str = "constant",
        vocab_size: int | None = None,
        draft_rows: int | None = None,
        context: int = 1 << 30,
        cache: str = "static",
        graphs: bool | None = None,
        compile_draft: bool = False,
        ragged: bool = True,
    ):
        if cache not in ("dynamic", "static"):
            raise ValueError(f"cache must be 'dynamic' or 'static', got {cache!r}")
        self.static = cache == "static"
        if self.static:
            check_static_model(target, "target")
            if draft is not None:
                check_static_model(draft, "draft")
        if draft is None and num_draft_tokens != 0:
            raise ValueError("a loop without a draft decodes with the target alone: pass num_draft_tokens=0")
        self.target, self.draft, self.ragged = target, draft, ragged
        self.device = next(target.parameters()).device
        self.num_draft_tokens, self.schedule_name = num_draft_tokens, schedule
        self.target_vocab = target.config.get_text_config().vocab_size
        self.vocab_size = vocab_size or self.target_vocab
        self.draft_rows, self.context = draft_rows, context
        # A trimmed draft's head scores K target ids (row i: draft_to_target[i]), and with prompt rows K + E,
        # the last E filled per call with the prompt's tokens outside the set; None: the shared vocabulary.
        self.prompt_rows = prompt_rows(draft)
        self.draft_to_target = self.prompt_rows.map if self.prompt_rows is not None else draft_to_target(draft)
        self.draft_width = self.vocab_size if self.draft_to_target is None else self.draft_to_target.numel()
        on_cuda = graphs_available(self.device)
        self.graphs_enabled = (self.static and on_cuda and not compile_draft) if graphs is None else graphs
        if self.graphs_enabled and not (self.static and on_cuda):
            raise ValueError(f"CUDA graphs need static caches on a CUDA device, but the models are on {self.device}: pass graphs=False")
        if self.graphs_enabled and compile_draft:
            raise ValueError("compile_draft replaces the CUDA graphs of the draft steps: pass graphs=False with it")
        # One graph per (k, sampling); k is a Python int, so dynamo specialises on it.
        self._draft_fn = torch.compile(self._draft_steps, fullgraph=True, dynamic=False) if compile_draft else self._draft_steps
        self._shape: tuple[int, int, int] | None = None
        self._retired = 0  # graphs captured by buffers since replaced
        self.sampling, self.temperature, self.top_p = False, 1.0, 1.0

    @classmethod
    def for_decoder(cls, decoder: Any, cache: str) -> SpecLoop:
        """The loop for a SpeculativeDecoder's pair and settings, on `cache` (the decoder imports this
        module, so its type is not named here)."""
        rows = decoder.draft_rows if decoder.draft_rows < decoder.target_vocab else None
        compiled = decoder.backend == "compiled"
        return cls(
            decoder.target,
            decoder.draft,
            decoder.num_draft_tokens,
            decoder.schedule_name,
            decoder.vocab_size,
            rows,
            decoder.context,
            cache=cache,
            graphs=False if compiled else None,
            compile_draft=compiled,
            ragged=decoder.ragged,
        )

    @property
    def captures(self) -> int:
        """CUDA graphs captured so far, over all buffers (0 off CUDA): a call that raised it paid for capture."""
        return self._retired + (len(self.runner.graphs) if self._shape is not None else 0)

    @property
    def steps(self) -> set:
        """Keys ("draft" | "verify", k, sampling) of the steps the current buffers have run."""
        return set(self.runner.keys) if self._shape is not None else set()

    # --- buffers ---------------------------------------------------------------------------

    def _allocate(self, batch: int, capacity: int, k_cap: int) -> None:
        """(Re)build caches and round buffers unless the current static ones fit; drop stale graphs."""
        if self.static and self._shape is not None and self._shape[0] == batch and self._shape[1] >= capacity and self._shape[2] >= k_cap:
            return
        self._retired = self.captures
        capacity = -(-capacity // 256) * 256  # headroom, so calls of similar length share buffers and graphs
        dev, side = self.device, StaticSide if self.static else DynamicSide
        self.pos = torch.zeros(batch, dtype=torch.long, device=dev)  # position of each row's last emitted token
        self.active = torch.ones(batch, dtype=torch.bool, device=dev)
        self.tokens = torch.zeros(batch, k_cap + 1, dtype=torch.long, device=dev)  # [last emitted, proposals...]
        self.pending = torch.zeros(batch, 2, dtype=torch.long, device=dev)  # the draft's next input
        self.result = torch.zeros(batch, k_cap + 4, dtype=torch.long, device=dev)  # [kept, n, top, emitted...]
        self.uniforms = torch.zeros(batch, 2 * k_cap + 1, device=dev)
        self.q = None  # the draft's distributions [B, k, V], allocated when sampling first runs
        self.steps_ahead = torch.arange(k_cap + 1, device=dev)
        self.tside = side(self.target, batch, capacity, context=self.context)
        self.dside = None if self.draft is None else side(self.draft, batch, capacity, self.draft_rows, self.context)
        self.runner = Graphs(dev, self.graphs_enabled)
        self._shape = (batch, capacity, k_cap)

    def _sides(self) -> list:
        return [self.tside] + ([self.dside] if self.dside is not None else [])

    def _state(self) -> list[torch.Tensor]:
        """The tensors a step mutates besides the caches' contents (restored after a graph's warm-up)."""
        lengths = [s.length for s in self._sides()] if self.static else []
        return lengths + [s.valid for s in self._sides()] + [self.pos, self.tokens, self.pending, self.result]

    # --- the two steps of a round ----------------------------------------------------------

    def _choose(self, logits: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The next token from `logits` [B, V]: its argmax, or a draw at the uniforms `u` [B]."""
        if not self.sampling:
            return logits.argmax(-1), None
        probs = warp(logits, self.temperature, self.top_p)
        return sample(probs, u), probs

    def _draft_steps(self, k: int) -> None:
        """k draft steps from the two pending tokens; proposals land in tokens[:, 1:k+1] (and their
        distributions in q when sampling). A trimmed draft chooses among its rows, proposes the
        target id of the row chosen and gives every other id probability 0 in q; its next input is
        that target id (its input embedding is whole)."""
        ids, positions = self.pending, self.pos[:, None] - 1 + self.steps_ahead[:2]
        d2t = self.draft_to_target
        for j in range(1, k + 1):
            logits = self.dside.forward(ids, positions, keep=1)[:, -1, : self.draft_width]
            choice, probs = self._choose(logits, self.uniforms[:, j - 1])
            if d2t is None:
                self.tokens[:, j] = choice
                if probs is not None:
                    self.q[:, j - 1, : self.vocab_size] = probs
            else:
                self.tokens[:, j] = d2t[choice]
                if probs is not None:  # unused prompt rows repeat id 0 with probability 0: added, not copied
                    self.q[:, j - 1].zero_().index_add_(1, d2t, probs)
            ids, positions = self.tokens[:, j : j + 1], self.pos[:, None] + j

    def _verify(self, k: int) -> None:
        """Target forward over [last, proposals], acceptance, holes for rejected slots, and the next
        round's state; writes [kept, n, top, emitted...] per row into `result`."""
        logits = self.tside.forward(self.tokens[:, : k + 1], self.pos[:, None] + self.steps_ahead[: k + 1], keep=k + 1)
        proposals = self.tokens[:, 1 : k + 1]
        if self.sampling:
            p = warp(logits, self.temperature, self.top_p)
            n, nxt = rejection_accept(proposals, self.q[:, :k], p, self.uniforms[:, k : 2 * k + 1])
        else:
            n, nxt = greedy_accept(proposals, logits)
        # Each row keeps its own accepted block (ragged), or all rows the shortest one (lockstep);
        # finished rows keep the longest live one, so they add no holes.
        kept = n if self.ragged else torch.where(self.active, n, k).min().expand_as(n)
        top = torch.where(self.active, kept, 0).max()
        kept = torch.where(self.active, kept, top)
        emitted = torch.cat([proposals, nxt[:, None]], 1)
        at_kept = kept[:, None]
        # The token at `kept`: the row's accepted draft where it accepted more (lockstep), else the target's own.
        y = torch.where(n > kept, emitted.gather(1, at_kept).squeeze(1), nxt)
        emitted.scatter_(1, at_kept, y[:, None])
        before_y = self.tokens[:, : k + 1].gather(1, at_kept).squeeze(1)
        for side in self._sides():
            side.reject(kept, k)
            side.shrink(k - top)
        self.pending.copy_(torch.stack([before_y, y], 1))
        self.tokens[:, 0] = y
        self.pos += kept + 1
        self.result[:, 0], self.result[:, 1], self.result[:, 2] = kept, n, top
        self.result[:, 3 : k + 4] = emitted

    def _round(self, k: int) -> tuple[list[list[int]], float, float, float]:
        """One round: [kept, n, top, emitted...] per row (read in the round's one host sync), the
        seconds the draft steps (uniforms included) and the verify took on the device's clock, and
        the host time at which the round's bookkeeping starts (the verify's end on a CPU; after the
        sync on CUDA, where the host waits for the device)."""
        clock = Clock(self.device)
        if self.sampling:
            self.uniforms[:, : 2 * k + 1].copy_(torch.rand(self.uniforms.shape[0], 2 * k + 1, generator=self.generator, device=self.device))
        if k:
            self.runner.run(("draft", k, self.sampling), lambda: self._draft_fn(k), self._state)
        clock.mark()
        self.runner.run(("verify", k, self.sampling), lambda: self._verify(k), self._state)
        clock.mark()
        verify_end = clock.marks[-1]
        result = self.result[:, : k + 4].tolist()
        return result, clock.seconds(0, 1), clock.seconds(1, 2), time.perf_counter() if clock.cuda else verify_end

    # --- the loop --------------------------------------------------------------------------

    def _prefill(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Both caches filled with the prompt (the draft's without its last token, which it reads
        as a pending token); returns each row's first token."""
        prompt_len = input_ids.shape[1]
        offset = prompt_len - attention_mask.sum(-1)
        positions = torch.arange(prompt_len, device=self.device)[None] - offset[:, None]
        padded = bool((attention_mask == 0).any())
        for side, width in ((self.tside, prompt_len), (self.dside, prompt_len - 1)):
            if side is None:
                continue
            side.valid.fill_(True)
            side.valid[:, :width] = attention_mask[:, :width].bool()
            if self.static:
                side.length.zero_()
            else:
                side.holes = padded
            side.size = width
        logits = self.tside.forward(input_ids, positions, keep=1)[:, -1]
        if self.sampling:
            u = torch.rand(input_ids.shape[0], generator=self.generator, device=self.device)
        first, _ = self._choose(logits, u if self.sampling else None)
        if self.dside is not None and prompt_len > 1:
            self.dside.forward(input_ids[:, :-1], positions[:, :-1], keep=1)
        self.pos.copy_(prompt_len - offset)
        self.tokens[:, 0] = first
        self.pending.copy_(torch.stack([input_ids[:, -1], first], 1))
        self.active.fill_(True)
        return first

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor,
        max_new_tokens: int,
        eos: list[int],
        pad: int,
        start: float | None = None,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> SpecOutput:
        """Generation of checked inputs (see SpeculativeDecoder.generate); `start` is when the call
        began, for TTFT and wall time."""
        start = time.perf_counter() if start is None else start
        batch, prompt_len = input_ids.shape
        schedule = make_schedule(self.schedule_name, self.num_draft_tokens)
        k_cap = max(self.num_draft_tokens, getattr(schedule, "k_max", 0))
        # Holes add at most k slots a round; twice the output's room keeps compaction rare.
        self._allocate(batch, prompt_len + 2 * max_new_tokens + 2 * (k_cap + 1), k_cap)
        self.sampling, self.temperature, self.top_p, self.generator = do_sample, temperature, top_p, generator
        if do_sample and self.q is None:
            self.q = torch.zeros(batch, k_cap, self.target_vocab, device=self.device)
        stats = SpecStats(num_sequences=batch)
        eos_set = set(eos)

        if self.prompt_rows is not None:
            self.prompt_rows.fill(input_ids[attention_mask.bool()], self.vocab_size)
        first = self._prefill(input_ids, attention_mask).tolist()
        stats.sequence_forwards, stats.target_forwards = batch, 1
        stats.draft_forwards = int(self.dside is not None and prompt_len > 1)
        stats.ttft_s = time.perf_counter() - start
        real = attention_mask.sum(-1).tolist()
        limit = [min(max_new_tokens, self.context - r) for r in real]  # tokens each row may emit
        out = [[t] for t in first]
        live = [i for i in range(batch) if first[i] not in eos_set and limit[i] > 1]
        waste = [prompt_len - r for r in real]  # per row: slots that hold no token of its own
        self._retire([i for i in range(batch) if i not in live])

        while live:
            room = [limit[i] - len(out[i]) for i in live]
            k = min(schedule.next_k(), k_cap)
            if not self.static:  # (static rounds keep the schedule's k: their graphs exist)
                k = max(1, min(k, max(room) - 1)) if self.dside is not None else 0
            result, draft_s, verify_s, booked_from = self._round(k)
            proposed = [min(k, r - 1) for r in room]
            accepted = [min(result[i][1], p) for i, p in zip(live, proposed)]
            for p, a in zip(proposed, accepted):
                schedule.update(p, a, draft_s, verify_s)
            stats.record_round(proposed, accepted)
            stats.sequence_forwards += len(live)
            stats.target_forwards += 1
            stats.draft_forwards += k
            top = result[0][2]
            for side in self._sides():
                side.size += top + 1
            finished = []
            for i, r in zip(live, room):
                block = result[i][3 : 3 + result[i][0] + 1][:r]
                ends = [j for j, t in enumerate(block) if t in eos_set]
                if ends:
                    block = block[: ends[0] + 1]
                out[i] += block
                waste[i] += top - result[i][0]
                if ends or len(out[i]) >= limit[i]:
                    finished.append(i)
            live = [i for i in live if i not in finished]
            self._retire(finished)
            if live:
                self._compact_if_needed(live, waste)
            stats.record_times(k, draft_s, verify_s, time.perf_counter() - booked_from)

        stats.new_tokens = sum(map(len, out))
        width = max(map(len, out))
        new = torch.tensor([row + [pad] * (width - len(row)) for row in out], dtype=torch.long, device=self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        stats.wall_s = time.perf_counter() - start
        return SpecOutput(torch.cat([input_ids, new], 1), stats)

    def _retire(self, rows: list[int]) -> None:
        if rows:
            self.active[rows] = False

    def _compact_if_needed(self, live: list[int], waste: list[int]) -> None:
        """Squeeze the holes out of both caches when `_compaction_due`; `waste` (per row: slots that
        hold none of its tokens) is lowered by what every live row gains."""
        shrink = min(waste[i] for i in live)
        if not shrink or not self._compaction_due(shrink):
            return
        for side in self._sides():
            side.compact(side.size - shrink)
        for i in range(len(waste)):
            waste[i] = max(0, waste[i] - shrink)

    def _compaction_due(self, shrink: int) -> bool:
        """When the next round would overflow a static cache, or when compaction would cut a
        dynamic cache by a quarter (attention reads every slot, holes too)."""
        size = self.tside.size
        if self.static:
            return size + self._shape[2] + 1 > self.tside.capacity
        return shrink >= max(16, size // 4)


def target_only_generate(
    target: PreTrainedModel,
    input_ids: torch.LongTensor,
    max_new_tokens: int,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int = 0,
    loop: SpecLoop | None = None,
) -> SpecOutput:
    """Greedy decoding with the target alone through the static loop's graphed step (k = 0): the
    baseline against which the graphed speculative loop's speedup is measured. Pass `loop` (built
    with `SpecLoop(target, None, 0)`) to reuse its captured graph across calls."""
    loop = loop or SpecLoop(target, None, 0, context=getattr(target.config.get_text_config(), "max_position_embeddings", 1 << 30))
    eos = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    input_ids = input_ids.to(loop.device)
    return loop.generate(input_ids, torch.ones_like(input_ids), max_new_tokens, eos, pad_token_id)
