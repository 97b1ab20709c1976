"""The speed model (distill.speculative.costs): the formula by hand, best k, the fitted α, measured
costs, and the backends it times."""

from __future__ import annotations

import json

import pytest

from distill.common.tiny import tiny_qwen2
from distill.speculative.costs import (
    Costs,
    CostSampler,
    best_k,
    expected_tokens_per_round,
    fit_alpha,
    measure_costs,
    predicted_speedup,
    resolve_backend,
    spread_evenly,
)


def test_expected_tokens_per_round_by_hand():
    for k in (1, 3, 8):
        assert expected_tokens_per_round(0.0, k) == 1.0  # nothing accepted: the target's own token only
        assert expected_tokens_per_round(1.0, k) == k + 1  # everything accepted plus the bonus token
    assert expected_tokens_per_round(0.5, 2) == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    assert expected_tokens_per_round(0.7, 4) == pytest.approx((1 - 0.7**5) / (1 - 0.7))
    # 1.75 / (2 * 0.1 + 1.2) = 1.25
    assert predicted_speedup(0.5, 2, c=0.1, v_k=1.2) == pytest.approx(1.25)
    # a free draft and a free verify: speedup is the tokens per round
    assert predicted_speedup(1.0, 4, c=0.0, v_k=1.0) == 5.0
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens_per_round(1.2, 3)
    with pytest.raises(ValueError, match="v\\(k\\)"):
        predicted_speedup(0.5, 2, c=0.1, v_k=0.0)


def test_best_k_is_the_argmax_of_the_predicted_curve(hand_costs):
    # α = 0.8: E = 1.8, 2.44, 2.952, 3.3616 over k·0.2 + v = 1.2, 1.45, 1.7, 2.0 -> 1.50, 1.68, 1.74, 1.68
    curve = {k: predicted_speedup(0.8, k, hand_costs.c, hand_costs.v[k]) for k in hand_costs.v}
    assert [round(curve[k], 2) for k in (1, 2, 3, 4)] == [1.5, 1.68, 1.74, 1.68]
    assert best_k(0.8, hand_costs) == 3
    assert best_k(0.8, hand_costs, k_max=2) == 2
    assert best_k(0.3, hand_costs) == 1  # 1.08, 0.96, 0.83, 0.71: a weak draft wants short blocks
    assert best_k(1.0, Costs(1, 0.01, 0.01, {1: 1.0, 8: 1.0}, "cpu", "float32")) == 8
    with pytest.raises(ValueError, match="no v\\(k\\)"):
        best_k(0.8, hand_costs, k_max=0)


def test_a_round_costs_its_two_token_first_draft_step(hand_costs):
    """The loop's first draft step of a round reads two tokens: a round is c₂ + (k-1)·c + v(k), and
    costs without c₂ (older reports) read it as c, the textbook k·c + v(k)."""
    two = Costs(0.01, 0.002, 0.2, {1: 1.0, 3: 1.1}, "cpu", "float32", c_first=0.3)
    assert two.round_cost(1) == pytest.approx(0.3 + 1.0)
    assert two.round_cost(3) == pytest.approx(0.3 + 2 * 0.2 + 1.1)
    # α = 0.5, k = 3: E = 1.875 over 1.8
    assert two.speedup(0.5, 3) == pytest.approx(1.875 / 1.8)
    assert hand_costs.c_first is None
    assert hand_costs.speedup(0.8, 3) == pytest.approx(predicted_speedup(0.8, 3, hand_costs.c, hand_costs.v[3]))


def test_cost_repeats_spread_evenly_over_a_runs_calls():
    assert spread_evenly(4, 6) == [0, 1, 1, 0, 1, 1]
    assert spread_evenly(20, 3) == [6, 7, 7]
    assert spread_evenly(5, 0) == []


def test_fit_alpha_counts_tested_positions():
    # Three rounds of k = 3 accepting 3, 0 and 1 drafts: 4 successes in 3 + 1 + 2 = 6 tested positions.
    assert fit_alpha([3, 3, 3], [2, 1, 1]) == pytest.approx(4 / 6)
    assert fit_alpha([], []) == 0.0


def test_measure_costs_are_positive_and_sane(tokenizer):
    target = tiny_qwen2(len(tokenizer), hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, tokenizer=tokenizer, seed=3)
    draft = tiny_qwen2(len(tokenizer), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, tokenizer=tokenizer, seed=4)
    costs = measure_costs(target, draft, ks=[1, 2, 4], prompt_len=32, repeats=5, warmup=2)
    assert sorted(costs.v) == [1, 2, 4]
    assert costs.target_step_s > 0 and costs.draft_step_s > 0
    assert 0 < costs.c < 1  # one layer of width 32 against four of width 256
    assert 0 < costs.c_first < 1 and costs.round_cost(2) == pytest.approx(costs.c_first + costs.c + costs.v[2])
    for k, v in costs.v.items():
        assert 0.2 < v < 4 * (k + 1), (k, v)  # verifying k+1 tokens costs about one step, never wildly more
    assert costs.device == "cpu" and costs.dtype == "float32" and costs.prompt_len == 32
    assert json.loads(json.dumps(costs.to_dict()))["v"].keys() == {"1", "2", "4"}
    with pytest.raises(ValueError, match="context"):
        measure_costs(target, draft, ks=[4], prompt_len=1022)


def test_costs_are_ratios_within_each_repeat_so_drift_cancels(tokenizer):
    """Repeats spread over a long run see the machine at different speeds: the second repeat here runs
    at half speed throughout, so every ratio is unchanged, while a ratio of medians would mix speeds."""
    target = tiny_qwen2(len(tokenizer), hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, tokenizer=tokenizer, seed=3)
    draft = tiny_qwen2(len(tokenizer), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, tokenizer=tokenizer, seed=4)
    sampler = CostSampler(target, {"d": draft}, ks=[1, 3], prompt_len=8, warmup=0)
    hand = {"target": [0.100, 0.200, 0.100], ("draft", "d"): [0.040, 0.080, 0.050], ("first", ("draft", "d")): [0.045, 0.090, 0.055]}
    hand |= {1: [0.105, 0.210, 0.105], 3: [0.110, 0.220, 0.120]}
    sampler.times = hand
    costs = sampler.costs()["d"]
    assert costs.target_step_s == pytest.approx(0.100) and costs.draft_step_s == pytest.approx(0.050)
    assert costs.c == pytest.approx(0.4) and costs.c_first == pytest.approx(0.45)  # medians of 0.4, 0.4, 0.5 and 0.45, 0.45, 0.55
    assert costs.v == pytest.approx({1: 1.05, 3: 1.1}) and costs.repeats == 3


def test_the_speedup_model_refuses_the_compiled_backend(target, draft):
    """Its costs come from the eager or static steps; a compiled draft's would be mis-measured."""
    with pytest.raises(ValueError, match="backend='static' or 'eager'"):
        resolve_backend("compiled", target, draft)
    assert resolve_backend("static", target, draft) == "static"
