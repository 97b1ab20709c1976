"""scripts/bench_recipes.py: its recipe grid (distill.training.grid), the rank correlation
(distill.common.ranks), and a smoke run of the study as a script, with tiny settings on a made-up
GSM8K-shaped file (the study itself runs for an hour)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distill.common.benchmarks import command_line
from distill.training.grid import CE, WINNER

REPO = Path(__file__).resolve().parents[2]


def bench_recipes(argv: list[str]) -> None:
    """Run the study as a script, as its docstring says (one thread)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_recipes.py"), *argv], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


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
    assert text.count("<!-- results:bench_recipes -->") == 1 and command_line("bench_recipes", argv) in text and "Spearman" in text
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
    assert text.count("<!-- results:bench_adaspec -->") == 1 and "AdaSPEC keep 0.5 · target responses" in text
    assert f"| reference: {WINNER} | 2 | " in text and " pts | " in text  # the reference first, the others as points over it
