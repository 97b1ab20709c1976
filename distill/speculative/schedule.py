"""How many draft tokens to propose each round: a constant k, or an adaptive k chosen from the
running per-position acceptance and the measured cost of a draft step against a target step."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ConstantSchedule:
    """Always propose `k` tokens."""

    k: int

    def next_k(self) -> int:
        return self.k

    def update(self, proposed: int, accepted: int, draft_s: float = 0.0, verify_s: float = 0.0) -> None:
        pass


@dataclass
class AdaptiveSchedule:
    """Pick the k that maximises expected tokens per unit of time.

    Keeps, for each draft position j, the running rate at which position j is accepted given
    that j-1 was (a Beta(2, 1) prior, so unexplored positions look promising), and the running
    cost of one draft step relative to one verification. Expected tokens of a round with k drafts
    are 1 + sum_i prod_{j<=i} a_j (Leviathan et al.); its cost is k*c + 1. Never falls below the
    transformers heuristic's reach: k moves at most +2 / -1 per round."""

    k: int
    k_max: int = 16
    decay: float = 0.9
    hits: list[float] = field(default_factory=list)
    tries: list[float] = field(default_factory=list)
    cost_ratio: float | None = None

    def __post_init__(self) -> None:
        self.hits = [2.0] * self.k_max
        self.tries = [3.0] * self.k_max

    def next_k(self) -> int:
        c = 0.1 if self.cost_ratio is None else self.cost_ratio
        best_k, best_rate, survive, expected = 1, 0.0, 1.0, 1.0
        for k in range(1, self.k_max + 1):
            survive *= self.hits[k - 1] / self.tries[k - 1]
            expected += survive
            rate = expected / (k * c + 1.0)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return max(1, min(best_k, self.k + 2, self.k_max)) if best_k > self.k else max(best_k, self.k - 1)

    def update(self, proposed: int, accepted: int, draft_s: float = 0.0, verify_s: float = 0.0) -> None:
        self.k = proposed
        for j in range(min(accepted + 1, proposed)):  # positions that were tested
            self.hits[j] = self.decay * self.hits[j] + (1.0 if j < accepted else 0.0)
            self.tries[j] = self.decay * self.tries[j] + 1.0
        if draft_s > 0 and verify_s > 0 and proposed > 0:
            ratio = (draft_s / proposed) / verify_s
            self.cost_ratio = ratio if self.cost_ratio is None else 0.8 * self.cost_ratio + 0.2 * ratio


def make_schedule(schedule: str, k: int) -> ConstantSchedule | AdaptiveSchedule:
    """The schedule named `schedule` ("constant" or "adaptive"), starting at k draft tokens."""
    if schedule == "constant":
        return ConstantSchedule(k)
    if schedule == "adaptive":
        return AdaptiveSchedule(k, k_max=max(16, k))
    raise ValueError(f"schedule must be 'constant' or 'adaptive', got {schedule!r}")
