"""scripts/bench_vllm.py (distill.engines.vllm) without vLLM: the counter reader, the per-prompt deltas, the
per-request counts, the report and its rendering, on a stand-in engine that returns known counts the way
vLLM's worker does (cumulative counters read before and after each call). The real engine is
tests/test_real.py's, run where `distill vllm-env` has made vLLM's environment."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from distill.common.docs import render_benchmark
from distill.engines import vllm_worker
from distill.engines.vllm import Counts, EngineError, counted_as_distill, counts_of, crossover, main, read_counters, request_counts

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_vllm.py"
K = 3
# Accepted draft tokens per round for each prompt, per draft: "b" differs from "a" at one position of one
# round only (prompt 1, its second round: 2 accepted instead of 3), so a delta taken wrongly cannot pass.
ROUNDS = {"a": [[3, 1, 0], [3, 3, 2], [2, 0, 3], [1, 1, 1]], "b": [[3, 1, 0], [3, 2, 2], [2, 0, 3], [1, 1, 1]]}


def _snapshot(c: Counts) -> dict[str, Any]:
    return {
        "vllm:spec_decode_num_drafts": c.drafts,
        "vllm:spec_decode_num_draft_tokens": c.drafted,
        "vllm:spec_decode_num_accepted_tokens": c.accepted,
        "vllm:spec_decode_num_accepted_tokens_per_pos": list(c.per_position),
    }


class StandIn:
    """What vllm_worker.py replies, for a scripted draft: its prompt ids rendered by the same chat template,
    its output (the target's, so greedy identity holds) and cumulative counters since it started."""

    def __init__(self, config: dict[str, Any], tokenizer, calls: list):
        self.config, self.tokenizer, self.calls = config, tokenizer, calls
        self.name = Path(config["draft"]).name if config["draft"] else None
        self.total = Counts(per_position=(0,) * K) if self.name else Counts()
        self.info = {"vllm": "stand-in"}
        self.seen = 0

    def _ids(self, messages) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(self, prompts, sampling, concurrency):
        self.calls.append((self.name, len(prompts), concurrency))
        before, results = self.total, []
        for messages in prompts:
            index = int(re.search(r"anna has (\d+) apples", messages[-1]["content"]).group(1))
            rounds = ROUNDS[self.name][index] if self.name else []
            n = 1 + sum(a + 1 for a in rounds) if rounds else 10
            if self.name:
                self.total = Counts(
                    self.total.drafts + len(rounds),
                    self.total.drafted + K * len(rounds),
                    self.total.accepted + sum(rounds),
                    tuple(p + sum(a > j for a in rounds) for j, p in enumerate(self.total.per_position)),
                )
            results.append(
                {
                    "prompt_ids": self._ids(messages),
                    "output_ids": list(range(n)),
                    "finish_reason": "stop",
                    "wall_s": 1.0 if self.name else 2.0,
                    "ttft_s": 0.1,
                    "decode_s": 0.5 if self.name else 1.5,
                    "queued_s": 0.0,
                    "per_step_accepted": rounds if self.name else None,
                    "per_step_drafted": [K] * len(rounds) if self.name else None,
                }
            )
        self.seen += len(prompts)
        return {"results": results, "counters_before": _snapshot(before), "counters_after": _snapshot(self.total), "wall_s": 1.0 * len(prompts)}

    def close(self):
        pass


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_pair):
    """A tiny target and drafts as folders (a and b: the stand-in engine scripts their counts; smaller: a draft of
    fewer embedding rows, which vLLM refuses), a GSM8K-like file and a `distill accept` report."""
    root = tmp_path_factory.mktemp("bench_vllm")
    for name, model in (("target", tiny_pair.target), ("a", tiny_pair.target), ("b", tiny_pair.target), ("smaller", tiny_pair.draft)):
        model.save_pretrained(root / name)
        tiny_pair.tokenizer.save_pretrained(root / name)
    rows = [{"question": f"anna has {i} apples and gets 4 more . how many ?", "answer": f"{i} + 4 = {i + 4} #### {i + 4}"} for i in range(4)]
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = {
        "settings": {"num_draft_tokens": 3, "num_samples": {"gsm8k": 4}, "max_new_tokens_per_task": {"gsm8k": 16}, "mode": "greedy", "dtype": "float32"},
        "drafts": {"a": {"tasks": {"gsm8k": {"acceptance_rate": 0.5}}}, "b": {"tasks": {"gsm8k": {"acceptance_rate": 0.47}}}},
        "comparisons": [{"task": "gsm8k", "draft": "b", "reference": "a", "acceptance_rate": {"value": -0.03, "low": -0.05, "high": -0.01, "level": 0.95}}],
    }
    (root / "ours.json").write_text(json.dumps(report))
    return root


