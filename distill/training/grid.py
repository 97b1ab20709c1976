"""Recipe grids for comparison studies: variants of one base recipe (a plain dict, as read from YAML)
that differ only in what the study varies — the loss, the training data — each with its own
output_dir and the same seed, draft init and steps.

- `objective_recipes`: the same draft trained with forward-KL distillation and with cross-entropy only;
- `recipe_grid`: a DistillSpec-style grid, data source × divergence, plus the cross-entropy baseline;
- `adaspec_grid`: selective distillation (AdaSPEC) at kept fractions, against the grid's winner.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Recipe = dict[str, Any]

# Distillation against plain training: the same draft, data, seed and steps; only the loss differs.
OBJECTIVES = {
    "cross-entropy only": {"divergence_weight": 0.0, "ce_weight": 1.0},
    "KL-distilled (forward KL)": {"divergence": "forward_kl", "divergence_weight": 1.0, "ce_weight": 0.0},
}

CE = "cross-entropy (dataset responses)"
# Training data: recipe overrides per source ("target" also gets its generation cache path).
SOURCES = {
    "dataset responses": {},
    "target responses": {"data": {"response_source": "target"}},
    "on-policy λ = 0.5": {"loss": {"lmbda": 0.5}},
}
DIVERGENCES = {
    "forward KL": {"divergence": "forward_kl"},
    "reverse KL": {"divergence": "reverse_kl"},
    "JSD β = 0.5": {"divergence": "jsd", "beta": 0.5},
    "TVD": {"divergence": "tvd"},
}
WINNER = "forward KL · target responses"  # the grid's best recipe (docs/benchmarks.md, bench_recipes): AdaSPEC's reference


def objective_recipes(base: Recipe, work: Path, steps: int) -> dict[str, Recipe]:
    """One recipe per objective in OBJECTIVES from `base`: own output_dir under `work`, same seed and steps."""
    recipes = {}
    for i, (name, loss) in enumerate(OBJECTIVES.items()):
        recipe = copy.deepcopy(base)
        recipe["output_dir"] = str(work / ("draft-ce" if i == 0 else "draft-kd"))
        recipe["loss"] = {**recipe.get("loss", {}), **loss}
        recipe["training"] = {**recipe["training"], "max_steps": steps, "eval_steps": steps, "save_steps": 10 * steps}
        recipes[name] = recipe
    return recipes


def recipe_grid(base: Recipe, work: Path, steps: int, generation_max_new_tokens: int, on_policy_max_new_tokens: int) -> dict[str, Recipe]:
    """The CE baseline and every source × divergence recipe from `base`: own output_dir under
    `work`, the same seed, steps and draft init; training evaluates nothing (measured afterwards).
    The target-source recipes share one generation cache, so the target answers once for all."""

    def one(slug: str, loss: dict[str, Any], source: dict[str, Any]) -> Recipe:
        recipe = copy.deepcopy(base)
        recipe["output_dir"] = str(work / slug)
        recipe["data"] = {**recipe["data"], "eval_split": None, **source.get("data", {})}
        if recipe["data"].get("response_source") == "target":
            recipe["data"].update(
                generation_cache=str(work / "target-responses.jsonl"), generation_max_new_tokens=generation_max_new_tokens, generation_batch_size=32
            )
        recipe["loss"] = {**recipe.get("loss", {}), "max_new_tokens_on_policy": on_policy_max_new_tokens, **loss, **source.get("loss", {})}
        recipe["training"] = {**recipe["training"], "max_steps": steps, "eval_steps": None, "save_steps": 10 * steps}
        return recipe

    grid = {CE: one("ce", {"divergence_weight": 0.0, "ce_weight": 1.0}, {})}
    for div_name, div in DIVERGENCES.items():  # divergence outermost: a run cut short still covers every source
        for source_name, source in SOURCES.items():
            slug = f"{source_name.split()[0]}-{div['divergence']}".lower()
            grid[f"{div_name} · {source_name}"] = one(slug, {**div, "divergence_weight": 1.0, "ce_weight": 0.0}, source)
    return grid


def adaspec_grid(grid: dict[str, Recipe], keeps: Sequence[float], work: Path) -> dict[str, Recipe]:
    """AdaSPEC recipes: the winner's recipe, its loss on the `keep` fraction of tokens that its own
    trained draft (the reference) shows are learnable."""
    reference = str(Path(grid[WINNER]["output_dir"]) / "draft")
    out = {}
    for keep in keeps:
        recipe = copy.deepcopy(grid[WINNER])
        recipe["output_dir"] = str(work / f"adaspec-{keep:g}")
        recipe["loss"]["token_selection"] = {"reference": reference, "keep_fraction": keep}
        out[f"AdaSPEC keep {keep:g} · target responses"] = recipe
    return out
