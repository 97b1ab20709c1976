"""The recipe grids of the recipe study (distill.training.grid): the CE baseline and every response
source × divergence, and the AdaSPEC recipes over the winner."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from distill.training.grid import CE, DIVERGENCES, WINNER, adaspec_grid, recipe_grid
from distill.training.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base():
    recipe = yaml.safe_load((REPO / "recipes" / "tiny-cpu.yaml").read_text())
    recipe["data"] = {"dataset": "train.jsonl", "adapter": "gsm8k", "eval_split": "test.jsonl", "max_prompt_length": 64, "max_length": 128}
    return recipe


def test_grid_is_the_ce_baseline_and_every_source_times_divergence(base, tmp_path):
    grid = recipe_grid(base, tmp_path, steps=7, generation_max_new_tokens=32, on_policy_max_new_tokens=16)
    assert len(grid) == 1 + 3 * 4 and CE in grid
    recipes = {name: load_recipe(r) for name, r in grid.items()}
    ce = recipes[CE]
    assert (ce.loss.divergence_weight, ce.loss.ce_weight, ce.loss.lmbda, ce.data.response_source) == (0.0, 1.0, 0.0, "dataset")
    for name, r in recipes.items():
        assert r.training.max_steps == 7 and r.seed == ce.seed and r.draft.config == ce.draft.config
        assert r.data.dataset == "train.jsonl" and r.data.eval_split is None  # measured after training, alike for all
        if name == CE:
            continue
        divergence, source = name.split(" · ")
        assert (r.loss.divergence_weight, r.loss.ce_weight) == (1.0, 0.0)
        assert r.loss.divergence == DIVERGENCES[divergence]["divergence"]
        assert r.loss.lmbda == (0.5 if source.startswith("on-policy") else 0.0)
        assert r.data.response_source == ("target" if source == "target responses" else "dataset")
    assert {recipes[n].loss.beta for n in recipes if n.startswith("JSD")} == {0.5}
    caches = {r.data.generation_cache for r in recipes.values() if r.data.response_source == "target"}
    assert len(caches) == 1  # the target answers once, for all four target-source drafts
    assert len({r.output_dir for r in recipes.values()}) == len(recipes)
    assert "response_source" not in base["data"] and "lmbda" not in base.get("loss", {})  # the base is not mutated


def test_adaspec_recipes_are_the_winner_with_its_draft_as_reference(base, tmp_path):
    grid = recipe_grid(base, tmp_path, steps=7, generation_max_new_tokens=32, on_policy_max_new_tokens=16)
    adaspec = {name: load_recipe(r) for name, r in adaspec_grid(grid, [0.2, 0.4], tmp_path).items()}
    winner = load_recipe(grid[WINNER])
    assert list(adaspec) == ["AdaSPEC keep 0.2 · target responses", "AdaSPEC keep 0.4 · target responses"]
    for keep, r in zip((0.2, 0.4), adaspec.values()):
        assert r.loss.token_selection.keep_fraction == keep and r.loss.token_selection.reference == f"{winner.output_dir}/draft"
        assert (r.data, r.training, r.draft, r.seed) == (winner.data, winner.training, winner.draft, winner.seed)
        assert r.output_dir != winner.output_dir
