"""`distill bench` (distill.commands.bench) end to end on tiny models: measured costs, predicted and
synthetic speedups written as JSON and Markdown, random models built from config files, and clear
refusals."""

from __future__ import annotations

import json

import pytest
import torch

from distill.commands.bench import main
from distill.commands.render_docs import main as render_docs
from distill.common.tiny import tiny_qwen2


def test_bench_runs_end_to_end_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    md = tmp_path / "docs" / "benchmarks.md"
    rc = main(
        [
            "--ks",
            "1..2",
            "--synthetic-acceptance",
            "0.8",
            "--prompt-len",
            "16",
            "--num-prompts",
            "1",
            "--max-new-tokens",
            "12",
            "--repeats",
            "2",
            "--json",
            str(out),
            "--markdown",
            str(md),
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert set(report["costs"]["v"]) == {"1", "2"} and report["costs"]["c"] > 0
    assert report["alphas"] == [0.8]
    assert [(p["alpha"], p["k"]) for p in report["predicted"]] == [(0.8, 1), (0.8, 2)]
    assert report["best_k"][0]["best_k"] in (1, 2)
    assert [(r["alpha"], r["k"]) for r in report["synthetic"]] == [(0.8, 1), (0.8, 2)]
    assert all(r["greedy_identity"] == 1.0 and r["speedup"] > 0 for r in report["synthetic"])
    assert report["environment"]["torch"] == torch.__version__
    printed = capsys.readouterr().out
    assert "| k | v(k) | α = 0.8 |" in printed and "best k" in printed and "measured α" in printed
    assert "<!-- results:distill-bench -->" in md.read_text()
    assert json.loads((tmp_path / "docs" / "results" / "distill-bench.json").read_text())["kind"] == "benchmark"
    assert render_docs(["--check", "--root", str(tmp_path)]) == 0  # the section is its report's rendering


def test_bench_builds_random_models_from_config_files(tmp_path, tokenizer, capsys):
    paths = []
    for name, hidden, layers in (("target", 64, 2), ("draft", 32, 1)):
        config = tiny_qwen2(len(tokenizer), hidden_size=hidden, num_layers=layers, num_heads=2, num_kv_heads=1, tokenizer=tokenizer).config
        paths.append(tmp_path / f"{name}.json")
        config.to_json_file(paths[-1])
    out = tmp_path / "bench.json"
    # No --alpha and no synthetic runs: α is measured with the (random) draft on random-id prompts.
    assert (
        main(
            [
                "--model-config-target",
                str(paths[0]),
                "--model-config-draft",
                str(paths[1]),
                "--ks",
                "1,3",
                "--prompt-len",
                "8",
                "--num-prompts",
                "2",
                "--max-new-tokens",
                "8",
                "--repeats",
                "2",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["alpha_source"].startswith("measured with the real draft") and report["synthetic"] == []
    assert len(report["alphas"]) == 1 and 0.0 <= report["alphas"][0] <= 1.0
    assert set(report["costs"]["v"]) == {"1", "3"}
    assert "random weights of target.json" in capsys.readouterr().out


def test_bench_refuses_bad_arguments(capsys):
    with pytest.raises(SystemExit, match="both a target and a draft"):
        main(["--target", "some/model"])
    with pytest.raises(SystemExit):
        main(["--ks", "0..2"])
    assert "draft lengths >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--alpha", "1.5"])
    assert "[0, 1]" in capsys.readouterr().err
