"""The bundled decoder: greedy output identical to target.generate, sampled output distributed as
the target's, stats that add up, and clear errors for bad input."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from transformers import GenerationConfig, Qwen2ForCausalLM

import distill.speculative.loop as loop_module
from batches import left_padded_batch
from distill.common.tiny import build_tokenizer, noisy_copy, tiny_qwen2
from distill.speculative import SpeculativeDecoder
from distill.speculative.cache import DynamicSide, StaticSide
from distill.speculative.sampling import sample


@pytest.mark.parametrize("draft_kind", ["small", "noisy", "self"])
@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_greedy_equals_target_generate(pair, tokenizer, examples, draft_kind, k, batch_size):
    target, drafts = pair
    enc = left_padded_batch(tokenizer, examples, batch_size)
    expected = target.generate(**enc, max_new_tokens=24, do_sample=False)
    out = SpeculativeDecoder(target, drafts[draft_kind], num_draft_tokens=k).generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=24)
    assert out.sequences.tolist() == expected.tolist()


def test_noisy_draft_is_partially_accepted(pair, tokenizer, examples):
    """Guards the identity tests above: they must cover rejections as well as acceptances."""
    target, drafts = pair
    enc = left_padded_batch(tokenizer, examples, 1)
    stats = SpeculativeDecoder(target, drafts["noisy"], num_draft_tokens=4).generate(enc["input_ids"], max_new_tokens=40).stats
    assert 0.1 < stats.acceptance_rate < 0.95


@pytest.mark.parametrize("draft_kind,batch_size", [("self", 3), ("noisy", 4)])
def test_eos_inside_an_accepted_block_stops_there(pair, tokenizer, examples, draft_kind, batch_size):
    target, drafts = pair
    enc = left_padded_batch(tokenizer, examples, batch_size)
    free = target.generate(**enc, max_new_tokens=20, do_sample=False)
    prompt_len = enc["input_ids"].shape[1]
    eos = int(free[0, prompt_len + 5])  # a token the first row emits mid-block with k = 6
    expected = target.generate(**enc, max_new_tokens=20, do_sample=False, eos_token_id=eos, pad_token_id=0)
    out = SpeculativeDecoder(target, drafts[draft_kind], num_draft_tokens=6).generate(
        enc["input_ids"], enc["attention_mask"], max_new_tokens=20, eos_token_id=eos, pad_token_id=0
    )
    assert out.sequences.tolist() == expected.tolist()
    row0 = out.sequences[0, prompt_len:].tolist()
    assert row0.index(eos) <= 5 and all(t == 0 for t in row0[row0.index(eos) + 1 :])


@pytest.mark.parametrize("draft_kind,batch_size", [("self", 2), ("noisy", 4)])
@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 13])
def test_max_new_tokens_is_never_overshot(pair, tokenizer, examples, max_new_tokens, draft_kind, batch_size):
    target, drafts = pair
    enc = left_padded_batch(tokenizer, examples, batch_size)
    expected = target.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
    out = SpeculativeDecoder(target, drafts[draft_kind], num_draft_tokens=5).generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=max_new_tokens)
    assert out.sequences.tolist() == expected.tolist()
    assert out.sequences.shape[1] == enc["input_ids"].shape[1] + max_new_tokens


@pytest.mark.parametrize("draft_kind", ["noisy", "self", "small"])
def test_adaptive_k_keeps_greedy_identity_and_moves_k(pair, tokenizer, examples, draft_kind):
    target, drafts = pair
    enc = left_padded_batch(tokenizer, examples, 1)
    expected = target.generate(**enc, max_new_tokens=40, do_sample=False)
    out = SpeculativeDecoder(target, drafts[draft_kind], num_draft_tokens=3, schedule="adaptive").generate(enc["input_ids"], max_new_tokens=40)
    assert out.sequences.tolist() == expected.tolist()
    if draft_kind == "self":  # every round fully accepted: k must grow past its start
        assert len(out.stats.position_proposed) > 3
    if draft_kind == "small":  # nothing accepted: k must fall to 1
        assert out.stats.rounds > 10 and out.stats.position_proposed[1] < out.stats.position_proposed[0]


def test_stats_add_up(pair, tokenizer, examples):
    target, drafts = pair
    enc = left_padded_batch(tokenizer, examples, 1)
    s = SpeculativeDecoder(target, drafts["noisy"], num_draft_tokens=4).generate(enc["input_ids"], max_new_tokens=33).stats
    assert s.accepted <= s.proposed and s.new_tokens == 33
    # Batch of one, no EOS: every target forward emits its accepted block plus one token of its own.
    assert s.new_tokens == s.accepted + s.target_forwards
    # The draft reads the prompt once, then makes one step per proposal (none cut short here, as
    # the constant k = 4 fits 33 tokens: 1 + 8 rounds of at most 5).
    assert s.target_forwards == s.rounds + 1 and s.draft_forwards == 1 + s.proposed
    rates = s.per_position_acceptance
    assert all(a >= b for a, b in zip(rates, rates[1:]))
    assert s.acceptance_rate == pytest.approx(s.accepted / s.proposed)
    assert s.tokens_per_target_forward == pytest.approx(s.new_tokens / s.target_forwards)
    assert 0 < s.ttft_s <= s.wall_s and s.tpot_s > 0
    assert set(s.to_dict()) >= {"acceptance_rate", "mean_accepted_length", "per_position_acceptance", "tpot_s"}


# --- sampling: the output distribution is the target's -------------------------------------

VOCAB = 6


@pytest.fixture(scope="module")
def small_vocab_pair():
    target = tiny_qwen2(VOCAB, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=21, tie_word_embeddings=False, initializer_range=0.5)
    draft = tiny_qwen2(VOCAB, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=22, tie_word_embeddings=False, initializer_range=0.5)
    for m in (target, draft):
        m.generation_config.eos_token_id = None
        m.config.eos_token_id = m.config.pad_token_id = m.config.bos_token_id = None
    return target, draft


def _exact_joint(target, prompt, steps, temperature, top_p):
    """P(t1..t_steps | prompt) for every sequence, by enumerating all VOCAB**steps continuations."""
    from distill.speculative.sampling import warp

    seqs = torch.tensor(list(itertools.product(range(VOCAB), repeat=steps)))
    ids = torch.cat([prompt.expand(len(seqs), -1), seqs], 1)
    with torch.no_grad():
        probs = warp(target(ids).logits, temperature, top_p)
    p = len(prompt[0])
    cond = probs[:, p - 1 : p - 1 + steps].gather(-1, seqs[..., None]).squeeze(-1)
    return seqs, cond.prod(-1).double()


def _sampled_tvd(target, draft, temperature, top_p, n=12000, steps=3, seed=0, backend="eager"):
    prompt = torch.tensor([[1, 4, 2]])
    seqs, exact = _exact_joint(target, prompt, steps, temperature, top_p)
    out = SpeculativeDecoder(target, draft, num_draft_tokens=2, backend=backend).generate(
        prompt.expand(n, -1), max_new_tokens=steps, do_sample=True, temperature=temperature, top_p=top_p, seed=seed
    )
    new = out.sequences[:, -steps:]
    codes = (new * torch.tensor([VOCAB ** (steps - 1 - i) for i in range(steps)])).sum(-1)
    empirical = torch.bincount(codes, minlength=VOCAB**steps).double() / n
    assert out.stats.proposed > 0 and 0 < out.stats.acceptance_rate < 1  # rejections were exercised
    return 0.5 * (empirical - exact).abs().sum().item(), exact


# 12,000 draws over 216 outcomes: an exact sampler's empirical TVD to the truth measured 0.007-0.027
# (seeds 0 and 1, both settings); the sampler that drops the residual measured 0.12.
TVD_BOUND = 0.075


@pytest.mark.parametrize("backend", ["eager", "static"])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_sampling_follows_the_target_distribution(small_vocab_pair, temperature, top_p, backend):
    target, draft = small_vocab_pair
    tvd, _ = _sampled_tvd(target, draft, temperature, top_p, backend=backend)
    assert tvd < TVD_BOUND


def test_compiled_draft_sampling_follows_the_target_distribution(small_vocab_pair):
    """The compiled backend samples the draft inside its torch.compile graph (uniforms drawn outside)."""
    target, draft = small_vocab_pair
    torch._dynamo.reset()
    tvd, _ = _sampled_tvd(target, draft, 0.7, 0.9, backend="compiled")
    assert tvd < TVD_BOUND


def _drop_residual(draft_tokens, q, p, u):
    """A broken rule: on rejection it samples from p instead of norm(max(0, p - q))."""
    k = draft_tokens.shape[1]
    idx = draft_tokens[..., None]
    p_d, q_d = p[:, :k].gather(-1, idx).squeeze(-1), q.gather(-1, idx).squeeze(-1)
    n = (u[:, :k] * q_d <= p_d).int().cumprod(-1).sum(-1)
    p_n = p.gather(1, n[:, None, None].expand(-1, 1, p.shape[-1])).squeeze(1)
    return n, sample(p_n, u[:, k])


@pytest.mark.parametrize("backend", ["eager", "static"])
def test_sampling_test_catches_a_sampler_that_drops_the_residual(small_vocab_pair, monkeypatch, backend):
    target, draft = small_vocab_pair
    monkeypatch.setattr(loop_module, "rejection_accept", _drop_residual)
    tvd, _ = _sampled_tvd(target, draft, 1.0, 1.0, backend=backend)
    assert tvd > TVD_BOUND


def test_inverse_cdf_sampling_draws_each_token_at_its_probability():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.25, 0.25]])
    u = torch.tensor([0.0, 0.49, 0.5, 0.74, 0.75, 0.999999])
    assert sample(probs.expand(6, -1), u).tolist() == [1, 1, 3, 3, 4, 4]  # zero-probability ids never drawn
    draws = sample(torch.tensor([[1.0, 3.0]]).expand(40000, -1), torch.rand(40000, generator=torch.Generator().manual_seed(0)))
    assert draws.float().mean().item() == pytest.approx(0.75, abs=0.01)  # unnormalised weights are fine


# --- ragged batches: every row keeps its own accepted length ---------------------------------


def test_rows_keep_their_own_accepted_length(pair, tokenizer, examples, monkeypatch):
    """Rows whose accepted blocks differ almost every round each emit their own block plus one
    target token; the holes this leaves in the caches are squeezed out on a long run, and the
    output stays the target's row for row."""
    target, drafts = pair
    enc = left_padded_batch(tokenizer, examples, 4)
    kept, compactions = [], []
    round_, compact = loop_module.SpecLoop._round, DynamicSide.compact
    monkeypatch.setattr(loop_module.SpecLoop, "_round", lambda self, k: (r := round_(self, k), kept.append([row[0] for row in r[0]]))[0])
    monkeypatch.setattr(DynamicSide, "compact", lambda self, keep: (compactions.append(keep), compact(self, keep))[1])
    expected = target.generate(**enc, max_new_tokens=150, do_sample=False)
    out = SpeculativeDecoder(target, drafts["noisy"], num_draft_tokens=4).generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=150)
    assert out.sequences.tolist() == expected.tolist()
    assert sum(len(set(row)) > 1 for row in kept) > len(kept) / 2  # blocks differed between rows in most rounds
    s = out.stats
    assert s.new_tokens == 4 * 150 and s.new_tokens == s.accepted + s.sequence_forwards
    assert compactions


