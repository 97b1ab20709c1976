"""distill.engines.llamacpp (scripts/bench_llamacpp.py): llama.cpp's own speculative decoding with this project's drafts as GGUFs.

For each GSM8K prompt of the evaluation's sample (eval/tasks/gsm8k.py, the first `--num-prompts` of its
seeded draw: the prompts `distill accept` measured), greedy:

- the target alone: `llama-completion -m TARGET.gguf -p PROMPT -n N --temp 0 -no-cnv --verbose-prompt`,
  whose printed prompt ids are checked equal to this project's tokenization of the same chat prompt;
- each draft: `llama-speculative-simple -m TARGET.gguf -md DRAFT.gguf --spec-type draft-simple
  --spec-draft-n-min K --spec-draft-n-max K --draft-p-min 0 ...` (exactly K draft tokens every round;
  the older `--draft-min/--draft-max` are removed in this llama.cpp build).

Drafts are `NAME=PATH`: a `.gguf` is used as is (e.g. the original Q4_K_M base); a model folder or training
output is exported first with `distill export-gguf` in each `--outtypes` (f16,q8_0), named NAME-f16 and so
on. Pooled over the prompts: acceptance (n_accept / n_drafted), tokens/s (decoded tokens / decode seconds)
and the speedup over the target alone, beside this project's decoder's acceptance from a `distill accept`
report of the same prompts (`--ours`). llama-speculative-simple's first round drafts from the prompt alone,
before the target has written a token; this project's decoder takes the first token from the target's
prefill and drafts from the second on, so it has no such round. Each run's first round is read from its
debug lines (`--log-verbosity 5`: `accepted A/D draft tokens` every round) and the acceptance is also given
without it, as this project's decoder counts. The report is JSON (`--json`), each prompt's runs journalled beside
it as they finish (`distill.eval.journal`), so a stopped benchmark resumes; llama.cpp's tools are found in
`--llama-cpp DIR` (or DIR/build/bin, DIR/bin) or on PATH, and when absent the benchmark is skipped with a
message (exit 0). The parsing reads the lines llama.cpp's examples/speculative-simple and
tools/completion print (llama.cpp vendored in llama-cpp-python 0.3.36).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from distill.commands.export_gguf import OUTTYPES, export_gguf
from distill.common.benchmarks import report as write_benchmark
from distill.common.docs import Block, markdown_table
from distill.common.docs import table as table_block
from distill.common.io import file_stamp, write_json
from distill.common.models import ModelLoadError, load_tokenizer
from distill.common.provenance import MachineLoad, describe, versions, warn
from distill.engines.inputs import DEFAULT_DATA, Prompt, gsm8k_prompts, journal_path, parse_drafts, prompt_key, prompt_mismatch
from distill.engines.ours import ours_acceptance, ours_difference
from distill.eval.intervals import bootstrap, difference, format_interval, ratio, ratio_of_ratios
from distill.eval.journal import Journal, Run, busiest
from distill.eval.report import difference_text

TOOLS = ("llama-completion", "llama-speculative-simple")
BUILD_HINT = "build them with ../shared/tools/build-llamacpp (it prints the folder) and pass --llama-cpp FOLDER"
Runner = Callable[[list[str]], str]  # runs one llama.cpp command, returns its stdout + stderr


class LlamaCppOutputError(ValueError):
    """llama.cpp printed something this parser cannot read (another version, or the run failed)."""


@dataclass
class SpeculativeRun:
    """One `llama-speculative-simple` run, as it reports itself."""

    n_input: int
    n_predict: int
    seconds: float
    n_draft: int
    n_drafted: int
    n_accept: int
    first_drafted: int  # the first round's draft tokens, drafted from the prompt alone
    first_accept: int


@dataclass
class TargetRun:
    """One `llama-completion` run of the target alone: its prompt ids and its decode timing."""

    prompt_ids: list[int]
    n_eval: int
    eval_ms: float


def _number(pattern: str, text: str, what: str, cast: Callable[[str], Any] = int) -> Any:
    found = re.findall(pattern, text, flags=re.MULTILINE)
    if not found:
        raise LlamaCppOutputError(f"no {what} in llama.cpp's output (expected a line matching {pattern!r}); the run failed or printed another format")
    return cast(found[-1])


def parse_speculative(text: str) -> SpeculativeRun:
    """The `decoded N tokens in S seconds`, `n_draft`, `n_drafted` and `n_accept` lines of llama-speculative-simple,
    and its first round's `accepted A/D draft tokens` debug line (printed under `--log-verbosity 5`)."""
    decoded = re.findall(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", text)
    if not decoded:
        raise LlamaCppOutputError("no 'decoded N tokens in S seconds' line in llama-speculative-simple's output; the run failed or printed another format")
    n_predict, seconds = int(decoded[-1][0]), float(decoded[-1][1])
    first = re.search(r"accepted (\d+)/(\d+) draft tokens", text)
    if first is None:
        raise LlamaCppOutputError("no 'accepted A/D draft tokens' line in llama-speculative-simple's output: run it with --log-verbosity 5 (its debug lines)")
    return SpeculativeRun(
        n_input=_number(r"encoded\s+(\d+) tokens in", text, "'encoded N tokens' line"),
        n_predict=n_predict,
        seconds=seconds,
        n_draft=_number(r"^.*\bn_draft\s+=\s+(\d+)\s*$", text, "n_draft"),
        n_drafted=_number(r"^.*\bn_drafted\s+=\s+(\d+)\s*$", text, "n_drafted"),
        n_accept=_number(r"^.*\bn_accept\s+=\s+(\d+)\s*$", text, "n_accept"),
        first_drafted=int(first.group(2)),
        first_accept=int(first.group(1)),
    )


def parse_completion(text: str) -> TargetRun:
    """llama-completion's `--verbose-prompt` ids (`number of tokens in prompt = N`, then N lines `ID -> 'piece'`)
    and its `eval time = X ms / N runs` line (prompt processing excluded)."""
    head = re.search(r"number of tokens in prompt = (\d+)", text)
    if head is None:
        raise LlamaCppOutputError("no 'number of tokens in prompt = N' line in llama-completion's output: run it with --verbose-prompt")
    n = int(head.group(1))
    ids = [int(m) for m in re.findall(r"^(?:[\d.]+ [A-Z] )?\s*(-?\d+) -> '", text[head.end() :], flags=re.MULTILINE)[:n]]  # LOG_INF may prefix a timestamp
    if len(ids) != n:
        raise LlamaCppOutputError(f"llama-completion announced {n} prompt tokens but printed {len(ids)}")
    evals = re.findall(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) runs", text)
    if not evals:
        raise LlamaCppOutputError("no 'eval time = X ms / N runs' line in llama-completion's output; the run failed or printed another format")
    return TargetRun(ids, int(evals[-1][1]), float(evals[-1][0]))


def find_tools(directory: str | os.PathLike | None = None) -> dict[str, Path] | None:
    """llama.cpp's tools in `directory` (or its build/bin, bin), else on PATH; None when any is missing."""
    found = {}
    for tool in TOOLS:
        if directory is not None:
            candidates = [Path(directory) / sub / tool for sub in (".", "build/bin", "bin")]
            path = next((p for p in candidates if p.is_file() and os.access(p, os.X_OK)), None)
        else:
            which = shutil.which(tool)
            path = Path(which) if which else None
        if path is None:
            return None
        found[tool] = path
    return found


def skip_message(directory: str | os.PathLike | None = None) -> str:
    """What the benchmark prints when llama.cpp is absent."""
    where = f"in --llama-cpp {directory} (or its build/bin, bin)" if directory is not None else "on PATH (or pass --llama-cpp DIR)"
    return f"bench_llamacpp: skipped: llama.cpp's {' and '.join(TOOLS)} not found {where}; {BUILD_HINT}"


def subprocess_runner(timeout: float) -> Runner:
    """Run a command, returning stdout + stderr; a failure is a LlamaCppOutputError naming the command and its last lines."""

    def run(cmd: list[str]) -> str:
        done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, stdin=subprocess.DEVNULL)
        text = done.stdout + "\n" + done.stderr
        if done.returncode != 0:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise LlamaCppOutputError(f"{Path(cmd[0]).name} exited {done.returncode}: {tail}")
        return text

    return run


