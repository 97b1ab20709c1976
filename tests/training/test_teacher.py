"""The teacher signal: response masks, top-k on the real vocabulary, the frozen online teacher, and
the offline cache (round trip, manifest checks, resume, and the same sparse loss as online)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from distill.common.tiny import build_tokenizer
from distill.common.vocab import tokenizer_fingerprint
from distill.training.data import DataCollatorForDistill, build_eval_dataset, build_train_dataset
from distill.training.recipe import load_recipe
from distill.training.teacher import (
    SHARD_PATTERN,
    CachedTeacherCollator,
    CacheMismatchError,
    TeacherCache,
    cache_dirs,
    cache_identity,
    finish_cache,
    main,
    prepare_teacher,
    response_mask,
    topk_logprobs,
    write_cache,
)

TOP_K = 8


@pytest.fixture(scope="module")
def tiny_dir(tiny_run):
    """A saved target (embedding padded +32 past the tokenizer), 10 training and 6 eval examples, and
    recipes that cache the teacher's top-k in <folder>/cache."""
    run = tiny_run(
        "teacher",
        train_rows=10,
        eval_rows=6,
        draft_vocab_pad=8,
        training={"max_steps": 2, "per_device_train_batch_size": 4, "logging_steps": 1, "report_to": ["none"]},
    )
    run.sections["teacher"] = {"mode": "cache", "cache_dir": str(run / "cache"), "top_k": TOP_K, "batch_size": 3}
    return run


@pytest.fixture(scope="module")
def saved_tokenizer(tiny_dir):
    """The target's tokenizer as every run loads it (from the saved target directory)."""
    return AutoTokenizer.from_pretrained(tiny_dir / "target")


def test_response_mask_marks_positions_predicting_response_tokens():
    labels = torch.tensor([[-100, -100, 5, 6, -100], [-100, 7, 8, 9, 10]])
    assert response_mask(labels).tolist() == [[False, True, True, False, False], [True, True, True, True, False]]


def test_topk_skips_padding_rows_and_normalises_over_real_vocab():
    logits = torch.tensor([[[0.0, 1.0, 2.0, 50.0, 60.0]]])  # rows 3, 4 are embedding padding
    ids, logps = topk_logprobs(logits, 2, vocab_size=3)
    assert ids.tolist() == [[[2, 1]]]
    expected = torch.log_softmax(torch.tensor([0.0, 1.0, 2.0]), -1)[[2, 1]]
    torch.testing.assert_close(logps[0, 0], expected)
    with pytest.raises(ValueError, match="top_k"):
        topk_logprobs(logits, 4, vocab_size=3)


def test_online_teacher_is_frozen_in_eval_mode(target):
    from accelerate import Accelerator

    teacher = prepare_teacher(copy.deepcopy(target).train(), Accelerator(cpu=True))
    assert not teacher.training
    assert not any(p.requires_grad for p in teacher.parameters())


