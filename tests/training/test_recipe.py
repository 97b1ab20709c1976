"""Recipes: validation errors a user can act on, round trips, and every shipped file loads."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from distill.training.recipe import (
    DEFAULT_LORA_MODULES,
    REMOVED_KEYS,
    LoraSpec,
    Recipe,
    RecipeError,
    RemovedKeyError,
    load_recipe,
    recipe_help,
    recipe_keys,
    save_recipe,
)

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
ACCELERATE = RECIPES / "accelerate"
GPU_PLAN = REPO / "docs" / "gpu-plan.md"

MINIMAL = {
    "output_dir": "runs/x",
    "target": {"name_or_path": "Qwen/Qwen2.5-7B-Instruct"},
    "draft": {"name_or_path": "Qwen/Qwen2.5-0.5B-Instruct"},
    "data": {"dataset": "openai/gsm8k"},
    "training": {"max_steps": 10},
}


def with_(path: str, value) -> dict:
    """MINIMAL with one dotted key set."""
    data = copy.deepcopy(MINIMAL)
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return data


def errors_of(data) -> str:
    with pytest.raises(RecipeError) as info:
        load_recipe(data)
    return str(info.value)


def test_minimal_recipe_fills_the_documented_defaults():
    r = load_recipe(MINIMAL)
    assert isinstance(r, Recipe)
    assert r.seed == 0 and r.target.dtype == "auto" and r.draft.lora is None and r.draft.merge_on_save is True
    assert r.data.split == "train" and r.data.max_prompt_length == 512 and r.data.max_length == 1024
    assert r.data.response_source == "dataset" and r.data.adapter is None
    assert r.teacher.mode == "online" and r.teacher.top_k == 32
    assert r.loss.divergence == "forward_kl" and r.loss.beta == 0.5 and r.loss.lmbda == 0.0
    assert r.training.learning_rate == 5e-5 and r.training.report_to == ["none"] and r.training.save_total_limit == 2


def test_unknown_key_names_its_place_and_the_closest_valid_key():
    msg = errors_of(with_("loss.divergense", "jsd"))
    assert "loss.divergense: unknown key" in msg and "did you mean 'loss.divergence'" in msg


def test_key_in_the_wrong_section_points_to_where_it_belongs():
    msg = errors_of(with_("loss.learning_rate", 1e-4))
    assert "loss.learning_rate: unknown key" in msg and "'training.learning_rate'" in msg


def test_unknown_top_level_and_nested_lora_keys():
    data = with_("trainig", {"max_steps": 3})
    data["draft"]["lora"] = {"rank": 8}
    msg = errors_of(data)
    assert "trainig: unknown key; did you mean 'training'?" in msg
    assert "draft.lora.rank: unknown key" in msg


def test_wrong_type_names_key_expected_type_and_value():
    msg = errors_of(with_("training.max_steps", "100"))
    assert "training.max_steps: expected int, got str '100'" in msg


def test_bool_is_not_accepted_as_a_number_but_int_is_a_float():
    assert "expected int, got bool True" in errors_of(with_("training.max_steps", True))
    r = load_recipe(with_("training.learning_rate", 1))
    assert r.training.learning_rate == 1.0 and isinstance(r.training.learning_rate, float)


def test_bad_enum_lists_the_allowed_values():
    msg = errors_of(with_("loss.divergence", "kl"))
    assert "loss.divergence: 'kl' is not allowed" in msg
    for name in ("'forward_kl'", "'reverse_kl'", "'jsd'", "'tvd'"):
        assert name in msg
    assert "'float32', 'bfloat16', 'float16', 'auto'" in errors_of(with_("target.dtype", "bf16"))


def test_missing_required_keys_and_ranges():
    data = copy.deepcopy(MINIMAL)
    del data["training"]["max_steps"]
    assert "training.max_steps: required key is missing" in errors_of(data)
    assert "loss.beta: must be between 0 and 1, got 1.5" in errors_of(with_("loss.beta", 1.5))
    assert "training.max_steps: must be > 0, got 0" in errors_of(with_("training.max_steps", 0))


def test_all_errors_are_reported_at_once():
    data = with_("loss.divergense", "jsd")
    data["training"]["max_steps"] = "x"
    err = pytest.raises(RecipeError, load_recipe, data).value
    assert len(err.errors) == 2


def test_cross_field_rules():
    assert "teacher.cache_dir: required" in errors_of(with_("teacher.mode", "cache"))
    assert "data.generation_cache: required" in errors_of(with_("data.response_source", "target"))
    assert "data.max_prompt_length: must be < data.max_length" in errors_of(with_("data.max_prompt_length", 2048))
    both = with_("draft.config", {"hidden_size": 32})
    assert "exactly one of draft.name_or_path" in errors_of(both)
    cached = with_("teacher", {"mode": "cache", "cache_dir": "c", "top_k": 16})
    cached["loss"] = {"top_k": 32}
    assert "loss.top_k: 32 exceeds the cached teacher.top_k 16" in errors_of(cached)


def test_lora_defaults():
    r = load_recipe(with_("draft.lora", {}))
    assert r.draft.lora == LoraSpec(r=16, alpha=32, dropout=0.05, target_modules=DEFAULT_LORA_MODULES)


def test_yaml_file_errors_name_the_file_and_read_exponent_floats(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(
        "output_dir: runs/x\ntarget: {name_or_path: t}\ndraft: {name_or_path: d}\ndata: {dataset: d.jsonl}\ntraining: {max_steps: 5, learning_rate: 5e-5}\n"
    )
    assert load_recipe(good).training.learning_rate == 5e-5  # PyYAML alone would read the string '5e-5'
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("max_steps: 5", "max_step: 5"))
    msg = errors_of(bad)
    assert str(bad) in msg and "training.max_step: unknown key; did you mean 'training.max_steps'?" in msg
    dup = tmp_path / "dup.yaml"
    dup.write_text(good.read_text() + "output_dir: runs/y\n")
    assert "duplicate key 'output_dir'" in errors_of(dup)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    assert "empty" in errors_of(empty)
    with pytest.raises(FileNotFoundError):
        load_recipe(tmp_path / "missing.yaml")


def test_save_and_load_round_trip_atomically(tmp_path):
    r = load_recipe(RECIPES / "qwen2.5-0.5b-from-7b-lora.yaml")
    out = save_recipe(r, tmp_path / "run" / "recipe.yaml")
    assert load_recipe(out) == r
    assert load_recipe(r.to_dict()) == r
    assert sorted(p.name for p in out.parent.iterdir()) == ["recipe.yaml"]  # no temp file left behind


def _cost_section(name: str) -> str:
    """The recipe's section of docs/gpu-plan.md, "Cost arithmetic of each recipe"."""
    text = GPU_PLAN.read_text()
    start = text.index("## Cost arithmetic of each recipe")
    head = f"### recipes/{name}\n"
    assert head in text[start:], f"docs/gpu-plan.md has no section {head.strip()!r}"
    section = text[text.index(head, start) + len(head) :]
    return section.split("\n#", 1)[0]


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_recipe_loads(path):
    r = load_recipe(path)
    assert r.training.max_steps > 0
    costs = _cost_section(path.name)
    if path.name.startswith("qwen2.5-coder"):  # the real CPU pair: distilled on training rows, never evaluated ones
        assert r.target.name_or_path == "Qwen/Qwen2.5-Coder-1.5B-Instruct" and r.draft.name_or_path == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
        assert "tokens/s" in costs
        if r.data.sources:
            _check_mix(r)
        else:
            assert r.data.split == "train" and r.data.prompt_template == "gsm8k"
    elif path.name.startswith("qwen2.5"):
        assert r.target.name_or_path == "Qwen/Qwen2.5-7B-Instruct" and r.target.dtype == "bfloat16"
        assert r.draft.name_or_path.startswith("Qwen/Qwen2.5-") and r.training.bf16
        assert "GB" in costs and "tokens/s" in costs and "FLOP" in costs  # the cost arithmetic is stated
    else:
        assert "FLOP" in costs