@pytest.mark.parametrize("backend", ["eager", "static"])
def test_compacting_after_every_round_leaves_the_output_unchanged(pair, tokenizer, examples, monkeypatch, backend):
    target, drafts = pair
    enc = left_padded_batch(tokenizer, examples, 4)
    calls = []
    monkeypatch.setattr(loop_module.SpecLoop, "_compaction_due", lambda self, shrink: calls.append(shrink) or True)
    expected = target.generate(**enc, max_new_tokens=40, do_sample=False)
    out = SpeculativeDecoder(target, drafts["noisy"], num_draft_tokens=4, backend=backend).generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=40)
    assert out.sequences.tolist() == expected.tolist()
    assert len(calls) > 3


@pytest.mark.parametrize("side_kind", ["dynamic", "static"])
def test_holes_and_compaction_give_the_logits_of_a_cache_without_them(target, side_kind):
    """Two rounds of three slots: row 0 keeps 1 then 3, row 1 keeps 3 then 1. The next token's
    logits equal a plain forward over each row's kept tokens, before and after compaction."""
    side_cls = DynamicSide if side_kind == "dynamic" else StaticSide
    gen = torch.Generator().manual_seed(0)
    prompt, a, b, x = (torch.randint(3, 300, (2, n), generator=gen) for n in (4, 3, 3, 1))
    expected = torch.stack(
        [target(torch.cat([prompt[0], a[0, :1], b[0], x[0]])[None]).logits[0, -1], target(torch.cat([prompt[1], a[1], b[1, :1], x[1]])[None]).logits[0, -1]]
    )
    got = []
    for compact in (False, True):
        side = side_cls(target, 2, 64)
        ahead = torch.arange(3)[None]
        side.forward(prompt, torch.arange(4)[None].expand(2, -1), keep=1)
        side.forward(a, 4 + ahead.expand(2, -1), keep=3)
        side.reject(torch.tensor([0, 2]), 2)
        side.forward(b, torch.tensor([[5], [7]]) + ahead, keep=3)
        side.reject(torch.tensor([2, 0]), 2)
        side.size = 10
        if compact:
            side.compact(8)  # each row holds 8 kept tokens among 10 slots
            assert side.size == 8 and int(side.length) == 8
        got.append(side.forward(x, torch.tensor([[8], [8]]), keep=1)[:, -1])
    for logits in got:
        torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-5)