def test_cache_round_trip_manifest_and_resume(tiny_dir, saved_tokenizer, target):
    tokenizer = saved_tokenizer
    recipe_path = tiny_dir / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(tiny_dir.recipe()))
    assert main([str(recipe_path), "--shard-size", "4"]) == 0
    where = cache_dirs(tiny_dir / "cache")
    cache = TeacherCache(where["train"])
    manifest = cache.manifest
    assert manifest["complete"] and manifest["num_examples"] == 10 and manifest["num_shards"] == 3
    assert manifest["top_k"] == TOP_K and manifest["dtype"] == "float32" and manifest["vocab_size"] == len(tokenizer)
    assert manifest["tokenizer_fingerprint"] == tokenizer_fingerprint(tokenizer)
    assert manifest["target"] == str(tiny_dir / "target") and manifest["recipe"]["teacher"]["top_k"] == TOP_K
    assert {"torch", "transformers", "distill"} <= manifest["versions"].keys()
    assert TeacherCache(where["eval"]).manifest["num_examples"] == 6

    # Each example's rows are the target's top-k on its response positions, ids on the real vocabulary.
    recipe = load_recipe(tiny_dir.recipe())
    dataset = build_train_dataset(recipe.data, tokenizer)
    row = dataset[5]
    with torch.no_grad():
        logits = target(input_ids=torch.tensor([row["input_ids"]])).logits
    ids, logps = topk_logprobs(logits, TOP_K, len(tokenizer))
    positions = response_mask(torch.tensor([row["labels"]]))[0].nonzero().squeeze(-1)
    pos, cached_ids, cached_logps = cache.example(5)
    assert pos.tolist() == positions.tolist() and len(pos) > 0
    assert torch.equal(cached_ids, ids[0, positions])
    torch.testing.assert_close(cached_logps, logps[0, positions], atol=1e-5, rtol=1e-5)
    assert int(cached_ids.max()) < len(tokenizer) < target.config.vocab_size

    # A lost shard makes the cache unreadable until a rerun fills exactly that shard.
    before = {s: (where["train"] / SHARD_PATTERN.format(s)).stat().st_mtime_ns for s in (0, 2)}
    (where["train"] / SHARD_PATTERN.format(1)).unlink()
    with pytest.raises(CacheMismatchError, match="incomplete"):
        TeacherCache(where["train"])
    assert main([str(recipe_path), "--shard-size", "4"]) == 0
    assert {s: (where["train"] / SHARD_PATTERN.format(s)).stat().st_mtime_ns for s in (0, 2)} == before
    again = TeacherCache(where["train"]).example(5)
    assert all(torch.equal(a, b) for a, b in zip(again, (pos, cached_ids, cached_logps)))

    # A cache for other data, another tokenizer or fewer entries per position is refused.
    identity = cache_identity(str(tiny_dir / "target"), None, tokenizer, dataset)
    cache.check(identity, TOP_K)
    with pytest.raises(CacheMismatchError, match="top_k"):
        cache.check(identity, TOP_K + 1)
    with pytest.raises(CacheMismatchError, match="dataset_fingerprint"):
        cache.check(cache_identity(str(tiny_dir / "target"), None, tokenizer, dataset.select(range(9))))
    other = build_tokenizer(["a completely different corpus", "of words"], vocab_size=300)
    with pytest.raises(CacheMismatchError, match="tokenizer_fingerprint"):
        cache.check({**identity, "tokenizer_fingerprint": tokenizer_fingerprint(other)})
    with pytest.raises(CacheMismatchError, match="different teacher cache"):
        write_cache(target, dataset, where["train"], identity, top_k=TOP_K + 1, pad_token_id=tokenizer.pad_token_id, shard_size=4)


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("float16", 2e-3)])
def test_cached_sparse_loss_equals_online_sparse_loss(tiny_dir, saved_tokenizer, target, dtype, tol):
    tokenizer = saved_tokenizer
    from distill.training.train import build_trainer

    cache_dir = tiny_dir / f"cache-{dtype}"
    online = load_recipe(tiny_dir.recipe(teacher={"mode": "online"}, loss={"top_k": TOP_K}))
    cached = load_recipe(tiny_dir.recipe(teacher={"cache_dir": str(cache_dir)}, loss={"top_k": TOP_K}))
    dataset = build_train_dataset(online.data, tokenizer)
    identity = cache_identity(online.target.name_or_path, None, tokenizer, dataset)
    write_cache(
        target, dataset, cache_dirs(cache_dir)["train"], identity, top_k=TOP_K, pad_token_id=tokenizer.pad_token_id, batch_size=3, shard_size=4, dtype=dtype
    )
    finish_cache(cache_dirs(cache_dir)["train"])
    eval_ds = build_eval_dataset(online.data, tokenizer)
    write_cache(
        target,
        eval_ds,
        cache_dirs(cache_dir)["eval"],
        cache_identity(online.target.name_or_path, None, tokenizer, eval_ds),
        top_k=TOP_K,
        pad_token_id=tokenizer.pad_token_id,
        dtype=dtype,
    )
    finish_cache(cache_dirs(cache_dir)["eval"])

    t_online, t_cached = build_trainer(online), build_trainer(cached)
    features = [dict(dataset[i], example_index=i) for i in (0, 3, 7, 9)]
    batch_online = DataCollatorForDistill(tokenizer)([{k: v for k, v in f.items() if k != "example_index"} for f in features])
    batch_cached = CachedTeacherCollator(DataCollatorForDistill(tokenizer), TeacherCache(cache_dirs(cache_dir)["train"]))(features)
    assert torch.equal(batch_cached["input_ids"], batch_online["input_ids"])
    with torch.no_grad():
        loss_online = t_online.compute_loss(t_online.model, batch_online)
        loss_cached = t_cached.compute_loss(t_cached.model, batch_cached)
    assert loss_online.item() > 0
    torch.testing.assert_close(loss_cached, loss_online, atol=tol, rtol=tol)


