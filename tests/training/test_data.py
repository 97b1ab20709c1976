"""distill.training.data on small files written to tmp_path: adapters, masks, truncation, seq-KD cache, collator."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from distill.common.tiny import build_tokenizer
from distill.common.vocab import check_tokenizers_agree, tokenizer_fingerprint
from distill.training.data import (
    DataCollatorForDistill,
    build_eval_dataset,
    build_train_dataset,
    detect_adapter,
    generate_responses,
    load_examples,
    tokenize_example,
)
from distill.training.recipe import DataSpec

GSM8K_TRAIN = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "train.jsonl"


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def response_text(tokenizer, row: dict) -> str:
    """What the loss is taken on: the tokens whose label is not -100, decoded."""
    ids = [t for t, lab in zip(row["input_ids"], row["labels"]) if lab != -100]
    assert ids == [lab for lab in row["labels"] if lab != -100]  # labels are the input ids themselves there
    return tokenizer.decode(ids)


@pytest.fixture(scope="module")
def gsm8k_rows() -> list[dict]:
    if not GSM8K_TRAIN.exists():
        pytest.skip(f"the real GSM8K sample is not at {GSM8K_TRAIN}")
    with open(GSM8K_TRAIN) as f:
        return [json.loads(next(f)) for _ in range(4)]


# --------------------------------------------------------------------------- adapters


def test_gsm8k_real_lines_autodetected_and_masked(tmp_path, gsm8k_rows, tokenizer):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", gsm8k_rows)
    examples = load_examples(path)
    assert [e["messages"] for e in examples] == [[{"role": "user", "content": r["question"]}] for r in gsm8k_rows]
    assert [e["response"] for e in examples] == [r["answer"] for r in gsm8k_rows]
    assert examples[0]["response"].endswith("#### 72")
    row = tokenize_example(tokenizer, examples[0]["messages"], examples[0]["response"], 512, 1024)
    assert response_text(tokenizer, row) == gsm8k_rows[0]["answer"] + "<|im_end|>"


def test_mmlu_prompt_lists_lettered_options(tmp_path):
    rows = [
        {"question": "2 + 2 = ?", "choices": ["3", "5", "4", "22"], "answer": 2, "subject": "math"},
        {"question": "Sky colour?", "choices": ["blue", "green"], "answer": "A", "subject": "x"},
    ]
    examples = load_examples(write_jsonl(tmp_path / "mmlu.jsonl", rows))
    assert examples[0]["messages"][0]["content"] == ("2 + 2 = ?\n\nA. 3\nB. 5\nC. 4\nD. 22\n\nAnswer with the letter of the correct option.")
    assert examples[0]["response"] == "The answer is C."
    assert examples[1]["response"] == "The answer is A."
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "choices": ["a", "b"], "answer": 5}])
    with pytest.raises(ValueError, match="choice index or letter"):
        load_examples(bad, adapter="mmlu")


def test_cnndm_summarize_prompt(tmp_path):
    rows = [{"article": "The cat sat on the mat all day.", "highlights": "Cat sits.", "id": "1"}]
    (ex,) = load_examples(write_jsonl(tmp_path / "cnn.jsonl", rows))
    assert ex["messages"] == [{"role": "user", "content": "Summarize the following article.\n\nThe cat sat on the mat all day."}]
    assert ex["response"] == "Cat sits."


def test_messages_last_assistant_turn_is_the_response(tmp_path):
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "name a colour"},
        {"role": "assistant", "content": "red"},
    ]
    rows = [{"messages": chat, "prompt": "ignored"}, {"messages": chat[:4]}]
    first, second = load_examples(write_jsonl(tmp_path / "chat.jsonl", rows))
    assert first["messages"] == chat[:4] and first["response"] == "red"
    assert second["messages"] == chat[:4] and second["response"] is None  # a prompt only: the target must answer


def test_prompt_response_from_parquet_and_json(tmp_path, tokenizer):
    from datasets import Dataset

    rows = [{"prompt": "tell me about the cat .", "response": "the old cat sees the dog ."}, {"prompt": "p2", "response": "r2"}]
    Dataset.from_list(rows).to_parquet(str(tmp_path / "pr.parquet"))
    (tmp_path / "pr.json").write_text(json.dumps(rows))
    for name in ("pr.parquet", "pr.json"):
        examples = load_examples(str(tmp_path / name))
        assert examples[0] == {"messages": [{"role": "user", "content": rows[0]["prompt"]}], "response": rows[0]["response"]}
        assert len(examples) == 2


def test_auto_detection_order_and_error_lists_the_columns():
    assert detect_adapter(["messages", "prompt", "prompt_id"]) == "messages"
    assert detect_adapter(["question", "choices", "answer"]) == "mmlu"
    assert detect_adapter(["question", "answer"]) == "gsm8k"
    assert detect_adapter(["article", "highlights", "id"]) == "cnndm"
    assert detect_adapter(["prompt"]) == "prompt_response"
    with pytest.raises(ValueError) as info:
        detect_adapter(["text", "label"])
    msg = str(info.value)
    assert "['text', 'label']" in msg and "data.adapter" in msg and "gsm8k: question, answer" in msg


def test_load_errors_are_specific(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"text": "a", "label": 1}])
    with pytest.raises(ValueError, match=r"columns \['text', 'label'\]"):
        load_examples(path)
    with pytest.raises(ValueError, match=r"adapter 'gsm8k' needs columns \['question', 'answer'\]"):
        load_examples(path, adapter="gsm8k")
    with pytest.raises(ValueError, match="unknown adapter 'gsm'"):
        load_examples(path, adapter="gsm")
    with pytest.raises(ValueError, match="single split, 'train'"):
        load_examples(path, split="test")
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_examples(str(tmp_path / "missing.jsonl"))


def test_num_samples_is_a_seeded_random_subset(tmp_path):
    path = write_jsonl(tmp_path / "n.jsonl", [{"prompt": f"p{i}", "response": f"r{i}"} for i in range(20)])
    a = load_examples(path, num_samples=5, seed=1)
    assert len(a) == 5 and a == load_examples(path, num_samples=5, seed=1)
    assert a != load_examples(path, num_samples=5, seed=2)
    assert len(load_examples(path, num_samples=50)) == 20


# --------------------------------------------------------------------------- tokenization


def test_masks_cover_exactly_the_response(tokenizer):
    messages = [{"role": "user", "content": "anna has 3 apples and gets 4 more . how many apples does anna have ?"}]
    response = "anna has 3 + 4 = 7 apples . #### 7"
    row = tokenize_example(tokenizer, messages, response, 512, 1024)
    n_prompt = row["labels"].count(-100)
    assert row["labels"][:n_prompt] == [-100] * n_prompt and -100 not in row["labels"][n_prompt:]
    assert tokenizer.decode(row["input_ids"][:n_prompt]) == tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert response_text(tokenizer, row) == response + "<|im_end|>"
    assert row["input_ids"][-1] == tokenizer.eos_token_id
    assert row["attention_mask"] == [1] * len(row["input_ids"])


def test_truncation_keeps_the_prompt_end_and_caps_the_length(tokenizer):
    messages = [{"role": "user", "content": "tell me about the fox . " * 10}]
    response = "the red fox chases the hen by the river . " * 5
    full = tokenize_example(tokenizer, messages, response, 512, 1024)
    n_prompt = full["labels"].count(-100)
    assert n_prompt > 20 and len(full["input_ids"]) - n_prompt > 12
    cut = tokenize_example(tokenizer, messages, response, 20, 32)
    assert len(cut["input_ids"]) == 32 and cut["labels"].count(-100) == 20
    assert cut["input_ids"][:20] == full["input_ids"][n_prompt - 20 : n_prompt]  # prompt cut from the left
    assert cut["input_ids"][20:] == full["input_ids"][n_prompt : n_prompt + 12]  # response cut from the right
    with pytest.raises(ValueError, match="max_prompt_length"):
        tokenize_example(tokenizer, messages, response, 32, 32)
    with pytest.raises(ValueError, match="no response"):
        tokenize_example(tokenizer, messages, None, 20, 32)


def test_collator_right_pads(tokenizer):
    features = [
        {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "labels": [-100, 6, 7]},
        {"input_ids": [8, 9, 10, 11, 12], "attention_mask": [1] * 5, "labels": [-100, -100, 10, 11, 12]},
    ]
    batch = DataCollatorForDistill(tokenizer)(features)
    pad = tokenizer.pad_token_id
    assert batch["input_ids"].tolist() == [[5, 6, 7, pad, pad], [8, 9, 10, 11, 12]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1] * 5]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, -100], [-100, -100, 10, 11, 12]]
    assert batch["input_ids"].dtype == torch.long


# --------------------------------------------------------------------------- tokenizers


def test_tokenizer_fingerprint_and_agreement(tmp_path, tokenizer):
    tokenizer.save_pretrained(tmp_path / "tok")
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert tokenizer_fingerprint(reloaded) == tokenizer_fingerprint(tokenizer)
    check_tokenizers_agree(tokenizer, reloaded)
    other = build_tokenizer(["completely different words here", "zebra quartz"] * 20, vocab_size=300)
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(tokenizer)
    with pytest.raises(ValueError) as info:
        check_tokenizers_agree(tokenizer, other)
    msg = str(info.value)
    assert "tokens only in the target's" in msg and "tokens only in the draft's" in msg


# --------------------------------------------------------------------------- sequence-level KD


@pytest.fixture(scope="module")
def saved_target(tmp_path_factory, tokenizer):
    """A tiny target (embedding padded past the tokenizer) as a user has it: saved, then loaded with
    from_pretrained. Untied head and a wide init, so its greedy answers differ from prompt to prompt
    (a tied random init only repeats its last input token)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer) + 32,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        initializer_range=0.3,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("target")
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def prompts(examples, n: int) -> list[dict]:
    out = [{"messages": [{"role": "user", "content": e["prompt"]}], "response": None} for e in examples[:n]]
    return out + [out[0]]  # a repeated prompt is generated once


