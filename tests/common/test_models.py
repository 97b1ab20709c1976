"""distill.common.models: one loader for Hub ids, folders, training outputs and .gguf files, and
`distill convert-gguf`, on a tiny Qwen2 written as a GGUF here (the real pair: tests/test_real.py)."""

from __future__ import annotations

import builtins
import copy
import json
import os
import stat

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distill.commands.convert_gguf import convert_gguf
from distill.commands.convert_gguf import main as convert_main
from distill.common import models
from distill.common.models import ModelLoadError, load_config, load_model, load_tokenizer, resolve
from distill.common.tiny import tiny_qwen2
from tiny_gguf import write_gguf

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny(tokenizer):
    """A tiny Qwen2 with an untied head (as the Coder GGUFs have), padded 8 rows past the tokenizer."""
    return tiny_qwen2(len(tokenizer) + 8, hidden_size=64, num_layers=2, tokenizer=tokenizer, seed=3, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory, tiny, tokenizer):
    return write_gguf(tiny, tokenizer, tmp_path_factory.mktemp("gguf") / "tiny-qwen2.gguf")


def _logits(model, n: int = 12) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.arange(1, n + 1).unsqueeze(0)).logits


def test_references_resolve_to_hub_ids_folders_training_outputs_and_gguf_files(tmp_path, gguf_file):
    assert resolve("Qwen/Qwen2.5-0.5B-Instruct") == models.ModelSource("Qwen/Qwen2.5-0.5B-Instruct", "hub", "Qwen/Qwen2.5-0.5B-Instruct")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert resolve(tmp_path / "model").kind == "folder"
    (tmp_path / "run" / "draft").mkdir(parents=True)
    (tmp_path / "run" / "draft" / "config.json").write_text("{}")
    assert resolve(tmp_path / "run").path == str(tmp_path / "run" / "draft")  # a training output_dir loads its draft/
    src = resolve(gguf_file)
    assert (src.kind, src.location, src.kwargs()) == ("gguf", str(gguf_file.parent), {"gguf_file": gguf_file.name})
    for bad, message in [
        ("runs/tiny/nope", "no such file or folder"),
        (tmp_path / "nope.gguf", "no such GGUF file"),
        (tmp_path / "run" / "draft" / "config.json", "is a file, not a model folder"),
        (tmp_path, "holds no model"),
    ]:
        with pytest.raises(ModelLoadError, match=message):
            resolve(bad)


def test_a_gguf_loads_as_a_plain_model_with_its_tokenizer(gguf_file, tiny, tokenizer, tmp_path):
    model = load_model(gguf_file, dtype="float32")
    torch.testing.assert_close(_logits(model), _logits(tiny), rtol=0, atol=0)  # float32 tensors: the same model
    assert model.hf_quantizer is None and not model.is_quantized and not hasattr(model.config, "quantization_config")  # trainable, saveable
    model.save_pretrained(tmp_path / "saved")  # the "quantized with gguf and is not serializable" trap is gone
    tok = load_tokenizer(gguf_file)
    text = "anna has 3 apples and gets 4 more ."
    assert tok(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    chat = [{"role": "user", "content": text}]
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == tokenizer.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True
    )
    assert load_config(gguf_file).vocab_size == tiny.config.vocab_size
    assert load_model(gguf_file, dtype="bfloat16").dtype == torch.bfloat16


def test_convert_gguf_writes_a_folder_transformers_loads_with_the_same_logits(gguf_file, tmp_path):
    out = tmp_path / "converted"
    assert convert_main([str(gguf_file), str(out)]) == 0
    plain = AutoModelForCausalLM.from_pretrained(out).eval()  # no distill needed to read it
    torch.testing.assert_close(_logits(plain), _logits(load_model(gguf_file, dtype="float32")), rtol=0, atol=0)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"]) == (tok.eos_token_id, tok.pad_token_id)
    info = json.loads((out / "conversion.json").read_text())
    assert info["source_bytes"] == gguf_file.stat().st_size and info["dtype"] == "float32"
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [out, *out.iterdir()]}
    assert modes["converted"] == 0o755 and all(m == 0o644 for name, m in modes.items() if name != "converted"), modes
    half = convert_gguf(gguf_file, tmp_path / "half", dtype="bfloat16")
    assert AutoModelForCausalLM.from_pretrained(half).dtype == torch.bfloat16


