"""Keep measured tables in docs/benchmarks.md: each benchmark owns one named section, rewritten
atomically in place, so rerunning a benchmark replaces its numbers and leaves the others."""

from __future__ import annotations

import os
import re
from pathlib import Path

from distill.common.io import atomic_write


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
