"""95% intervals for the evaluation's figures: a percentile bootstrap over prompts.

Every headline figure is a ratio of sums over prompts (accepted / proposed draft tokens, emitted
tokens / target forwards, target time / speculative time), so one resampling of the prompts gives
the figure and its interval alike: draw prompts with replacement, add their columns, apply the
figure. Two systems measured on the same prompts are compared by resampling the prompts jointly, so
the interval of their difference keeps the pairing (what varies from prompt to prompt cancels).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

LEVEL = 0.95
RESAMPLES = 4000

Columns = Mapping[str, Sequence[float]]
Figure = Callable[[Mapping[str, np.ndarray]], np.ndarray]


@dataclass(frozen=True)
class Interval:
    """A figure measured on these prompts (`value`) and its bootstrap interval [low, high]."""

    value: float
    low: float
    high: float
    level: float = LEVEL
    prompts: int = 0

    def excludes(self, x: float = 0.0) -> bool:
        """Whether `x` lies outside the interval: for a difference, whether it is outside noise."""
        return not self.low <= x <= self.high

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def __format__(self, spec: str) -> str:
        """`f"{iv:.3f}"` -> "0.870 [0.850, 0.889]"."""
        return format_interval(self.to_dict(), spec)


def format_interval(figure: dict[str, float] | None, fmt: str, suffix: str = "") -> str:
    """'0.870 [0.850, 0.889]' from an interval record (`Interval.to_dict`, as reports keep it), `suffix` after
    the value; – when absent."""
    if not figure:
        return "–"
    return f"{format(figure['value'], fmt)}{suffix} [{format(figure['low'], fmt)}, {format(figure['high'], fmt)}]"


def _safe(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, 0 where den is 0."""
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape), where=den != 0)


def ratio(num: str, den: str) -> Figure:
    """The figure Σ num / Σ den (pooled over prompts)."""
    return lambda s: _safe(s[num], s[den])


def ratio_of_ratios(num_a: str, den_a: str, num_b: str, den_b: str) -> Figure:
    """(Σ num_a / Σ den_a) / (Σ num_b / Σ den_b): e.g. the decode speedup, target TPOT over speculative TPOT."""
    return lambda s: _safe(_safe(s[num_a], s[den_a]), _safe(s[num_b], s[den_b]))


def difference(a: Figure, b: Figure) -> Figure:
    """a − b on the same resampled prompts: the paired difference of two figures."""
    return lambda s: a(s) - b(s)


def bootstrap(columns: Columns, figure: Figure, *, resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL) -> Interval:
    """`figure` of the column sums over all prompts, and its percentile interval over `resamples`
    resamplings of the prompts (rows) with replacement; deterministic for a given `seed`."""
    names = list(columns)
    table = np.array([np.asarray(columns[name], dtype=float) for name in names])  # [columns, prompts]
    n = table.shape[1] if table.size else 0
    if n == 0:
        raise ValueError("bootstrap over no prompts")
    value = float(figure(dict(zip(names, table.sum(axis=1)))))
    counts = np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=resamples)  # [resamples, prompts]
    sums = counts @ table.T  # [resamples, columns]
    draws = np.asarray(figure({name: sums[:, i] for i, name in enumerate(names)}), dtype=float)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return Interval(value, float(low), float(high), level, n)