def _args(setup: Path, out: Path, *extra: str) -> list[str]:
    return [
        *["--target", str(setup / "target"), "--draft", f"a={setup / 'a'}", "--draft", f"b={setup / 'b'}"],
        *["--data-file", str(setup / "test.jsonl"), "--num-prompts", "4", "--max-new-tokens", "16", "--ours", str(setup / "ours.json")],
        *["--json", str(out / "report.json"), *extra],
    ]


def _launcher(tokenizer, calls):
    return lambda config: StandIn(config, tokenizer, calls)


def test_the_counter_reader_takes_differences_of_cumulative_readings():
    before = read_counters(_snapshot(Counts(4, 12, 7, (4, 2, 1))))
    after = read_counters(_snapshot(Counts(9, 27, 15, (8, 5, 2))))
    assert after - before == Counts(5, 15, 8, (4, 3, 1))
    assert counts_of({"counters_before": _snapshot(Counts(4, 12, 7, (4, 2, 1))), "counters_after": _snapshot(Counts(9, 27, 15, (8, 5, 2)))}).accepted == 8
    assert read_counters({}) == Counts()  # the target alone has no speculative counters
    with pytest.raises(EngineError, match="went back"):
        _ = before - after
    # one request's own counts from its rounds: accepted [3, 1, 0] of 3 each -> position 1 twice, 2 and 3 once
    assert request_counts({"per_step_accepted": [3, 1, 0], "per_step_drafted": [3, 3, 3]}, 3) == Counts(3, 9, 4, (2, 1, 1))
    # counted as the distill decoder counts under an 8-token limit: round 1 proposes 3 (7 tokens left), round 2
    # only 2 (3 left: two drafts and the target's token), and the third round is past the limit
    assert counted_as_distill({"per_step_accepted": [3, 3, 3], "per_step_drafted": [3, 3, 3]}, 8) == (5, 5)


def test_the_worker_sums_vllms_metrics_over_engines():
    """vllm_worker.metrics (run inside vLLM's environment) on objects shaped as `LLM.get_metrics()` returns them."""

    class M:
        def __init__(self, name, value=None, values=None):
            self.name, self.value, self.values = name, value, values

    class LLM:
        def get_metrics(self):
            return [
                M("vllm:spec_decode_num_drafts", 3),
                M("vllm:spec_decode_num_draft_tokens", 9),
                M("vllm:spec_decode_num_accepted_tokens", 5),
                M("vllm:spec_decode_num_accepted_tokens_per_pos", values=[3, 1, 1]),
                M("vllm:spec_decode_num_accepted_tokens_per_pos", values=[1, 0, 0]),
                M("vllm:generation_tokens", 40),
            ]

    assert read_counters(vllm_worker.metrics(LLM())) == Counts(3, 9, 5, (4, 1, 1))


