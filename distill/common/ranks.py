"""Rank correlation: whether two measures order the same things alike (e.g. held-out 1 − TVD and
acceptance across drafts), whatever the scale of either."""

from __future__ import annotations

from collections.abc import Sequence


def ranks(values: Sequence[float]) -> list[float]:
    """Each value's 0-based rank in ascending order; tied values share their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for m in range(i, j + 1):
            out[order[m]] = (i + j) / 2
        i = j + 1
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (ties get their mean rank): Pearson's r of the ranks; NaN when
    either side is constant."""
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else float("nan")
