"""`distill rehearse` and the `--set` override: stand-ins keep the real shapes that matter, overrides
are typed and misspellings named, and the quick rehearsal passes on the real Qwen2.5 tokenizer."""

from __future__ import annotations

import json

import pytest

from distill.commands.rehearse import GSM8K_DIR, MODEL_CONFIGS, TOKENIZER_DIR, rehearse, standin_config
from distill.commands.rehearse_checks import REAL_VOCAB, RehearsalError, check_ids
from distill.training.recipe import RecipeError, load_recipe

LORA = MODEL_CONFIGS.parent / "qwen2.5-0.5b-from-7b-lora.yaml"


@pytest.mark.parametrize("name", ["qwen2.5-7b-instruct", "qwen2.5-0.5b-instruct", "qwen2.5-1.5b-instruct"])
def test_standin_keeps_vocab_tying_and_head_ratio(name):
    real = json.loads((MODEL_CONFIGS / f"{name}.json").read_text())
    cfg = standin_config(real, num_layers=1)
    assert cfg["vocab_size"] == real["vocab_size"] and cfg["tie_word_embeddings"] == real["tie_word_embeddings"]
    assert cfg["num_attention_heads"] / cfg["num_key_value_heads"] == real["num_attention_heads"] / real["num_key_value_heads"]
    assert cfg["hidden_size"] <= 64 and cfg["num_hidden_layers"] == 1


def test_set_overrides_are_typed_and_misspellings_named():
    recipe = load_recipe(LORA, ["training.max_steps=3", "data.subset=null", "loss.lmbda=5e-1", "training.report_to=[none]"])
    assert (recipe.training.max_steps, recipe.data.subset, recipe.loss.lmbda, recipe.training.report_to) == (3, None, 0.5, ["none"])
    with pytest.raises(RecipeError, match="did you mean 'training.max_steps'"):
        load_recipe(LORA, ["training.max_step=3"])
    with pytest.raises(RecipeError, match="did you mean 'training.max_steps'"):
        load_recipe(LORA, ["max_steps=3"])
    with pytest.raises(RecipeError, match="KEY=VALUE"):
        load_recipe(LORA, ["training.max_steps"])
    with pytest.raises(RecipeError, match="training.max_steps: expected int"):
        load_recipe(LORA, ["training.max_steps=many"])


def test_check_ids_catches_padding_ids_and_missing_stops():
    checks: list[str] = []
    check_ids([[5, 151645], [1, 2, 3]], "ok", checks, max_new_tokens=3)
    with pytest.raises(RehearsalError, match="no id >= 151665"):
        check_ids([[5, REAL_VOCAB + 3]], "bad", [])
    with pytest.raises(RehearsalError, match="stops at <|im_end|>"):
        check_ids([[5, 6]], "no stop", [], max_new_tokens=8)


@pytest.mark.skipif(
    not (TOKENIZER_DIR / "tokenizer.json").is_file() or not (GSM8K_DIR / "test.jsonl").is_file(),
    reason="needs ../shared/data/qwen2.5-tokenizer and ../shared/data/gsm8k",
)
def test_quick_rehearsal_passes_on_the_real_tokenizer(tmp_path):
    """LoRA recipe, training data, GSM8K acceptance, the decoder, publish (padded and not) and the
    other-tokenizer refusals, each with its checks; a failed check raises RehearsalError."""
    docs = tmp_path / "docs" / "benchmarks.md"
    report = rehearse(tmp_path / "rehearsal", quick=True, markdown=str(docs))
    saved = json.loads((tmp_path / "docs" / "results" / "rehearsal-quick.json").read_text())
    assert [row[0] for row in saved["blocks"][1]["rows"]] == [s["name"] for s in report["steps"]]
    assert "<!-- results:rehearsal-quick -->" in docs.read_text()
    names = [s["name"] for s in report["steps"]]
    assert names[:2] == ["stand-ins", "train LoRA"] and "publish --pad-vocab-to-target" in names
    assert all(s["checks"] for s in report["steps"])
