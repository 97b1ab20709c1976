"""Training a draft from a recipe: acceptance on held-out data rises, a resumed run ends where an
uninterrupted one does, LoRA merges exactly, mismatched tokenizers are refused, the output layout,
on-policy batches, the same run under DeepSpeed ZeRO-2/3 through `accelerate launch`, and the tiny
target and data that recipes/tiny-cpu.yaml trains on."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from distill.common.tiny import build_tokenizer, tiny_qwen2
from distill.training.recipe import load_recipe
from distill.training.teacher import cache_teacher
from distill.training.train import build_trainer, main, save_draft, train

REPO = Path(__file__).resolve().parents[2]


def _chat(tokenizer, example: dict) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": example["prompt"]}, {"role": "assistant", "content": example["response"]}], tokenize=False
    )


@pytest.fixture(scope="module")
def tiny_dir(tiny_run, tokenizer, target, draft, examples):
    """A target trained briefly on the corpus (so it has a distribution worth matching; embedding
    padded +32), a pretrained-draft directory (padded +8), 64 training and 16 eval examples."""
    run = tiny_run(
        "train",
        train_rows=64,
        eval_rows=16,
        draft_vocab_pad=8,
        training={
            "max_steps": 4,
            "per_device_train_batch_size": 8,
            "learning_rate": 1e-2,
            "lr_scheduler_type": "constant",
            "logging_steps": 1,
            "save_steps": 100,
            "report_to": ["none"],
        },
    )
    tok = AutoTokenizer.from_pretrained(run / "target")  # as every run loads it
    model = copy.deepcopy(target).train()
    enc = tok([_chat(tok, e) for e in examples], add_special_tokens=False, padding=True, padding_side="right", return_tensors="pt")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        idx = torch.randint(0, len(examples), (16,), generator=gen)
        ids, att = enc.input_ids[idx], enc.attention_mask[idx]
        model(input_ids=ids, attention_mask=att, labels=ids.masked_fill(att == 0, -100)).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval().save_pretrained(run / "target")
    draft.save_pretrained(run / "draft")
    tokenizer.save_pretrained(run / "draft")
    return run


class StopAt(TrainerCallback):
    """Ends training after `step`, as a killed job would (the checkpoint at `step` is already saved)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control


def test_distillation_raises_heldout_expected_acceptance(tiny_dir):
    recipe = load_recipe(tiny_dir.recipe("kd", training={"max_steps": 30}))
    trainer = build_trainer(recipe)
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    print(
        f"held-out expected acceptance {before['eval_expected_acceptance']:.3f} -> {after['eval_expected_acceptance']:.3f}, "
        f"top-1 agreement {before['eval_top1_agreement']:.3f} -> {after['eval_top1_agreement']:.3f}"
    )
    assert 0 <= before["eval_expected_acceptance"] <= 1 and 0 <= before["eval_top1_agreement"] <= 1
    assert after["eval_loss"] < before["eval_loss"]
    assert after["eval_expected_acceptance"] > before["eval_expected_acceptance"] + 0.1
    assert after["eval_top1_agreement"] > before["eval_top1_agreement"]


