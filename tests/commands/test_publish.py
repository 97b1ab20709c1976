"""`distill publish`: merged/adapter folders that reload to the same model, vocabulary padding that
changes no output, a model card with the measured numbers, atomic writes, and no upload unless asked."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import jinja2
import pytest
import torch
import yaml
from huggingface_hub import HfApi, ModelCard
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import distill.commands.publish as publish_module
from distill.commands.publish import main, pad_vocab, publish
from distill.common.tiny import build_tokenizer, corpus_texts
from distill.speculative import SpeculativeDecoder

REPO_ROOT = Path(__file__).resolve().parents[2]
OFFSET = 0.2
PROMPTS = ["anna has 3 apples and gets 4 more . how many", "tell me about the fox .", "the red"]

SAMPLE_REPORT = {
    "target": "tiny-target",
    "environment": {"device": "cpu", "dtype": "float32", "torch": "2.13.0"},
    "settings": {"num_draft_tokens": 4, "temperature": 0.0},
    "drafts": {
        "base": {
            "path": "Qwen/Qwen2.5-0.5B-Instruct",
            "tasks": {
                "gsm8k": {
                    "acceptance_rate": 0.5512,
                    "mean_accepted_length": 2.2051,
                    "tokens_per_target_forward": 2.2,
                    "speedup": 1.48,
                    "ttft_s": 0.1,
                    "tpot_s": 0.02,
                    "tokens_per_s": 50.0,
                    "quality": 0.611,
                    "target_quality": 0.615,
                    "quality_metric": "exact_match",
                    "greedy_identity": 1.0,
                    "per_position_acceptance": [0.7, 0.5, 0.4, 0.3],
                },
            },
        },
        "distilled": {
            "path": "runs/tiny/draft",
            "tasks": {
                "gsm8k": {
                    "acceptance_rate": 0.7234,
                    "mean_accepted_length": 3.4117,
                    "tokens_per_target_forward": 3.4,
                    "speedup": 2.147,
                    "ttft_s": 0.1,
                    "tpot_s": 0.01,
                    "tokens_per_s": 90.0,
                    "quality": 0.6123,
                    "target_quality": 0.615,
                    "quality_metric": "exact_match",
                    "greedy_identity": 1.0,
                    "per_position_acceptance": [0.9, 0.8, 0.6, 0.5],
                },
                "cnndm": {
                    "acceptance_rate": 0.6018,
                    "mean_accepted_length": 2.8,
                    "tokens_per_target_forward": 2.8,
                    "speedup": 1.9062,
                    "ttft_s": 0.1,
                    "tpot_s": 0.01,
                    "tokens_per_s": 80.0,
                    "quality": 0.2871,
                    "target_quality": 0.2902,
                    "quality_metric": "rougeL",
                    "greedy_identity": 0.9853,
                    "per_position_acceptance": [0.8, 0.6, 0.5, 0.4],
                },
            },
        },
    },
}


def _write_run(run: Path, tokenizer, adapter_model, recipe: dict) -> Path:
    adapter_model.save_pretrained(run / "draft")
    tokenizer.save_pretrained(run / "draft")
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    (run / "run_info.json").write_text(json.dumps({"seed": 0, "git_rev": "abc1234", "versions": {"torch": torch.__version__}}))
    return run


@pytest.fixture(scope="module")
def env(tmp_path_factory, tokenizer, target, draft):
    """A target and a base draft on disk, a LoRA training output on that base, and the merged model in memory."""
    root = tmp_path_factory.mktemp("publish")
    base = copy.deepcopy(draft)
    with torch.no_grad():  # trained embeddings share a common direction; a zero padding row would then win some argmaxes
        base.get_input_embeddings().weight += OFFSET * torch.randn(draft.config.hidden_size, generator=torch.Generator().manual_seed(3))
    for name, model in (("target", target), ("base", base)):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    base = AutoModelForCausalLM.from_pretrained(root / "base")
    torch.manual_seed(0)  # peft draws the A matrices from the global generator: fixed, whatever ran before
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"]))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:  # peft starts B at zero (a no-op adapter); make the merge change the model
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    lora.eval()
    recipe = {
        "seed": 0,
        "output_dir": str(root / "run"),
        "target": {"name_or_path": str(root / "target")},
        "draft": {"name_or_path": "Qwen/Qwen2.5-0.5B-Instruct", "lora": {"r": 4, "alpha": 8}},
        "data": {"dataset": "openai/gsm8k", "adapter": "gsm8k"},
        "loss": {"divergence": "forward_kl", "temperature": 1.0},
        "training": {"max_steps": 10},
    }
    run = _write_run(root / "run", tokenizer, lora, recipe)
    merged = copy.deepcopy(lora).merge_and_unload().eval()
    report = root / "report.json"
    report.write_text(json.dumps(SAMPLE_REPORT))
    return SimpleNamespace(root=root, run=run, target_dir=root / "target", base_dir=root / "base", lora=lora, merged=merged, report=report)


def _inputs(tokenizer):
    return tokenizer(PROMPTS, return_tensors="pt", padding=True)


def _greedy(model, tokenizer, n=24):
    return model.generate(**_inputs(tokenizer), do_sample=False, max_new_tokens=n, min_new_tokens=n)


def test_lora_run_publishes_merged_safetensors_that_reload_to_the_same_model(env, tokenizer, tmp_path):
    out = publish(tmp_path / "draft", run_dir=env.run)
    names = {p.name for p in out.iterdir()}
    assert "model.safetensors" in names and "README.md" in names and "recipe.yaml" in names
    assert not {"adapter_config.json", "adapter_model.safetensors", "pytorch_model.bin"} & names
    # The tokenizer is the target's, byte for byte.
    assert (out / "tokenizer.json").read_bytes() == (env.target_dir / "tokenizer.json").read_bytes()
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["model_type"] == "qwen2"
    # transformers-4 readers (vLLM/SGLang pinned to v4) see the same RoPE base and dtype.
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] and config["torch_dtype"] == "float32"

    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert torch.equal(_greedy(reloaded, tokenizer), _greedy(env.merged, tokenizer))
    base = AutoModelForCausalLM.from_pretrained(env.base_dir).eval()
    with torch.no_grad():
        ids = _inputs(tokenizer)["input_ids"][:1]
        assert not torch.allclose(reloaded(ids).logits, base(ids).logits, atol=1e-3), "the LoRA was not merged"
        torch.testing.assert_close(reloaded(ids).logits, env.lora(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_reloaded_draft_gives_identical_greedy_speculative_output(env, tokenizer, target, tmp_path):
    out = publish(tmp_path / "draft", run_dir=env.run, pad_vocab_to_target=True)
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    enc = tokenizer(PROMPTS[:1], return_tensors="pt")
    plain = target.generate(**enc, do_sample=False, max_new_tokens=20)
    spec = SpeculativeDecoder(target, reloaded, num_draft_tokens=3, tokenizer=tokenizer, draft_tokenizer=AutoTokenizer.from_pretrained(out))
    got = spec.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=20)
    assert torch.equal(got.sequences[:, : plain.shape[1]], plain)
    in_memory = SpeculativeDecoder(target, env.merged, num_draft_tokens=3).generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=20)
    assert got.stats.accepted == in_memory.stats.accepted and got.stats.proposed == in_memory.stats.proposed


def test_keep_adapter_writes_the_adapter_and_it_reloads(env, tokenizer, tmp_path):
    out = publish(tmp_path / "adapter", run_dir=env.run, keep_adapter=True)
    names = {p.name for p in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names and "model.safetensors" not in names
    assert ModelCard.load(out / "README.md").data.library_name == "peft"
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = _inputs(tokenizer)["input_ids"][:1]
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, env.lora(input_ids=ids).logits)
    with pytest.raises(ValueError, match="--keep-adapter"):
        publish(tmp_path / "x", draft=env.base_dir, target=str(env.target_dir), keep_adapter=True)
    assert not (tmp_path / "x").exists()


def test_pad_vocab_to_target_changes_no_output(env, tokenizer, target, tmp_path):
    out = publish(tmp_path / "padded", draft=env.base_dir, target=str(env.target_dir), pad_vocab_to_target=True)
    unpadded = AutoModelForCausalLM.from_pretrained(env.base_dir).eval()
    padded = AutoModelForCausalLM.from_pretrained(out).eval()
    old, real = unpadded.config.vocab_size, len(tokenizer)
    # What vLLM's draft_model check compares.
    assert AutoConfig.from_pretrained(out).vocab_size == target.config.vocab_size == padded.lm_head.weight.shape[0] > old
    assert padded.generation_config.suppress_tokens == list(range(real, target.config.vocab_size))  # every id no text produces

    assert torch.equal(_greedy(padded, tokenizer, 32), _greedy(unpadded, tokenizer, 32))
    enc = tokenizer(PROMPTS[0], return_tensors="pt")
    with torch.no_grad():
        lp, lu = padded(**enc).logits, unpadded(**enc).logits
    assert torch.equal(lp[..., :old], lu)
    assert (lp[..., old:].amax(-1) < lp[..., :real].amax(-1)).all()

    # Sampling: every step of a sampled run draws from exactly the unpadded draft's distribution.
    torch.manual_seed(0)
    run = padded.generate(**enc, do_sample=True, top_k=0, top_p=1.0, temperature=1.0, max_new_tokens=24, output_scores=True, return_dict_in_generate=True)
    seq, start = run.sequences, enc["input_ids"].shape[1] - 1
    assert (seq < real).all()
    with torch.no_grad():  # the unpadded draft's distribution over the real tokens (padding rows suppressed)
        ref = unpadded(seq).logits[0, start : start + len(run.scores), :real].softmax(-1)
    probs = torch.cat(run.scores).softmax(-1)
    assert (probs[:, real:] == 0).all()
    torch.testing.assert_close(probs[:, :real], ref, rtol=1e-5, atol=1e-7)

    # Without suppress_tokens (vLLM ignores it) a padded id is never the argmax and never likelier than 1/real,
    # whatever the hidden state (random directions, and ones opposite the rows' common direction).
    w = padded.lm_head.weight.detach()
    h = torch.randn(4096, padded.config.hidden_size, generator=torch.Generator().manual_seed(1)) * torch.logspace(-2, 2, 4096).unsqueeze(1)
    h = torch.cat([h, -w[:real].mean(0) * torch.logspace(-2, 2, 64).unsqueeze(1)])  # every real logit negative here
    logits = h @ w.T
    assert (logits[-64:, :real] < 0).all()
    assert (logits[:, old:].amax(-1) < logits[:, :real].amax(-1)).all()
    assert (logits.softmax(-1)[:, old:] <= 1 / real + 1e-6).all()


def test_pad_vocab_refuses_to_shrink(draft, tokenizer):
    model = copy.deepcopy(draft)
    with pytest.raises(ValueError, match="cannot shrink"):
        pad_vocab(model, draft.config.vocab_size - 1, len(tokenizer))
    assert pad_vocab(model, draft.config.vocab_size, len(tokenizer)) == []


def test_model_card_holds_the_measured_numbers_and_hub_metadata(env, tmp_path):
    out = publish(tmp_path / "card", run_dir=env.run, eval_report=env.report, license="mit")
    text = (out / "README.md").read_text()
    header = yaml.safe_load(text.split("---\n")[1])
    assert header["base_model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert header["library_name"] == "transformers" and header["pipeline_tag"] == "text-generation"
    assert header["license"] == "mit" and header["datasets"] == ["openai/gsm8k"]
    assert "speculative-decoding" in header["tags"]
    assert ModelCard.load(out / "README.md").data.license == "mit"
    # One row per draft × task, with the report's numbers; a schema-1 report has one (end-to-end) speedup and no runs.
    assert "| distilled | gsm8k | 0.723 | 3.41 | – | 2.15× | 0.612 (exact_match) | 0.615 | 100.0% |" in text
    assert "| distilled | cnndm | 0.602 | 2.80 | – | 1.91× | 0.287 (rougeL) | 0.290 | 98.5% |" in text
    assert "| base | gsm8k | 0.551 | 2.21 | – | 1.48× |" in text
    assert "schema-1 report, whose timing runs were not recorded" in text
    assert str(env.target_dir) in text
    assert (env.run / "recipe.yaml").read_text().rstrip() in text
    assert "assistant_model=draft" in text and "STANDALONE" in text
    assert f'"method": "draft_model", "model": "{out}", "num_speculative_tokens": 4' in text
    assert json.loads((out / "eval_report.json").read_text()) == SAMPLE_REPORT
    assert publish(tmp_path / "apache", run_dir=env.run).joinpath("README.md").read_text().count("license: apache-2.0") == 1


def test_model_card_is_rendered_from_the_template_file(env, tmp_path, monkeypatch):
    text = publish_module.MODEL_CARD_TEMPLATE.read_text(encoding="utf-8")
    assert "{{ name }}" in text and "## Acceptance" in text and "{{ acceptance.table }}" in text

    # The card publish writes is that file filled in: an edit to its prose and placeholders shows up.
    prose = "A draft model for speculative decoding under **{{ target }}**"
    assert prose in text
    edited = tmp_path / "model_card.md"
    edited.write_text(text.replace(prose, "EDITED: a draft for **{{ target }}** at {{ repo }}"), encoding="utf-8")
    monkeypatch.setattr(publish_module, "MODEL_CARD_TEMPLATE", edited)
    out = publish(tmp_path / "edited", run_dir=env.run, eval_report=env.report)
    card = (out / "README.md").read_text()
    assert f"EDITED: a draft for **{env.target_dir}** at {out}" in card and "A draft model for speculative decoding" not in card
    assert "| distilled | gsm8k | 0.723 | 3.41 | – | 2.15× |" in card and card.endswith("```\n") and "{{" not in card and "{%" not in card

    # A placeholder the code does not fill fails the publish (no silent blank), and nothing is left behind.
    edited.write_text(text.replace("{{ name }}", "{{ no_such_value }}"), encoding="utf-8")
    with pytest.raises(jinja2.UndefinedError, match="no_such_value"):
        publish(tmp_path / "site" / "undefined", run_dir=env.run)
    assert list((tmp_path / "site").iterdir()) == []


def test_a_recipe_with_a_retired_eval_section_still_publishes(env, tmp_path):
    """recipe.yaml is read as plain YAML, so an older run's `eval:` section (no longer a recipe key) is kept
    verbatim but not used: the card's draft length comes only from the eval report."""
    run = tmp_path / "old-run"
    shutil.copytree(env.run, run)
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    recipe["eval"] = {"num_draft_tokens": 7, "tasks": ["gsm8k"]}
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    out = publish(tmp_path / "out", run_dir=run)
    card = (out / "README.md").read_text()
    assert (out / "recipe.yaml").read_text() == (run / "recipe.yaml").read_text() and "num_draft_tokens: 7" in card
    assert '"num_speculative_tokens": 5' in card and "--speculative-num-steps 5 " in card  # the default, not the recipe's 7
    card = publish(tmp_path / "with-report", run_dir=run, eval_report=env.report).joinpath("README.md").read_text()
    assert '"num_speculative_tokens": 4' in card and "--speculative-num-steps 4 " in card  # the report's settings


