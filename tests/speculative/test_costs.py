"""The speed model: the formula by hand, best k and measured costs (distill.speculative.costs), a
synthetic draft whose acceptance is what it was set to (distill.commands.synthetic), `distill bench` end to
end on tiny models (distill.commands.bench)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from transformers import DynamicCache

from distill.commands.bench import main
from distill.commands.synthetic import SyntheticDraft, TargetBaseline, greedy_decode, run_synthetic, synthetic_sweep, target_baseline
from distill.common.tiny import tiny_qwen2
from distill.speculative import SpeculativeDecoder
from distill.speculative.costs import (
    Costs,
    best_k,
    expected_tokens_per_round,
    fit_alpha,
    measure_costs,
    predicted_speedup,
    resolve_backend,
)

# Costs that make every prediction below a number checked by hand.
HAND_COSTS = Costs(target_step_s=0.01, draft_step_s=0.002, c=0.2, v={1: 1.0, 2: 1.05, 3: 1.1, 4: 1.2}, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def pair(tokenizer):
    """An untied target with diverse greedy output and a smaller draft, sharing the tokenizer's vocabulary."""
    target = tiny_qwen2(len(tokenizer), hidden_size=64, num_layers=2, tokenizer=tokenizer, seed=21, tie_word_embeddings=False, initializer_range=0.1)
    draft = tiny_qwen2(
        len(tokenizer),
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        tokenizer=tokenizer,
        seed=22,
        tie_word_embeddings=False,
        initializer_range=0.1,
    )
    return target, draft


def _prompts(tokenizer, examples, n):
    return [tokenizer(examples[i]["prompt"], return_tensors="pt")["input_ids"] for i in range(n)]


def _no_eos(model):
    """The model's generation config with EOS stopping off, so `generate` runs the full length."""
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None
    return config


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


def test_best_k_is_the_argmax_of_the_predicted_curve():
    # α = 0.8: E = 1.8, 2.44, 2.952, 3.3616 over k·0.2 + v = 1.2, 1.45, 1.7, 2.0 -> 1.50, 1.68, 1.74, 1.68
    curve = {k: predicted_speedup(0.8, k, HAND_COSTS.c, HAND_COSTS.v[k]) for k in HAND_COSTS.v}
    assert [round(curve[k], 2) for k in (1, 2, 3, 4)] == [1.5, 1.68, 1.74, 1.68]
    assert best_k(0.8, HAND_COSTS) == 3
    assert best_k(0.8, HAND_COSTS, k_max=2) == 2
    assert best_k(0.3, HAND_COSTS) == 1  # 1.08, 0.96, 0.83, 0.71: a weak draft wants short blocks
    assert best_k(1.0, Costs(1, 0.01, 0.01, {1: 1.0, 8: 1.0}, "cpu", "float32")) == 8
    with pytest.raises(ValueError, match="no v\\(k\\)"):
        best_k(0.8, HAND_COSTS, k_max=0)


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
    assert costs.c == pytest.approx(costs.draft_step_s / costs.target_step_s)
    assert 0 < costs.c < 1  # one layer of width 32 against four of width 256
    for k, v in costs.v.items():
        assert 0.2 < v < 4 * (k + 1), (k, v)  # verifying k+1 tokens costs about one step, never wildly more
    assert costs.device == "cpu" and costs.dtype == "float32" and costs.prompt_len == 32
    assert json.loads(json.dumps(costs.to_dict()))["v"].keys() == {"1", "2", "4"}
    with pytest.raises(ValueError, match="context"):
        measure_costs(target, draft, ks=[4], prompt_len=1022)


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


def test_synthetic_acceptance_follows_the_per_position_rule(pair, tokenizer, examples):
    """With success α independently per position, a round of k accepts Σ_{i=1..k} α^i drafts on
    average, position j is accepted with probability α^j, and acceptance_rate is that sum over k."""
    target, draft = pair
    alpha, k = 0.6, 3
    prompts = _prompts(tokenizer, examples, 4)
    decoded = [greedy_decode(target, p, 200) for p in prompts]  # a baseline of one's own: not re-timed
    baseline = TargetBaseline([d[0] for d in decoded], [d[1] for d in decoded], [d[2] for d in decoded])
    result = run_synthetic(target, draft, alpha, k, prompts, max_new_tokens=200, costs=HAND_COSTS, baseline=baseline, seed=0)
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


def test_bench_runs_end_to_end_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    md = tmp_path / "benchmarks.md"
    rc = main(
        [
            "--ks",
            "1..2",
            "--synthetic-acceptance",
            "0.8",
            "--prompt-len",
            "16",
            "--num-prompts",
            "1",
            "--max-new-tokens",
            "12",
            "--repeats",
            "2",
            "--json",
            str(out),
            "--markdown",
            str(md),
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert set(report["costs"]["v"]) == {"1", "2"} and report["costs"]["c"] > 0
    assert report["alphas"] == [0.8]
    assert [(p["alpha"], p["k"]) for p in report["predicted"]] == [(0.8, 1), (0.8, 2)]
    assert report["best_k"][0]["best_k"] in (1, 2)
    assert [(r["alpha"], r["k"]) for r in report["synthetic"]] == [(0.8, 1), (0.8, 2)]
    assert all(r["greedy_identity"] == 1.0 and r["speedup"] > 0 for r in report["synthetic"])
    assert report["environment"]["torch"] == torch.__version__
    printed = capsys.readouterr().out
    assert "| k | v(k) | α = 0.8 |" in printed and "best k" in printed and "measured α" in printed
    assert "<!-- distill-bench -->" in md.read_text()


def test_bench_builds_random_models_from_config_files(tmp_path, tokenizer, capsys):
    paths = []
    for name, hidden, layers in (("target", 64, 2), ("draft", 32, 1)):
        config = tiny_qwen2(len(tokenizer), hidden_size=hidden, num_layers=layers, num_heads=2, num_kv_heads=1, tokenizer=tokenizer).config
        paths.append(tmp_path / f"{name}.json")
        config.to_json_file(paths[-1])
    out = tmp_path / "bench.json"
    # No --alpha and no synthetic runs: α is measured with the (random) draft on random-id prompts.
    assert (
        main(
            [
                "--model-config-target",
                str(paths[0]),
                "--model-config-draft",
                str(paths[1]),
                "--ks",
                "1,3",
                "--prompt-len",
                "8",
                "--num-prompts",
                "2",
                "--max-new-tokens",
                "8",
                "--repeats",
                "2",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["alpha_source"].startswith("measured with the real draft") and report["synthetic"] == []
    assert len(report["alphas"]) == 1 and 0.0 <= report["alphas"][0] <= 1.0
    assert set(report["costs"]["v"]) == {"1", "3"}
    assert "random weights of target.json" in capsys.readouterr().out


def test_bench_refuses_bad_arguments(capsys):
    with pytest.raises(SystemExit, match="both a target and a draft"):
        main(["--target", "some/model"])
    with pytest.raises(SystemExit):
        main(["--ks", "0..2"])
    assert "draft lengths >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--alpha", "1.5"])
    assert "[0, 1]" in capsys.readouterr().err


def test_the_speedup_model_refuses_the_compiled_backend(target, draft):
    """Its costs come from the eager or static steps; a compiled draft's would be mis-measured."""
    with pytest.raises(ValueError, match="backend='static' or 'eager'"):
        resolve_backend("compiled", target, draft)
    assert resolve_backend("static", target, draft) == "static"