def _check_mix(r: Recipe) -> None:
    """A mixed recipe: each task's training side only (GSM8K train, MMLU validation without test's
    questions, CNN/DM's training rows), under training templates only."""
    from distill.common.prompts import HELD_OUT_TEMPLATES, TRAINING_TEMPLATES

    sources = {s.adapter: s for s in r.data.sources}
    assert set(sources) == {"gsm8k", "mmlu", "cnndm_train"}
    assert sources["gsm8k"].dataset.endswith("gsm8k/train.jsonl") and sources["mmlu"].dataset.endswith("mmlu/validation.jsonl")
    assert sources["mmlu"].exclude == ["../shared/data/mmlu/test.jsonl"] and sources["cnndm_train"].max_article_words == 512
    held = {n for names in HELD_OUT_TEMPLATES.values() for n in names}
    for adapter, source in sources.items():
        task = adapter.removesuffix("_train")
        assert source.templates == list(TRAINING_TEMPLATES[task]) and not held & set(source.templates)
    assert r.data.num_samples == 256 and r.data.response_source == "target" and r.data.generation_cache and r.teacher.mode == "cache"


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_recipe_headers_say_what_and_how_and_point_to_the_cost_arithmetic(path):
    """The header: what the recipe is for, the exact command, a pointer to docs/gpu-plan.md; no arithmetic."""
    lines = path.read_text().splitlines()
    header = lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))]
    text = "\n".join(header)
    assert len(header) <= 15, f"{path.name}: a {len(header)}-line header; the arithmetic belongs in docs/gpu-plan.md"
    assert "docs/gpu-plan.md" in text and "Cost arithmetic of each recipe" in text
    assert f"recipes/{path.name}" in text  # the command that runs it
    assert " GB" not in text and "FLOP" not in text


