"""`distill docs`: the docs' measured tables are renderings of reports committed under docs/results/,
and a hand edit of a rendered figure fails the check."""

from __future__ import annotations

import json
from pathlib import Path

from distill.commands.render_docs import main

REPO = Path(__file__).resolve().parents[2]


def _iv(value: float, low: float, high: float) -> dict:
    return {"value": value, "low": low, "high": high, "level": 0.95, "prompts": 30}


def _row(acc: float) -> dict:
    return {
        "num_prompts": 30,
        "identical_outputs": 30,
        "greedy_identity": 1.0,
        "quality": 0.6,
        "quality_vs_target": {**_iv(0.033, -0.033, 0.1), "outside_noise": False},
        "intervals": {
            "quality": _iv(0.6, 0.433, 0.767),
            "acceptance_rate": _iv(acc, acc - 0.02, acc + 0.02),
            "per_position_acceptance": [_iv(0.9, 0.88, 0.92), _iv(0.8, 0.77, 0.83)],
            "tokens_per_target_forward": _iv(2.6, 2.5, 2.7),
            "decode_speedup": _iv(1.7, 1.6, 1.8),
            "end_to_end_speedup": _iv(1.6, 1.5, 1.7),
        },
        "decomposition": {"predicted_decode_speedup": 1.72},
        "ttft_s": 0.2,
        "tpot_s": 0.1,
        "tokens_per_s": 9.5,
        "wall_s": 300.0,
    }


REPORT = {
    "schema_version": 2,
    "target": "/cache/coder-1.5b",
    "environment": {"dtype": "bfloat16", "device_name": "AMD EPYC", "torch_threads": 2},
    "settings": {
        "mode": "greedy",
        "num_draft_tokens": 2,
        "seed": 0,
        "data_files": {"gsm8k": "/data/gsm8k/test.jsonl"},
        "max_new_tokens_per_task": {"gsm8k": 256},
    },
    "target_only": {
        "gsm8k": {
            "num_prompts": 30,
            "ttft_s": 0.25,
            "tpot_s": 0.175,
            "tokens_per_s": 5.5,
            "wall_s": 600.0,
            "quality": 0.567,
            "quality_metric": "exact_match",
            "intervals": {"quality": _iv(0.567, 0.4, 0.733)},
        }
    },
    "drafts": {"base": {"tasks": {"gsm8k": _row(0.83)}}, "distilled": {"tasks": {"gsm8k": _row(0.87)}}},
    "comparisons": [
        {
            "task": "gsm8k",
            "reference": "base",
            "draft": "distilled",
            "acceptance_rate": {**_iv(0.04, 0.02, 0.06), "outside_noise": True},
            "decode_speedup": {**_iv(0.01, -0.01, 0.03), "outside_noise": False},
        }
    ],
    "runs": {"r1": {"machine_load": {"others_cores": 0.03}}},
}


def _docs(tmp_path: Path, report: dict) -> Path:
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "real.json").write_text(json.dumps(report))
    doc = tmp_path / "docs" / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n<!-- results:real -->\nnot yet rendered\n<!-- /results:real -->\n")
    return doc


def test_a_section_is_rendered_from_its_report_and_a_hand_edit_fails_the_check(tmp_path, capsys):
    doc = _docs(tmp_path, REPORT)
    assert main(["--check", "--root", str(tmp_path)]) == 1  # not rendered yet
    assert main(["--root", str(tmp_path)]) == 0
    text = doc.read_text()
    assert (
        "| distilled | 0.600 [0.433, 0.767] | +0.033 [-0.033, +0.100] | 0.870 [0.850, 0.890] | 0.90 [0.88, 0.92] / 0.80 [0.77, 0.83] | 2.60 [2.50, 2.70] "
        "| 1.70× [1.60, 1.80] | 1.72× |" in text
    )
    assert "| draft | exact_match | exact_match − target only | acceptance |" in text
    assert "target-only exact_match 0.567 [0.400, 0.733]." in text
    assert "30 gsm8k prompts from `test.jsonl`, the first 30 of a shuffle seeded 0" in text
    assert "| gsm8k | distilled − base | +0.040 [+0.020, +0.060]* |" in text
    assert "| system | TTFT ms | TPOT ms | tokens/s | seconds / prompt |" in text
    assert "| target only | 250.0 | 175.0 | 5.50 | 20.0 |" in text  # 600 s over 30 prompts
    assert "| distilled | 200.0 | 100.0 | 9.50 | 10.0 |" in text
    assert main(["--check", "--root", str(tmp_path)]) == 0
    doc.write_text(text.replace("1.70× [1.60, 1.80]", "1.80× [1.60, 1.80]", 1))
    capsys.readouterr()
    assert main(["--check", "--root", str(tmp_path)]) == 1
    assert "section(s) real differ from their reports" in capsys.readouterr().err