def test_ce_weight_adds_cross_entropy_on_the_labels(tiny_dir):
    plain = build_trainer(load_recipe(tiny_dir.recipe("ce0")))
    with_ce = build_trainer(load_recipe(tiny_dir.recipe("ce1", loss={"ce_weight": 0.5})))
    batch = next(iter(plain.get_train_dataloader()))
    with torch.no_grad():
        kd = plain.compute_loss(plain.model, batch)
        both = with_ce.compute_loss(with_ce.model, batch)
        logits = plain.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    vocab = plain.vocab_size
    ce = torch.nn.functional.cross_entropy(logits[:, :-1, :vocab].reshape(-1, vocab), batch["labels"][:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(both, kd + 0.5 * ce, atol=1e-5, rtol=1e-5)


def test_resumed_run_ends_with_the_same_weights(tiny_dir):
    sections = {"training": {"max_steps": 6, "save_steps": 3}, "data": {"eval_split": None}}
    straight = build_trainer(load_recipe(tiny_dir.recipe("straight", **sections)))
    straight.train()

    interrupted = load_recipe(tiny_dir.recipe("resumed", **sections))
    build_trainer(interrupted, callbacks=[StopAt(3)]).train()
    assert (Path(interrupted.output_dir) / "checkpoint-3").is_dir()
    assert not (Path(interrupted.output_dir) / "checkpoint-6").exists()
    with pytest.raises(FileExistsError, match="--resume"):
        train(interrupted)
    train(interrupted, resume=True)  # a new trainer continues from checkpoint-3

    resumed = AutoModelForCausalLM.from_pretrained(Path(interrupted.output_dir) / "draft").state_dict()
    expected = straight.model.state_dict()
    assert resumed.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(resumed[name], value, atol=1e-6, rtol=1e-5, msg=name)
    info = json.loads((Path(interrupted.output_dir) / "run_info.json").read_text())
    assert info["resumed_from"].endswith("checkpoint-3") and info["global_step"] == 6


def test_lora_run_merges_into_a_model_with_the_same_logits(tiny_dir):
    draft = {"name_or_path": str(tiny_dir / "draft"), "dtype": "float32", "lora": {"r": 4, "alpha": 8, "dropout": 0.0}}
    recipe = load_recipe(tiny_dir.recipe("lora", draft=draft, training={"max_steps": 3}, data={"eval_split": None}))
    trainer = build_trainer(recipe)
    trainer.train()
    batch = next(iter(trainer.get_train_dataloader()))
    peft_model = trainer.model.eval()
    with torch.no_grad():
        expected = peft_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    trained = [p for n, p in peft_model.named_parameters() if "lora_B" in n]
    assert trained and any(p.abs().sum() > 0 for p in trained)  # the adapter did learn something
    out = save_draft(trainer, recipe)
    assert not (out / "adapter_config.json").exists() and (out / "model.safetensors").exists()
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        got = merged(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(tiny_dir / "draft")
    assert not torch.allclose(base.model.layers[0].self_attn.q_proj.weight, merged.model.layers[0].self_attn.q_proj.weight)

    unmerged = load_recipe(tiny_dir.recipe("lora-adapter", draft={**draft, "merge_on_save": False}, training={"max_steps": 1}, data={"eval_split": None}))
    train(unmerged)
    assert (Path(unmerged.output_dir) / "draft" / "adapter_config.json").exists()


def test_activation_checkpointing_trains_the_same_lora_draft(tiny_dir):
    """The CPU recipes recompute activations to fit in memory (peak 16 -> 7 GB on the mix recipe); the
    trained adapter must be the one a run that keeps them gets, LoRA dropout included."""
    draft = {"name_or_path": str(tiny_dir / "draft"), "dtype": "float32", "lora": {"r": 4, "alpha": 8, "dropout": 0.1}}
    weights = {}
    for name, checkpointing in (("kept", False), ("recomputed", True)):
        recipe = load_recipe(
            tiny_dir.recipe(f"lora-{name}", draft=draft, training={"max_steps": 3, "gradient_checkpointing": checkpointing}, data={"eval_split": None})
        )
        trainer = build_trainer(recipe)
        trainer.train()
        assert any(getattr(m, "gradient_checkpointing", False) for m in trainer.model.modules()) is checkpointing
        weights[name] = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    assert weights["kept"].keys() == weights["recomputed"].keys() and weights["kept"]
    for n, value in weights["kept"].items():
        torch.testing.assert_close(weights["recomputed"][n], value, atol=1e-6, rtol=1e-5, msg=n)


def test_draft_with_another_tokenizer_is_refused(tiny_dir, examples):
    other = build_tokenizer([e["response"][::-1] for e in examples], vocab_size=300)
    model = tiny_qwen2(len(other) + 8, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, tokenizer=other)
    model.save_pretrained(tiny_dir / "foreign-draft")
    other.save_pretrained(tiny_dir / "foreign-draft")
    recipe = load_recipe(tiny_dir.recipe("foreign", draft={"name_or_path": str(tiny_dir / "foreign-draft")}))
    with pytest.raises(ValueError, match="tokenizers (differ|disagree)"):
        build_trainer(recipe)


def test_recipe_run_writes_the_output_layout(tiny_dir):
    recipe_path = tiny_dir / "layout.yaml"
    recipe_path.write_text(yaml.safe_dump(tiny_dir.recipe("layout", training={"max_steps": 2, "save_steps": 2, "eval_steps": 1})))
    assert main([str(recipe_path)]) == 0
    out = tiny_dir / "layout"
    assert (out / "checkpoint-2").is_dir()
    draft = AutoModelForCausalLM.from_pretrained(out / "draft")
    assert draft.config.vocab_size == len(AutoTokenizer.from_pretrained(out / "draft")) + 8
    assert load_recipe(out / "recipe.yaml") == load_recipe(recipe_path)
    info = json.loads((out / "run_info.json").read_text())
    assert info["seed"] == 0 and info["recipe_path"] == str(recipe_path) and info["global_step"] == 2
    assert {"torch", "transformers", "trl", "distill"} <= info["versions"].keys()
    assert {"train_loss", "eval_loss", "eval_expected_acceptance", "eval_top1_agreement"} <= info["metrics"].keys()
    history = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    assert any("eval_expected_acceptance" in h and "eval_loss" in h for h in history)
    fresh = tiny_dir / "fresh.yaml"
    fresh.write_text(yaml.safe_dump(tiny_dir.recipe("fresh")))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(load_recipe(fresh), resume=True)


def test_cache_mode_trains_and_reports_acceptance(tiny_dir):
    recipe = load_recipe(tiny_dir.recipe("cached", teacher={"mode": "cache", "cache_dir": str(tiny_dir / "cache"), "top_k": 16}, training={"max_steps": 2}))
    cache_teacher(recipe)
    metrics = train(recipe)
    assert metrics["train_loss"] > 0 and 0 < metrics["eval_expected_acceptance"] < 1
    on_policy = load_recipe(tiny_dir.recipe("cached-on-policy", teacher=dataclasses.asdict(recipe.teacher), loss={"lmbda": 0.5}))
    with pytest.raises(ValueError, match="online teacher"):
        build_trainer(on_policy)


def test_on_policy_batches_keep_prompts_and_train_on_samples(tiny_dir):
    recipe = load_recipe(tiny_dir.recipe("on-policy", loss={"lmbda": 1.0, "max_new_tokens_on_policy": 8}, training={"max_steps": 2}, data={"eval_split": None}))
    trainer = build_trainer(recipe)
    batch = next(iter(trainer.get_train_dataloader()))
    new = trainer._on_policy_inputs(trainer.model, batch)
    assert int(new["input_ids"].max()) < trainer.vocab_size  # the draft's padding rows are never sampled
    for i in range(batch["input_ids"].shape[0]):
        start = int((batch["labels"][i] != -100).nonzero()[0])
        assert torch.equal(new["input_ids"][i, :start], batch["input_ids"][i, :start])
        assert (new["labels"][i, :start] == -100).all()
        n = int(new["attention_mask"][i].sum())
        assert new["attention_mask"][i, :n].all() and not new["attention_mask"][i, n:].any()  # right-padded
        assert 0 < n - start <= 8 and torch.equal(new["labels"][i, start:n], new["input_ids"][i, start:n])
    result = trainer.train()
    assert torch.isfinite(torch.tensor(result.training_loss)) and result.training_loss > 0


def _first_loss(output_dir: Path) -> float:
    last = max(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    history = json.loads((last / "trainer_state.json").read_text())["log_history"]
    return next(h["loss"] for h in history if "loss" in h)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    ("stage", "selective"), [("zero2", False), ("zero2", True), pytest.param("zero3", False, marks=pytest.mark.slow)], ids=["zero2", "zero2-adaspec", "zero3"]
)
def test_deepspeed_run_matches_the_plain_run(tiny_dir, stage, selective):
    """A few steps of the recipe under `accelerate launch` with the shipped DeepSpeed config (CPU
    overrides: one process, no mixed precision) give the plain run's losses; with AdaSPEC token
    selection (the pretrained draft as reference) too."""
    pytest.importorskip("deepspeed")
    sections = {"training": {"max_steps": 3, "save_steps": 3}, "data": {"eval_split": None}}
    plain, name = _plain_run(tiny_dir, "plain", sections), stage
    if selective:
        sections["loss"] = {"token_selection": {"reference": str(tiny_dir / "draft"), "keep_fraction": 0.5}}
        plain, name = _plain_run(tiny_dir, "plain-adaspec", sections), f"{stage}-adaspec"
    (tiny_dir / f"{name}.yaml").write_text(yaml.safe_dump(tiny_dir.recipe(name, **sections)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or "accelerate"
    cmd = [
        accelerate,
        "launch",
        "--config_file",
        str(REPO / f"recipes/accelerate/{stage}.yaml"),
        "--num_processes",
        "1",
        "--mixed_precision",
        "no",
        "--main_process_port",
        str(_free_port()),
        str(REPO / "scripts/train.py"),
        str(tiny_dir / f"{name}.yaml"),
    ]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((tiny_dir / name / "run_info.json").read_text())["deepspeed"] is True
    loss = _first_loss(tiny_dir / name)
    assert 0 < loss < float("inf")
    assert loss == pytest.approx(_first_loss(plain), rel=1e-4)
    if selective:
        assert _first_loss(plain) != pytest.approx(_first_loss(tiny_dir / "plain"), rel=1e-3)  # the selection was applied
        history = json.loads((tiny_dir / name / "checkpoint-3" / "trainer_state.json").read_text())["log_history"]
        assert all(h["kept_fraction"] == pytest.approx(0.5, abs=0.02) for h in history if "loss" in h)
    assert AutoModelForCausalLM.from_pretrained(tiny_dir / name / "draft").config.vocab_size == tiny_dir.recipe(name)["draft"]["config"]["vocab_size"]


def _plain_run(tiny_dir, name: str, sections: dict) -> Path:
    """The one-process run `name` of the recipe with `sections`, trained once per module."""
    if not (tiny_dir / name).exists():
        train(load_recipe(tiny_dir.recipe(name, **sections)))
    return tiny_dir / name


def test_prepare_tiny_writes_what_tiny_cpu_recipe_trains_on(tmp_path):
    from distill.commands.prepare_tiny import prepare

    small = {
        "train_examples": 120,
        "eval_examples": 16,
        "hidden_size": 32,
        "num_layers": 1,
        "num_heads": 2,
        "num_kv_heads": 1,
        "intermediate_size": 64,
        "steps": 3,
    }
    info = prepare(tmp_path / "tiny", **small)
    target_dir = tmp_path / "tiny" / "target"
    tok = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir)
    assert info["tokenizer_size"] == len(tok) and model.config.vocab_size == len(tok) + 32  # padded like Qwen2.5-7B
    assert len((tmp_path / "tiny" / "train.jsonl").read_text().splitlines()) == 120
    assert {"prompt", "response"} == json.loads((tmp_path / "tiny" / "eval.jsonl").read_text().splitlines()[0]).keys()
    stamp = (target_dir / "model.safetensors").stat().st_mtime_ns
    assert prepare(tmp_path / "tiny", **small) == info and (target_dir / "model.safetensors").stat().st_mtime_ns == stamp  # done: skipped

    # The shipped tiny recipe, pointed at this directory, builds and computes a finite loss.
    recipe = yaml.safe_load((REPO / "recipes" / "tiny-cpu.yaml").read_text())
    recipe["output_dir"] = str(tmp_path / "run")
    recipe["target"]["name_or_path"] = str(target_dir)
    recipe["data"].update(dataset=str(tmp_path / "tiny" / "train.jsonl"), eval_split=str(tmp_path / "tiny" / "eval.jsonl"))
    trainer = build_trainer(load_recipe(recipe))
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        assert 0 < trainer.compute_loss(trainer.model, batch).item() < float("inf")