# --------------------------------------------------------------------------- --help-recipe


def _declared(cls: type = Recipe, prefix: str = "") -> dict[str, dataclasses.Field]:
    """Every field of every section dataclass, walked from Recipe: dotted path -> field."""
    found = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        found[prefix + f.name] = f
        for sub in (a for a in (typing.get_args(hints[f.name]) or (hints[f.name],)) if dataclasses.is_dataclass(a)):
            found.update(_declared(sub, f"{prefix}{f.name}."))
    return found


def test_every_recipe_key_carries_its_help():
    declared = _declared()
    assert {"seed", "data.max_length", "draft.lora.r", "loss.token_selection.keep_fraction", "loss.lmbda", "data.sources.templates"} <= set(declared)
    missing = [path for path, f in declared.items() if not str(f.metadata.get("help", "")).strip()]
    assert not missing, f"recipe keys without a help in their declaration: {missing}"


def test_help_recipe_lists_every_key_with_its_type_default_and_help(capsys):
    from distill.cli import main

    assert main(["train", "--help-recipe"]) == 0
    out = capsys.readouterr().out
    keys = recipe_keys()
    assert {k.path for k in keys} == set(_declared())  # every key, walked from the dataclasses
    lines = out.splitlines()
    for key in keys:
        head = f"{key.path}: {key.type} " + (key.default if key.default == "(required)" else f"= {key.default}")
        assert head in (line.strip() for line in lines), f"--help-recipe does not list {head!r}"
        words = " ".join(out.split())
        assert " ".join(key.help.split()) in words
    assert "data.max_length: int = 1024" in out and "training.max_steps: int (required)" in out
    assert "loss.divergence: 'forward_kl' | 'reverse_kl' | 'jsd' | 'tvd' = forward_kl" in out
    assert "draft.lora.target_modules: list[str] = [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]" in out
    assert "data.packing" in out and "\n  eval\n" in out  # listed under "Removed keys"
    assert out == recipe_help() + "\n"


def test_help_recipe_answers_without_torch_and_through_the_train_script():
    code = "import sys\nfrom distill.cli import main\nassert main(['train', '--help-recipe']) == 0\nprint('torch loaded' if 'torch' in sys.modules else 'torch not loaded')"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert run.stdout.rstrip().endswith("torch not loaded") and "data.max_length: int = 1024" in run.stdout


