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
from distill.training.recipe import DataSource, DataSpec

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


# --------------------------------------------------------------------------- sources, templates, splits, data-file errors

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"the shared data folder is not at {SHARED}")
REPO = Path(__file__).resolve().parents[2]


def test_draws_are_the_rows_datasets_shuffle_draws(tmp_path):
    """Local files are read row by row now; the rows a seed draws stay those of `Dataset.shuffle` (the
    prompts, and so the generation caches, of recipes trained before)."""
    from datasets import Dataset

    rows = [{"prompt": f"p{i}", "response": f"r{i}"} for i in range(40)]
    path = write_jsonl(tmp_path / "n.jsonl", rows)
    for seed, n in ((0, 7), (3, 39)):
        want = Dataset.from_list(rows).shuffle(seed=seed).select(range(n))
        assert [e["messages"][0]["content"] for e in load_examples(path, num_samples=n, seed=seed)] == [r["prompt"] for r in want]


@pytest.mark.parametrize(
    ("adapter", "rows", "line", "problem"),
    [
        ("gsm8k", [{"question": "q", "answer": "a"}, "{broken"], 2, r"not JSON"),
        (
            "mmlu",
            [{"question": "q", "choices": ["a", "b"], "answer": 1}, {"question": "q", "choices": ["a", "b"], "answer": 2}],
            2,
            r"mmlu answer must be a choice index or letter, got 2 for 2 choices \(out of range\)",
        ),
        ("mmlu", [{"question": "q", "choices": "ab", "answer": 0}], 1, r"mmlu 'choices' must be a list of texts"),
        ("cnndm", [{"article": "a", "highlights": "h"}, {"article": 3, "highlights": "h"}], 2, r"'article' is a int, not text"),
        ("prompt_response", [{"prompt": "p"}, {"prompt": "p", "response": ["r"]}], 2, r"'response' is a list, not text"),
    ],
)
def test_a_bad_training_row_names_its_file_and_line(tmp_path, adapter, rows, line, problem):
    from distill.common.io import DataFileError

    path = tmp_path / "rows.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    with pytest.raises(DataFileError, match=rf"^{path}:{line}: {problem}"):
        load_examples(str(path), adapter, num_samples=1)  # every row of a file is checked, drawn or not


