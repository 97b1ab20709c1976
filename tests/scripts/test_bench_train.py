"""Fast checks of what scripts/bench_train.py is built from (the benchmark itself runs for minutes):
the objective recipes (distill.training.grid), chat prompts, the JSONL reader, the report section,
TRL's dataset format, and the script's refusal of a missing GSM8K folder, run as a script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from distill.commands.render_docs import main as render_docs
from distill.common.benchmarks import command_line, report
from distill.common.docs import table
from distill.common.io import read_jsonl
from distill.common.prompts import chat_prompts
from distill.common.provenance import MachineLoad
from distill.training.grid import objective_recipes
from distill.training.recipe import load_recipe
from distill.training.trl_baseline import trl_dataset

REPO = Path(__file__).resolve().parents[2]


def tiny_recipe() -> dict:
    """recipes/tiny-cpu.yaml as a plain dict, as the benchmark reads it."""
    return yaml.safe_load((REPO / "recipes" / "tiny-cpu.yaml").read_text())


def test_objective_recipes_differ_only_in_loss_and_output_dir(tmp_path):
    base = tiny_recipe()
    recipes = objective_recipes(base, tmp_path, steps=7)
    (ce_name, ce), (kd_name, kd) = recipes.items()
    assert "cross-entropy" in ce_name and "KL" in kd_name
    ce_r, kd_r = load_recipe(ce), load_recipe(kd)
    assert (ce_r.loss.divergence_weight, ce_r.loss.ce_weight) == (0.0, 1.0)
    assert (kd_r.loss.divergence, kd_r.loss.divergence_weight, kd_r.loss.ce_weight) == ("forward_kl", 1.0, 0.0)
    assert ce_r.training.max_steps == kd_r.training.max_steps == 7
    assert ce_r.seed == kd_r.seed and ce_r.draft.config == kd_r.draft.config and ce_r.data == kd_r.data
    assert ce_r.output_dir != kd_r.output_dir and Path(ce_r.output_dir).parent == tmp_path
    assert base == tiny_recipe() and base["loss"] == {"divergence": "forward_kl", "temperature": 1.0}  # the base is not mutated


def test_chat_prompts_end_with_the_assistant_turn(tokenizer):
    (ids,) = chat_prompts(tokenizer, ["what is 2 + 3?"])
    assert ids.dim() == 2 and ids.shape[0] == 1
    text = tokenizer.decode(ids[0])
    assert "what is 2 + 3?" in text and text.endswith("<|im_start|>assistant\n")


def test_read_jsonl_takes_the_first_rows_and_names_a_missing_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(5)) + "\n")
    assert [r["i"] for r in read_jsonl(path, 3)] == [0, 1, 2]
    assert len(read_jsonl(path)) == 5
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_report_writes_its_report_and_the_section_rendered_from_it(tmp_path, capsys):
    docs = tmp_path / "docs" / "benchmarks.md"
    cmd = command_line("bench_train", ["tiny", "--steps", "200", "--work", "a b"])
    assert cmd == "python scripts/bench_train.py tiny --steps 200 --work 'a b'"
    load = MachineLoad().start()
    report("bench_train_tiny", "Tiny", cmd, [table(["draft", "held-out 1 − TVD"], [["ce", 0.61]]), "notes"], docs, load)
    report("bench_train_tiny", "Tiny", cmd, [table(["draft", "held-out 1 − TVD"], [["ce", 0.62]]), "notes"], docs, load)
    text = docs.read_text()
    assert text.count("<!-- results:bench_train_tiny -->") == 1 and "| ce | 0.62 |" in text and "0.61" not in text
    assert cmd in text and "Machine load while timed" in text and cmd in capsys.readouterr().out
    saved = json.loads((tmp_path / "docs" / "results" / "bench_train_tiny.json").read_text())
    assert saved["blocks"][0]["rows"] == [["ce", 0.62]] and saved["environment"]["torch"] and saved["machine_load"]["cpus"] >= 1
    assert render_docs(["--check", "--root", str(tmp_path)]) == 0
    docs.write_text(text.replace("| ce | 0.62 |", "| ce | 0.63 |"))  # a figure edited by hand
    assert render_docs(["--check", "--root", str(tmp_path)]) == 1


def test_trl_dataset_is_conversational_prompts():
    ds = trl_dataset([{"prompt": "hi", "response": "there"}])
    assert ds.column_names == ["prompt"] and ds[0]["prompt"] == [{"role": "user", "content": "hi"}]


def test_gsm8k_without_data_is_a_clear_error(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_train.py"), "gsm8k", "--gsm8k-dir", str(tmp_path)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 2 and "--gsm8k-dir" in done.stderr
