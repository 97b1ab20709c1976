"""`distill export-gguf`: the tiny draft written as a GGUF in f16, bf16 and q8_0 and read back with gguf's
reader (metadata and tensor types as llama.cpp's converter writes them) and transformers' GGUF loader
(the same greedy tokens and logits within 0.05 for f16/bf16, ≥ 99% top-1 agreement for q8_0 on the
draft trained briefly; the same tokenizer and chat template); a tied head, a LoRA training output merged first; the real Qwen2.5 tokenizer
laid out as the official GGUFs have it; and refusals in one line with nothing written."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from distill.commands.export_gguf import CONTROL, NORMAL, UNUSED, USER_DEFINED, export_gguf, llama_vocab, main, read_llama_vocab
from distill.common.models import load_model, load_tokenizer
from distill.common.tiny import tiny_qwen2

gguf = pytest.importorskip("gguf")

SHARED = Path(__file__).resolve().parents[3] / "shared"
QWEN_TOKENIZER = SHARED / "data" / "qwen2.5-tokenizer"
REAL_GGUF = Path(os.environ.get("DISTILL_REAL_DIR", Path.home() / ".cache" / "distill-real")) / "qwen2.5-coder-0.5b-instruct.gguf"
TEXTS = ["anna has 3 apples and gets 4 more . how many apples does anna have ?", "tell me about the fox .", " the  red\ncat <|im_end|>"]


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory, tiny_pair):
    """The tiny pair's untied draft (8 rows past the tokenizer) saved with the tokenizer, as `distill publish` leaves it."""
    root = tmp_path_factory.mktemp("export") / "draft"
    tiny_pair.draft.save_pretrained(root)
    tiny_pair.tokenizer.save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory, tiny_pair, examples):
    """The tiny pair's draft after 150 CE steps on the tiny corpus (~1 s): confident where the corpus is, as a
    distilled draft is. The random-weight draft's logits are near-flat (top-2 within 0.03 at ~14% of positions,
    under Q8_0's rounding), so its q8_0 agreement (~98%) measures ties, not the export."""
    tok, model = tiny_pair.tokenizer, copy.deepcopy(tiny_pair.draft).train()
    rows = [tok(e["prompt"] + " " + e["response"], return_tensors="pt")["input_ids"][0] for e in examples[:300]]
    optimizer, gen = torch.optim.AdamW(model.parameters(), lr=3e-3), torch.Generator().manual_seed(0)
    for _ in range(150):
        batch = [rows[i] for i in torch.randint(0, len(rows), (16,), generator=gen)]
        ids = torch.nn.utils.rnn.pad_sequence(batch, batch_first=True, padding_value=tok.pad_token_id)
        mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(r) for r in batch], batch_first=True)
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    root = tmp_path_factory.mktemp("trained") / "draft"
    model.eval().save_pretrained(root)
    tok.save_pretrained(root)
    return root


def _prompts(tokenizer) -> list[torch.Tensor]:
    return [tokenizer(t, return_tensors="pt")["input_ids"] for t in TEXTS]


@torch.no_grad()
def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids).logits[0]


@torch.no_grad()
def _greedy(model, ids: torch.Tensor, n: int = 24) -> torch.Tensor:
    return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)


def _fields(path: Path) -> dict:
    reader = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}, {t.name: t.tensor_type.name for t in reader.tensors}


@pytest.mark.parametrize("outtype", ["f16", "bf16"])
def test_f16_and_bf16_give_the_same_greedy_tokens_and_logits_within_0_05(outtype, draft_dir, tiny_pair, tmp_path):
    out = export_gguf(draft_dir, tmp_path / f"draft-{outtype}.gguf", outtype)
    fields, tensors = _fields(out.path)
    config = tiny_pair.draft.config
    assert fields["general.architecture"] == "qwen2" and fields["general.file_type"] == {"f16": 1, "bf16": 32}[outtype]
    assert (fields["qwen2.block_count"], fields["qwen2.embedding_length"], fields["qwen2.feed_forward_length"]) == (
        config.num_hidden_layers,
        config.hidden_size,
        config.intermediate_size,
    )
    assert (fields["qwen2.attention.head_count"], fields["qwen2.attention.head_count_kv"], fields["qwen2.context_length"]) == (2, 1, 1024)
    assert fields["qwen2.rope.freq_base"] == 10000.0 and fields["qwen2.attention.layer_norm_rms_epsilon"] == pytest.approx(config.rms_norm_eps)
    assert (fields["tokenizer.ggml.model"], fields["tokenizer.ggml.pre"], fields["tokenizer.ggml.add_bos_token"]) == ("gpt2", "qwen2", False)
    # Names from gguf's qwen2 tensor map; 1-D tensors (norms, biases) stay F32, the rest in the type asked; the untied head is written.
    assert tensors["token_embd.weight"] == tensors["output.weight"] == tensors["blk.0.attn_q.weight"] == outtype.upper()
    assert {tensors[n] for n in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "blk.0.attn_q.bias", "blk.0.attn_v.bias")} == {"F32"}
    assert len(tensors) == 3 + 12 * config.num_hidden_layers

    reloaded = load_model(out.path, dtype="float32")  # transformers' GGUF loader
    for ids in _prompts(tiny_pair.tokenizer):
        assert (_logits(reloaded, ids) - _logits(tiny_pair.draft, ids)).abs().max() <= 0.05
        assert torch.equal(_greedy(reloaded, ids), _greedy(tiny_pair.draft, ids))