def test_distill_train_reports_a_bad_data_line_in_one_line_and_exit_2(tiny_run, capsys):
    from distill.cli import main

    run = tiny_run("bad-line", train_rows=4, eval_rows=2, training={"max_steps": 1})
    lines = (run / "train.jsonl").read_text().splitlines()
    lines[2] = json.dumps({"prompt": "x", "response": 3})
    (run / "train.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["train", str(run.write_recipe("bad"))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err) and err[-1] == f"distill train: error: {run / 'train.jsonl'}:3: 'response' is a int, not text"


def _task_rows(tmp_path) -> dict[str, str]:
    return {
        "gsm8k": write_jsonl(tmp_path / "g.jsonl", [{"question": f"g{i} ?", "answer": f"#### {i}"} for i in range(20)]),
        "mmlu": write_jsonl(
            tmp_path / "m.jsonl",
            [{"question": f"m{i} ?", "subject": "high_school_physics", "choices": ["w", "x", "y", "z"], "answer": i % 4} for i in range(10)],
        ),
        "cnndm": write_jsonl(tmp_path / "c.jsonl", [{"article": f"story {i} " + "word " * 30, "highlights": f"h{i}", "id": f"id{i}"} for i in range(250)]),
    }


def test_sources_mix_by_share_with_templates_in_turn(tmp_path):
    from distill.training.data import _recipe_examples, source_counts

    files = _task_rows(tmp_path)
    spec = DataSpec(
        num_samples=10,
        sources=[
            DataSource(dataset=files["gsm8k"], adapter="gsm8k", share=2, templates=["gsm8k", "gsm8k-brief"]),
            DataSource(dataset=files["mmlu"], adapter="mmlu", share=1, templates=["mmlu-brief"]),
            DataSource(dataset=files["cnndm"], adapter="cnndm_train", share=1, templates=["cnndm"], max_article_words=4),
        ],
    )
    assert source_counts(spec) == [5, 3, 2] and sum(source_counts(DataSpec(num_samples=7, sources=spec.sources))) == 7
    examples = _recipe_examples(spec, 0, "train")
    texts = [e["messages"][0]["content"] for e in examples]
    assert len(examples) == 10 and all(len(e["messages"]) == 1 for e in examples)
    assert [t.startswith("Solve the following math problem.") for t in texts[:5]] == [True, False, True, False, True]  # gsm8k, gsm8k-brief in turn
    assert texts[1].startswith("Answer this word problem.") and [e["response"] for e in examples[:1]] == [examples[0]["response"]]
    assert texts[5] == "A question on high school physics. Reply with the letter of the correct option only.\n\n" + texts[5].split("\n\n", 1)[1]
    assert texts[5].endswith("\nA. w\nB. x\nC. y\nD. z\nAnswer:")  # the MMLU text as `distill accept` asks it
    for text in texts[8:]:
        assert text.startswith("Summarize the following news article in three sentences.\n\nstory ") and len(text.split("\n\n")[1].split()) == 4
        assert int(text.split("\n\n")[1].split()[1]) >= 200  # cnndm_train: the training rows only


def test_a_task_template_asks_training_prompts_exactly_as_the_evaluation_asks(tmp_path):
    """Under a task's template a training row becomes the prompt `distill accept` asks for that row."""
    from distill.eval.tasks import get_task

    files = _task_rows(tmp_path)
    for task, adapter, template in (
        ("gsm8k", "gsm8k", "gsm8k-plain"),
        ("mmlu", "mmlu", "mmlu"),
        ("mmlu", "mmlu", "mmlu-exam"),
        ("cnndm", "cnndm", "cnndm-tldr"),
    ):
        trained = load_examples(files[task], adapter, prompt_template=template, max_article_words=5)
        asked = get_task(task).load(data_file=files[task], num_samples=None, template=template, **({"max_article_words": 5} if task == "cnndm" else {}))
        assert [e["messages"] for e in trained[: len(asked)]] == [e.messages for e in asked], (task, template)


def test_exclude_drops_the_evaluations_prompts_and_cnndm_train_needs_its_rows(tmp_path):
    files = _task_rows(tmp_path)
    evaluated = write_jsonl(tmp_path / "test.jsonl", [{"question": f"g{i}  ?", "answer": "#### 1"} for i in range(0, 20, 2)])
    kept = load_examples(files["gsm8k"], "gsm8k", exclude=[evaluated])
    assert [e["messages"][0]["content"] for e in kept] == [f"g{i} ?" for i in range(1, 20, 2)]  # whitespace does not hide a repeat
    short = write_jsonl(tmp_path / "short.jsonl", [{"article": "a", "highlights": "h", "id": "x"}] * 10)
    with pytest.raises(ValueError, match="has 10 rows; cnndm_train reads rows 200-573"):
        load_examples(short, "cnndm_train")
    assert len(load_examples(files["cnndm"], "cnndm_train")) == 50


def test_a_template_rewrites_a_chat_rows_last_user_turn_and_subject_needs_a_subject(tmp_path):
    from distill.common.io import DataFileError

    path = write_jsonl(tmp_path / "pr.jsonl", [{"prompt": "hello", "response": "hi"}])
    assert load_examples(path, prompt_templates=["Say: {question}"])[0]["messages"] == [{"role": "user", "content": "Say: hello"}]
    nosubject = write_jsonl(tmp_path / "m.jsonl", [{"question": "q", "choices": ["a", "b", "c", "d"], "answer": 0}])
    with pytest.raises(DataFileError, match=r"m.jsonl:1: template 'mmlu' asks for \{subject\}"):
        load_examples(nosubject, "mmlu", prompt_template="mmlu")


@needs_shared
def test_cnndm_evaluation_and_training_rows_are_disjoint_on_the_real_file():
    from distill.common.splits import CNNDM_EVAL_ROWS, CNNDM_ROWS, CNNDM_TRAIN_ROWS
    from distill.eval.tasks import cnndm

    path = SHARED / "cnndm" / "test.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == CNNDM_ROWS and set(CNNDM_EVAL_ROWS) | set(CNNDM_TRAIN_ROWS) == set(range(CNNDM_ROWS))
    by_highlights = {r["highlights"]: r["id"] for r in rows}
    evaluated = {e.id.removeprefix("cnndm-") for e in cnndm.load(data_file=path, num_samples=None)}
    trained = {by_highlights[e["response"]] for e in load_examples(str(path), "cnndm_train")}
    assert len(evaluated) == 200 and len(trained) == 374 and not evaluated & trained
    assert evaluated == {rows[i]["id"] for i in CNNDM_EVAL_ROWS} and trained == {rows[i]["id"] for i in CNNDM_TRAIN_ROWS}


@needs_shared
def test_the_mix_recipe_never_trains_on_an_evaluated_prompt_and_its_prompts_fit():
    from transformers import AutoTokenizer

    from distill.eval.tasks import cnndm, gsm8k, mmlu
    from distill.training.data import _recipe_examples, source_counts
    from distill.training.recipe import load_recipe

    recipe = load_recipe(REPO / "recipes" / "qwen2.5-coder-0.5b-from-1.5b-mix-cpu.yaml")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        examples = _recipe_examples(recipe.data, recipe.seed, "train")
    counts = source_counts(recipe.data)
    assert counts == [128, 64, 64] and len(examples) == 256
    asked = {" ".join(e["messages"][0]["content"].split()) for e in examples}
    for task, path in ((gsm8k, "gsm8k/test.jsonl"), (mmlu, "mmlu/test.jsonl"), (cnndm, "cnndm/test.jsonl")):
        for template in ("gsm8k", "mmlu", "cnndm"):
            if template == task.TASK.name:
                evaluated = {" ".join(e.messages[0]["content"].split()) for e in task.load(data_file=SHARED / path, num_samples=None, template=template)}
                assert not asked & evaluated, task.TASK.name
    tok = AutoTokenizer.from_pretrained(SHARED / "qwen2.5-tokenizer")
    lengths = [len(tok.apply_chat_template(e["messages"], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]) for e in examples]
    assert max(lengths) <= recipe.data.max_prompt_length  # a truncated article fits whole