def test_each_tasks_prompts_are_described_as_its_loader_draws_them(tmp_path):
    labels = {"gsm8k@boxed": 256, "mmlu@exam": 256, "cnndm": 128}
    report = {
        **REPORT,
        "settings": {**REPORT["settings"], "max_new_tokens_per_task": labels},
        "target_only": {label: REPORT["target_only"]["gsm8k"] for label in labels},
        "drafts": {name: {"tasks": {label: _row(0.8) for label in labels}} for name in ("base", "distilled")},
        "comparisons": [],
    }
    doc = _docs(tmp_path, report)
    assert main(["--root", str(tmp_path)]) == 0
    text = doc.read_text()
    assert "30 gsm8k@boxed prompts from `test.jsonl`, the first 30 of a shuffle seeded 0 (" in text
    assert "30 mmlu@exam prompts from `the Hub split`, the first 30 of an order stratified by subject, seeded 0 (" in text
    assert "30 cnndm prompts from `the Hub split`, the first 30 of a shuffle seeded 0 of the evaluation rows 0-199 (distill.common.splits) (" in text


def test_a_report_of_another_schema_or_a_missing_report_is_named(tmp_path, capsys):
    _docs(tmp_path, {**REPORT, "schema_version": 1})
    assert main(["--root", str(tmp_path)]) == 2
    assert "has report schema 1; `distill docs` renders schemas [2]" in capsys.readouterr().err
    (tmp_path / "docs" / "results" / "real.json").unlink()
    assert main(["--check", "--root", str(tmp_path)]) == 2
    assert "section results:real has no report" in capsys.readouterr().err


def test_the_repositorys_docs_match_their_committed_reports():
    assert main(["--check", "--root", str(REPO)]) == 0


def test_the_headline_view_is_one_paragraph_with_intervals_and_the_paired_difference(tmp_path):
    doc = _docs(tmp_path, REPORT)
    doc.write_text("# README\n\n<!-- results:real@headline -->\n<!-- /results:real@headline -->\n")
    assert main(["--root", str(tmp_path)]) == 0
    text = doc.read_text()
    assert "Greedy, k = 2, bfloat16, 30 gsm8k prompts × ≤ 256 tokens (`docs/results/real.json`" in text
    assert "distilled acceptance 0.870 [0.850, 0.890], decode speedup 1.70× [1.60, 1.80]" in text
    assert "distilled − base: acceptance +0.040 [+0.020, +0.060]" in text and "decode speedup +0.010 [-0.010, +0.030] (acceptance outside noise)" in text
    assert main(["--check", "--root", str(tmp_path)]) == 0


LOAD = {"cpus": 2, "torch_threads": 2, "others_cores": 0.02, "loadavg_start": [0.5], "loadavg_end": [1.9], "busy": False, "warning": None}


def test_a_benchmark_report_renders_as_its_section_and_an_unknown_schema_is_named(tmp_path, capsys):
    from distill.common.docs import benchmark_report, table

    record = benchmark_report("bench_x", "Tiny bench", "python scripts/bench_x.py", [table(["draft", "acceptance"], [["kd", 0.6251]]), "notes"], LOAD, {})
    doc = _docs(tmp_path, record)
    assert main(["--root", str(tmp_path)]) == 0
    text = doc.read_text()
    assert "## Tiny bench\n\n```\npython scripts/bench_x.py\n```\n\n| draft | acceptance |\n| --- | --- |\n| kd | 0.625 |\n\nnotes\n\n" in text
    assert "other processes used 0.02 of 2 cores" in text
    (tmp_path / "docs" / "results" / "real.json").write_text(json.dumps({**record, "schema_version": 9}))
    assert main(["--root", str(tmp_path)]) == 2
    assert "has schema 9; this distill renders schema 1" in capsys.readouterr().err