def test_q8_0_agrees_on_the_top_token_at_99_percent_of_positions(trained_dir, tiny_pair, examples, tmp_path):
    out = export_gguf(trained_dir, tmp_path / "draft-q8_0.gguf", "q8_0")
    _, tensors = _fields(out.path)
    assert tensors["blk.0.ffn_down.weight"] == tensors["token_embd.weight"] == "Q8_0" and tensors["output_norm.weight"] == "F32"
    assert out.bytes < export_gguf(trained_dir, tmp_path / "f16.gguf", "f16").bytes
    tok = tiny_pair.tokenizer
    ids = torch.cat([tok(e["prompt"] + " " + e["response"], return_tensors="pt")["input_ids"] for e in examples[300:400]], dim=1)[:, :2000]  # held out
    want, have = _logits(load_model(trained_dir, dtype="float32"), ids), _logits(load_model(out.path, dtype="float32"), ids)
    agree = (have.argmax(-1) == want.argmax(-1)).float().mean().item()
    assert agree >= 0.99, agree


def test_the_tokenizer_round_trips_with_its_specials_and_chat_template(draft_dir, tiny_pair, tmp_path):
    out = export_gguf(draft_dir, tmp_path / "draft.gguf", "f16").path
    tok, original = load_tokenizer(out), tiny_pair.tokenizer
    chat = [{"role": "user", "content": TEXTS[0]}]
    rendered = original.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert tok.chat_template == original.chat_template
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == rendered
    for text in [*TEXTS, rendered]:
        ids = original(text, add_special_tokens=False)["input_ids"]
        assert tok(text, add_special_tokens=False)["input_ids"] == ids
        assert tok.decode(ids) == original.decode(ids)
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    vocab = read_llama_vocab(out)  # what llama.cpp reads
    n = len(original)
    assert len(vocab.tokens) == tiny_pair.draft.config.vocab_size and vocab.tokens[n:] == [f"[PAD{i}]" for i in range(n, len(vocab.tokens))]
    assert vocab.types[n:] == [UNUSED] * (len(vocab.tokens) - n)
    assert {vocab.tokens[i] for i, t in enumerate(vocab.types) if t == CONTROL} == {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    assert (vocab.eos, vocab.pad, vocab.add_bos) == (original.eos_token_id, original.pad_token_id, False)


def test_a_tied_draft_writes_no_output_tensor_and_reloads_tied(tiny_pair, tmp_path):
    tied = tiny_qwen2(len(tiny_pair.tokenizer), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, tokenizer=tiny_pair.tokenizer, seed=5)
    tied.save_pretrained(tmp_path / "tied")
    tiny_pair.tokenizer.save_pretrained(tmp_path / "tied")
    out = export_gguf(tmp_path / "tied", tmp_path / "tied.gguf")
    assert out.tied and "output.weight" not in _fields(out.path)[1]  # llama.cpp's qwen2 then reads token_embd
    reloaded = load_model(out.path, dtype="float32")
    assert reloaded.config.tie_word_embeddings
    ids = _prompts(tiny_pair.tokenizer)[0]
    assert (_logits(reloaded, ids) - _logits(tied, ids)).abs().max() <= 0.05


def test_a_lora_training_output_is_merged_first(draft_dir, tiny_pair, tmp_path, capsys):
    from peft import LoraConfig, get_peft_model

    base = load_model(draft_dir, dtype="float32")
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"]))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:  # peft starts B at zero: make the merge change the model
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.5)
    run = tmp_path / "run"
    lora.save_pretrained(run / "draft")
    tiny_pair.tokenizer.save_pretrained(run / "draft")
    assert json.loads((run / "draft" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(draft_dir)
    merged = copy.deepcopy(lora).merge_and_unload().eval()

    assert main([str(run), str(tmp_path / "run.gguf")]) == 0  # the training output folder resolves to its draft/
    assert "LoRA merged" in capsys.readouterr().out
    reloaded = load_model(tmp_path / "run.gguf", dtype="float32")
    ids = _prompts(tiny_pair.tokenizer)[0]
    assert (_logits(reloaded, ids) - _logits(merged, ids)).abs().max() <= 0.05
    assert (_logits(reloaded, ids) - _logits(tiny_pair.draft, ids)).abs().max() > 0.5, "the LoRA was not merged"
    assert gguf.GGUFReader(str(tmp_path / "run.gguf")).fields["general.name"].contents() == "run"


@pytest.mark.parametrize("case", ["architecture", "no tokenizer", "other pre-tokenizer", "outtype", "exists", "not .gguf", "no such draft"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(case, draft_dir, tiny_pair, tmp_path, capsys):
    src, out, extra = draft_dir, tmp_path / "out.gguf", []
    if case == "architecture":
        src = tmp_path / "llama"
        config = LlamaConfig(vocab_size=len(tiny_pair.tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
        LlamaForCausalLM(config).save_pretrained(src)
        tiny_pair.tokenizer.save_pretrained(src)
    elif case == "no tokenizer":
        src = tmp_path / "bare"
        tiny_pair.draft.save_pretrained(src)
    elif case == "other pre-tokenizer":
        from tokenizers import pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        # A tokenizer-only folder given with --tokenizer (beside a qwen2 config.json, transformers would load Qwen2Tokenizer, Qwen's split).
        src, other = tmp_path / "bare", tmp_path / "gpt2-split"
        tiny_pair.draft.save_pretrained(src)
        backend = copy.deepcopy(tiny_pair.tokenizer.backend_tokenizer)
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's regex, not Qwen2's
        PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>").save_pretrained(other)
        extra = ["--tokenizer", str(other)]
    elif case == "outtype":
        extra = ["--outtype", "q4_k"]
    elif case == "exists":
        out.write_text("a user's file")
    elif case == "not .gguf":
        out = tmp_path / "out.bin"
    elif case == "no such draft":
        src = tmp_path / "nowhere"
    capsys.readouterr()
    assert main([str(src), str(out), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("distill export-gguf: error: ") and "\n" not in err and "Traceback" not in err
    expected = {
        "architecture": "LlamaForCausalLM (model_type 'llama') is not supported",
        "no tokenizer": "holds no tokenizer",
        "other pre-tokenizer": "not Qwen2's byte-level BPE",
        "outtype": "--outtype 'q4_k': choose one of f16, bf16, q8_0",
        "exists": "already exists",
        "not .gguf": "must be a .gguf file name",
        "no such draft": "no such file or folder",
    }[case]
    assert expected in err, err
    if case == "exists":
        assert out.read_text() == "a user's file"
    else:
        assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no temporary left beside it


@pytest.mark.skipif(not (QWEN_TOKENIZER / "tokenizer.json").is_file(), reason=f"no Qwen2.5 tokenizer in {QWEN_TOKENIZER}")
def test_the_real_qwen_tokenizer_is_laid_out_as_the_official_gguf_has_it():
    tok = load_tokenizer(QWEN_TOKENIZER)
    config = type("Config", (), {"bos_token_id": 151643})()
    vocab = llama_vocab(tok, 151_936, config)  # Qwen2.5-0.5B's embedding rows
    counts = {t: vocab.types.count(t) for t in (NORMAL, CONTROL, USER_DEFINED, UNUSED)}
    assert counts == {NORMAL: 151_643, CONTROL: 20, USER_DEFINED: 2, UNUSED: 271}  # as in qwen2.5-coder-0.5b-instruct.gguf
    assert (vocab.bos, vocab.eos, vocab.pad, vocab.add_bos, vocab.add_eos) == (151643, 151645, 151643, False, False)
    assert vocab.tokens[151657] == "<tool_call>" and vocab.types[151657] == USER_DEFINED and vocab.types[151659] == CONTROL  # <|fim_prefix|>


@pytest.mark.skipif(not (REAL_GGUF.is_file() and (QWEN_TOKENIZER / "tokenizer.json").is_file()), reason=f"needs {REAL_GGUF} and {QWEN_TOKENIZER}")
def test_the_real_qwen_tokenizer_is_written_exactly_as_llama_cpps_converter_wrote_the_official_gguf():
    """The token list, types, merges and special ids of Qwen2.5-Coder-0.5B-Instruct's GGUF (llama.cpp's converter)
    equal what export-gguf writes for the Qwen2.5 tokenizer over 151,936 rows (skipped unless fetch-real-qwen ran; ~2 s)."""
    vocab = llama_vocab(load_tokenizer(QWEN_TOKENIZER), 151_936, type("Config", (), {"bos_token_id": 151643})())
    official = read_llama_vocab(REAL_GGUF)
    assert vocab.tokens == official.tokens and vocab.types == official.types and vocab.merges == official.merges
    assert (vocab.bos, vocab.eos, vocab.pad, vocab.add_bos, vocab.add_eos, vocab.model, vocab.pre) == (
        official.bos,
        official.eos,
        official.pad,
        official.add_bos,
        official.add_eos,
        official.model,
        official.pre,
    )
