"""Keep measured tables in docs/benchmarks.md: each benchmark owns one named section, rewritten
atomically in place, so rerunning a benchmark replaces its numbers and leaves the others. A
benchmark's figures are kept as a report (docs/results/NAME.json) and its section is that report's
rendering, so that `distill docs --check` catches a figure edited by hand."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from distill.common.io import atomic_write
from distill.common.provenance import describe

BENCHMARK_SCHEMA = 1  # the version of the benchmark reports `benchmark_report` writes and `render_benchmark` reads
Block = str | dict[str, Any]  # a paragraph of Markdown, or a table {"header": [...], "rows": [[...], ...]}


def write_section(path: str | os.PathLike, name: str, markdown: str) -> None:
    """Replace (or append) the section between `<!-- name -->` and `<!-- /name -->`."""
    path = Path(path)
    text = path.read_text() if path.exists() else "# Benchmarks\n\nEvery measured table, with the command that produced it.\n"
    block = f"<!-- {name} -->\n{markdown.strip()}\n<!-- /{name} -->"
    pattern = re.compile(rf"<!-- {re.escape(name)} -->.*?<!-- /{re.escape(name)} -->", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    atomic_write(path, text)


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A GitHub Markdown table; floats to three significant decimals."""
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows])


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """A table block of a benchmark report: the measured values themselves, formatted only when rendered."""
    return {"header": list(header), "rows": [list(row) for row in rows]}


def render_blocks(blocks: Sequence[Block]) -> str:
    """Paragraphs as written, tables through `markdown_table`, one blank line apart."""
    return "\n\n".join(b if isinstance(b, str) else markdown_table(b["header"], b["rows"]) for b in blocks)


def benchmark_report(
    section: str, title: str, command: str, blocks: Sequence[Block], machine_load: dict[str, Any], environment: dict[str, Any]
) -> dict[str, Any]:
    """The committed form of one benchmark's section: what ran, its tables' values, the machine's load."""
    return {
        "schema_version": BENCHMARK_SCHEMA,
        "kind": "benchmark",
        "section": section,
        "title": title,
        "command": command,
        "blocks": list(blocks),
        "machine_load": machine_load,
        "environment": environment,
    }


def render_benchmark(report: dict[str, Any]) -> str:
    """A benchmark report's section: title, the command that produced it, its blocks, how busy the machine was."""
    version = report.get("schema_version")
    if version != BENCHMARK_SCHEMA:
        raise ValueError(
            f"benchmark report {report.get('section')!r} has schema {version}; this distill renders schema {BENCHMARK_SCHEMA}: re-measure it or upgrade distill"
        )
    return f"## {report['title']}\n\n```\n{report['command']}\n```\n\n{render_blocks(report['blocks'])}\n\n{describe(report['machine_load'])}"
