"""A synthetic draft whose acceptance is what it was set to (distill.commands.synthetic): accepted
always at α = 1, never at α = 0, position j with probability α^j between, and the target's greedy
output kept in both loops."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import DynamicCache

from distill.commands.synthetic import SyntheticDraft, TargetBaseline, greedy_decode, run_synthetic, synthetic_sweep, target_baseline
from distill.speculative import SpeculativeDecoder
from distill.speculative.costs import measure_costs, predicted_speedup


@pytest.fixture(scope="module")
def pair(tiny_pair):
    """The shared pair, its target emitting tokenizer ids only: every token it emits can be proposed."""
    return tiny_pair.real_vocab_target, tiny_pair.draft


def _prompts(tokenizer, examples, n):
    return [tokenizer(examples[i]["prompt"], return_tensors="pt")["input_ids"] for i in range(n)]


def _no_eos(model):
    """The model's generation config with EOS stopping off, so `generate` runs the full length."""
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None
    return config


def _synthetic_run(target, draft, ids, alpha, k, max_new_tokens, seed=0):
    reference, _, _ = greedy_decode(target, ids, max_new_tokens)
    synthetic = SyntheticDraft(draft, [reference[0]], alpha, seed=seed)
    out = SpeculativeDecoder(target, synthetic, num_draft_tokens=k).generate(ids, max_new_tokens=max_new_tokens, eos_token_id=[])
    return reference, out


def test_synthetic_draft_at_alpha_one_is_always_accepted(pair, tokenizer, examples):
    target, draft = pair
    k, rounds = 3, 5
    ids = _prompts(tokenizer, examples, 1)[0]
    reference, out = _synthetic_run(target, draft, ids, 1.0, k, 1 + rounds * (k + 1))
    stats = out.stats
    assert stats.acceptance_rate == 1.0
    assert stats.per_position_acceptance == [1.0] * k
    assert stats.rounds == rounds and stats.target_forwards == rounds + 1  # prefill + one verify per round
    # k + 1 tokens per verify; only the prefill's single token pulls the average below k + 1
    assert stats.tokens_per_target_forward == pytest.approx((1 + rounds * (k + 1)) / (rounds + 1))
    assert out.sequences.tolist() == reference.tolist()


def test_synthetic_draft_at_alpha_zero_is_never_accepted(pair, tokenizer, examples):
    target, draft = pair
    ids = _prompts(tokenizer, examples, 1)[0]
    reference, out = _synthetic_run(target, draft, ids, 0.0, 4, 20)
    assert out.stats.accepted == 0 and out.stats.acceptance_rate == 0.0
    assert out.stats.tokens_per_target_forward == 1.0
    assert out.sequences.tolist() == reference.tolist()


def test_synthetic_acceptance_follows_the_per_position_rule(pair, tokenizer, examples, hand_costs):
    """With success α independently per position, a round of k accepts Σ_{i=1..k} α^i drafts on
    average, position j is accepted with probability α^j, and acceptance_rate is that sum over k."""
    target, draft = pair
    alpha, k = 0.6, 3
    prompts = _prompts(tokenizer, examples, 4)
    decoded = [greedy_decode(target, p, 200) for p in prompts]  # a baseline of one's own: not re-timed
    baseline = TargetBaseline([d[0] for d in decoded], [d[1] for d in decoded], [d[2] for d in decoded])
    result = run_synthetic(target, draft, alpha, k, prompts, max_new_tokens=200, costs=hand_costs, baseline=baseline, seed=0)
    expected = sum(alpha**i for i in range(1, k + 1))  # 1.176
    rounds = result["rounds"]
    assert rounds > 300
    # Accepted length per round has std ≈ 1.17 here: the tolerances are about 3 standard errors.
    assert result["expected_accepted_length"] == pytest.approx(expected)
    assert result["mean_accepted_length"] == pytest.approx(expected, abs=3 * 1.17 / math.sqrt(rounds))
    assert result["acceptance_rate"] == pytest.approx(expected / k, abs=1.2 / math.sqrt(rounds))
    assert result["measured_alpha"] == pytest.approx(alpha, abs=0.05)
    for j, rate in enumerate(result["per_position_acceptance"], start=1):
        assert rate == pytest.approx(alpha**j, abs=0.08), j
    assert result["greedy_identity"] == 1.0
    assert result["predicted_speedup"] == pytest.approx(predicted_speedup(result["measured_alpha"], k, 0.2, 1.1))
    assert result["speedup"] > 0 and result["decode_speedup"] > 0