def test_a_mixed_recipe_names_each_source_and_its_share(env, tmp_path):
    run = tmp_path / "mix-run"
    shutil.copytree(env.run, run)
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    recipe["data"].pop("dataset", None)
    recipe["data"]["sources"] = [{"dataset": "openai/gsm8k", "share": 0.5}, {"dataset": "/data/mmlu/validation.jsonl", "share": 0.25}]
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    card = publish(tmp_path / "out", run_dir=run).joinpath("README.md").read_text()
    assert "- Training data: `openai/gsm8k` (share 0.5), `/data/mmlu/validation.jsonl` (share 0.25)" in card
    assert yaml.safe_load(card.split("---\n")[1])["datasets"] == ["openai/gsm8k"]  # Hub ids only in the metadata


def test_refuses_a_non_empty_out_without_force(env, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main([str(env.run), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"
    assert main([str(env.run), "--out", str(out), "--force"]) == 0
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()
    (tmp_path / "empty").mkdir()
    assert main([str(env.run), "--out", str(tmp_path / "empty")]) == 0


def test_refuses_a_draft_whose_tokenizer_differs(env, examples, tokenizer, draft, tmp_path):
    other = build_tokenizer(corpus_texts(examples), vocab_size=len(tokenizer) - 1)  # one merge fewer
    missing = sorted(set(tokenizer.get_vocab()) - set(other.get_vocab()))
    assert len(missing) == 1
    draft.save_pretrained(tmp_path / "odd")
    other.save_pretrained(tmp_path / "odd")
    with pytest.raises(ValueError, match="disagree") as err:
        publish(tmp_path / "out", draft=tmp_path / "odd", target=str(env.target_dir))
    assert repr(missing[0]) in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_schema_2_report_gives_both_speedups_with_intervals_and_names_the_run(env, tmp_path):
    """The card quotes what `distill accept` now writes: decode and end-to-end speedups, each figure with
    its 95% interval, and the run that timed them; a report of a newer schema is refused by name."""
    report = json.loads(json.dumps(SAMPLE_REPORT))
    report["schema_version"] = 2
    report["runs"] = {"r1": {"run_id": "r1", "started": "2026-12-04T23:00:00+00:00", "device_name": "AMD EPYC", "torch_threads": 2}}
    for entry in report["drafts"].values():
        for row in entry["tasks"].values():
            speed = row.pop("speedup")
            row.update(end_to_end_speedup=speed, decode_speedup=speed * 1.1)
            row["intervals"] = {
                "acceptance_rate": {"value": row["acceptance_rate"], "low": row["acceptance_rate"] - 0.02, "high": row["acceptance_rate"] + 0.01},
                "decode_speedup": {"value": speed * 1.1, "low": speed, "high": speed * 1.2},
            }
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(report))
    text = (publish(tmp_path / "card", run_dir=env.run, eval_report=path) / "README.md").read_text()
    assert "| distilled | gsm8k | 0.723 [0.703, 0.733] | 3.41 | 2.36× [2.15, 2.58] | 2.15× | 0.612 (exact_match) |" in text
    assert "Speeds timed in run(s) `r1` started 2026-12-04T23:00:00+00:00 on AMD EPYC, 2 threads" in text
    report["schema_version"] = 3
    path.write_text(json.dumps(report))
    with pytest.raises(ValueError, match="schema 3; this distill reads schemas \\[1, 2\\]"):
        publish(tmp_path / "newer", run_dir=env.run, eval_report=path)


def test_a_failure_midway_leaves_nothing_behind(env, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"target": "t", "drafts": {"d": {"tasks": {"gsm8k": {"acceptance_rate": 0.5}}}}}))
    site = tmp_path / "site"
    site.mkdir()
    with pytest.raises(ValueError, match="speedup"):  # raised after the weights were written
        publish(site / "out", run_dir=env.run, eval_report=bad)
    assert list(site.iterdir()) == []
    with pytest.raises(FileNotFoundError, match="eval-report"):
        publish(site / "out", run_dir=env.run, eval_report=tmp_path / "missing.json")
    assert list(site.iterdir()) == []


