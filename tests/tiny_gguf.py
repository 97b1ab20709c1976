"""Write a tiny Qwen2 model and its tokenizer as a GGUF file (float32 tensors), laid out the way
llama.cpp's converter lays out Qwen2.5 checkpoints, so the `.gguf` paths run without the real files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from transformers import PreTrainedModel, PreTrainedTokenizerBase

_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _tensor_name(key: str) -> str:
    if key == "model.embed_tokens.weight":
        return "token_embd.weight"
    if key == "model.norm.weight":
        return "output_norm.weight"
    if key == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = key.split(".", 3)
    return f"blk.{layer}.{_LAYER[rest]}"


def write_gguf(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path, architecture: str = "qwen2") -> Path:
    """`model` (untied head written as `output.weight`) and `tokenizer` (padded with [PADn] tokens to
    the embedding's rows, as llama.cpp does) as one GGUF file at `path`."""
    import gguf

    config = model.config
    rows = config.vocab_size
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab))), "token ids must be contiguous"
    tokens = [t for t, _ in vocab] + [f"[PAD{i}]" for i in range(len(vocab), rows)]
    specials = set(tokenizer.all_special_tokens) | {str(t) for t in tokenizer.added_tokens_decoder.values()}
    types = [gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens[: len(vocab)]]
    types += [gguf.TokenType.USER_DEFINED] * (rows - len(vocab))
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny qwen2")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_bos_token_id(tokenizer.pad_token_id)
    writer.add_chat_template(tokenizer.chat_template)
    state = model.state_dict()
    if "lm_head.weight" not in state or config.tie_word_embeddings:
        state["lm_head.weight"] = model.get_output_embeddings().weight
    for key, tensor in state.items():
        writer.add_tensor(_tensor_name(key), tensor.detach().float().numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