def test_one_request_at_a_time_report_pairs_and_renders(setup, tmp_path, tiny_pair):
    calls: list = []
    docs = tmp_path / "docs" / "benchmarks.md"
    docs.parent.mkdir()
    docs.write_text("# Benchmarks\n")
    assert main(_args(setup, tmp_path, "--docs", str(docs)), launcher=_launcher(tiny_pair.tokenizer, calls)) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    a, b = report["drafts"]["a"], report["drafts"]["b"]
    # a: accepted 4 + 8 + 5 + 3 = 20 of 4 prompts x 3 rounds x 3 = 36 drafted; b one fewer
    assert (a["accepted"], a["drafted"], a["drafts"]) == (20, 36, 12) and (b["accepted"], b["drafted"]) == (19, 36)
    assert a["acceptance"]["value"] == pytest.approx(20 / 36) and b["acceptance"]["value"] == pytest.approx(19 / 36)
    assert a["acceptance_counted_as_distill"]["value"] == pytest.approx(20 / 36)  # no output reaches the 16-token limit
    # per position, over 12 rounds: a accepts position 1 in 10 rounds, 2 in 6, 3 in 4; b loses position 3 once
    assert a["per_position_accepted"] == [10, 6, 4] and b["per_position_accepted"] == [10, 6, 3]
    assert [p["value"] for p in a["per_position"]] == pytest.approx([10 / 12, 6 / 12, 4 / 12])
    # outputs: 1 + sum(accepted + 1) tokens; target forwards: 1 + rounds
    assert a["tokens_per_target_forward"]["value"] == pytest.approx((4 * 1 + 20 + 12) / (4 + 12))
    # decode speedup = TPOT alone / TPOT with the draft: 1.5 s over 9 tokens against 0.5 s over the draft's tokens - 1
    assert a["decode_speedup"]["value"] == pytest.approx((4 * 1.5 / 36) / (4 * 0.5 / (20 + 12)))
    assert a["end_to_end_speedup"]["value"] == pytest.approx((36 / 4) / (40 / 8))
    assert a["identical_outputs"] == 0 and a["request_counts_agree"] == 4  # the stand-in's target writes 10 tokens
    [c] = report["comparisons"]
    assert (c["draft"], c["reference"]) == ("b", "a") and c["vllm"]["value"] == pytest.approx(-1 / 36)
    assert c["ours"]["value"] == -0.03 and c["vllm_minus_ours"] == pytest.approx(-1 / 36 + 0.03)
    assert a["ours"]["acceptance"] == 0.5 and a["ours"]["settings_differ"] is None
    # interleaved: each prompt's target-alone call just before the draft's, one request each
    assert calls[:4] == [(None, 1, 1), ("a", 1, 1), (None, 1, 1), ("a", 1, 1)] and len(calls) == 16
    assert report["cpu"]["name"] and "bf16" in report["cpu"]["bf16"] and report["vllm"]["vllm"] == "stand-in"
    saved = json.loads((tmp_path / "docs" / "results" / "bench_vllm.json").read_text())
    text = docs.read_text()
    assert "<!-- results:bench_vllm -->" in text and render_benchmark(saved) in text
    assert "0.556 [" in text and "−" in text and "20/36" in text
    # the same command again resumes from the journal: no engine is asked anything
    calls.clear()
    assert main(_args(setup, tmp_path), launcher=_launcher(tiny_pair.tokenizer, calls)) == 0
    assert calls == [] and json.loads((tmp_path / "report.json").read_text())["drafts"]["b"]["accepted"] == 19


def test_a_stopped_run_resumes_at_the_next_prompt(setup, tmp_path, tiny_pair):
    calls: list = []

    def flaky(config):
        engine = StandIn(config, tiny_pair.tokenizer, calls)
        if engine.name == "b":
            real = engine.generate

            def generate(prompts, sampling, concurrency):
                if engine.seen == 2:
                    raise EngineError("the engine died")
                return real(prompts, sampling, concurrency)

            engine.generate = generate
        return engine

    assert main(_args(setup, tmp_path), launcher=flaky) == 1
    calls.clear()
    assert main(_args(setup, tmp_path), launcher=_launcher(tiny_pair.tokenizer, calls)) == 0
    assert calls == [(None, 1, 1), ("b", 1, 1), (None, 1, 1), ("b", 1, 1)]  # b's prompts 3 and 4 only
    assert json.loads((tmp_path / "report.json").read_text())["drafts"]["b"]["accepted"] == 19


