"""`distill docs [--check]`: every measured table in the docs, rendered from a report committed under
docs/results/, so that no number in docs/benchmarks.md or README.md is typed by hand.

A section `<!-- results:NAME -->` ... `<!-- /results:NAME -->` in a Markdown file is the rendering of
docs/results/NAME.json; `<!-- results:NAME@headline -->` is an acceptance report's one-paragraph
summary (README's measured figures: each draft's acceptance and speedups with their intervals, and the
paired difference). `distill docs` rewrites every such section; `distill docs --check` (run by
the test suite) exits 1 naming each section that differs from its report's rendering, so a hand edit
of a measured figure fails CI. An acceptance report (`distill accept`'s report.json, schema 2) renders
as its tables with intervals, a benchmark's report (scripts/bench_*.py, `distill demo --docs`, ...) as its
section; a report of a schema this version does not read is named with the
schema it needs.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from distill.common.docs import markdown_table, render_benchmark
from distill.common.io import atomic_write
from distill.eval.intervals import format_interval
from distill.eval.report import decomposition_table, difference_text, sweep_tables, vocab_table, with_interval
from distill.eval.tasks import get_task

DOCUMENTS = ("docs/benchmarks.md", "README.md")  # under the repository root (`--root`)
RESULTS = "docs/results"
SECTION = re.compile(r"<!-- results:(?P<name>[\w.-]+(?:@(?P<view>\w+))?) -->\n(?P<body>.*?)<!-- /results:(?P=name) -->", re.S)
READS = (2,)  # acceptance report schemas this renderer reads


def _prompts(report: dict[str, Any], task: str) -> str:
    """How the task's prompts were drawn: count, file, seed, nesting, length."""
    st = report["settings"]
    name = task.partition("@")[0]  # a label `gsm8k@boxed` is gsm8k's prompts under another template
    source = (st.get("data_files") or {}).get(name, "the Hub split")
    n = report["target_only"][task]["num_prompts"]
    drawn = get_task(name).drawn.format(n=n, seed=st["seed"])
    return (
        f"{n} {task} prompts from `{Path(source).name if source != 'the Hub split' else source}`, {drawn} "
        f"(a smaller run of the same seed takes a prefix of these), ≤ {st['max_new_tokens_per_task'][task]} new tokens"
    )


def _task_rows(report: dict[str, Any], task: str) -> list[list[Any]]:
    """One row per draft: quality and its paired difference from target-only, acceptance, per position,
    tokens per forward, both speedups with intervals, the prediction, identity."""
    rows = []
    for name, entry in report["drafts"].items():
        r = entry["tasks"][task]
        iv = r.get("intervals") or {}
        dec = r.get("decomposition") or {}
        rows.append(
            [
                name,
                with_interval(r, "quality", ".3f"),
                difference_text(r.get("quality_vs_target")),
                format_interval(iv.get("acceptance_rate"), ".3f"),
                " / ".join(format_interval(p, ".2f") for p in iv.get("per_position_acceptance", [])),
                format_interval(iv.get("tokens_per_target_forward"), ".2f"),
                format_interval(iv.get("decode_speedup"), ".2f", "×"),
                "–" if dec.get("predicted_decode_speedup") is None else f"{dec['predicted_decode_speedup']:.2f}×",
                format_interval(iv.get("end_to_end_speedup"), ".2f", "×"),
                "–" if r.get("greedy_identity") is None else f"{r['identical_outputs']}/{r['num_prompts']}",
            ]
        )
    return rows


def _timing_rows(report: dict[str, Any], task: str) -> list[list[Any]]:
    """Target-only, then each draft: TTFT, TPOT, throughput and seconds per prompt (what sizes a run's counts)."""
    systems = [("target only", report["target_only"][task])] + [(name, entry["tasks"][task]) for name, entry in report["drafts"].items()]
    return [
        [name, f"{r['ttft_s'] * 1e3:.1f}", f"{r['tpot_s'] * 1e3:.1f}", f"{r['tokens_per_s']:.2f}", f"{r['wall_s'] / r['num_prompts']:.1f}"]
        for name, r in systems
    ]