def test_sliding_window_models_advance_in_lockstep_and_stay_identical(tokenizer, examples):
    """Holes would shift a sliding window, so such pairs advance by the shortest block, losslessly."""
    config = tiny_qwen2(len(tokenizer) + 8, num_layers=2, tokenizer=tokenizer).config
    config.layer_types, config.sliding_window, config.use_sliding_window = ["sliding_attention", "full_attention"], 6, True
    torch.manual_seed(31)
    target = Qwen2ForCausalLM(config).eval()
    target.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    draft = noisy_copy(target, 0.05, 33)
    enc = left_padded_batch(tokenizer, examples, 3)
    expected = target.generate(**enc, max_new_tokens=30, do_sample=False)
    decoder = SpeculativeDecoder(target, draft, num_draft_tokens=3)
    assert not decoder.ragged
    out = decoder.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=30)
    assert out.sequences.tolist() == expected.tolist()


# --- vocabularies and bad input --------------------------------------------------------------


def test_different_embedding_sizes_work_and_padding_ids_are_fed_safely(tokenizer, examples):
    """Target padded +32 rows, draft +8 (7B vs 0.5B); a random target emits padding-row ids the
    draft cannot embed, and output must still equal the target's."""
    target = tiny_qwen2(len(tokenizer) + 32, tokenizer=tokenizer, seed=5, tie_word_embeddings=False, initializer_range=0.3)
    draft = tiny_qwen2(len(tokenizer) + 8, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, tokenizer=tokenizer, seed=6)
    enc = left_padded_batch(tokenizer, examples, 2)
    expected = target.generate(**enc, max_new_tokens=30, do_sample=False)
    assert (expected >= len(tokenizer) + 8).any(), "the case needs a target that emits ids past the draft's rows"
    dec = SpeculativeDecoder(target, draft, num_draft_tokens=3, tokenizer=tokenizer, draft_tokenizer=tokenizer)
    assert dec.vocab_size == len(tokenizer)
    assert dec.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=30).sequences.tolist() == expected.tolist()
    sampled = dec.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=30, do_sample=True, seed=1)
    assert sampled.sequences.shape[0] == 2


