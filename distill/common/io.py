"""Files that are whole or absent: one atomic file write, one atomic folder swap, one JSON writer,
one JSONL reader with located errors.

A killed run must never leave a half-written checkpoint, cache or report, and what it writes is for
others to read: files get mode 0644 and folders 0755 (mkstemp/mkdtemp make 0600/0700), and the
temporary beside the target is removed when the write fails.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FILE_MODE, FOLDER_MODE = 0o644, 0o755


class DataFileError(ValueError):
    """A data file that cannot be read: the message names the file, the line and the problem."""


def atomic_write(path: str | os.PathLike, data: str | bytes | Callable[[str], None]) -> Path:
    """Write `data` to `path` through a temporary file in the same folder, then rename it into place.

    `data` is text (UTF-8), bytes, or a function that writes the temporary file given its path (for
    writers that take a path, such as safetensors' `save_file`). Parent folders are created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if callable(data):
            os.close(fd)
            data(tmp)
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def to_json(payload: Any) -> str:
    """The project's JSON text: indented, UTF-8 kept readable, paths and other objects as strings, ending in a newline."""
    return json.dumps(payload, indent=2, ensure_ascii=False, default=str) + "\n"


def write_json(path: str | os.PathLike, payload: Any) -> Path:
    """`payload` as indented JSON at `path`, written atomically."""
    return atomic_write(path, to_json(payload))


HASHED_BYTES = 64 << 20  # files up to this size are stamped by content, larger ones (weights) by size and time


def file_stamp(path: Path) -> list:
    """The content hash of each small file (a data file or config copied or remounted keeps its stamp),
    and size and modification time of each large one, for a local file or every file under a folder."""
    files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file())

    def one(f: Path) -> tuple:
        size = f.stat().st_size
        return (size, hashlib.sha256(f.read_bytes()).hexdigest()) if size <= HASHED_BYTES else (size, f.stat().st_mtime_ns)

    return [(str(f.relative_to(path)) if f != path else f.name, *one(f)) for f in files]


def json_lines(path: str | os.PathLike, text: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of JSON-lines `text` read from `path`. Split on
    newlines only (JSON strings may hold \\u2028 and other characters `str.splitlines` breaks at); a line
    that is not a JSON object raises DataFileError naming the file and the line."""
    rows = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataFileError(f"{path}:{number}: not JSON ({err.msg} at column {err.colno}); fix or delete the line") from None
        if not isinstance(row, dict):
            raise DataFileError(f"{path}:{number}: a JSON {type(row).__name__}, not an object with the task's fields; fix or delete the line")
        rows.append((number, row))
    return rows


def read_jsonl(path: str | os.PathLike, n: int | None = None) -> list[dict[str, Any]]:
    """The first `n` (all when None) objects of a JSON-lines file, blank lines skipped (`json_lines`)."""
    return [row for _, row in json_lines(path, Path(path).read_text(encoding="utf-8"))][:n]


def share_permissions(folder: str | os.PathLike) -> None:
    """Give `folder` and everything under it the modes of published files: folders 0755, files 0644
    (temporary folders and transformers' temp-file-and-rename saves leave 0700 / 0600)."""
    for root, _dirs, files in os.walk(folder):
        os.chmod(root, FOLDER_MODE)
        for name in files:
            os.chmod(os.path.join(root, name), FILE_MODE)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    at_fdcwd, rename_exchange = -100, 2
    return renameat2 is not None and renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def swap_folder(tmp: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Move the finished folder `tmp` to `out` with published modes. An existing `out` is exchanged
    with it atomically and then removed, so a killed run leaves `out` either old or whole and new;
    where no exchange exists the old folder is moved aside first and put back if the rename fails."""
    tmp, out = Path(tmp), Path(out)
    share_permissions(tmp)
    if not out.exists():
        os.replace(tmp, out)
        return out
    if _exchange(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)  # now the old folder
        return out
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    os.replace(out, aside / out.name)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(aside / out.name, out)
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    return out


@contextmanager
def atomic_folder(out: str | os.PathLike) -> Iterator[Path]:
    """Build a folder in a temporary beside `out`, then swap it into place (`swap_folder`); the
    temporary is removed when the block raises, and `out` keeps what it had."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        yield tmp
        swap_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
