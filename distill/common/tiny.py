"""Tiny, locally built stand-ins for the Qwen2.5 family: a synthetic corpus, a tokenizer trained
on it, and small `Qwen2ForCausalLM` models, so the whole pipeline runs on a CPU with no download."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Sequence

import torch
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen2.5's chat template, reduced to the parts the toolkit uses (system, user, assistant turns).
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_NAMES = ["anna", "ben", "cara", "dev", "eli", "fay", "gus", "hana", "ivo", "june"]
_ITEMS = ["apples", "books", "coins", "pens", "cards", "shells", "stamps", "cups"]
_ANIMALS = ["cat", "dog", "fox", "owl", "bee", "cow", "hen", "yak"]
_COLOURS = ["red", "blue", "green", "small", "old", "quick", "lazy", "bright"]
_VERBS = ["sees", "likes", "chases", "finds", "helps", "follows"]
_PLACES = ["in the park", "by the river", "at home", "on the hill", "near the farm"]


def _arithmetic(rng: random.Random) -> tuple[str, str]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b = rng.randint(1, 20), rng.randint(1, 20)
    if rng.random() < 0.5:
        question = f"{name} has {a} {item} and gets {b} more . how many {item} does {name} have ?"
        answer = f"{name} has {a} + {b} = {a + b} {item} . #### {a + b}"
    else:
        a, b = max(a, b), min(a, b)
        question = f"{name} has {a} {item} and gives away {b} . how many {item} are left ?"
        answer = f"{name} has {a} - {b} = {a - b} {item} left . #### {a - b}"
    return question, answer


def _story(rng: random.Random) -> tuple[str, str]:
    animal = rng.choice(_ANIMALS)
    question = f"tell me about the {animal} ."
    sentences = []
    for _ in range(rng.randint(2, 4)):
        colour = rng.choice(_COLOURS)
        other = rng.choice(_ANIMALS)
        place = rng.choice(_PLACES) if rng.random() < 0.7 else "every day"
        sentences.append(f"the {colour} {animal} {rng.choice(_VERBS)} the {other} {place} .")
    return question, " ".join(sentences)


def make_examples(n: int, seed: int = 0) -> list[dict[str, str]]:
    """`n` prompt/response pairs of a small synthetic language: word problems with `#### N`
    answers (as GSM8K writes them) and short stories with some entropy for a draft to match."""
    rng = random.Random(seed)
    return [dict(zip(("prompt", "response"), (_arithmetic if rng.random() < 0.5 else _story)(rng))) for _ in range(n)]


def build_tokenizer(texts: Sequence[str], vocab_size: int = 512) -> Qwen2Tokenizer:
    """A Qwen2 tokenizer (Qwen2.5's byte-level BPE pre-tokenization, special tokens and chat
    template) whose merges are trained on `texts`; it saves and reloads as itself."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    hf = Qwen2Tokenizer(
        vocab=tok.get_vocab(),
        merges=merges,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        padding_side="left",
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def corpus_texts(examples: Sequence[dict[str, str]]) -> list[str]:
    """The plain texts a tokenizer is trained on: every prompt and response."""
    return [t for ex in examples for t in (ex["prompt"], ex["response"])] + ["You are a helpful assistant.", "system user assistant"]


def tiny_qwen2(
    vocab_size: int,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 1024,
    tokenizer: PreTrainedTokenizerBase | None = None,
    seed: int = 0,
    tie_word_embeddings: bool = True,
    initializer_range: float = 0.02,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 model; `vocab_size` may exceed the tokenizer's (padded rows, as in Qwen2.5)."""
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        initializer_range=initializer_range,
        rope_theta=10000.0,
        torch_dtype="float32",
    )
    if tokenizer is not None:
        config.eos_token_id = tokenizer.eos_token_id
        config.pad_token_id = tokenizer.pad_token_id
        config.bos_token_id = None
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    if tokenizer is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.bos_token_id = None
    return model


def random_pair(target_shape: dict, draft_shape: dict, seed: int = 0) -> tuple[Qwen2ForCausalLM, Qwen2ForCausalLM, Qwen2Tokenizer]:
    """A target and a draft with random weights and untied heads over one tokenizer trained on the
    corpus; the shapes are `tiny_qwen2` keyword arguments. For timing loops, not for acceptance."""
    tok = build_tokenizer(corpus_texts(make_examples(2000, seed=seed)), vocab_size=512)
    target = tiny_qwen2(len(tok), tokenizer=tok, seed=seed + 1, tie_word_embeddings=False, initializer_range=0.05, **target_shape)
    draft = tiny_qwen2(len(tok), tokenizer=tok, seed=seed + 2, tie_word_embeddings=False, initializer_range=0.05, **draft_shape)
    return target, draft, tok


def noisy_copy(model: Qwen2ForCausalLM, scale: float, seed: int = 0) -> Qwen2ForCausalLM:
    """A copy of `model` with Gaussian noise of `scale` × each tensor's std: a draft that agrees
    with the target often but not always, for exercising both acceptance and rejection."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std())
    return draft
