"""How a benchmark reports: the exact command that produced its tables, its report under the docs'
results/ folder (the measured values, the environment, how busy the machine was while it ran) and
its section of docs/benchmarks.md, rendered from that report."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from distill.common.docs import Block, benchmark_report, render_benchmark, write_section
from distill.common.io import write_json
from distill.common.provenance import MachineLoad, environment, warn


def command_line(script: str, argv: Sequence[str] | None = None) -> str:
    """`python scripts/<script>.py ARGS` for `argv` (the process's arguments when None), quoted as a
    shell would need them."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join(["python", f"scripts/{script}.py", *map(shlex.quote, args)])


def report(
    section: str, title: str, cmd: str, blocks: Sequence[Block], docs: str | os.PathLike | None, load: MachineLoad | dict[str, Any], prog: str = "bench"
) -> str:
    """Print the benchmark's section, with the machine's load since `load` started, or as `load` recorded
    it (timings are only as good as the machine was idle), and return its text; given `docs`, also write
    the report to results/`section`.json beside it and the section `results:section` of `docs` rendered
    from it (what `distill docs` re-renders and checks)."""
    busy = load if isinstance(load, dict) else load.report()
    record = benchmark_report(section, title, cmd, blocks, busy, environment())
    text = render_benchmark(record)
    print(text)
    warn(busy, prog)
    if docs:
        write_json(Path(docs).parent / "results" / f"{section}.json", record)
        write_section(docs, f"results:{section}", text)
    return text
