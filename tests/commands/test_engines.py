"""distill.commands.engines: the serving engines' rules on a draft beside its target, reproduced offline.
An unpadded draft (8 rows past the tokenizer under a target padded 32) passes transformers (with both
tokenizers) and llama.cpp (24 rows apart, ≤ 128) but not vLLM or SGLang; padded to the target's
vocab_size it passes all four. transformers' rule is checked against transformers itself; `distill
publish --gguf` writes the GGUF and records the verdicts in publish_info.json and the model card."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from distill.commands.engines import ENGINES, check_engines, check_folder, describe, llamacpp_compatible, summary
from distill.commands.export_gguf import export_gguf, read_llama_vocab
from distill.commands.publish import pad_vocab, publish

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_pair):
    """The tiny pair's target (+32 rows) and its draft (+8 rows) unpadded and padded to the target's vocab_size, each with the tokenizer."""
    root = tmp_path_factory.mktemp("engines")
    padded = copy.deepcopy(tiny_pair.draft)
    pad_vocab(padded, tiny_pair.target.config.vocab_size, len(tiny_pair.tokenizer))
    for name, model in (("target", tiny_pair.target), ("unpadded", tiny_pair.draft), ("padded", padded)):
        model.save_pretrained(root / name)
        tiny_pair.tokenizer.save_pretrained(root / name)
    return root


def _verdicts(checks) -> dict[str, bool]:
    return {c.engine: c.ok for c in checks}


def test_an_unpadded_draft_passes_transformers_and_llama_cpp_but_not_vllm_or_sglang(folders):
    checks = check_folder(folders / "unpadded", str(folders / "target"))
    assert [c.engine for c in checks] == list(ENGINES)
    assert _verdicts(checks) == {"transformers": True, "vLLM": False, "SGLang": False, "llama.cpp": True}
    by = {c.engine: c for c in checks}
    assert "assistant_tokenizer=tokenizer" in by["transformers"].command and "universal assisted decoding" in by["transformers"].reason
    assert "--pad-vocab-to-target" in by["vLLM"].reason and "verify_equal_vocab_size_if_draft_model" in by["vLLM"].rule
    assert "--pad-vocab-to-target" in by["SGLang"].reason and "#23838" in by["SGLang"].rule
    assert "392 vs 416 tokens (≤ 128 apart)" in by["llama.cpp"].reason
    assert "--spec-draft-n-max 3 --spec-draft-n-min 3 --draft-p-min 0" in by["llama.cpp"].command
    assert summary(checks) == "satisfies transformers, llama.cpp; not vLLM, SGLang"


def test_a_padded_draft_passes_every_engine(folders):
    checks = check_folder(folders / "padded", str(folders / "target"), repo="me/draft", k=4)
    assert all(_verdicts(checks).values()), [c.reason for c in checks if not c.ok]
    by = {c.engine: c for c in checks}
    assert '"num_speculative_tokens": 4' in by["vLLM"].command and '"model": "me/draft"' in by["vLLM"].command
    assert "--speculative-num-draft-tokens 5" in by["SGLang"].command
    assert by["transformers"].command == "target.generate(**inputs, assistant_model=draft)"


def test_the_transformers_rule_is_transformers_own(folders, tiny_pair):
    """What check_transformers predicts is what generate() does: a plain assistant_model= call is refused
    for the unpadded draft and needs both tokenizers; the padded draft is taken as is."""
    from transformers import AutoModelForCausalLM

    target, tok = tiny_pair.target, tiny_pair.tokenizer
    enc = tok(["anna has 3 apples"], return_tensors="pt")
    unpadded = AutoModelForCausalLM.from_pretrained(folders / "unpadded").eval()
    padded = AutoModelForCausalLM.from_pretrained(folders / "padded").eval()
    kwargs = {"do_sample": False, "max_new_tokens": 6, "pad_token_id": tok.pad_token_id}
    with pytest.raises(ValueError, match="different tokenizers"):
        target.generate(**enc, assistant_model=unpadded, **kwargs)
    with torch.no_grad():
        plain = target.generate(**enc, **kwargs)
        assert torch.equal(target.generate(**enc, assistant_model=padded, **kwargs), plain)
        assert torch.equal(target.generate(**enc, assistant_model=unpadded, tokenizer=tok, assistant_tokenizer=tok, **kwargs), plain)


def test_another_tokenizer_fails_every_engine(folders, tiny_pair):
    from distill.common.tiny import build_tokenizer, corpus_texts, make_examples

    draft, target = describe(folders / "padded"), describe(folders / "target")
    other = build_tokenizer(corpus_texts(make_examples(200, seed=7)), vocab_size=384)  # another merge table
    draft.tokenizer = other
    draft.llama = replace(draft.llama, tokens=[*draft.llama.tokens[:5], *reversed(draft.llama.tokens[5:])])
    verdicts = _verdicts(check_engines(draft, target))
    assert verdicts == {"transformers": False, "vLLM": False, "SGLang": False, "llama.cpp": False}


def test_llama_cpps_vocabulary_rule():
    """common_speculative_are_compatible: ≤ 128 tokens apart, texts equal from id 5, the same add_bos/BOS and add_eos/EOS."""
    from distill.commands.export_gguf import LlamaVocab

    base = LlamaVocab([f"t{i}" for i in range(300)], [1] * 300, [], 0, 2, 1, False, False, None)
    assert llamacpp_compatible(base, replace(base, tokens=base.tokens + [f"[PAD{i}]" for i in range(300, 428)])) is None  # 128 apart
    assert "more than llama.cpp's 128" in llamacpp_compatible(base, replace(base, tokens=base.tokens + [f"[PAD{i}]" for i in range(300, 429)]))
    assert llamacpp_compatible(base, replace(base, tokens=["x", *base.tokens[1:]])) is None  # ids 0-4 are not compared
    assert "token 5 is" in llamacpp_compatible(base, replace(base, tokens=[*base.tokens[:5], "x", *base.tokens[6:]]))
    assert "add_bos_token" in llamacpp_compatible(base, replace(base, add_bos=True))
    assert llamacpp_compatible(replace(base, bos=7), base) is None  # BOS ids compared only when BOS is added
    assert "add_eos_token" in llamacpp_compatible(replace(base, add_eos=True, eos=3), replace(base, add_eos=True))
    assert "vocab type" in llamacpp_compatible(base, replace(base, model="llama"))


def test_llama_cpp_reads_the_gguf_files_when_there_are_some(folders, tmp_path):
    draft_gguf = export_gguf(folders / "unpadded", tmp_path / "draft.gguf", "q8_0").path
    target_gguf = export_gguf(folders / "target", tmp_path / "target.gguf", "f16").path
    checks = {c.engine: c for c in check_folder(folders / "unpadded", str(target_gguf), gguf=draft_gguf)}
    assert checks["llama.cpp"].ok and f"-m {target_gguf} -md draft.gguf" in checks["llama.cpp"].command
    assert len(read_llama_vocab(target_gguf).tokens) - len(read_llama_vocab(draft_gguf).tokens) == 24


def test_publish_with_gguf_writes_the_file_and_records_the_engines(folders, tiny_pair, tmp_path):
    out = publish(tmp_path / "pub", draft=folders / "unpadded", target=str(folders / "target"), gguf="q8_0")
    assert (out / "draft-q8_0.gguf").is_file()
    info = json.loads((out / "publish_info.json").read_text())
    assert info["gguf"]["path"] == "draft-q8_0.gguf" and info["gguf"]["tensor_types"]["Q8_0"] == 9
    assert {e["engine"]: e["ok"] for e in info["engines"]} == {"transformers": True, "vLLM": False, "SGLang": False, "llama.cpp": True}
    card = (out / "README.md").read_text()
    assert "## Engine compatibility" in card and "| vLLM | no | vocab_size" in card and "| llama.cpp | yes |" in card
    assert "-md draft-q8_0.gguf --spec-type draft-simple" in card
    with pytest.raises(ValueError, match="--gguf-outtype 'q4_0'"):
        publish(tmp_path / "bad", draft=folders / "unpadded", target=str(folders / "target"), gguf="q4_0")
    assert not (tmp_path / "bad").exists()


QWEN_TOKENIZER = Path(__file__).resolve().parents[3] / "shared" / "data" / "qwen2.5-tokenizer"


@pytest.mark.skipif(not (QWEN_TOKENIZER / "tokenizer.json").is_file(), reason=f"no Qwen2.5 tokenizer in {QWEN_TOKENIZER}")
def test_qwen2_5_0_5b_under_7b_is_128_rows_apart_which_llama_cpp_takes_and_vllm_does_not():
    """The real shapes: 0.5B's 151,936 embedding rows under 7B's 152,064, one 151,665-token tokenizer."""
    from distill.commands.engines import Side
    from distill.commands.export_gguf import llama_vocab
    from distill.common.models import load_tokenizer

    tok = load_tokenizer(QWEN_TOKENIZER)
    config = type("Config", (), {"bos_token_id": 151643})()
    draft, target = (Side(name, rows, ["Qwen2ForCausalLM"], False, tok, llama_vocab(tok, rows, config)) for name, rows in (("0.5b", 151_936), ("7b", 152_064)))
    assert _verdicts(check_engines(draft, target)) == {"transformers": True, "vLLM": False, "SGLang": False, "llama.cpp": True}
    assert llamacpp_compatible(replace(draft.llama, tokens=draft.llama.tokens[:-1]), target.llama) is not None  # 129 apart: refused