def speculative_args(k: int) -> list[str]:
    """Exactly `k` draft tokens every round, greedy drafting (this llama.cpp build's spelling)."""
    return ["--spec-type", "draft-simple", "--spec-draft-n-min", str(k), "--spec-draft-n-max", str(k), "--draft-p-min", "0"]


ROUND_LOG = ["--log-verbosity", "5"]  # llama-speculative-simple's debug lines: each round's accepted / drafted


def common_args(max_new_tokens: int, threads: int, ctx: int, extra: Sequence[str]) -> list[str]:
    return ["-n", str(max_new_tokens), "--temp", "0", "--seed", "0", "-t", str(threads), "-c", str(ctx), *extra]


def prepare_drafts(drafts: dict[str, str], outtypes: Sequence[str], work: Path) -> dict[str, dict[str, Any]]:
    """name -> {path of the GGUF, source, outtype}: a .gguf as is, anything else exported in each outtype (reused when present)."""
    ready = {}
    for name, path in drafts.items():
        if path.lower().endswith(".gguf"):
            if not Path(path).is_file():
                raise ValueError(f"--draft {name}={path}: no such GGUF file")
            ready[name] = {"gguf": path, "source": path, "outtype": "as given", "family": name}
            continue
        for outtype in outtypes:
            out = work / f"{name}-{outtype}.gguf"
            if not out.is_file():
                print(f"exporting {path} -> {out}", file=sys.stderr)
                export_gguf(path, out, outtype)
            ready[f"{name}-{outtype}"] = {"gguf": str(out), "source": path, "outtype": outtype, "family": name}
    return ready


