"""Local data files read row by row with the place of each row, so that a bad row is reported as
`FILE:LINE: problem` (DataFileError) by every command that reads data: evaluation tasks and training.

JSON lines (.jsonl, or a .json file that is not one JSON array), a JSON array of objects (.json) and
Parquet (.parquet, placed by row number) are read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from distill.common.io import DataFileError, json_lines

SUFFIXES = (".jsonl", ".json", ".parquet")
Row = tuple[str, dict[str, Any]]  # (where: "FILE:LINE", the row)


def read_rows(path: str | os.PathLike, allow_empty: bool = False) -> list[Row]:
    """Every row of a local .jsonl, .json or .parquet file with its place; a line that is not a JSON
    object, an unreadable file or (unless `allow_empty`) a file of no rows is a DataFileError naming
    the file (and line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist; pass an existing file")
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"data file {str(path)!r} has an unsupported suffix {path.suffix!r}; use one of {list(SUFFIXES)}")
    if suffix == ".parquet":
        rows = _parquet(path)
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise DataFileError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8") from None
        rows = _json_array(path, text) if suffix == ".json" and text.lstrip().startswith("[") else _json_lines(path, text)
    if not rows and not allow_empty:
        raise DataFileError(f"{path}: no rows; point at a file with data")
    return rows


def _json_lines(path: Path, text: str) -> list[Row]:
    return [(f"{path}:{number}", row) for number, row in json_lines(path, text)]


def _json_array(path: Path, text: str) -> list[Row]:
    """The objects of a JSON array, each placed at the line it starts on."""
    decoder, rows = json.JSONDecoder(), []
    at = text.index("[") + 1

    def skip(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    at = skip(at)
    while at < len(text) and text[at] != "]":
        line = text.count("\n", 0, at) + 1
        try:
            row, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError as err:
            raise DataFileError(f"{path}:{err.lineno}: not JSON ({err.msg} at column {err.colno}); fix the file") from None
        if not isinstance(row, dict):
            raise DataFileError(f"{path}:{line}: a JSON {type(row).__name__}, not an object with the task's fields; fix the item")
        rows.append((f"{path}:{line}", row))
        at = skip(end)
        if at < len(text) and text[at] == ",":
            at = skip(at + 1)
        elif at >= len(text) or text[at] != "]":
            raise DataFileError(f"{path}:{text.count(chr(10), 0, at) + 1}: not JSON (expected ',' or ']' after an item); fix the file")
    if at >= len(text):
        raise DataFileError(f"{path}:{text.count(chr(10)) + 1}: not JSON (the array is not closed); fix the file")
    return rows


def _parquet(path: Path) -> list[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise DataFileError(f"{path}: not a readable Parquet file ({err}); rewrite it") from None
    return [(f"{path}: row {i + 1}", row) for i, row in enumerate(table.to_pylist())]


def hub_rows(hub_id: str, config: str | None, split: str) -> list[Row]:
    """Every row of a Hub dataset split, placed by row number."""
    import datasets

    ds = datasets.load_dataset(hub_id, config, split=split)
    return [(f"{hub_id} ({config}, {split}) row {i + 1}", row) for i, row in enumerate(ds)]


def check_rows(rows: Sequence[Row], check: Callable[[dict[str, Any]], str | None]) -> None:
    """Raise DataFileError `WHERE: problem` for the first row `check` finds a problem with."""
    for where, row in rows:
        problem = check(row)
        if problem:
            raise DataFileError(f"{where}: {problem}")


def text_field(row: dict[str, Any], name: str, what: str) -> str | None:
    """The problem with `row[name]` as a non-empty string of a `what` row, or None when it is one."""
    if name not in row or row[name] is None:
        return f"no {name!r} field; {what} rows need it"
    if not isinstance(row[name], str):
        return f"{name!r} is a {type(row[name]).__name__}, not text"
    if not row[name].strip():
        return f"{name!r} is empty"
    return None