def test_train_main_prints_the_recipe_help_and_still_needs_a_recipe(capsys):
    from distill.training.train import main

    assert main(["--help-recipe"]) == 0
    assert capsys.readouterr().out == recipe_help() + "\n"
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2 and "the following arguments are required: recipe" in capsys.readouterr().err


# --------------------------------------------------------------------------- removed keys


@pytest.mark.parametrize(
    "path,value",
    [("data.packing", False), ("data.packing", True), ("eval", {"num_prompts": 64, "max_new_tokens": 128, "num_draft_tokens": 5}), ("eval", {})],
)
def test_a_removed_key_is_one_line_naming_it(path, value):
    err = pytest.raises(RemovedKeyError, load_recipe, with_(path, value)).value
    assert isinstance(err, RecipeError) and len(err.errors) == 1
    assert str(err) == f"recipe key '{path}' was removed: {REMOVED_KEYS[path]}; delete the key"
    assert "\n" not in str(err)


def test_a_removed_key_in_a_file_names_the_file_and_every_removed_key(tmp_path):
    old = tmp_path / "old.yaml"
    data = with_("data.packing", False)
    data["eval"] = {"num_prompts": 32}
    old.write_text(yaml.safe_dump(data))
    lines = str(pytest.raises(RemovedKeyError, load_recipe, old).value).splitlines()
    assert lines == [
        f"{old}: recipe key 'data.packing' was removed: examples are always padded per batch; delete the key",
        f"{old}: recipe key 'eval' was removed: {REMOVED_KEYS['eval']}; delete the key",
    ]


def test_a_removed_key_set_on_the_command_line_is_refused():
    for item, key in (("data.packing=true", "data.packing"), ("eval.num_draft_tokens=3", "eval")):
        err = pytest.raises(RemovedKeyError, load_recipe, MINIMAL, [item]).value
        assert str(err) == f"--set {item.partition('=')[0]}: recipe key '{key}' was removed: {REMOVED_KEYS[key]}; drop this --set"