def _measure(
    tools: dict[str, Path], target: str, drafts: dict[str, dict[str, Any]], pid: str, text: str, ids: list[int], k: int, base: list[str], runner: Runner
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """One prompt, timed together: the target alone (its prompt ids checked equal to ours), then every draft."""
    alone = parse_completion(runner([str(tools["llama-completion"]), "-m", target, "-p", text, "-no-cnv", "--verbose-prompt", *base]))
    if (problem := prompt_mismatch(Prompt(pid, text, ids, []), "llama.cpp's tokenizer", alone.prompt_ids)) is not None:
        raise LlamaCppOutputError(problem)
    runs = {}
    for name, draft in drafts.items():
        cmd = [str(tools["llama-speculative-simple"]), "-m", target, "-md", draft["gguf"], "-p", text, *speculative_args(k), *ROUND_LOG, *base]
        run = parse_speculative(runner(cmd))
        if run.n_draft != k:
            raise LlamaCppOutputError(f"llama-speculative-simple reports n_draft = {run.n_draft}, not {k}: it ignored --spec-draft-n-max")
        if run.n_input != len(ids):
            raise LlamaCppOutputError(f"prompt {pid}: llama-speculative-simple encoded {run.n_input} prompt tokens, this project {len(ids)}")
        runs[name] = {"prompt": pid, **asdict(run)}
    return {"prompt": pid, **asdict(alone), "prompt_ids": len(alone.prompt_ids)}, runs


def bench(
    tools: dict[str, Path],
    target: str,
    drafts: dict[str, dict[str, Any]],
    prompts: Sequence[Prompt],
    *,
    k: int = 3,
    max_new_tokens: int = 256,
    threads: int = 2,
    ctx: int = 2048,
    extra: Sequence[str] = (),
    runner: Runner,
    ours: dict[str, Any] | None = None,
    journal: Journal,
    load: MachineLoad,
) -> dict[str, Any]:
    """Run the target alone and every draft on every prompt; the pooled figures and each run as a report dict.
    Each prompt's runs are appended to `journal` as they finish (with `load` so far) and a prompt already
    journalled is reused, not rerun: a stopped benchmark resumes, every prompt's speedup within one run."""
    base = common_args(max_new_tokens, threads, ctx, extra)
    target_runs, spec_runs = [], {name: [] for name in drafts}
    for index, (pid, text, ids, _) in enumerate(prompts):
        key = prompt_key(pid, text)
        done = journal.latest(key)
        reused = done is not None
        if done is None:
            alone, runs = _measure(tools, target, drafts, pid, text, ids, k, base, runner)
            done = journal.add(key, {"target": alone, "drafts": runs, "machine_load": load.report()})
        target_runs.append({**done["target"], "run_id": done["run_id"]})
        for name in drafts:
            spec_runs[name].append({**done["drafts"][name], "run_id": done["run_id"]})
        print(f"prompt {index + 1}/{len(prompts)} {'reused from ' + str(journal.path) if reused else 'done'}", file=sys.stderr)
    alone_tps = sum(r["n_eval"] for r in target_runs) / (sum(r["eval_ms"] for r in target_runs) / 1e3)
    report_drafts = {}
    for name, runs in spec_runs.items():
        drafted, accepted = sum(r["n_drafted"] for r in runs), sum(r["n_accept"] for r in runs)
        tps = sum(r["n_predict"] for r in runs) / sum(r["seconds"] for r in runs)
        report_drafts[name] = {
            **{key: drafts[name][key] for key in ("gguf", "source", "outtype")},
            "acceptance": accepted / drafted if drafted else None,
            "n_accept": accepted,
            "n_drafted": drafted,
            "tokens": sum(r["n_predict"] for r in runs),
            "tokens_per_s": tps,
            "speedup": tps / alone_tps,
            "ours": ours_acceptance(ours, drafts[name]["family"], k, len(prompts), max_new_tokens),
            "after_first_round": _after_first_round(runs),
            "intervals": {
                "acceptance": bootstrap(_acceptance_columns(runs), ratio("a", "d")).to_dict(),
                "speedup": bootstrap(_speed_columns(runs, target_runs), ratio_of_ratios("p", "s", "e", "t")).to_dict(),
            },
            "runs": runs,
        }
    return {
        "target_only": {"tokens": sum(r["n_eval"] for r in target_runs), "tokens_per_s": alone_tps, "runs": target_runs},
        "drafts": report_drafts,
        "prompt_ids_checked": len(target_runs),
    }


def _acceptance_columns(runs: Sequence[dict[str, Any]], tag: str = "", skip_first: bool = False) -> dict[str, list[float]]:
    """Per prompt, accepted and drafted tokens (columns a, d, suffixed by `tag`) for the bootstrap; with
    `skip_first`, those of the rounds after the first (the rounds this project's decoder has too)."""
    if skip_first:
        return {f"a{tag}": [r["n_accept"] - r["first_accept"] for r in runs], f"d{tag}": [r["n_drafted"] - r["first_drafted"] for r in runs]}
    return {f"a{tag}": [r["n_accept"] for r in runs], f"d{tag}": [r["n_drafted"] for r in runs]}


def _after_first_round(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Acceptance over the rounds after the first (with its interval), and the first rounds' own counts."""
    first_accept, first_drafted = sum(r["first_accept"] for r in runs), sum(r["first_drafted"] for r in runs)
    accepted, drafted = sum(r["n_accept"] for r in runs) - first_accept, sum(r["n_drafted"] for r in runs) - first_drafted
    return {
        "acceptance": accepted / drafted if drafted else None,
        "n_accept": accepted,
        "n_drafted": drafted,
        "interval": bootstrap(_acceptance_columns(runs, skip_first=True), ratio("a", "d")).to_dict(),
        "first_accept": first_accept,
        "first_drafted": first_drafted,
    }


def _speed_columns(runs: Sequence[dict[str, Any]], target_runs: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Per prompt, the speculative run's tokens and seconds and the target's alone, for the speedup's bootstrap."""
    return {
        "p": [r["n_predict"] for r in runs],
        "s": [r["seconds"] for r in runs],
        "e": [r["n_eval"] for r in target_runs],
        "t": [r["eval_ms"] / 1e3 for r in target_runs],
    }


def _paired(d: dict[str, Any], ref: dict[str, Any], skip_first: bool = False) -> dict[str, Any]:
    """`d`'s acceptance minus `ref`'s over the same prompts, with its 95% interval and whether it excludes 0."""
    columns = {**_acceptance_columns(d["runs"], "1", skip_first), **_acceptance_columns(ref["runs"], "0", skip_first)}
    iv = bootstrap(columns, difference(ratio("a1", "d1"), ratio("a0", "d0")))
    return {**iv.to_dict(), "outside_noise": iv.excludes(0.0)}


def comparisons(report: dict[str, Any], reference: str, ours: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every draft's acceptance minus the reference draft's in llama.cpp, paired over the same prompts with its
    95% interval (every round, and the rounds after the first), beside this project's decoder's paired
    difference for the same two drafts (from `ours`)."""
    ref = report["drafts"][reference]
    out = []
    for name, d in report["drafts"].items():
        if name == reference:
            continue
        whole = _paired(d, ref)
        later = _paired(d, ref, skip_first=True)
        mine = ours_difference(ours, (d.get("ours") or {}).get("draft"), (ref.get("ours") or {}).get("draft"))
        out.append(
            {
                "draft": name,
                "reference": reference,
                "llama_cpp": whole,
                "llama_cpp_after_first_round": later,
                "ours": mine,
                "llama_cpp_minus_ours": None if mine is None else whole["value"] - mine["value"],
                "after_first_round_minus_ours": None if mine is None else later["value"] - mine["value"],
            }
        )
    return out


HEADER = [
    "system",
    "draft type",
    "acceptance (llama.cpp)",
    "accepted / drafted",
    "after round 1 (llama.cpp)",
    "tokens/s",
    "speedup",
    "acceptance (distill decoder)",
]
COMPARISON_HEADER = ["difference", "llama.cpp", "llama.cpp after round 1", "distill decoder", "llama.cpp − distill", "after round 1 − distill"]


def _signed(value: float | None) -> str:
    """A signed difference, – when there is none."""
    return "–" if value is None else f"{value:+.3f}"


def _after_cell(after: dict[str, Any]) -> str:
    """Acceptance after round 1 with its interval, and what round 1 itself accepted."""
    return f"{format_interval(after['interval'], '.3f')} (round 1: {after['first_accept']}/{after['first_drafted']})"


def rows(report: dict[str, Any]) -> list[list[Any]]:
    """The main table's rows: the target alone, then one per draft, with 95% intervals over prompts."""
    out = [["llama.cpp target alone", "–", "–", "–", "–", round(report["target_only"]["tokens_per_s"], 2), "1.00×", "–"]]
    for name, d in report["drafts"].items():
        ours = d.get("ours") or {}
        mine = "–" if ours.get("acceptance") is None else f"{ours['acceptance']:.3f}" + (" (other settings)" if ours.get("settings_differ") else "")
        iv = d.get("intervals") or {}
        out.append(
            [
                name,
                d["outtype"],
                format_interval(iv.get("acceptance"), ".3f") if iv else f"{d['acceptance']:.3f}",
                f"{d['n_accept']}/{d['n_drafted']}",
                _after_cell(d["after_first_round"]),
                round(d["tokens_per_s"], 2),
                format_interval(iv.get("speedup"), ".2f", "×") if iv else f"{d['speedup']:.2f}×",
                mine,
            ]
        )
    return out


def comparison_rows(report: dict[str, Any]) -> list[list[Any]]:
    """The paired differences' rows (* = the interval excludes 0)."""
    return [
        [
            f"{c['draft']} − {c['reference']}",
            difference_text(c["llama_cpp"]),
            difference_text(c["llama_cpp_after_first_round"]),
            format_interval(c["ours"], "+.3f"),
            _signed(c["llama_cpp_minus_ours"]),
            _signed(c["after_first_round_minus_ours"]),
        ]
        for c in report.get("comparisons") or []
    ]


def table(report: dict[str, Any]) -> str:
    """The Markdown tables of a report: target alone and one row per draft, then the paired differences."""
    text = markdown_table(HEADER, rows(report))
    return text + ("\n\n" + markdown_table(COMPARISON_HEADER, comparison_rows(report)) if report.get("comparisons") else "")


def docs_blocks(report: dict[str, Any]) -> list[Block]:
    """The benchmark's section: what ran, the drafts, the paired differences."""
    st, cpp = report["settings"], report["llama_cpp"]
    blocks: list[Block] = [
        f"llama.cpp {cpp.get('version') or '(version unknown)'}, target `{Path(st['target']).name}`, {st['num_prompts']} GSM8K prompts from "
        f"`{Path(st['data_file']).name}` (the first {st['num_prompts']} of the seed-{st['seed']} shuffle `distill accept` draws; every prompt's ids "
        f"checked equal to this project's), ≤ {st['max_new_tokens']} tokens, greedy, exactly {st['num_draft_tokens']} draft tokens a round "
        f"(`{' '.join(st['speculative_args'])}`), {st['threads']} threads. [low, high] = 95% bootstrap interval over prompts; the distill "
        "decoder's figures come from the `distill accept` report given with --ours (its own run, on the same prompts). llama.cpp's "
        "first round drafts from the prompt alone, before the target has written a token; the distill decoder takes the first "
        "token from the target's prefill and drafts from the second on, so it has no such round: \"after round 1\" is llama.cpp's "
        "acceptance without it (read from its `--log-verbosity 5` lines), counted as the distill decoder counts.",
        table_block(HEADER, rows(report)),
    ]
    if report.get("comparisons"):
        blocks += ["Paired differences on the same prompts (* = the interval excludes 0):", table_block(COMPARISON_HEADER, comparison_rows(report))]
    return blocks


def fingerprint(args: argparse.Namespace, drafts: dict[str, dict[str, Any]]) -> str:
    """A hash of everything a timing depends on (the GGUF files by size and time, the data by content, the
    llama.cpp options), so a rerun with the same settings resumes and any change starts the journal afresh."""
    keyed = {
        "target": [args.target, file_stamp(Path(args.target))],
        "drafts": {name: [d["gguf"], file_stamp(Path(d["gguf"]))] for name, d in drafts.items()},
        "data": file_stamp(Path(args.data_file)),
        **{key: getattr(args, key) for key in ("seed", "max_new_tokens", "num_draft_tokens", "threads", "ctx", "llama_args", "llama_cpp")},
        "round_log": ROUND_LOG,
    }
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


def run_loads(journal: Journal, report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The runs that timed the report's prompts, each with its machine load: at its end, or for a run that
    was stopped, as journalled with its last prompt."""
    return {run_id: journal.run_with_load(run_id) for run_id in {r["run_id"] for r in report["target_only"]["runs"]}}


def _version(tools: dict[str, Path], runner: Runner) -> str | None:
    try:
        text = runner([str(tools["llama-completion"]), "--version"])
    except (ValueError, OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"version: (.+)", text)  # e.g. "0.5.0-dev (build 1, commit 0c1e570)"
    return found.group(1).strip() if found else None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/bench_llamacpp.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="the target as a GGUF (e.g. ~/.cache/distill-real/qwen2.5-coder-1.5b-instruct.gguf)")
    p.add_argument(
        "--draft", action="append", default=[], required=True, help="NAME=PATH: a .gguf as is, or a model folder / training output exported (repeatable)"
    )
    p.add_argument("--outtypes", default="f16,q8_0", help=f"the types each non-GGUF draft is exported in (from {', '.join(OUTTYPES)}; default f16,q8_0)")
    p.add_argument("--llama-cpp", help="the folder holding llama-completion and llama-speculative-simple (or its build/bin); default: PATH")
    p.add_argument("--data-file", default=DEFAULT_DATA, help=f"GSM8K JSONL with question/answer (default {DEFAULT_DATA})")
    p.add_argument("--num-prompts", type=int, default=30, help="prompts of the evaluation's seeded GSM8K draw (default 30)")
    p.add_argument("--seed", type=int, default=0, help="the draw's seed, as `distill accept --seed` (default 0)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--num-draft-tokens", "-k", type=int, default=3, help="draft tokens every round, exactly (default 3)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp threads, -t (default: every core)")
    p.add_argument("--ctx", type=int, default=2048, help="llama.cpp context, -c (default 2048)")
    p.add_argument("--llama-args", default="", help="extra arguments for every llama.cpp command, e.g. '-ngl 99' (one string)")
    p.add_argument("--tokenizer", help="the tokenizer prompts are checked against (default: the target's)")
    p.add_argument("--ours", help="a `distill accept` JSON on the same prompts: this project's decoder's acceptance beside llama.cpp's")
    p.add_argument("--work", default="llamacpp-drafts", help="where exported drafts go (reused when present)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one llama.cpp run may take")
    p.add_argument(
        "--json",
        default="llamacpp-report.json",
        help="the report to write (default llamacpp-report.json); each prompt's runs are journalled beside it as they finish "
        "(NAME.records.jsonl), so the same command run again resumes a stopped benchmark",
    )
    p.add_argument("--reference", help="the draft every other is compared with, paired over the prompts (default: the first, e.g. base-f16)")
    p.add_argument("--docs", help="also write the --section section of this Markdown file (docs/benchmarks.md), its report in results/ beside it")
    p.add_argument(
        "--section",
        default="bench_llamacpp",
        help="the section of --docs to rewrite and its results/NAME.json (default bench_llamacpp; another target: another name)",
    )
    return p


def main(argv: Sequence[str] | None = None, runner: Runner | None = None) -> int:
    """scripts/bench_llamacpp.py; 0 also when llama.cpp is absent (skipped, said why), 2 on bad input."""
    args = parser().parse_args(argv)
    tools = find_tools(args.llama_cpp)
    if tools is None:
        print(skip_message(args.llama_cpp))
        return 0
    run = runner or subprocess_runner(args.timeout)
    started = time.time()
    load = MachineLoad().start()  # llama.cpp's time counts as this process's (its children), the rest as others'
    try:
        if args.num_draft_tokens < 1 or args.num_prompts < 1:
            raise ValueError("--num-draft-tokens and --num-prompts must be >= 1")
        outtypes = [t for t in args.outtypes.split(",") if t]
        if bad := [t for t in outtypes if t not in OUTTYPES]:
            raise ValueError(f"--outtypes {','.join(bad)}: choose from {', '.join(OUTTYPES)}")
        args.target = os.path.expanduser(args.target)
        if not Path(args.target).is_file() or not args.target.lower().endswith(".gguf"):
            raise ValueError(f"--target {args.target}: not a .gguf file; llama.cpp runs GGUF targets (fetch it, or convert with llama.cpp)")
        ours = json.loads(Path(args.ours).read_text()) if args.ours else None
        drafts = prepare_drafts(parse_drafts(args.draft), outtypes, Path(args.work))
        tokenizer = load_tokenizer(args.tokenizer or args.target)
        prompts = gsm8k_prompts(tokenizer, args.data_file, args.num_prompts, args.seed)
        journal = Journal(journal_path(args.json), fingerprint(args, drafts), prog="bench_llamacpp")
        command = shlex.join(["python", "scripts/bench_llamacpp.py", *(sys.argv[1:] if argv is None else argv)])
        journal.begin(dataclasses.replace(Run.begin("cpu", command), torch_threads=args.threads))
        report = bench(
            tools,
            args.target,
            drafts,
            prompts,
            k=args.num_draft_tokens,
            max_new_tokens=args.max_new_tokens,
            threads=args.threads,
            ctx=args.ctx,
            extra=shlex.split(args.llama_args),
            runner=run,
            ours=ours,
            journal=journal,
            load=load,
        )
    except (ValueError, FileNotFoundError, ModelLoadError) as err:
        print(f"bench_llamacpp: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    reference = args.reference or next(iter(report["drafts"]))
    if reference not in report["drafts"]:
        print(f"bench_llamacpp: error: --reference {reference}: no such draft; choose from {', '.join(report['drafts'])}", file=sys.stderr)
        return 2
    report["comparisons"] = comparisons(report, reference, ours)
    journal.end(load.stop().report())
    runs = run_loads(journal, report)
    busy = busiest(runs.values())
    report = {
        "settings": {
            "target": args.target,
            "drafts": {name: d["gguf"] for name, d in drafts.items()},
            "num_prompts": args.num_prompts,
            "seed": args.seed,
            "data_file": args.data_file,
            "max_new_tokens": args.max_new_tokens,
            "num_draft_tokens": args.num_draft_tokens,
            "threads": args.threads,
            "ctx": args.ctx,
            "llama_args": args.llama_args,
            "speculative_args": speculative_args(args.num_draft_tokens),
            "mode": "greedy",
        },
        "llama_cpp": {"tools": {k: str(v) for k, v in tools.items()}, "version": _version(tools, run)},
        "environment": versions(("distill", "transformers", "gguf")),
        "seconds": round(time.time() - started, 1),
        "machine_load": busy,  # the busiest of the runs that timed these prompts
        "runs": runs,
        **report,
    }
    write_json(args.json, report)
    if args.docs:
        write_benchmark(
            args.section,
            f"llama.cpp's speculative decoding with the drafts as GGUF, target {Path(args.target).name}",
            command,
            docs_blocks(report),
            args.docs,
            busy,
            "bench_llamacpp",
        )
    else:
        print(f"{table(report)}\n\n{describe(busy)}")
        warn(busy, "bench_llamacpp")
    print(f"wrote {args.json}")
    return 0