def count_generate(monkeypatch, model, fail_after: int | None = None) -> list[int]:
    """Wrap the real `generate`, recording each call's batch size (and failing later, like a killed job)."""
    calls: list[int] = []
    real = functools.partial(type(model).generate, model)  # the model's own method, never an earlier wrapper

    def counting(*args, **kwargs):
        if fail_after is not None and len(calls) >= fail_after:
            raise RuntimeError("killed")
        calls.append(kwargs["input_ids"].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "generate", counting)
    return calls


def test_seq_kd_cache_round_trip_is_greedy_and_resumes(tmp_path, saved_target, examples, monkeypatch):
    model, tok = saved_target
    exs = prompts(examples, 6)
    cache = tmp_path / "gen" / "generations.jsonl"
    calls = count_generate(monkeypatch, model)
    out = generate_responses(model, tok, exs, max_new_tokens=8, cache_path=cache, batch_size=4)
    assert calls == [4, 2]  # 6 unique prompts, batches of 4
    assert [o["messages"] for o in out] == [e["messages"] for e in exs]
    assert out[-1]["response"] == out[0]["response"]
    assert len({o["response"] for o in out}) == 6  # answers depend on the prompt

    # each cached response is the target's own greedy continuation of that prompt alone
    for ex, got in zip(exs[:3], out[:3]):
        ids = tok.apply_chat_template(ex["messages"], add_generation_prompt=True, return_tensors="pt", return_dict=True)
        seq = model.generate(**ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
        assert got["response"] == tok.decode(seq[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)

    lines = cache.read_text().splitlines()
    assert len(lines) == 6 and not Path(f"{cache}.partial").exists()
    manifest = json.loads(Path(f"{cache}.manifest.json").read_text())
    assert manifest["model"] == model.config._name_or_path and manifest["tokenizer"] == tokenizer_fingerprint(tok)
    assert manifest["generation"]["max_new_tokens"] == 8 and manifest["generation"]["do_sample"] is False

    calls.clear()
    again = generate_responses(model, tok, exs, max_new_tokens=8, cache_path=cache, batch_size=4)
    assert calls == [] and again == out  # nothing generated twice
    assert load_examples(str(cache), adapter="messages") == [
        {"messages": e["messages"], "response": o["response"]} for e, o in zip(exs[:6], out[:6])
    ]  # the cache is itself a chat dataset


def test_seq_kd_killed_run_resumes_where_it_stopped(tmp_path, saved_target, examples, monkeypatch):
    model, tok = saved_target
    exs = prompts(examples, 6)
    cache = tmp_path / "generations.jsonl"
    count_generate(monkeypatch, model, fail_after=1)
    with pytest.raises(RuntimeError, match="killed"):
        generate_responses(model, tok, exs, max_new_tokens=8, cache_path=cache, batch_size=4)
    partial = Path(f"{cache}.partial")
    assert not cache.exists() and len(partial.read_text().splitlines()) == 4
    with open(partial, "a") as f:
        f.write('{"key": "half a li')  # killed in the middle of a write
    calls = count_generate(monkeypatch, model)
    resumed = generate_responses(model, tok, exs, max_new_tokens=8, cache_path=cache, batch_size=4)
    assert calls == [2]  # only the prompts the killed run had not finished
    assert len(cache.read_text().splitlines()) == 6 and not partial.exists()
    fresh = generate_responses(model, tok, exs, max_new_tokens=8, cache_path=tmp_path / "fresh.jsonl", batch_size=4)
    assert resumed == fresh


def test_seq_kd_manifest_mismatch_is_an_error(tmp_path, saved_target, examples, tokenizer):
    model, tok = saved_target
    exs = prompts(examples, 2)
    cache = tmp_path / "generations.jsonl"
    generate_responses(model, tok, exs, max_new_tokens=4, cache_path=cache)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_responses(model, tok, exs, max_new_tokens=8, cache_path=cache)
    with pytest.raises(ValueError, match="do_sample"):
        generate_responses(model, tok, exs, max_new_tokens=4, cache_path=cache, do_sample=True)
    other = build_tokenizer(["other words entirely"] * 10, vocab_size=300)
    other.pad_token = "<|endoftext|>"
    with pytest.raises(ValueError, match="tokenizer"):
        generate_responses(model, other, exs, max_new_tokens=4, cache_path=cache)
    Path(f"{cache}.manifest.json").unlink()
    with pytest.raises(ValueError, match="has no manifest"):
        generate_responses(model, tok, exs, max_new_tokens=4, cache_path=cache)


# --------------------------------------------------------------------------- datasets


def test_build_train_dataset_from_the_dataset_responses(tmp_path, tokenizer, examples):
    path = write_jsonl(tmp_path / "train.jsonl", examples[:10])
    ds = build_train_dataset(DataSpec(dataset=path, max_prompt_length=64, max_length=96), tokenizer)
    assert len(ds) == 10 and set(ds.column_names) == {"input_ids", "attention_mask", "labels"}
    assert response_text(tokenizer, ds[3]) == examples[3]["response"] + "<|im_end|>"
    batch = DataCollatorForDistill(tokenizer)([ds[i] for i in range(4)])
    assert batch["input_ids"].shape == batch["labels"].shape == (4, max(len(ds[i]["input_ids"]) for i in range(4)))


def test_build_train_dataset_needs_responses_or_the_target(tmp_path, tokenizer, saved_target, examples):
    path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": e["prompt"]} for e in examples[:5]])
    with pytest.raises(ValueError, match="5 of 5 examples have no response"):
        build_train_dataset(DataSpec(dataset=path), tokenizer)
    spec = DataSpec(
        dataset=path,
        response_source="target",
        generation_cache=str(tmp_path / "gen.jsonl"),
        generation_max_new_tokens=6,
        max_prompt_length=64,
        max_length=96,
    )
    with pytest.raises(ValueError, match="generation cache .* is not finished: run `distill cache-teacher RECIPE` first"):
        build_train_dataset(spec, tokenizer)
    model, tok = saved_target
    ds = build_train_dataset(spec, tok, target=model)
    generated = load_examples(str(tmp_path / "gen.jsonl"), adapter="messages")
    by_prompt = {g["messages"][0]["content"]: g["response"] for g in generated}
    assert len(ds) == 5
    # The response is the target's own tokens, as generated: cut at 6 tokens, so no EOS is appended after them.
    records = {json.loads(line)["messages"][0]["content"]: json.loads(line) for line in (tmp_path / "gen.jsonl").read_text().splitlines()}
    first = records[examples[0]["prompt"]]["response_ids"]
    assert [t for t in ds[0]["labels"] if t != -100] == first and len(first) <= 6
    assert response_text(tok, ds[0]) == by_prompt[examples[0]["prompt"]] + ("<|im_end|>" if first[-1] == tok.eos_token_id else "")


def test_build_eval_dataset_from_a_local_file(tmp_path, tokenizer, examples):
    train = write_jsonl(tmp_path / "train.jsonl", examples[:10])
    held_out = write_jsonl(tmp_path / "eval.jsonl", examples[10:40])
    spec = DataSpec(dataset=train, eval_split=held_out, eval_samples=8, max_prompt_length=64, max_length=256)
    ds = build_eval_dataset(spec, tokenizer)
    assert len(ds) == 8
    texts = {e["response"] + "<|im_end|>" for e in examples[10:40]}
    assert all(response_text(tokenizer, row) in texts for row in ds)
    assert build_eval_dataset(DataSpec(dataset=train), tokenizer) is None