def _check_schema(name: str, report: dict[str, Any]) -> None:
    """Refuse an acceptance report of a schema this renderer does not read, naming the one it needs."""
    version = report.get("schema_version", 1)
    if version not in READS:
        raise ValueError(
            f"docs/results/{name.partition('@')[0]}.json has report schema {version}; `distill docs` renders schemas {list(READS)}: re-measure it or upgrade distill"
        )


def render_acceptance(name: str, report: dict[str, Any]) -> str:
    """An acceptance report's tables: per task each draft's figures with 95% intervals, then the paired differences."""
    _check_schema(name, report)
    st, env = report["settings"], report["environment"]
    lines = [
        f"Target `{Path(report['target']).name}`, {st['mode']} decoding, k = {st['num_draft_tokens']}, {env['dtype']}, {env['device_name']}, "
        f"{env['torch_threads']} torch threads. Rendered from `docs/results/{name}.json` by `distill docs`; [low, high] = 95% bootstrap interval over prompts.",
    ]
    for task in report["target_only"]:
        base = report["target_only"][task]
        lines += [
            "",
            f"{_prompts(report, task)}; target-only {base['quality_metric']} {with_interval(base, 'quality', '.3f')}.",
            "",
            markdown_table(
                [
                    "draft",
                    base["quality_metric"],
                    f"{base['quality_metric']} − target only",
                    "acceptance",
                    "per position",
                    "tokens / target forward",
                    "decode speedup",
                    "predicted decode",
                    "end-to-end speedup",
                    "greedy identity",
                ],
                _task_rows(report, task),
            ),
        ]
        lines += ["", markdown_table(["system", "TTFT ms", "TPOT ms", "tokens/s", "seconds / prompt"], _timing_rows(report, task))]
    comparisons = report.get("comparisons") or []
    if comparisons:
        lines += ["", "Paired differences on the same prompts (* = the interval excludes 0):", ""]
        lines.append(
            markdown_table(
                ["task", "difference", "acceptance", "tokens / target forward", "decode speedup"],
                [
                    [c["task"], f"{c['draft']} − {c['reference']}"]
                    + [difference_text(c.get(f)) for f in ("acceptance_rate", "tokens_per_target_forward", "decode_speedup")]
                    for c in comparisons
                ],
            )
        )
    lines += vocab_table(report, "####") + decomposition_table(report, "####") + sweep_tables(report, "####")
    loads = [(run_id, (run.get("machine_load") or {}).get("others_cores")) for run_id, run in (report.get("runs") or {}).items()]
    lines += ["", "Timed in " + "; ".join(f"run `{r}` (other processes {'–' if c is None else format(c, '.2f')} cores)" for r, c in loads) + "."]
    return "\n".join(lines)


def _noise_verdict(comparison: dict[str, Any]) -> str:
    """Which of a paired difference's acceptance and decode speedup lie outside noise (their interval excludes 0)."""
    outside = [
        label for key, label in (("acceptance_rate", "acceptance"), ("decode_speedup", "decode speedup")) if (comparison.get(key) or {}).get("outside_noise")
    ]
    return " and ".join(outside) + " outside noise" if outside else "both within noise"