def test_seq_kd_recipe_trains_from_the_cache_without_the_target(tiny_dir, saved_tokenizer, tmp_path):
    """The full recipe's two steps: `distill cache-teacher` generates the target's responses and caches
    its top-k; training (teacher.mode: cache) then reads both without loading the target."""
    from distill.training.train import build_trainer

    tokenizer = saved_tokenizer
    gens = tmp_path / "generations.jsonl"
    d = tiny_dir.recipe(
        teacher={"cache_dir": str(tmp_path / "cache")}, data={"response_source": "target", "generation_cache": str(gens), "generation_max_new_tokens": 6}
    )
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(d))
    with pytest.raises(ValueError, match=r"not finished: run `distill cache-teacher RECIPE` first"):
        build_trainer(load_recipe(d))

    assert main([str(recipe_path)]) == 0
    records = [json.loads(line) for line in gens.read_text().splitlines()]
    assert len(records) == len({r["key"] for r in records}) == 15  # 10 train + 6 eval prompts, one repeated
    trainer = build_trainer(load_recipe(d))
    loaded = AutoModelForCausalLM.from_pretrained(tiny_dir / "target").eval()
    online = build_train_dataset(load_recipe(d).data, tokenizer, target=loaded)  # the same cache, read with the target loaded
    assert trainer.train_dataset["input_ids"] == online["input_ids"] and trainer.train_dataset["labels"] == online["labels"]
    assert trainer.train().training_loss > 0

    longer = {**d, "data": {**d["data"], "generation_max_new_tokens": 7}}
    with pytest.raises(ValueError, match=r"made with other settings .*max_new_tokens.*distill cache-teacher"):
        build_trainer(load_recipe(longer))
    gens.write_text("".join(json.dumps(r) + "\n" for r in records[1:]))  # one prompt's generation lost
    with pytest.raises(ValueError, match=r"lacks 1 of (10|6) prompts"):
        build_trainer(load_recipe(d))


def test_distill_train_builds_a_missing_seq_kd_cache_then_trains_in_one_command(tiny_dir, saved_tokenizer, tmp_path):
    """`distill train RECIPE` with teacher.mode cache and no cache yet generates the target's responses,
    keeps their top-k (no second pass), finishes the cache and trains from it, as the two commands do."""
    from distill.training.train import main as train_main

    gens = tmp_path / "generations.jsonl"
    d = tiny_dir.recipe(
        teacher={"cache_dir": str(tmp_path / "cache")},
        data={"response_source": "target", "generation_cache": str(gens), "generation_max_new_tokens": 6},
    )
    d["output_dir"] = str(tmp_path / "run")
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(d))
    assert train_main([str(recipe_path)]) == 0
    records = [json.loads(line) for line in gens.read_text().splitlines()]
    assert len(records) == 15 and all(r["response_ids"] for r in records)
    for split, rows in (("train", 10), ("eval", 6)):
        assert TeacherCache(cache_dirs(tmp_path / "cache")[split]).manifest["num_examples"] == rows
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert info["global_step"] == 2 and (tmp_path / "run" / "draft" / "config.json").is_file()

    two = tmp_path / "two"  # the same recipe as two commands: the same generations
    d2 = {
        **d,
        "output_dir": str(two / "run"),
        "teacher": {**d["teacher"], "cache_dir": str(two / "cache")},
        "data": {**d["data"], "generation_cache": str(two / "g.jsonl")},
    }
    two.mkdir()
    (two / "recipe.yaml").write_text(yaml.safe_dump(d2))
    assert main([str(two / "recipe.yaml")]) == 0
    assert [json.loads(line) for line in (two / "g.jsonl").read_text().splitlines()] == records


def test_two_processes_share_the_seq_kd_generation_and_write_the_single_process_cache(tiny_dir, saved_tokenizer, tmp_path):
    """`distill cache-teacher` in 2 CPU processes (torchrun, gloo): each process answers
    its share of the prompts (no process waits on one doing them all), and the merged generation cache
    and teacher cache equal a single-process run's (the teacher rows up to the float noise of other batches)."""
    import os
    import socket
    import subprocess
    import sys

    REPO = Path(__file__).resolve().parents[2]

    runs = {}
    for procs in (1, 2):
        root = tmp_path / f"p{procs}"
        d = tiny_dir.recipe(
            teacher={"cache_dir": str(root / "cache")},
            data={"response_source": "target", "generation_cache": str(root / "gens.jsonl"), "generation_max_new_tokens": 6},
        )
        (root).mkdir()
        (root / "recipe.yaml").write_text(yaml.safe_dump(d))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(procs),
            "--master_port",
            str(port),
            "-m",
            "distill.cli",
            "cache-teacher",
            str(root / "recipe.yaml"),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "ACCELERATE_USE_CPU": "true"}
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
        assert run.returncode == 0, run.stderr[-3000:]
        runs[procs] = (root, run.stderr)
    root1, root2 = runs[1][0], runs[2][0]
    shares = [int(m) for m in __import__("re").findall(r"seq-KD generation, process \d of 2: 100%\|[^|]*\| (\d+)/\d+", runs[2][1])]
    assert len(shares) == 2 and all(shares) and sum(shares) == 15, shares  # 15 distinct prompts, split between the two
    assert not list(root2.glob("gens.jsonl.partial*"))
    by_key = lambda p: {json.loads(line)["key"]: json.loads(line) for line in p.read_text().splitlines()}  # noqa: E731
    assert by_key(root2 / "gens.jsonl") == by_key(root1 / "gens.jsonl")
    for split in ("train", "eval"):
        one, two = TeacherCache(root1 / "cache" / split), TeacherCache(root2 / "cache" / split)
        assert one.manifest["num_examples"] == two.manifest["num_examples"]
        for i in range(one.manifest["num_examples"]):  # the rows kept while generating: batches differ, so float noise only
            (pos1, ids1, lp1), (pos2, ids2, lp2) = one.example(i), two.example(i)
            assert torch.equal(pos1, pos2) and torch.equal(ids1[:, 0], ids2[:, 0])
            torch.testing.assert_close(lp1, lp2, atol=1e-5, rtol=0)


