"""scripts/bench_recipes.py: its recipe grid (distill.training.grid), the rank correlation
(distill.common.ranks), and a smoke run of the study as a script, with tiny settings on a made-up
GSM8K-shaped file (the study itself runs for an hour)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from distill.common.benchmarks import command_line
from distill.common.ranks import spearman
from distill.training.grid import CE, DIVERGENCES, WINNER, adaspec_grid, recipe_grid
from distill.training.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]


def bench_recipes(argv: list[str]) -> None:
    """Run the study as a script, as its docstring says (one thread)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_recipes.py"), *argv], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


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


def test_spearman_ranks_with_ties():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)  # ranks 0.5, 0.5, 2
    assert math.isnan(spearman([1, 1], [1, 2]))


def test_study_smoke_run_writes_table_plot_and_resumes(tmp_path):
    data = tmp_path / "gsm8k"
    data.mkdir()
    for split, n in (("train", 48), ("test", 8)):
        rows = [
            {
                "question": f"Tom has {a} apples and buys {a + 2} more. How many apples?",
                "answer": f"He has {a} + {a + 2} = <<{a}+{a + 2}={2 * a + 2}>>{2 * a + 2} apples.\n#### {2 * a + 2}",
            }
            for a in range(n)
        ]
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    docs, plot, work = tmp_path / "benchmarks.md", tmp_path / "plot.png", tmp_path / "work"
    only = [CE, "forward KL · target responses", "TVD · on-policy λ = 0.5"]
    argv = [
        "--gsm8k-dir",
        str(data),
        "--rows",
        "48",
        "--vocab-size",
        "200",
        "--target-steps",
        "3",
        "--steps",
        "2",
        "--prompts",
        "2",
        "--max-new-tokens",
        "6",
        "--eval-samples",
        "4",
        "--generation-max-new-tokens",
        "8",
        "--on-policy-max-new-tokens",
        "8",
        "--work",
        str(work),
        "--docs",
        str(docs),
        "--plot",
        str(plot),
        "--only",
        *only,
    ]
    bench_recipes(argv)
    results = json.loads((work / "recipes" / "results.json").read_text())["results"]
    assert list(results) == only
    for r in results.values():
        assert r["steps"] == 2 and r["greedy_identity"] == 1.0  # greedy speculative output is the target's
        for key in ("acceptance_rate", "sampled_acceptance_rate", "held_out_expected_acceptance"):
            assert 0.0 <= r[key] <= 1.0
    assert results["forward KL · target responses"]["generation_s"] > 0 and results[CE]["generation_s"] == 0
    assert len((work / "recipes" / "target-responses.jsonl").read_text().splitlines()) == 48
    text = docs.read_text()
    assert text.count("<!-- bench_recipes -->") == 1 and command_line("bench_recipes", argv) in text and "Spearman" in text
    assert all(name in text for name in only) and plot.stat().st_size > 0
    draft = work / "recipes" / "ce" / "draft" / "model.safetensors"
    before = draft.stat().st_mtime_ns
    bench_recipes(argv)  # a rerun with the same settings measures nothing again
    assert draft.stat().st_mtime_ns == before
    # AdaSPEC against the winner, which the run above already trained (the reference is reused, not retrained)
    reference = work / "recipes" / "target-forward_kl" / "draft" / "model.safetensors"
    before = reference.stat().st_mtime_ns
    adaspec = [a for a in argv if a not in ("--only", *only)] + ["--adaspec", "0.5", "1"]
    bench_recipes(adaspec)
    assert reference.stat().st_mtime_ns == before
    results = json.loads((work / "recipes" / "results.json").read_text())["results"]
    winner = results[WINNER]
    for keep in ("0.5", "1"):
        row = results[f"AdaSPEC keep {keep} · target responses"]
        assert row["greedy_identity"] == 1.0 and row["reference_s"] == pytest.approx(winner["train_cpu_s"] - winner["generation_s"])
        assert row["train_cpu_s"] > row["reference_s"] + row["generation_s"]
    text = docs.read_text()
    assert text.count("<!-- bench_adaspec -->") == 1 and "AdaSPEC keep 0.5 · target responses" in text
    assert f"| reference: {WINNER} | 2 | " in text and " pts | " in text  # the reference first, the others as points over it


def test_adaspec_recipes_are_the_winner_with_its_draft_as_reference(base, tmp_path):
    grid = recipe_grid(base, tmp_path, steps=7, generation_max_new_tokens=32, on_policy_max_new_tokens=16)
    adaspec = {name: load_recipe(r) for name, r in adaspec_grid(grid, [0.2, 0.4], tmp_path).items()}
    winner = load_recipe(grid[WINNER])
    assert list(adaspec) == ["AdaSPEC keep 0.2 · target responses", "AdaSPEC keep 0.4 · target responses"]
    for keep, r in zip((0.2, 0.4), adaspec.values()):
        assert r.loss.token_selection.keep_fraction == keep and r.loss.token_selection.reference == f"{winner.output_dir}/draft"
        assert (r.data, r.training, r.draft, r.seed) == (winner.data, winner.training, winner.draft, winner.seed)
        assert r.output_dir != winner.output_dir
