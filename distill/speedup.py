"""The speedup model's former home, kept so that `from distill.speedup import ...` keeps working.

The model now lives by concern (docs/architecture.md):

- `distill.speculative.costs`: the formula, `Costs`, `measure_costs` (c and v(k)), `best_k`
- `distill.synthetic`: `SyntheticDraft` and the runs at controlled acceptance
- `distill.bench`: the `distill bench` command and its report

New code imports from those modules; this one only re-exports their public names.
"""

from __future__ import annotations

from distill.bench import main, render_markdown, tiny_pair
from distill.speculative.costs import (
    Costs,
    best_k,
    expected_tokens_per_round,
    fit_alpha,
    measure_costs,
    predicted_speedup,
    resolve_backend,
)
from distill.synthetic import SyntheticDraft, TargetBaseline, greedy_decode, run_synthetic, synthetic_sweep, target_baseline

__all__ = [
    "Costs",
    "SyntheticDraft",
    "TargetBaseline",
    "best_k",
    "expected_tokens_per_round",
    "fit_alpha",
    "greedy_decode",
    "main",
    "measure_costs",
    "predicted_speedup",
    "render_markdown",
    "resolve_backend",
    "run_synthetic",
    "synthetic_sweep",
    "target_baseline",
    "tiny_pair",
]

if __name__ == "__main__":
    raise SystemExit(main())
