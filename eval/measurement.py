"""Timed decoding for the acceptance evaluation: one batch decoded by the target alone (transformers'
`generate`) or speculatively (the bundled decoder), and which calls a run must make so that every
speedup compares calls timed in one run.

A speedup pairs each speculative call with the target-only call on the same prompts timed in the
same run, interleaved batch by batch. A run reuses a journalled call's outputs and acceptance from
any earlier run, but when a batch lacks such a pair for some system (a draft added to a finished
run, a retrained draft, a journal older than runs), the run times the batch's target-only call again
and then each system that lacks its pair.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.generation.streamers import BaseStreamer

from distill.common.vocab import cut_at_eos
from distill.eval.journal import Journal
from distill.speculative import SpeculativeDecoder

TARGET = "target"
ALONE = "alone:"  # journal system of a draft decoding by itself (its own task quality)


@dataclass
class Decoding:
    """How the run decodes: greedy or sampled, and the stop/pad ids both decoders use."""

    max_new_tokens: int
    do_sample: bool
    temperature: float
    top_p: float
    eos: list[int]
    pad: int


class FirstTokenClock(BaseStreamer):
    """Notes when `generate` hands over its first new token (its second `put`; the first is the prompt)."""

    def __init__(self) -> None:
        self.puts, self.first = 0, None

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def target_generate(target: PreTrainedModel, batch: dict[str, torch.Tensor], dec: Decoding, seed: int) -> dict[str, Any]:
    """Target-only `generate` on one batch: new tokens per row, wall time and time to first token."""
    kwargs: dict[str, Any] = {"do_sample": dec.do_sample}
    if dec.do_sample:
        kwargs.update(temperature=dec.temperature, top_p=dec.top_p, top_k=0)
        torch.manual_seed(seed)
    device = batch["input_ids"].device
    clock = FirstTokenClock()
    _sync(device)
    start = time.perf_counter()
    out = target.generate(**batch, max_new_tokens=dec.max_new_tokens, eos_token_id=dec.eos, pad_token_id=dec.pad, streamer=clock, **kwargs)
    _sync(device)
    wall = time.perf_counter() - start
    new = out[:, batch["input_ids"].shape[1] :].tolist()
    return {"new": [cut_at_eos(row, set(dec.eos)) for row in new], "wall_s": wall, "ttft_s": (clock.first or time.perf_counter()) - start}


def speculative_generate(decoder: SpeculativeDecoder, batch: dict[str, torch.Tensor], dec: Decoding, seed: int) -> dict[str, Any]:
    """Speculative decoding of one batch: new tokens per row, wall time, TTFT and the decoder's stats
    (acceptance, and the decode phase timed per round: draft, verify, bookkeeping)."""
    out = decoder.generate(
        batch["input_ids"],
        batch["attention_mask"],
        max_new_tokens=dec.max_new_tokens,
        do_sample=dec.do_sample,
        temperature=dec.temperature if dec.do_sample else 1.0,
        top_p=dec.top_p,
        eos_token_id=dec.eos,
        pad_token_id=dec.pad,
        seed=seed,
    )
    new = out.sequences[:, batch["input_ids"].shape[1] :].tolist()
    return {"new": [cut_at_eos(row, set(dec.eos)) for row in new], "wall_s": out.stats.wall_s, "ttft_s": out.stats.ttft_s, "stats": out.stats.to_dict()}


@dataclass(frozen=True)
class Call:
    """One generate call of the plan: a batch of a task's prompts decoded by `system` (at `k`)."""

    key: str
    task: str
    batch: int
    examples: tuple[int, ...]
    system: str
    k: int | None

    @property
    def timed(self) -> bool:
        """Whether its timing enters a speedup (paired with the target-only call of its run)."""
        return self.system != TARGET and not self.system.startswith(ALONE)


def calls_to_run(batches: Sequence[Sequence[Call]], journal: Journal) -> list[Call]:
    """The calls this run makes, batch by batch in order: a batch in which some speculative call has no
    target-only call of its own run (or some call is not journalled at all) gets its target-only call
    timed again, then every speculative call lacking that pair and every call not journalled."""
    todo: list[Call] = []
    for calls in batches:
        target = next(c for c in calls if c.system == TARGET)
        unpaired = [c for c in calls if c.timed and (journal.latest(c.key) is None or journal.in_run(target.key, journal.latest(c.key)["run_id"]) is None)]
        missing = [c for c in calls if journal.latest(c.key) is None and c not in unpaired]
        if unpaired or missing:
            rerun_target = bool(unpaired) or journal.latest(target.key) is None
            todo += ([target] if rerun_target else []) + [c for c in calls if c in unpaired or (c in missing and c is not target)]
    return todo
