"""scripts/bench_batch.py, run as a script on a tiny saved pair: it runs every batch size and mode,
reports greedy identity per row and writes its section, and refuses a prompt file without prompts
(the benchmark itself runs on the demo pair). Its batches are left-padded by distill.speculative.batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distill.common.tiny import noisy_copy, tiny_qwen2

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_batch.py"


def bench_batch(*args: str | Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def pair(tokenizer, examples, tmp_path_factory):
    """A saved tiny target, a noisy copy of it as the draft, and a file of four prompts."""
    root = tmp_path_factory.mktemp("pair")
    target = tiny_qwen2(len(tokenizer), hidden_size=64, num_layers=2, tokenizer=tokenizer, seed=3, tie_word_embeddings=False, initializer_range=0.1)
    for name, model in (("target", target), ("draft", noisy_copy(target, 0.05, 4))):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": ex["prompt"]}) + "\n" for ex in examples[:4]))
    return root


def test_bench_batch_runs_every_batch_size_and_mode(pair, tmp_path):
    md = tmp_path / "b.md"
    args = ["--target", pair / "target", "--draft", pair / "draft", "--prompts", pair / "prompts.jsonl", "--batch-sizes", "1", "4", "--num-prompts", "4"]
    done = bench_batch(*args, "--max-new-tokens", "12", "--repeats", "1", "--output", md)
    assert done.returncode == 0, done.stderr[-3000:]  # greedy identity held for every row
    text = md.read_text()
    assert "<!-- results:bench_batch-custom -->" in text and "python scripts/bench_batch.py --target " in text
    rows = [line for line in text.splitlines() if line.startswith("| greedy") or line.startswith("| sampled")]
    assert len(rows) == 4 and all(r.split("|")[10].strip() == "4/4" for r in rows if "greedy" in r)


def test_bench_batch_refuses_a_prompt_file_without_prompts(pair, tmp_path):
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"question": "no prompt field"}\n')
    done = bench_batch("--target", pair / "target", "--draft", pair / "draft", "--prompts", bad, "--num-prompts", "1", "--output", "")
    assert done.returncode == 1 and '"prompt" field' in done.stderr