def render_headline(name: str, report: dict[str, Any]) -> str:
    """An acceptance report in one paragraph per task: what was measured, then per draft acceptance, decode
    and end-to-end speedup and greedy identity with intervals, then each paired difference and whether it is outside noise."""
    _check_schema(name, report)
    st, env = report["settings"], report["environment"]
    paragraphs = []
    for task in report["target_only"]:
        n = report["target_only"][task]["num_prompts"]
        drafts = []
        for draft, entry in report["drafts"].items():
            r, iv = entry["tasks"][task], entry["tasks"][task].get("intervals") or {}
            identity = "" if r.get("greedy_identity") is None else f", output equal to the target's on {r['identical_outputs']}/{r['num_prompts']} prompts"
            drafts.append(
                f"{draft} acceptance {format_interval(iv.get('acceptance_rate'), '.3f')}, decode speedup {format_interval(iv.get('decode_speedup'), '.2f', '×')}, "
                f"end-to-end {format_interval(iv.get('end_to_end_speedup'), '.2f', '×')}{identity}"
            )
        diffs = [
            f"{c['draft']} − {c['reference']}: acceptance {format_interval(c.get('acceptance_rate'), '+.3f')}, decode speedup {format_interval(c.get('decode_speedup'), '+.3f')} "
            f"({_noise_verdict(c)})"
            for c in report.get("comparisons") or []
            if c["task"] == task
        ]
        mode = "Greedy" if st["mode"] == "greedy" else f"Sampled (T = {st['temperature']})"
        paragraphs.append(
            f"{mode}, k = {st['num_draft_tokens']}, {env['dtype']}, {n} {task} prompts × ≤ {st['max_new_tokens_per_task'][task]} tokens "
            f"(`docs/results/{name.partition('@')[0]}.json`, one timing run, [95% bootstrap interval]): "
            + "; ".join(drafts)
            + "."
            + (" Paired, " + "; ".join(diffs) + "." if diffs else "")
        )
    return "\n\n".join(paragraphs)


def render(name: str, report: dict[str, Any]) -> str:
    """The Markdown of one committed report, by its kind (and the section's view: `NAME@headline`)."""
    view = name.partition("@")[2]
    if view and (view != "headline" or "target_only" not in report):
        raise ValueError(f"section results:{name}: unknown view {view!r}; the views are @headline, of an acceptance report")
    if view:
        return render_headline(name, report)
    if report.get("kind") == "benchmark":
        return render_benchmark(report)
    if "target_only" in report and "drafts" in report:
        return render_acceptance(name, report)
    raise ValueError(f"docs/results/{name}.json: not a report `distill docs` renders (expected `distill accept`'s report.json or a benchmark's)")


def rendered(text: str, results: Path) -> str:
    """`text` with every results section replaced by its report's rendering."""

    def one(match: re.Match) -> str:
        name = match["name"]
        path = results / f"{name.partition('@')[0]}.json"
        if not path.is_file():
            raise ValueError(f"section results:{name} has no report: commit {path}")
        return f"<!-- results:{name} -->\n{render(name, json.loads(path.read_text()))}\n<!-- /results:{name} -->"

    return SECTION.sub(one, text)


def stale_sections(path: Path, results: Path) -> list[str]:
    """The results sections of `path` whose text differs from their report's rendering."""
    text = path.read_text()
    fresh = {m["name"]: m["body"] for m in SECTION.finditer(rendered(text, results))}
    return [m["name"] for m in SECTION.finditer(text) if m["body"] != fresh[m["name"]]]


def main(argv: Sequence[str] | None = None) -> int:
    """`distill docs [--check]`: render (or check) every results section of the docs."""
    from distill.arguments import parser

    args = parser("docs").parse_args(argv)
    root = Path(args.root)
    results, documents = root / RESULTS, [root / d for d in DOCUMENTS if (root / d).is_file()]
    try:
        if not documents:
            raise ValueError(f"{root.resolve()} holds none of {', '.join(DOCUMENTS)}: run from the repository root or pass --root")
        if args.check:
            stale = {d: s for d in documents if (s := stale_sections(d, results))}
            for doc, names in stale.items():
                print(f"distill docs: {doc}: section(s) {', '.join(names)} differ from their reports in {results}: run `distill docs`", file=sys.stderr)
            return 1 if stale else 0
        for path in documents:
            text = path.read_text()
            if (new := rendered(text, results)) != text:
                atomic_write(path, new)
                print(f"distill docs: rendered {path}")
    except ValueError as err:
        print(f"distill docs: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
