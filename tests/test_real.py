"""The real Qwen2.5-Coder-0.5B/1.5B-Instruct pair (GGUF, Q4_K_M dequantised): loader, conversion,
lossless decoding and a LoRA step. `python -m pytest -q -m real`; skipped unless the GGUFs were
fetched (../shared/tools/fetch-real-qwen; ../shared/real-models.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from distill.commands.convert_gguf import convert_gguf
from distill.common.models import load_model, load_tokenizer

REAL_DIR = Path(os.environ.get("DISTILL_REAL_DIR", Path.home() / ".cache" / "distill-real"))
DRAFT_GGUF = REAL_DIR / "qwen2.5-coder-0.5b-instruct.gguf"
TARGET_GGUF = REAL_DIR / "qwen2.5-coder-1.5b-instruct.gguf"
GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(
        not (DRAFT_GGUF.is_file() and TARGET_GGUF.is_file()), reason=f"the real GGUF pair is not in {REAL_DIR}: fetch it with ../shared/tools/fetch-real-qwen"
    ),
    pytest.mark.skipif(not GSM8K.is_dir(), reason=f"no GSM8K data in {GSM8K}"),
]


def _questions(split: str, n: int) -> list[str]:
    from distill.common.prompts import apply_template

    rows = [json.loads(line) for line in (GSM8K / f"{split}.jsonl").read_text().splitlines()[:n]]
    return [apply_template("gsm8k", r["question"]) for r in rows]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(DRAFT_GGUF)


def test_the_loader_reads_the_real_gguf_with_its_tokenizer(tokenizer):
    assert len(tokenizer) == 151_936 and tokenizer.eos_token_id == 151_645 and tokenizer.pad_token_id == 151_643
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert load_tokenizer(TARGET_GGUF).get_vocab() == tokenizer.get_vocab()  # the pair shares its tokenizer


def test_convert_round_trip_gives_the_gguf_models_logits(tmp_path, tokenizer):
    out = convert_gguf(DRAFT_GGUF, tmp_path / "coder-0.5b")
    ids = tokenizer("Natalia sold clips to 48 of her friends in April.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want = load_model(DRAFT_GGUF, dtype="float32")(input_ids=ids).logits
        have = load_model(out, dtype="float32")(input_ids=ids).logits
    assert torch.equal(want, have)
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == 151_936 and config["tie_word_embeddings"] is False and "quantization_config" not in config


def test_greedy_speculative_decoding_of_the_real_pair_is_the_targets_own_in_float32(tokenizer):
    from distill.speculative import SpeculativeDecoder

    target, draft = load_model(TARGET_GGUF, dtype="float32"), load_model(DRAFT_GGUF, dtype="float32")
    decoder = SpeculativeDecoder(target, draft, num_draft_tokens=3, tokenizer=tokenizer, draft_tokenizer=tokenizer)
    accepted = proposed = 0
    for question in _questions("test", 3):
        enc = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
        expected = target.generate(**enc, max_new_tokens=48, do_sample=False, eos_token_id=151_645, pad_token_id=151_643)
        out = decoder.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=48, eos_token_id=151_645, pad_token_id=151_643)
        assert out.sequences.tolist() == expected.tolist()
        accepted, proposed = accepted + out.stats.accepted, proposed + out.stats.proposed
    assert accepted / proposed > 0.5  # a real pair of one family: most proposals pass


def test_three_lora_steps_of_the_real_draft_from_a_tiny_teacher_cache(tmp_path):
    from distill.training.recipe import load_recipe
    from distill.training.teacher import cache_teacher
    from distill.training.train import train

    rows = [json.loads(line) for line in (GSM8K / "train.jsonl").read_text().splitlines()[:6]]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": r["question"], "response": r["answer"]}) + "\n" for r in rows))
    recipe = load_recipe(
        Path(__file__).resolve().parents[1] / "recipes" / "qwen2.5-coder-0.5b-from-1.5b-cpu.yaml",
        [
            f"target.name_or_path={TARGET_GGUF}",
            f"draft.name_or_path={DRAFT_GGUF}",
            f"data.dataset={data}",
            "data.adapter=prompt_response",
            "data.response_source=dataset",
            "data.num_samples=null",
            "data.max_length=384",
            f"teacher.cache_dir={tmp_path / 'cache'}",
            f"output_dir={tmp_path / 'run'}",
            "training.max_steps=3",
            "training.per_device_train_batch_size=2",
            "training.save_steps=3",
            "training.logging_steps=1",
        ],
    )
    cache_teacher(recipe)
    metrics = train(recipe)
    assert metrics["train_loss"] > 0
    draft = load_model(tmp_path / "run", dtype="bfloat16")  # the merged LoRA draft, as a plain folder
    assert draft.config.vocab_size == 151_936
    history = json.loads((tmp_path / "run" / "checkpoint-3" / "trainer_state.json").read_text())["log_history"]
    assert [h["step"] for h in history if "loss" in h] == [1, 2, 3]
