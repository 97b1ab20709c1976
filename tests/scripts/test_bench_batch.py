"""scripts/bench_batch.py on a tiny saved pair: it runs every batch size and mode, reports greedy
identity per row, and writes its section (the benchmark itself runs on the demo pair)."""

from __future__ import annotations

import json

import pytest

from distill.common.tiny import noisy_copy, tiny_qwen2


@pytest.fixture(scope="module")
def bench(script):
    return script("bench_batch")


def test_bench_batch_runs_every_batch_size_and_mode(bench, tokenizer, examples, tmp_path):
    target = tiny_qwen2(len(tokenizer), hidden_size=64, num_layers=2, tokenizer=tokenizer, seed=3, tie_word_embeddings=False, initializer_range=0.1)
    for name, model in (("target", target), ("draft", noisy_copy(target, 0.05, 4))):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": ex["prompt"]}) + "\n" for ex in examples[:4]))
    md = tmp_path / "b.md"
    code = bench.main(
        [
            "--target",
            str(tmp_path / "target"),
            "--draft",
            str(tmp_path / "draft"),
            "--prompts",
            str(prompts),
            "--batch-sizes",
            "1",
            "4",
            "--num-prompts",
            "4",
            "--max-new-tokens",
            "12",
            "--repeats",
            "1",
            "--output",
            str(md),
        ]
    )
    assert code == 0  # greedy identity held for every row
    text = md.read_text()
    assert "<!-- bench_batch-custom -->" in text
    rows = [line for line in text.splitlines() if line.startswith("| greedy") or line.startswith("| sampled")]
    assert len(rows) == 4 and all(r.split("|")[10].strip() == "4/4" for r in rows if "greedy" in r)


def test_bench_batch_refuses_a_prompt_file_without_prompts(bench, tokenizer, tmp_path):
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"question": "no prompt field"}\n')
    with pytest.raises(SystemExit, match='"prompt" field'):
        bench.load_prompts(bad, tokenizer, 1)
