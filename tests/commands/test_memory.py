"""`distill memory`: the parameter arithmetic is exact, the estimate divides what ZeRO shards, and
the CPU check measures the per-token terms close to their estimates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from distill.commands.memory import estimate, lora_parameter_count, main, parameter_count
from distill.commands.rehearse import standin_config
from distill.training.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]
CONFIGS = {name: json.loads((REPO / "recipes/model_configs" / f"qwen2.5-{name}-instruct.json").read_text()) for name in ("0.5b", "1.5b", "7b")}


def test_parameter_counts_are_the_real_checkpoints_and_match_built_models():
    # the published parameter counts of Qwen2.5-0.5B/1.5B/7B-Instruct
    assert [parameter_count(CONFIGS[n]) for n in ("0.5b", "1.5b", "7b")] == [494_032_768, 1_543_714_304, 7_615_616_512]
    for name, cfg in CONFIGS.items():
        small = standin_config(cfg, 1)
        assert parameter_count(small) == Qwen2ForCausalLM(Qwen2Config(**small)).num_parameters(), name


def test_lora_count_equals_peft_trainable_parameters():
    cfg = {**standin_config(CONFIGS["0.5b"], 2), "vocab_size": 512}
    modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(Qwen2ForCausalLM(Qwen2Config(**cfg)), LoraConfig(r=4, target_modules=modules))
    assert lora_parameter_count(cfg, 4, modules) == model.get_nb_trainable_parameters()[0]
    assert lora_parameter_count(CONFIGS["0.5b"], 16, modules) == 8_798_208  # the LoRA recipe's header


def test_zero2_shards_gradients_and_optimizer_but_not_the_weights():
    recipe = load_recipe(REPO / "recipes/qwen2.5-1.5b-from-7b-full.yaml")
    one = estimate(recipe, CONFIGS["7b"], CONFIGS["1.5b"])
    eight = estimate(recipe, CONFIGS["7b"], CONFIGS["1.5b"], world_size=8, zero_stage=2)
    p = 1_543_714_304
    assert one["draft weights"] == one["gradients"] == 4 * p and one["AdamW states"] == 8 * p
    assert eight["draft weights"] == 2 * p and eight["gradients"] == 2 * p / 8 and eight["fp32 master weights + AdamW states"] == 12 * p / 8
    assert eight["target weights"] == one["target weights"] == 2 * 7_615_616_512  # ZeRO-2 replicates the frozen teacher
    assert one["teacher logits"] == 8 * 1024 * 152_064 * 2 and one["activations"] == 28 * 8 * 1024 * (6 * 1536 + 4 * 8960) * 2


def test_cpu_check_measures_the_per_token_terms_near_their_estimates():
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux /proc")
    small = {
        "hidden_size": 512,
        "intermediate_size": 2048,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 32_000,
        "max_position_embeddings": 2048,
    }
    configs = {"untied": {**small, "tie_word_embeddings": False}, "tied": {**small, "tie_word_embeddings": True}}
    # a fresh process, as `distill memory --check` runs: in a long-lived one, freed pages are reused and RSS does not grow
    code = f"import json; from distill.commands.memory import measure; print(json.dumps(measure({configs!r})))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    rows = json.loads(run.stdout.strip().splitlines()[-1])
    ratios = {r["term"].split(",")[0].split(" (")[0]: r["measured"] / r["estimated"] for r in rows}
    assert 0.6 < ratios["activations"] < 1.2 and 0.9 < ratios["teacher logits"] < 1.1
    assert 0.6 < ratios["fused loss"] < 1.3, ratios


def test_cli_prints_the_table(capsys):
    args = [
        "recipes/qwen2.5-0.5b-from-7b-lora.yaml",
        "--target-config",
        "recipes/model_configs/qwen2.5-7b-instruct.json",
        "--draft-config",
        "recipes/model_configs/qwen2.5-0.5b-instruct.json",
    ]
    assert main([str(REPO / args[0]), *[str(REPO / a) if a.endswith(".json") else a for a in args[1:]]]) == 0
    out = capsys.readouterr().out
    assert "| target weights | 15.23 |" in out and "**total**" in out


def test_cli_reads_the_shipped_configs_offline_and_names_the_flag_otherwise(capsys, monkeypatch):
    """Offline, the recipes' Hub names fall back to recipes/model_configs/; any other unreadable
    model ends with one line naming --draft-config / --target-config."""
    import transformers

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", offline)
    recipe = str(REPO / "recipes/qwen2.5-0.5b-from-7b-full.yaml")
    assert main([recipe, "--gpus", "8", "--zero", "2"]) == 0
    out = capsys.readouterr().out
    assert "| loss chunk | 6.22 |" in out and "**15.4**" in out  # 151,936 draft rows, 494M parameters
    with pytest.raises(SystemExit) as exit_:
        main([recipe, "--set", "draft.name_or_path=someone/my-draft"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "cannot read the config of someone/my-draft" in err and "pass --draft-config" in err
