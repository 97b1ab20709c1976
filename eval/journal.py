"""The acceptance evaluation's journal: every finished generate call, appended as it finishes, with
the timing run that made it (the llama.cpp benchmark journals each prompt's runs the same way).

A run is one invocation of the evaluation (`run_id`, start time, machine, torch threads; its machine
load is appended when it ends, and journalled with each call so far, so a stopped run's is known too).
Outputs and acceptance of any run may be reused; a timing is only ever compared with timings of its
own run: a speedup pairs each speculative call with the target-only call of the same prompts timed in
the same run. Journals written before runs were recorded are read whole: their calls count as one
earlier run (`LEGACY`) whose timings are never paired, so their outputs are reused and their prompts
re-timed.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from distill.common.io import atomic_write
from distill.common.provenance import environment

VERSION = 2
LEGACY = "legacy"  # the run of calls journalled before runs were recorded


@dataclass
class Run:
    """One invocation of the evaluation: the calls it timed are comparable with each other only."""

    run_id: str
    started: str
    device_name: str
    device: str
    torch_threads: int
    command: str = ""
    machine_load: dict[str, Any] | None = None

    @classmethod
    def begin(cls, device: Any, command: str = "") -> Run:
        """A new run on this machine, now."""
        env = environment(device)
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        return cls(uuid.uuid4().hex[:12], started, env["device_name"], env["device"], env["torch_threads"], command)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Journal:
    """Append-only JSONL: a header (fingerprint, version), run lines and call records. Reloaded when
    the settings match; started afresh (the old file moved aside, not lost) when they do not."""

    def __init__(self, path: Path, fingerprint: str, prog: str = "distill accept"):
        self.path = path
        self.records: dict[str, list[dict[str, Any]]] = {}  # key -> its calls, oldest first
        self.runs: dict[str, dict[str, Any]] = {}
        self.run: Run | None = None
        lines = path.read_text().splitlines() if path.exists() else []
        head = _json(lines[0]) if lines else None
        if lines and (head or {}).get("fingerprint") != fingerprint:
            kept = path.with_name(f"{path.stem}.{(head or {}).get('fingerprint', 'unknown')}{path.suffix}")
            path.replace(kept)
            print(f"{prog}: {path} holds a run with other settings or files; starting afresh (the old journal kept as {kept.name})", file=sys.stderr)
            lines = []
        for line in lines[1:]:
            self._read(_json(line))
        if not lines:
            atomic_write(path, json.dumps({"fingerprint": fingerprint, "journal_version": VERSION}) + "\n")

    def _read(self, entry: dict[str, Any] | None) -> None:
        """One journal line: a run, a run's machine load, or a call (a line cut short by a crash is skipped: that call is redone)."""
        if entry is None:
            return
        if "run" in entry:
            self.runs[entry["run"]["run_id"]] = entry["run"]
        elif "run_end" in entry:
            self.runs.setdefault(entry["run_end"], {})["machine_load"] = entry["machine_load"]
        elif "key" in entry:
            if "run_id" not in entry:
                entry["run_id"] = LEGACY
                self.runs.setdefault(LEGACY, {"run_id": LEGACY, "started": None, "note": "journalled before runs were recorded: timings not paired"})
            self.records.setdefault(entry["key"], []).append(entry)

    def _append(self, entry: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def begin(self, run: Run) -> None:
        """Start recording calls under `run`."""
        self.run = run
        self.runs[run.run_id] = run.to_dict()
        self._append({"run": run.to_dict()})

    def end(self, machine_load: dict[str, Any]) -> None:
        """Record how busy the machine was during this run."""
        assert self.run is not None
        self.run.machine_load = machine_load
        self.runs[self.run.run_id]["machine_load"] = machine_load
        self._append({"run_end": self.run.run_id, "machine_load": machine_load})

    def run_with_load(self, run_id: str) -> dict[str, Any]:
        """A run's line with its machine load: as recorded at its end or, for a run that was stopped, as
        journalled with its last call (None where neither was recorded: calls of older versions)."""
        run = dict(self.runs[run_id])
        if run.get("machine_load") is None:
            loads = [r["machine_load"] for calls in self.records.values() for r in calls if r["run_id"] == run_id and r.get("machine_load")]
            run["machine_load"] = max(loads, key=lambda m: m["wall_s"]) if loads else None
        return run

    def latest(self, key: str) -> dict[str, Any] | None:
        """The newest call under `key` (its outputs and acceptance), from any run."""
        calls = self.records.get(key)
        return calls[-1] if calls else None

    def in_run(self, key: str, run_id: str) -> dict[str, Any] | None:
        """The newest call under `key` timed in run `run_id` (never the legacy run's: its timings are not paired)."""
        if run_id == LEGACY:
            return None
        return next((r for r in reversed(self.records.get(key, [])) if r["run_id"] == run_id), None)

    def add(self, key: str, record: dict[str, Any]) -> dict[str, Any]:
        """Append one finished call, stamped with the current run."""
        assert self.run is not None, "Journal.begin(run) first"
        record = {"key": key, "run_id": self.run.run_id, **record}
        self._append(record)
        self.records.setdefault(key, []).append(record)
        return record


def _json(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def busiest(runs: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The machine load of the busiest of these runs (by the other processes' cores): what a report timed by
    all of them may claim about how idle the machine was."""
    loads = [r["machine_load"] for r in runs if r.get("machine_load")]
    return max(loads, key=lambda m: m["others_cores"] or 0.0) if loads else None