def test_distill_train_refuses_a_removed_key_with_one_line_and_exit_2(tmp_path, capsys):
    from distill.cli import main

    recipe = tmp_path / "old.yaml"
    recipe.write_text(yaml.safe_dump(with_("data.packing", False)))
    assert main(["train", str(recipe)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"distill train: error: {recipe}: recipe key 'data.packing' was removed: examples are always padded per batch; delete the key"]


def test_shipped_recipe_set():
    names = {p.name for p in RECIPES.glob("*.yaml")}
    assert names >= {
        "qwen2.5-0.5b-from-7b-lora.yaml",
        "qwen2.5-0.5b-from-7b-full.yaml",
        "qwen2.5-1.5b-from-7b-full.yaml",
        "tiny-cpu.yaml",
    }
    assert {p.name for p in ACCELERATE.glob("*.yaml")} == {"single_gpu.yaml", "multi_gpu.yaml", "zero2.yaml", "zero3.yaml"}


def test_tiny_recipe_reproduces_the_padded_vocab_mismatch():
    r = load_recipe(RECIPES / "tiny-cpu.yaml")
    assert r.target.name_or_path == "runs/tiny/target" and r.draft.name_or_path is None
    assert r.data.dataset == "runs/tiny/train.jsonl" and not r.training.bf16
    cfg = r.draft.config
    # the tiny target (see the recipe's header) has 508 embedding rows over a 476-token tokenizer
    assert 476 <= cfg["vocab_size"] < 508
    from transformers import Qwen2Config

    Qwen2Config(**cfg)  # a valid config dict


def _launch_args(path: Path):
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    parser = launch_command_parser()
    args = parser.parse_args(["--config_file", str(path), "scripts/train.py", "recipes/tiny-cpu.yaml"])
    return parser, *_validate_launch_command(args)


@pytest.mark.parametrize("name", ["single_gpu", "multi_gpu", "zero2", "zero3"])
def test_accelerate_configs_load_with_accelerate(name):
    """Parsed by accelerate's own loader, then by the validation `accelerate launch` runs."""
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    path = ACCELERATE / f"{name}.yaml"
    config = load_config_from_file(str(path))
    assert isinstance(config, ClusterConfig) and config.mixed_precision == "bf16" and not config.use_cpu
    parser, args, defaults, _ = _launch_args(path)
    known = set(vars(parser.parse_args(["x.py"])))
    unknown = set(config.deepspeed_config) - known  # accelerate would copy a misspelt key silently
    assert not unknown, f"{name}: deepspeed_config keys accelerate does not know: {unknown}"
    assert args.mixed_precision == "bf16"
    assert args.use_deepspeed == name.startswith("zero")
    assert args.multi_gpu == (name == "multi_gpu")


@pytest.mark.parametrize("name,stage", [("zero2", 2), ("zero3", 3)])
def test_zero_configs_build_the_deepspeed_plugin(name, stage, monkeypatch):
    """The environment `accelerate launch` would set gives a DeepSpeedPlugin with that ZeRO stage and
    "auto" batch settings, which the Trainer then fills from the recipe."""
    pytest.importorskip("deepspeed")
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    _, args, defaults, _ = _launch_args(ACCELERATE / f"{name}.yaml")
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
    _, env = prepare_deepspeed_cmd_env(args)
    for key, value in env.items():
        if key.startswith("ACCELERATE_"):
            monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()
    zero = plugin.deepspeed_config["zero_optimization"]
    assert zero["stage"] == stage
    assert plugin.deepspeed_config["gradient_accumulation_steps"] == "auto"
    assert plugin.zero3_init_flag == (stage == 3)
    assert zero["stage3_gather_16bit_weights_on_model_save"] == (stage == 3)


# --------------------------------------------------------------------------- data.sources


def _mix(**data) -> dict:
    recipe = copy.deepcopy(MINIMAL)
    del recipe["data"]["dataset"]
    recipe["data"] = {"num_samples": 8, "sources": [{"dataset": "a.jsonl", "adapter": "gsm8k", "templates": ["gsm8k", "gsm8k-brief"]}], **data}
    return recipe


def test_sources_validate_and_refuse_held_out_templates():
    r = load_recipe(_mix())
    assert r.data.dataset is None and r.data.sources[0].templates == ["gsm8k", "gsm8k-brief"] and r.data.sources[0].share == 1.0
    assert "data: set data.dataset (one dataset) or data.sources (a mix), not both" in errors_of(_mix(dataset="x.jsonl"))
    neither = copy.deepcopy(MINIMAL)
    del neither["data"]["dataset"]
    assert "data: set data.dataset (one dataset) or data.sources (a mix), the data to train on" in errors_of(neither)
    assert "data.num_samples: required with data.sources" in errors_of(_mix(num_samples=None))
    assert "data.adapter: leave it unset with data.sources; set data.sources[i].adapter" in errors_of(_mix(adapter="gsm8k"))
    assert "data.eval_split: leave it unset with data.sources" in errors_of(_mix(eval_split="e.jsonl"))
    bad = _mix()
    bad["data"]["sources"][0]["templates"] = ["gsm8k-boxed", "{question}", "mmlu", "nope"]
    message = errors_of(bad)
    assert "data.sources[0].templates: 'gsm8k-boxed' is held out of training" in message and "train with one of gsm8k, gsm8k-brief" in message
    assert "data.sources[0].templates: 'gsm8k-plain' is held out of training" in message  # a held-out template's text, unnamed
    assert "'mmlu' uses {subject}, which only MMLU rows give" in message and "'nope' is neither a template name" in message
    assert "data.prompt_template: 'mmlu-exam' is held out of training" in errors_of(with_("data.prompt_template", "mmlu-exam"))
    bad = _mix()
    bad["data"]["sources"][0] |= {"shares": 2, "exclude": ["openai/gsm8k"]}
    message = errors_of(bad)
    assert "data.sources[0].shares: unknown key; did you mean 'data.sources[0].share'?" in message
    bad["data"]["sources"][0].pop("shares")
    assert "data.sources[0].exclude: 'openai/gsm8k' is not a local .jsonl, .json or .parquet file" in errors_of(bad)
