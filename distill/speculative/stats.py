"""What one speculative generation returns and measured: its sequences, and acceptance, accepted
length, per-position acceptance, forwards, time to first token and time per output token."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch


@dataclass
class SpecStats:
    """Counts summed over the rows of a batch; times in seconds for the whole call.

    `accepted` counts draft tokens the target accepted, row by row, in each round. Every row emits
    its own accepted block plus one token of the target's, so `new_tokens` (what was emitted)
    equals `accepted + sequence_forwards`, less what EOS and `max_new_tokens` cut off (and, for
    models with sliding-window layers, whose rows advance by the shortest block, less that)."""

    proposed: int = 0
    accepted: int = 0
    new_tokens: int = 0
    rounds: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    sequence_forwards: int = 0  # target forwards counted once per row they served
    position_proposed: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    ttft_s: float = 0.0
    wall_s: float = 0.0
    num_sequences: int = 0
    # The decode phase (after the first token) timed per round, each part on its own clock: the draft's
    # k steps, the target's verify forward, and the host's bookkeeping (reading the result, emitting
    # blocks, stop checks, cache compaction). Their sum is the decode time less what no round holds.
    draft_s: float = 0.0
    verify_s: float = 0.0
    bookkeeping_s: float = 0.0
    draft_tokens_proposed: int = 0  # Σ k over rounds: draft steps taken after the prefill

    def record_times(self, k: int, draft_s: float, verify_s: float, bookkeeping_s: float) -> None:
        """Add one round's timings: k draft steps in `draft_s`, the verify in `verify_s`, the host's
        bookkeeping in `bookkeeping_s`."""
        self.draft_tokens_proposed += k
        self.draft_s += draft_s
        self.verify_s += verify_s
        self.bookkeeping_s += bookkeeping_s

    def record_round(self, proposed_per_row: list[int], accepted_per_row: list[int]) -> None:
        """Add one verification round: row b had proposed_per_row[b] draft tokens checked, of which
        the first accepted_per_row[b] were accepted."""
        k = max(proposed_per_row, default=0)
        if len(self.position_proposed) < k:
            grow = k - len(self.position_proposed)
            self.position_proposed += [0] * grow
            self.position_accepted += [0] * grow
        self.rounds += 1
        for p, n in zip(proposed_per_row, accepted_per_row):
            self.proposed += p
            self.accepted += n
            for j in range(p):
                self.position_proposed[j] += 1
                self.position_accepted[j] += j < n

    @property
    def acceptance_rate(self) -> float:
        """Fraction of proposed draft tokens the target accepted."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Draft tokens accepted per row per round (the accepted block length)."""
        checks = self.position_proposed[0] if self.position_proposed else 0
        return self.accepted / checks if checks else 0.0

    @property
    def tokens_per_target_forward(self) -> float:
        """Emitted tokens per sequence per target forward (prefill included): 1.0 for plain decoding."""
        return self.new_tokens / self.sequence_forwards if self.sequence_forwards else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """P(draft token j accepted) for j = 1..k: how deep into a block the draft stays right."""
        return [a / p if p else 0.0 for a, p in zip(self.position_accepted, self.position_proposed)]

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first, per sequence."""
        per_row = self.new_tokens / max(1, self.num_sequences)
        return (self.wall_s - self.ttft_s) / (per_row - 1) if per_row > 1 else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Emitted tokens of all rows per second of wall time (the batch's throughput)."""
        return self.new_tokens / self.wall_s if self.wall_s else 0.0

    def to_dict(self) -> dict:
        """All counts and derived figures, JSON-ready."""
        out = asdict(self)
        for name in ("acceptance_rate", "mean_accepted_length", "tokens_per_target_forward", "per_position_acceptance", "tpot_s", "tokens_per_s"):
            out[name] = getattr(self, name)
        return out


@dataclass
class SpecOutput:
    """`sequences` as `generate` returns them (prompt + new tokens, finished rows right-padded)."""

    sequences: torch.LongTensor
    stats: SpecStats