@pytest.mark.parametrize("k,backend", [(1, "eager"), (4, "eager"), (3, "static")])
def test_synthetic_draft_keeps_greedy_output_identical_to_generate(target, draft, tokenizer, examples, k, backend):
    """The conftest pair pads the target's embedding past the draft's: target tokens the draft cannot
    propose are just rejections, and every emitted token is still the target's, in both loops."""
    tokenizer.padding_side = "left"
    enc = tokenizer([examples[2]["prompt"], examples[3]["prompt"] + " " + examples[3]["response"]], return_tensors="pt", padding=True)
    expected = target.generate(**enc, max_new_tokens=24, do_sample=False, generation_config=_no_eos(target))
    rows = [seq[mask.bool()] for seq, mask in zip(expected, torch.nn.functional.pad(enc["attention_mask"], (0, 24), value=1))]
    synthetic = SyntheticDraft(draft, rows, alpha=0.7, seed=1)
    out = SpeculativeDecoder(target, synthetic, num_draft_tokens=k, backend=backend).generate(
        enc["input_ids"], enc["attention_mask"], max_new_tokens=24, eos_token_id=[]
    )
    assert out.sequences.tolist() == expected.tolist()
    assert out.stats.accepted > 0  # the left-padded rows' positions were found (position_ids path)


def test_run_synthetic_through_the_static_loop(pair, tokenizer, examples):
    """The static loop (graphed on CUDA, run step by step here) as both baseline and decoder, with
    one decoder reused across α: identity holds and acceptance follows each α in turn."""
    target, draft = pair
    prompts = _prompts(tokenizer, examples, 2)
    costs = measure_costs(target, draft, ks=[2], prompt_len=16, repeats=2, backend="static")
    baseline = target_baseline(target, prompts, 20, backend="static")
    assert baseline.backend == "static"
    assert [s.tolist() for s in baseline.sequences] == [greedy_decode(target, p, 20)[0].tolist() for p in prompts]
    rows = synthetic_sweep(target, draft, [0.0, 1.0], [2], prompts, 20, costs=costs, backend="static")
    assert [(r["alpha"], r["k"], r["backend"]) for r in rows] == [(0.0, 2, "static"), (1.0, 2, "static")]
    assert rows[0]["acceptance_rate"] == 0.0 and rows[1]["acceptance_rate"] == 1.0
    assert all(r["greedy_identity"] == 1.0 for r in rows)


def test_synthetic_draft_refuses_a_batch_it_was_not_built_for(pair):
    target, draft = pair
    synthetic = SyntheticDraft(draft, [torch.arange(10), torch.arange(12)], alpha=0.5)
    with pytest.raises(ValueError, match="use_rows"):
        synthetic(input_ids=torch.zeros(1, 3, dtype=torch.long))
    synthetic.use_rows([1])  # the second continuation alone: 0..11, so position q proposes q + 1 or a wrong token
    cache = DynamicCache(config=draft.config)
    logits = synthetic(input_ids=torch.arange(5)[None], cache=cache, use_cache=True, logits_to_keep=3).logits
    proposed = logits.argmax(-1)[0].tolist()
    assert all(p in (q + 1, q) for p, q in zip(proposed, [2, 3, 4]))  # q + 1 if hit, else (q + 1) - 1
    assert synthetic(input_ids=torch.tensor([[5]]), cache=cache, use_cache=True).logits.argmax(-1).item() in (5, 6)
    with pytest.raises(ValueError, match="alpha"):
        SyntheticDraft(draft, [torch.arange(10)], alpha=1.5)
