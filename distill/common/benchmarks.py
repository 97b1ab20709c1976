"""How a benchmark reports: the exact command that produced its table, and its section of
docs/benchmarks.md (title, command, table, notes, and how busy the machine was while it ran)."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence

from distill.common.docs import write_section
from distill.common.provenance import MachineLoad, describe, warn


def command_line(script: str, argv: Sequence[str] | None = None) -> str:
    """`python scripts/<script>.py ARGS` for `argv` (the process's arguments when None), quoted as a
    shell would need them."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join(["python", f"scripts/{script}.py", *map(shlex.quote, args)])


def report(section: str, title: str, cmd: str, table: str, notes: str, docs: str | os.PathLike, load: MachineLoad, prog: str = "bench") -> str:
    """Print the table with its command and write it as `section` of `docs`, with the machine's load
    since `load` started (timings are only as good as the machine was idle); returns the text."""
    busy = load.report()
    text = f"## {title}\n\n```\n{cmd}\n```\n\n{table}\n\n{notes}\n\n{describe(busy)}\n"
    print(text)
    warn(busy, prog)
    write_section(docs, section, text)
    return text
