"""`distill trim-vocab` and the trimmed-draft folder (distill.common.trim): the kept set and its map, the
folder the one loader reads and transformers alone refuses, bad input (one line, exit 2, nothing written),
and `distill publish` writing the trimmed folder beside its full-vocabulary export."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from distill.commands.publish import FULL_VOCAB, publish
from distill.commands.trim_vocab import main
from distill.common import trim
from distill.common.models import load_model
from distill.common.tiny import tiny_qwen2

K = 96


@pytest.fixture(scope="module")
def files(tmp_path_factory, tokenizer, examples):
    """A tied draft folder with its tokenizer (as Qwen2.5-0.5B is tied), one without, a target folder,
    and the texts: a JSONL of examples, a generation cache row, a plain-text file and an empty one."""
    root = tmp_path_factory.mktemp("trim")
    draft = tiny_qwen2(len(tokenizer) + 8, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, tokenizer=tokenizer, seed=3)
    draft.save_pretrained(root / "draft")
    tokenizer.save_pretrained(root / "draft")
    draft.save_pretrained(root / "bare")  # no tokenizer
    target = tiny_qwen2(len(tokenizer) + 32, tokenizer=tokenizer, seed=4, tie_word_embeddings=False)
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    (root / "texts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in examples[:200]))
    (root / "plain.txt").write_text("\n".join(e["response"] for e in examples[200:260]))
    (root / "empty.txt").write_text("")
    return root


def _run(files, *args):
    return main([str(files / "draft"), *map(str, args)])


def test_the_kept_set_holds_the_always_kept_ids_then_the_most_frequent():
    counts = torch.tensor([0, 5, 5, 9, 0, 1, 7, 0])
    ids = trim.select_ids(counts, 5, forced=[7])
    assert ids.tolist() == [1, 2, 3, 6, 7]  # 7 forced; 3 (9), 6 (7), then 1 and 2 tie at 5
    assert trim.select_ids(counts, 7, forced=[]).tolist() == [0, 1, 2, 3, 4, 5, 6]  # unseen ids fill in id order
    assert trim.coverage(counts, ids) == pytest.approx(26 / 27)
    with pytest.raises(trim.VocabTrimError, match="between 1 and"):
        trim.select_ids(counts, 9)
    with pytest.raises(trim.VocabTrimError, match="always kept"):
        trim.select_ids(counts, 1, forced=[0, 1])


def test_always_kept_covers_special_and_chat_template_tokens(tokenizer):
    kept = set(trim.always_kept(tokenizer))
    assert set(tokenizer.all_special_ids) <= kept
    chat = tokenizer.apply_chat_template([{"role": "user", "content": ""}], tokenize=True, add_generation_prompt=True)["input_ids"]
    assert set(chat) <= kept


def test_counting_reads_jsonl_fields_generation_caches_and_plain_text(files, tokenizer, tmp_path):
    cache = tmp_path / "gen.jsonl"
    cache.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ignored"}], "response_ids": [5, 5, 9]}) + "\n"
    )
    assert trim.count_tokens(tokenizer, [cache])[[5, 9]].tolist() == [2, 1]
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "the cat"}, {"role": "assistant", "content": "the dog"}]}) + "\n")
    assert int(trim.count_tokens(tokenizer, [chat]).sum()) == len(tokenizer("the dog", add_special_tokens=False)["input_ids"])
    plain = trim.count_tokens(tokenizer, [files / "plain.txt"])
    assert int(plain.sum()) == len(tokenizer((files / "plain.txt").read_text(), add_special_tokens=False)["input_ids"])


def test_trim_vocab_writes_a_folder_the_loader_reads_and_transformers_refuses(files, tmp_path, capsys):
    out = tmp_path / "trimmed"
    assert _run(files, out, "--size", K, "--from", files / "texts.jsonl", files / "plain.txt") == 0
    assert f"keeps {K} of" in capsys.readouterr().out
    original, trimmed = load_model(files / "draft"), load_model(out)
    ids = trimmed.draft_to_target
    assert ids.numel() == K and torch.equal(ids, ids.sort().values) and trimmed.lm_head.weight.shape == (K, 32)
    assert trimmed.get_input_embeddings().weight.shape[0] == original.get_input_embeddings().weight.shape[0]  # the input embedding is whole
    assert not trimmed.config.tie_word_embeddings and trimmed.config.draft_vocab_size == K
    probe = torch.arange(30)[None]
    with torch.no_grad():
        torch.testing.assert_close(trimmed(probe).logits, original(probe).logits[..., ids])
    saved = json.loads((out / trim.MAP_FILE).read_text())
    assert saved["draft_to_target"] == ids.tolist() and 0.9 < saved["coverage_of_counted_text"] <= 1
    torch.testing.assert_close(load_file(out / trim.FULL_HEAD_FILE)["weight"], original.lm_head.weight.detach())
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        AutoModelForCausalLM.from_pretrained(out)  # never a silent random head
    full = trim.restore_full_head(trimmed)
    with torch.no_grad():
        torch.testing.assert_close(full(probe).logits, original(probe).logits)


def test_a_loaded_trimmed_head_trains_and_decodes_a_one_position_slice_as_one_mm(files, tmp_path):
    """The head loads trainable, as every other weight (a full fine-tune of a trimmed folder trains it), and the
    decoder's first draft step, the last of two positions, runs it as one mm: a frozen head made torch's matmul
    copy all its K rows into a bmm on every round (+60 ms a round at K = 32k on the real draft, bf16)."""
    from torch.profiler import ProfilerActivity, profile

    assert _run(files, tmp_path / "trimmed", "--size", K, "--from", files / "texts.jsonl") == 0
    trimmed = load_model(tmp_path / "trimmed")
    assert all(p.requires_grad for p in trimmed.parameters())
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        trimmed(torch.arange(2)[None], logits_to_keep=1)
    ops = [e.name for e in prof.events()]
    assert "aten::bmm" not in ops and "aten::mm" in ops


def test_the_training_other_row_never_reaches_the_folder(files, tmp_path):
    model = load_model(files / "draft")
    trim.trim_head(model, list(range(10, 40)), other_row=True)
    assert model.lm_head.weight.shape[0] == 31
    model.save_pretrained(tmp_path / "t")
    trim.save_trim_files(model, tmp_path / "t")
    reloaded = load_model(tmp_path / "t")
    torch.testing.assert_close(reloaded.lm_head.weight, model.lm_head.weight[:30].detach())


@pytest.mark.parametrize(
    "case,message",
    [
        ("too_big", "larger than the draft's vocabulary"),
        ("zero", "at least 1"),
        ("no_tokenizer", "no tokenizer to count the text with"),
        ("empty", "no tokens to count"),
        ("missing", "no such file"),
        ("trimmed", "already trimmed"),
        ("occupied", "not empty; pass --force"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(files, tmp_path, capsys, tokenizer, case, message):
    out = tmp_path / "out"
    draft, size, texts = files / "draft", K, files / "texts.jsonl"
    if case == "too_big":
        size = len(tokenizer) + 1
    elif case == "zero":
        size = 0
    elif case == "no_tokenizer":
        draft = files / "bare"
    elif case == "empty":
        texts = files / "empty.txt"
    elif case == "missing":
        texts = files / "nowhere.jsonl"
    elif case == "trimmed":
        assert main([str(draft), str(tmp_path / "first"), "--size", "64", "--from", str(texts)]) == 0
        draft = tmp_path / "first"
    elif case == "occupied":
        out.mkdir()
        (out / "keep.txt").write_text("x")
    capsys.readouterr()
    assert main([str(draft), str(out), "--size", str(size), "--from", str(texts)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() or case == "occupied"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no temporary left behind


def test_publish_writes_the_trimmed_folder_and_its_full_vocabulary_export(files, tmp_path):
    trimmed = tmp_path / "trimmed"
    assert _run(files, trimmed, "--size", K, "--from", files / "texts.jsonl") == 0
    out = publish(tmp_path / "published", draft=trimmed, target=str(files / "target"))
    ids = load_model(out).draft_to_target
    assert ids.numel() == K and (out / trim.MAP_FILE).is_file()
    full = AutoModelForCausalLM.from_pretrained(out / FULL_VOCAB)  # a plain model every engine loads
    original = load_model(files / "draft")
    head = full.lm_head.weight.detach()
    torch.testing.assert_close(head[ids], load_model(trimmed).lm_head.weight.detach())
    outside = torch.ones(head.shape[0], dtype=torch.bool)
    outside[ids] = False
    torch.testing.assert_close(head[outside], original.lm_head.weight.detach()[outside])  # the original rows restored
    assert not hasattr(full.config, "draft_vocab_size")
    card = (out / "README.md").read_text()
    assert "Trimmed vocabulary: two folders" in card and f'subfolder="{FULL_VOCAB}"' in card and f"keeps {K} of" in card
    assert f"up to {trim.PROMPT_ROWS} of the prompt's own tokens" in card  # the rows the decoder adds, which its users may turn off


def test_gguf_export_of_a_trimmed_draft_is_the_full_vocabulary_draft(files, tmp_path):
    gguf = pytest.importorskip("gguf")
    from distill.commands.export_gguf import export_gguf

    trimmed = tmp_path / "trimmed"
    assert _run(files, trimmed, "--size", K, "--from", files / "texts.jsonl") == 0
    export_gguf(trimmed, tmp_path / "draft.gguf", "f16")
    tensors = {t.name: t for t in gguf.GGUFReader(tmp_path / "draft.gguf").tensors}
    full = trim.restore_full_head(load_model(trimmed)).lm_head.weight.detach()
    head = tensors.get("output.weight", tensors["token_embd.weight"])
    assert tuple(int(n) for n in head.shape[::-1]) == tuple(full.shape)
    torch.testing.assert_close(torch.tensor(head.data.astype("float32")).reshape(full.shape), full, atol=1e-3, rtol=1e-3)


def test_bench_sweeps_vocabulary_sizes(files, tmp_path, capsys):
    from distill.commands.bench import main as bench

    out = tmp_path / "bench.json"
    common = ["--ks", "1..2", "--prompt-len", "16", "--num-prompts", "1", "--max-new-tokens", "6", "--repeats", "2"]
    sweep = ["--vocab-sizes", "64,256", "--vocab-from", str(files / "texts.jsonl"), "--coverage-from", str(files / "plain.txt")]
    assert bench([*common, *sweep, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["vocab_sweep"]
    assert [r["draft"] for r in rows] == ["full", "K=64", "K=256"] and [r["vocab_size"] for r in rows][1:] == [64, 256]
    assert rows[0]["coverage"] == 1.0 and rows[1]["coverage"] <= rows[2]["coverage"] <= 1.0
    assert all(r["c"] > 0 and r["predicted_speedup"] > 0 and r["alpha_source"] == "measured" for r in rows)
    assert "Trimmed vocabulary" in capsys.readouterr().out
    assert bench([*common, *sweep[:2], "--vocab-from", str(files / "texts.jsonl"), "--coverage-from", str(files / "nowhere.txt")]) == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        bench([*common, "--vocab-sizes", "64"])
    assert exit_.value.code == 2 and "--vocab-from" in capsys.readouterr().err