def test_under_zero3_seq_kd_reads_a_finished_generation_cache_or_says_to_make_one(tiny_dir, saved_tokenizer, tmp_path, monkeypatch):
    """ZeRO-3 partitions the online target, which then cannot generate: training reads the responses
    from a finished generation cache, or stops saying how to write one first."""
    import distill.training.train as train_module
    from distill.training.data import generate_responses, load_examples

    d = tiny_dir.recipe(
        teacher={"mode": "online"}, data={"response_source": "target", "generation_cache": str(tmp_path / "gens.jsonl"), "generation_max_new_tokens": 6}
    )
    monkeypatch.setattr(train_module, "_zero3", lambda: True)
    with pytest.raises(ValueError, match=r"ZeRO-3 partitions it.*run `distill cache-teacher RECIPE` first"):
        train_module.build_trainer(load_recipe(d))
    recipe = load_recipe(d)
    target = AutoModelForCausalLM.from_pretrained(tiny_dir / "target").eval()
    examples = load_examples(recipe.data.dataset, recipe.data.adapter) + load_examples(recipe.data.eval_split, recipe.data.adapter)
    generate_responses(target, saved_tokenizer, examples, 6, tmp_path / "gens.jsonl", max_prompt_length=recipe.data.max_prompt_length)
    trainer = train_module.build_trainer(recipe)
    assert len(trainer.train_dataset) == 10


def test_seq_kd_caching_keeps_the_generation_logits_instead_of_a_second_pass(tiny_dir, saved_tokenizer, tmp_path, monkeypatch):
    """`distill cache-teacher` with target responses keeps the target's top-k of every greedy step
    while it generates: the cache then runs no forward pass over the responses, and holds what that
    pass would have given (positions exactly, log-probs up to float noise)."""
    import distill.training.teacher as teacher
    from distill.training.data import generate_responses, load_examples
    from distill.training.topk_store import TopKStore, store_dir

    gens = tmp_path / "generations.jsonl"
    d = tiny_dir.recipe(
        teacher={"cache_dir": str(tmp_path / "cache"), "top_k": TOP_K},
        data={"response_source": "target", "generation_cache": str(gens), "generation_max_new_tokens": 12},
    )
    recipe = load_recipe(d)
    forwards = []
    real = teacher.teacher_logits
    monkeypatch.setattr(teacher, "teacher_logits", lambda *a, **k: forwards.append(1) or real(*a, **k))
    teacher.cache_teacher(recipe)
    assert forwards == []  # every row came from the generation
    records = [json.loads(line) for line in gens.read_text().splitlines()]
    assert all(r["response_ids"] for r in records) and len(TopKStore(store_dir(gens), len(saved_tokenizer))) == len(records)

    target = teacher.load_target(str(tiny_dir / "target"))
    dataset = build_train_dataset(recipe.data, saved_tokenizer, target=target)
    again = write_cache(
        target, dataset, tmp_path / "forward", cache_identity("t", None, saved_tokenizer, dataset), top_k=TOP_K, pad_token_id=saved_tokenizer.pad_token_id
    )
    finish_cache(again)
    kept, forward = TeacherCache(cache_dirs(tmp_path / "cache")["train"]), TeacherCache(again)
    for i in range(len(dataset)):
        (pos1, ids1, lp1), (pos2, ids2, lp2) = kept.example(i), forward.example(i)
        assert torch.equal(pos1, pos2) and len(pos1) > 0
        assert torch.equal(ids1[:, 0], ids2[:, 0])  # greedy: the kept top-1 is the token the target chose next
        torch.testing.assert_close(lp1, lp2, atol=1e-4, rtol=0)
    # A cache generated without the top-k (or for another prompt) falls back to the forward pass, row by row.
    examples = load_examples(str(tiny_dir / "train.jsonl"))[:3]
    generate_responses(target, saved_tokenizer, examples, 12, tmp_path / "plain.jsonl", max_prompt_length=recipe.data.max_prompt_length)
    assert not store_dir(tmp_path / "plain.jsonl").exists()