def test_disagreeing_tokenizers_are_refused(tokenizer, target, draft):
    other = build_tokenizer(["completely different words here", "zebra quokka"], vocab_size=300)
    with pytest.raises(ValueError, match="tokenizers disagree"):
        SpeculativeDecoder(target, draft, tokenizer=tokenizer, draft_tokenizer=other)


def test_disagreeing_special_ids_are_refused(target, draft):
    other = copy.deepcopy(draft)
    other.config.eos_token_id = 7
    with pytest.raises(ValueError, match="eos_token_id"):
        SpeculativeDecoder(target, other)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"input_ids": torch.zeros(1, 0, dtype=torch.long)}, "non-empty"),
        ({"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.tensor([[1, 1, 1], [0, 0, 0]])}, "empty"),
        ({"input_ids": torch.ones(1, 2000, dtype=torch.long)}, "exceeds the models' context"),
        ({"input_ids": torch.ones(1, 3, dtype=torch.long), "max_new_tokens": 0}, "max_new_tokens"),
        ({"input_ids": torch.ones(1, 3, dtype=torch.long), "do_sample": True, "temperature": 0.0}, "temperature"),
        ({"input_ids": torch.ones(1, 3, dtype=torch.long), "top_p": 1.5}, "top_p"),
    ],
)
def test_bad_generate_input_is_refused(target, draft, kwargs, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeDecoder(target, draft).generate(**kwargs)


def test_bad_construction_is_refused(target, draft):
    with pytest.raises(ValueError, match="num_draft_tokens"):
        SpeculativeDecoder(target, draft, num_draft_tokens=0)
    with pytest.raises(ValueError, match="schedule"):
        SpeculativeDecoder(target, draft, schedule="fastest")
    with pytest.raises(ValueError, match="dtype"):
        SpeculativeDecoder(target, copy.deepcopy(draft).to(torch.float64))
    with pytest.raises(ValueError, match="device"):
        SpeculativeDecoder(target, copy.deepcopy(draft).to("meta"))