@pytest.mark.parametrize("case", ["truncated", "not gguf", "architecture", "out exists", "bad dtype"])
def test_convert_gguf_refuses_bad_input_in_one_line_and_writes_nothing(case, gguf_file, tiny, tokenizer, tmp_path, capsys):
    src, out, extra = tmp_path / "model.gguf", tmp_path / "out", []
    data = gguf_file.read_bytes()
    if case == "truncated":
        src.write_bytes(data[: len(data) * 2 // 3])
    elif case == "not gguf":
        src.write_text("<!DOCTYPE html> a download error page")
    elif case == "architecture":
        write_gguf(tiny, tokenizer, src, architecture="rwkv9")
    else:
        src.write_bytes(data)
    if case == "out exists":
        out.mkdir()
        (out / "keep.txt").write_text("a user's file")
    if case == "bad dtype":
        extra = ["--dtype", "int4"]
        with pytest.raises(SystemExit) as exit_:
            convert_main([str(src), str(out), *extra])
        assert exit_.value.code == 2
        return
    assert convert_main([str(src), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("distill convert-gguf: error: ") and "\n" not in err and "Traceback" not in err
    assert {"truncated": "truncated or corrupt", "not gguf": "not a GGUF file", "architecture": "cannot be dequantised", "out exists": "already exists"}[
        case
    ] in err
    if case == "out exists":
        assert [p.name for p in out.iterdir()] == ["keep.txt"]
    else:
        assert not out.exists()
    assert not list(tmp_path.glob(".out.*"))  # no half-written folder beside it


def test_without_the_gguf_package_a_gguf_is_refused_naming_the_extra(gguf_file, monkeypatch):
    real_import = builtins.__import__

    def no_gguf(name, *args, **kwargs):
        if name == "gguf":
            raise ImportError("No module named 'gguf'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gguf)
    with pytest.raises(ModelLoadError, match=r"needs the gguf package: pip install 'distill\[gguf\]'"):
        load_model(gguf_file)


@pytest.mark.parametrize("damage", ["torn weights", "config not json", "no weights"])
def test_a_damaged_folder_is_one_line_naming_the_file(damage, tiny, tokenizer, tmp_path):
    folder = tmp_path / "model"
    tiny.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    weights = folder / "model.safetensors"
    if damage == "torn weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "config not json":
        (folder / "config.json").write_text('{"model_type": "qwen2",')
    else:
        weights.unlink()
    with pytest.raises(ModelLoadError) as err:
        load_model(folder, what="draft")
    message = str(err.value)
    assert str(folder) in message and "\n" not in message and "draft" in message


def _mapped(folder) -> list[str]:
    """The lines of /proc/self/maps that map a file of `folder` into this process."""
    return [line for line in open("/proc/self/maps").read().splitlines() if str(folder) in line]


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads Linux's /proc/self/maps")
def test_weights_are_read_into_memory_not_left_mapped_from_the_checkpoint(tiny, tmp_path):
    """A checkpoint already in the dtype asked for stays memory-mapped by default, and the kernel may drop those
    pages whenever it reclaims memory, each re-read stalling decoding (the real bf16 draft measured c = 0.67
    against 0.46 so). The loader reads the weights into the process's own memory instead."""
    folder = tmp_path / "bf16"
    copy.deepcopy(tiny).to(torch.bfloat16).save_pretrained(folder)
    loaded = load_model(folder, dtype="bfloat16")
    assert loaded.dtype == torch.bfloat16 and _mapped(folder) == []
    mapped = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)  # transformers' default: the file stays mapped
    assert _mapped(folder) and torch.equal(_logits(loaded), _logits(mapped))