def test_concurrency_study_uses_per_request_counts_and_names_the_crossover(setup, tmp_path, tiny_pair):
    calls: list = []
    assert main(_args(setup, tmp_path, "--concurrency", "1,2,4", "--skip-single"), launcher=_launcher(tiny_pair.tokenizer, calls)) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert calls == [(None, 4, 1), ("a", 4, 1), (None, 4, 2), ("a", 4, 2), (None, 4, 4), ("a", 4, 4)] + [
        (None, 4, c) if i % 2 == 0 else ("b", 4, c) for c in (1, 2, 4) for i in range(2)
    ]
    row = report["concurrency"]["b"]["2"]
    assert row["draft"]["accepted"] == 19 and row["draft"]["drafted"] == 36 and row["draft"]["rounds"] == 12
    # tokens: target alone 4 x 10 in 4 s; draft 4 + 19 + 12 = 35 in 4 s
    assert row["speedup"] == pytest.approx(35 / 40) and report["crossover"] == {"a": 1, "b": 1}
    assert row["draft"]["tokens_per_round"] == pytest.approx(31 / 12)
    assert crossover({"x": {"1": {"speedup": 1.3}, "2": {"speedup": 1.1}, "4": {"speedup": 0.9}}, "y": {"1": {"speedup": 1.2}}}) == {"x": 4, "y": None}


def test_a_refused_draft_is_recorded_with_both_lines(setup, tmp_path, tiny_pair):
    """A draft of another vocab_size: this project's line first, then vLLM's own message, and the rest go on."""
    smaller = setup / "smaller"
    calls: list = []

    def launch(config):
        if config["draft"] == str(smaller):
            raise EngineError("ValueError: Target and draft model should have the same vocabulary size.")
        return StandIn(config, tiny_pair.tokenizer, calls)

    args = _args(setup, tmp_path) + ["--draft", f"c={smaller}"]
    assert main(args, launcher=launch) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert "vocab_size" in report["refused"]["c"]["distill"] and "same vocabulary size" in report["refused"]["c"]["vllm"]
    assert "c" not in report["drafts"] and set(report["drafts"]) == {"a", "b"}


def test_bad_input_is_one_line_and_exit_2(setup, tmp_path, tiny_pair, capsys):
    launch = _launcher(tiny_pair.tokenizer, [])
    assert main(["--target", str(tmp_path), "--draft", f"a={setup / 'a'}"], launcher=launch) == 2
    assert "not a Hugging Face model folder" in capsys.readouterr().err
    assert main(["--target", str(setup / "target"), "--draft", f"a={setup / 'a'}", "--concurrency", "0,2"], launcher=launch) == 2
    assert "--concurrency 0,2" in capsys.readouterr().err
    assert main(["--target", str(setup / "target"), "--draft", f"a={setup / 'a'}", "--draft-sample-methods", "topk"], launcher=launch) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "greedy, probabilistic" in err


def test_without_vllms_environment_it_is_skipped(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--target", "t", "--draft", "a=d", "--venv", str(tmp_path / "none")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "skipped" in done.stdout and "distill vllm-env" in done.stdout


def test_one_engine_at_a_time_interleaves_in_blocks(setup, tmp_path, tiny_pair):
    """--block 2: the target alone on a block's prompts, then the draft on them, never two engines at once; the same figures."""
    calls: list = []
    alive: list = []

    def launch(config):
        engine = StandIn(config, tiny_pair.tokenizer, calls)
        alive.append(engine)
        assert len(alive) == 1, "two engines running at once"
        engine.close = lambda: alive.remove(engine)
        return engine

    assert main(_args(setup, tmp_path, "--block", "2"), launcher=launch) == 0
    assert calls[:6] == [(None, 1, 1), (None, 1, 1), ("a", 1, 1), ("a", 1, 1), (None, 1, 1), (None, 1, 1)] and alive == []
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["drafts"]["b"]["accepted"] == 19 and report["settings"]["engines_at_once"] == 1
