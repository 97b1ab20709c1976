"""Fast checks of scripts/bench_train.py's pieces (the benchmark itself runs for minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distill.training.recipe import load_recipe


@pytest.fixture(scope="module")
def bench(script):
    return script("bench_train")


def test_objective_recipes_differ_only_in_loss_and_output_dir(bench, tmp_path):
    recipes = bench.objective_recipes(bench.base_recipe(), tmp_path, steps=7)
    (ce_name, ce), (kd_name, kd) = recipes.items()
    assert "cross-entropy" in ce_name and "KL" in kd_name
    ce_r, kd_r = load_recipe(ce), load_recipe(kd)
    assert (ce_r.loss.divergence_weight, ce_r.loss.ce_weight) == (0.0, 1.0)
    assert (kd_r.loss.divergence, kd_r.loss.divergence_weight, kd_r.loss.ce_weight) == ("forward_kl", 1.0, 0.0)
    assert ce_r.training.max_steps == kd_r.training.max_steps == 7
    assert ce_r.seed == kd_r.seed and ce_r.draft.config == kd_r.draft.config and ce_r.data == kd_r.data
    assert ce_r.output_dir != kd_r.output_dir and Path(ce_r.output_dir).parent == tmp_path
    assert bench.base_recipe()["loss"] == {"divergence": "forward_kl", "temperature": 1.0}  # the base is not mutated


def test_chat_prompts_end_with_the_assistant_turn(bench, tokenizer):
    (ids,) = bench.chat_prompts(tokenizer, ["what is 2 + 3?"])
    assert ids.dim() == 2 and ids.shape[0] == 1
    text = tokenizer.decode(ids[0])
    assert "what is 2 + 3?" in text and text.endswith("<|im_start|>assistant\n")


def test_read_jsonl_takes_the_first_rows_and_names_a_missing_file(bench, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(5)) + "\n")
    assert [r["i"] for r in bench.read_jsonl(path, 3)] == [0, 1, 2]
    assert len(bench.read_jsonl(path)) == 5
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        bench.read_jsonl(tmp_path / "missing.jsonl")


def test_report_writes_its_section_with_the_command(bench, tmp_path, capsys):
    docs = tmp_path / "benchmarks.md"
    row = bench.row(
        "ce",
        {
            "steps": 200,
            "acceptance_rate": 0.5,
            "tokens_per_target_forward": 2.25,
            "greedy_identity": 1.0,
            "eval_expected_acceptance": 0.61,
            "train_tokens_per_s": 1234.4,
            "train_s": 61.2,
        },
    )
    assert row == ["ce", 200, 0.5, 2.25, "100%", 0.61, "1234", "61"]
    table = bench.markdown_table(bench.HEADER, [row])
    cmd = bench.command_line(["tiny", "--steps", "200"])
    assert cmd == "python scripts/bench_train.py tiny --steps 200"
    bench.report("bench_train_tiny", "Tiny", cmd, table, "notes", docs)
    bench.report("bench_train_tiny", "Tiny", cmd, table.replace("0.61", "0.62"), "notes", docs)
    text = docs.read_text()
    assert text.count("<!-- bench_train_tiny -->") == 1 and "0.62" in text and "0.61" not in text
    assert cmd in text and cmd in capsys.readouterr().out


def test_trl_dataset_is_conversational_prompts(bench):
    ds = bench.trl_dataset([{"prompt": "hi", "response": "there"}])
    assert ds.column_names == ["prompt"] and ds[0]["prompt"] == [{"role": "user", "content": "hi"}]


def test_gsm8k_without_data_is_a_clear_error(bench, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["gsm8k", "--gsm8k-dir", str(tmp_path)])
    assert "--gsm8k-dir" in capsys.readouterr().err