@pytest.fixture
def hub_calls(monkeypatch):
    """Record HfApi's two network calls instead of making them (the only boundary faked here)."""
    calls = []
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: calls.append(("create_repo", repo_id, kw)) or f"https://huggingface.co/{repo_id}")
    monkeypatch.setattr(HfApi, "upload_folder", lambda self, **kw: calls.append(("upload_folder", kw["repo_id"], kw)))
    return calls


def test_nothing_leaves_the_machine_without_push_to_hub(env, tmp_path, hub_calls, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    publish(tmp_path / "local", run_dir=env.run)
    assert hub_calls == []


def test_push_to_hub_is_private_by_default(env, tmp_path, hub_calls, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    out = publish(tmp_path / "pushed", run_dir=env.run, push_to_hub="me/tiny-draft")
    (create, repo, kw), (upload, repo2, up) = hub_calls
    assert (create, repo, kw["private"], kw["exist_ok"]) == ("create_repo", "me/tiny-draft", True, True)
    assert (upload, repo2, up["folder_path"]) == ("upload_folder", "me/tiny-draft", str(out))
    assert '"model": "me/tiny-draft"' in (out / "README.md").read_text()
    hub_calls.clear()
    assert main([str(env.run), "--out", str(tmp_path / "public"), "--push-to-hub", "me/tiny-draft", "--public"]) == 0
    assert hub_calls[0][2]["private"] is False


def test_push_to_hub_without_a_token_fails_before_writing(env, tmp_path, hub_calls, monkeypatch):
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    with pytest.raises(ValueError, match="HF_TOKEN"):
        publish(tmp_path / "out", run_dir=env.run, push_to_hub="me/tiny-draft")
    assert hub_calls == [] and not (tmp_path / "out").exists()


def test_script_wrapper_publishes(env, tmp_path):
    out = tmp_path / "via-script"
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "publish.py"), str(env.run), "--out", str(out), "--pad-vocab-to-target"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith(str(out))
    assert AutoConfig.from_pretrained(out).vocab_size == AutoConfig.from_pretrained(env.target_dir).vocab_size


def test_pad_vocab_copy_keeps_the_models_greedy_output(tmp_path, tiny_pair):
    """`distill pad-vocab`: a target grown as Qwen2.5-7B is (more rows than its tokenizer's) decodes as the original,
    and its new rows' logits stay below the largest real logit at every position."""
    import torch

    from distill.commands.pad_vocab import main as pad_main
    from distill.common.models import load_model

    src = tmp_path / "target"
    tiny_pair.target.save_pretrained(src)
    tiny_pair.tokenizer.save_pretrained(src)
    rows = tiny_pair.target.config.vocab_size
    assert pad_main([str(src), str(tmp_path / "padded"), "--vocab-size", str(rows + 24)]) == 0
    padded = load_model(tmp_path / "padded", dtype="float32")
    assert padded.config.vocab_size == rows + 24 and padded.get_output_embeddings().weight.shape[0] == rows + 24
    ids = torch.tensor([tiny_pair.tokenizer("anna has 3 apples")["input_ids"]])
    mine = tiny_pair.target.generate(ids, max_new_tokens=12, do_sample=False)
    theirs = padded.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(mine, theirs)
    with torch.no_grad():
        logits = padded(theirs).logits[0]
    assert (logits[:, rows:].max(-1).values < logits[:, : len(tiny_pair.tokenizer)].max(-1).values).all()
    assert pad_main([str(src), str(tmp_path / "padded"), "--vocab-size", str(rows + 24)]) == 2  # exists: refused, kept
    assert pad_main([str(src), str(tmp_path / "same"), "--vocab-size", str(rows)]) == 2 and not (tmp_path / "same").exists()
