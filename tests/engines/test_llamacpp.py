"""scripts/bench_llamacpp.py (distill.engines.llamacpp) without llama.cpp: its parsing of the lines
llama.cpp's llama-speculative-simple and llama-completion print (captured from the build vendored in
llama-cpp-python 0.3.36, running GGUFs `distill export-gguf` wrote), the prompt-id check, the pooled
figures and the JSON report through a stand-in runner, and the message it skips with when llama.cpp is absent."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from distill.commands.render_docs import main as render_docs
from distill.engines.llamacpp import (
    LlamaCppOutputError,
    find_tools,
    main,
    parse_completion,
    parse_speculative,
    skip_message,
    speculative_args,
)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_llamacpp.py"

# llama-speculative-simple's first round (a --log-verbosity 5 debug line) and closing lines (stderr),
# timestamps as this build's LOG_DBG and LOG_INF print them.
SPECULATIVE = """\
0.00.018.119 I common_speculative_init_result: loading draft model 'd-f16.gguf'
0.00.021.502 D accepted 2/3 draft tokens, the last target token is: (1249)
0.00.022.311 D accepted 0/3 draft tokens, the last target token is: (311)
0.00.039.994 I encoded   11 tokens in    0.001 seconds, speed: 17973.855 t/s
0.00.040.005 I decoded   33 tokens in    0.017 seconds, speed: 1955.440 t/s
0.00.040.011 I
0.00.040.015 I n_draft   = 3
0.00.040.020 I n_predict = 33
0.00.040.026 I n_drafted = 93
0.00.040.030 I n_accept  = 0
0.00.040.035 I accept    = 0.000%
0.00.040.040 I
0.00.040.046 I draft:
0.00.040.072 I target:
0.00.040.098 I common_perf_print: prompt eval time =       6.34 ms /   136 tokens (    0.05 ms per token, 21440.96 tokens per second)
0.00.040.103 I common_perf_print:        eval time =       0.50 ms /     2 runs   (    0.25 ms per token,  4016.06 tokens per second)
"""

# llama-completion --verbose-prompt: the prompt's ids (a piece may hold a newline), then the perf lines.
COMPLETION = """\
0.00.016.946 I llama_completion: prompt: '<|im_start|>user
anna<|im_end|>
'
0.00.017.293 I llama_completion: number of tokens in prompt = 5
0.00.017.300 I      1 -> '<|im_start|>'
0.00.017.305 I     87 -> 'user'
0.00.017.501 I    201 -> '
'
0.00.017.510 I    362 -> 'anna'
0.00.017.497 I      2 -> '<|im_end|>'
0.00.017.540 I
0.00.017.862 I generate: n_ctx = 256, n_batch = 2048, n_predict = 16, n_keep = 0
0.00.020.274 I common_perf_print: prompt eval time =       1.15 ms /    54 tokens (    0.02 ms per token, 46997.39 tokens per second)
0.00.020.279 I common_perf_print:        eval time =       0.68 ms /    15 runs   (    0.05 ms per token, 22058.82 tokens per second)
"""


def test_speculative_output_is_parsed():
    run = parse_speculative(SPECULATIVE)
    assert (run.n_input, run.n_predict, run.seconds, run.n_draft, run.n_drafted, run.n_accept) == (11, 33, 0.017, 3, 93, 0)
    assert (run.first_accept, run.first_drafted) == (2, 3)  # the first round's line, not a later one
    assert parse_speculative(SPECULATIVE.replace("0.00.040.015 I ", "")).n_draft == 3  # without the timestamp prefix too
    with pytest.raises(LlamaCppOutputError, match="no 'decoded N tokens"):
        parse_speculative("error: failed to load model")
    with pytest.raises(LlamaCppOutputError, match="no n_accept"):
        parse_speculative(SPECULATIVE.replace("n_accept  = 0", ""))
    with pytest.raises(LlamaCppOutputError, match="--log-verbosity 5"):
        parse_speculative("\n".join(line for line in SPECULATIVE.splitlines() if " D " not in line))


def test_completion_output_is_parsed():
    run = parse_completion(COMPLETION)
    assert run.prompt_ids == [1, 87, 201, 362, 2] and (run.n_eval, run.eval_ms) == (15, 0.68)  # not the prompt eval line
    plain = "\n".join(line.split(" I ", 1)[-1] for line in COMPLETION.splitlines())
    assert parse_completion(plain).prompt_ids == [1, 87, 201, 362, 2]
    with pytest.raises(LlamaCppOutputError, match="--verbose-prompt"):
        parse_completion(COMPLETION.replace("number of tokens in prompt = 5", ""))
    with pytest.raises(LlamaCppOutputError, match="announced 6 prompt tokens but printed 5"):
        parse_completion(COMPLETION.replace("prompt = 5", "prompt = 6"))


def test_exactly_k_draft_tokens_every_round():
    assert speculative_args(3) == ["--spec-type", "draft-simple", "--spec-draft-n-min", "3", "--spec-draft-n-max", "3", "--draft-p-min", "0"]


def test_without_llama_cpp_the_script_is_skipped_with_a_message(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path), "OMP_NUM_THREADS": "1"}  # no llama.cpp tools on PATH
    done = subprocess.run([sys.executable, str(SCRIPT), "--target", "t.gguf", "--draft", "base=d.gguf"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == skip_message() and "skipped" in done.stdout and "build-llamacpp" in done.stdout
    assert not (tmp_path / "llamacpp-report.json").exists()
    assert find_tools(tmp_path) is None
    assert "in --llama-cpp /nowhere" in skip_message("/nowhere")


def _fake_tools(folder: Path) -> Path:
    (folder / "build" / "bin").mkdir(parents=True)
    for tool in ("llama-completion", "llama-speculative-simple"):
        path = folder / "build" / "bin" / tool
        path.write_text("#!/bin/sh\nexit 1\n")
        path.chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_pair):
    """A tiny target as a GGUF, the draft as a folder (exported by the benchmark), a GSM8K-like file and a `distill accept` report."""
    from distill.commands.export_gguf import export_gguf

    root = tmp_path_factory.mktemp("bench_llamacpp")
    for name, model in (("target", tiny_pair.target), ("draft", tiny_pair.draft)):
        model.save_pretrained(root / name)
        tiny_pair.tokenizer.save_pretrained(root / name)
    export_gguf(root / "target", root / "target.gguf", "f16")
    rows = [{"question": f"anna has {i} apples and gets 4 more . how many ?", "answer": f"{i} + 4 = {i + 4} #### {i + 4}"} for i in range(6)]
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = {
        "settings": {"num_draft_tokens": 3, "num_samples": {"gsm8k": 4}, "max_new_tokens_per_task": {"gsm8k": 16}, "mode": "greedy"},
        "drafts": {"draft": {"tasks": {"gsm8k": {"acceptance_rate": 0.625}}}},
    }
    (root / "ours.json").write_text(json.dumps(report))
    return root


def _runner(tokenizer, calls: list, shift: int = 0):
    """A stand-in for llama.cpp: the target alone prints the prompt's ids (tokenized as llama.cpp would, `shift`
    added to the last to fake a disagreement) and 10 decode runs in 50 ms; speculative runs accept 6 of 9 in 25 ms,
    1 of 3 in their first round (an f16 draft 8 of 9 on the prompts with an even number of apples, 3 of 3 in its
    first round: drafts differ prompt by prompt, and only in the first round)."""

    def run(cmd: list[str]) -> str:
        calls.append(cmd)
        if "--version" in cmd:
            return "version: 0.5.0-dev (build 1, commit 0c1e570)\nbuilt with GNU 12.2.0 for Linux x86_64"
        prompt = cmd[cmd.index("-p") + 1]
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if cmd[0].endswith("llama-completion"):
            ids = ids[:-1] + [ids[-1] + shift]
            lines = [f"0.00.1 I llama_completion: number of tokens in prompt = {len(ids)}", *(f"0.00.1 I {i:6d} -> 'x'" for i in ids)]
            return "\n".join([*lines, "0.00.2 I common_perf_print:        eval time =      50.00 ms /    10 runs   (5 ms per token, 200 tokens per second)"])
        even = int(re.search(r"anna has (\d+) apples", prompt).group(1)) % 2 == 0
        accepted = 8 if cmd[cmd.index("-md") + 1].endswith("-f16.gguf") and even else 6
        return (
            f"D accepted {3 if accepted == 8 else 1}/3 draft tokens, the last target token is: (7)\nD accepted 2/3 draft tokens\n"
            f"I encoded {len(ids):4d} tokens in 0.1 seconds\nI decoded   12 tokens in    0.025 seconds, speed: 480 t/s\n"
            f"I n_draft   = 3\nI n_predict = 12\nI n_drafted = 9\nI n_accept  = {accepted}\n"
        )

    return run


def test_the_benchmark_pools_runs_checks_prompt_ids_and_writes_its_report(setup, tiny_pair, tmp_path, capsys):
    calls: list = []
    args = ["--llama-cpp", str(_fake_tools(tmp_path / "llama")), "--target", str(setup / "target.gguf"), "--draft", f"draft={setup / 'draft'}"]
    args += ["--data-file", str(setup / "test.jsonl"), "--num-prompts", "4", "--max-new-tokens", "16", "--threads", "1", "--outtypes", "f16,q8_0"]
    args += ["--work", str(tmp_path / "work"), "--ours", str(setup / "ours.json"), "--json", str(tmp_path / "report.json")]
    docs = tmp_path / "docs" / "benchmarks.md"
    assert main([*args, "--docs", str(docs)], runner=_runner(tiny_pair.tokenizer, calls)) == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "report.json").read_text())
    assert (tmp_path / "work" / "draft-f16.gguf").is_file() and (tmp_path / "work" / "draft-q8_0.gguf").is_file()  # exported by the benchmark
    assert set(report["drafts"]) == {"draft-f16", "draft-q8_0"} and report["prompt_ids_checked"] == 4
    d = report["drafts"]["draft-q8_0"]
    assert d["acceptance"] == pytest.approx(6 / 9) and (d["n_accept"], d["n_drafted"]) == (24, 36)
    assert report["target_only"]["tokens_per_s"] == pytest.approx(200) and d["tokens_per_s"] == pytest.approx(480) and d["speedup"] == pytest.approx(2.4)
    assert d["ours"] == {"draft": "draft", "acceptance": 0.625, "per_position": None, "interval": None, "settings_differ": None}
    spec = [c for c in calls if c[0].endswith("llama-speculative-simple")]
    assert len(spec) == 8 and all(c[c.index("-md") + 1].endswith(".gguf") for c in spec)
    assert all(" ".join(speculative_args(3)) in " ".join(c) and "--temp 0" in " ".join(c) and "--log-verbosity 5" in " ".join(c) for c in spec)
    alone = [c for c in calls if c[0].endswith("llama-completion") and "--version" not in c]
    assert len(alone) == 4 and all("-no-cnv" in c and "--verbose-prompt" in c for c in alone)
    assert (
        report["llama_cpp"]["version"] == "0.5.0-dev (build 1, commit 0c1e570)"
        and "others_cores" in report["machine_load"]
        and report["settings"]["speculative_args"] == speculative_args(3)
    )
    assert (
        "| draft-q8_0 | q8_0 | 0.667 [0.667, 0.667] | 24/36 | 0.833 [0.833, 0.833] (round 1: 4/12) | 480 | 2.40× [2.40, 2.40] | 0.625 |"
        in capsys.readouterr().out
    )
    later = d["after_first_round"]  # 5 of the 6 tokens drafted after the first round, on every prompt
    assert later["acceptance"] == pytest.approx(20 / 24) and (later["n_accept"], later["n_drafted"]) == (20, 24)
    # the paired difference over the same prompts: q8_0 accepts 6 of 9 everywhere, f16 8 of 9 on the even prompts
    evens = sum(r["n_accept"] == 8 for r in report["drafts"]["draft-f16"]["runs"])
    (diff,) = report["comparisons"]
    assert (diff["draft"], diff["reference"]) == ("draft-q8_0", "draft-f16") and diff["ours"] is None
    assert diff["llama_cpp"]["value"] == pytest.approx(-2 * evens / 36) and diff["llama_cpp"]["low"] <= diff["llama_cpp"]["value"] <= diff["llama_cpp"]["high"]
    after = diff["llama_cpp_after_first_round"]  # both drafts differ in their first round only
    assert evens > 0 and after["value"] == pytest.approx(0.0) and not after["outside_noise"] and diff["after_first_round_minus_ours"] is None
    saved = json.loads((tmp_path / "docs" / "results" / "bench_llamacpp.json").read_text())
    assert saved["blocks"][1]["rows"][2][0] == "draft-q8_0" and "<!-- results:bench_llamacpp -->" in docs.read_text()
    assert render_docs(["--check", "--root", str(tmp_path)]) == 0
    # a second target keeps its own section and report beside the first
    assert main([*args, "--docs", str(docs), "--section", "bench_llamacpp-f16"], runner=_runner(tiny_pair.tokenizer, [])) == 0
    assert "## llama.cpp's speculative decoding with the drafts as GGUF, target target.gguf" in docs.read_text()
    assert "<!-- results:bench_llamacpp -->" in docs.read_text() and (tmp_path / "docs" / "results" / "bench_llamacpp-f16.json").is_file()
    assert render_docs(["--check", "--root", str(tmp_path)]) == 0


def test_a_prompt_llama_cpp_tokenizes_otherwise_is_refused(setup, tiny_pair, tmp_path, capsys):
    args = ["--llama-cpp", str(_fake_tools(tmp_path / "llama")), "--target", str(setup / "target.gguf"), "--draft", f"target={setup / 'target.gguf'}"]
    args += ["--data-file", str(setup / "test.jsonl"), "--num-prompts", "2", "--json", str(tmp_path / "report.json")]
    assert main(args, runner=_runner(tiny_pair.tokenizer, [], shift=1)) == 2
    err = capsys.readouterr().err.strip()
    assert "the tokenizers disagree" in err and "\n" not in err and not (tmp_path / "report.json").exists()


def test_a_stopped_benchmark_resumes_with_the_figures_of_an_uninterrupted_one(setup, tiny_pair, tmp_path, capsys):
    tools = _fake_tools(tmp_path / "llama")

    def args(out: Path, tokens: int = 16) -> list[str]:
        return [
            *["--llama-cpp", str(tools), "--target", str(setup / "target.gguf"), "--draft", f"draft={setup / 'draft'}"],
            *["--data-file", str(setup / "test.jsonl"), "--num-prompts", "4", "--max-new-tokens", str(tokens), "--threads", "1", "--outtypes", "f16,q8_0"],
            *["--work", str(tmp_path / "work"), "--json", str(out / "report.json")],
        ]

    whole = tmp_path / "whole"
    assert main(args(whole), runner=_runner(tiny_pair.tokenizer, [])) == 0
    stopped, calls = tmp_path / "stopped", []
    fine = _runner(tiny_pair.tokenizer, calls)

    def dies_on_the_third_prompt(cmd: list[str]) -> str:
        if sum(c[0].endswith("llama-completion") for c in calls) == 3 and cmd[0].endswith("llama-speculative-simple"):
            raise LlamaCppOutputError("llama-speculative-simple exited -9: killed")
        return fine(cmd)

    assert main(args(stopped), runner=dies_on_the_third_prompt) == 2 and not (stopped / "report.json").exists()
    assert "exited -9" in capsys.readouterr().err
    again: list = []
    assert main(args(stopped), runner=_runner(tiny_pair.tokenizer, again)) == 0
    assert "prompt 2/4 reused" in capsys.readouterr().err
    measured = [c for c in again if "--version" not in c]
    assert len(measured) == 2 * 3  # prompts 3 and 4 only: the target alone and both drafts each
    a, b = (json.loads((out / "report.json").read_text()) for out in (whole, stopped))
    for name in ("draft-f16", "draft-q8_0"):
        assert {k: b["drafts"][name][k] for k in ("n_accept", "n_drafted", "tokens", "tokens_per_s", "speedup")} == {
            k: a["drafts"][name][k] for k in ("n_accept", "n_drafted", "tokens", "tokens_per_s", "speedup")
        }
    assert len(b["runs"]) == 2 and all("others_cores" in r["machine_load"] for r in b["runs"].values())
    assert b["machine_load"] in [r["machine_load"] for r in b["runs"].values()]
    ids = [r["run_id"] for r in b["target_only"]["runs"]]
    assert ids[0] == ids[1] != ids[2] == ids[3] and set(ids) == set(b["runs"])  # each prompt timed within one run
    # other settings: the journal is kept aside and every prompt measured afresh
    fresh: list = []
    assert main(args(stopped, tokens=8), runner=_runner(tiny_pair.tokenizer, fresh)) == 0
    assert len([c for c in fresh if "--version" not in c]) == 4 * 3 and len(list(stopped.glob("report.records.*.jsonl"))) == 1
