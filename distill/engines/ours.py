"""This project's decoder's figures for the same drafts and prompts, read from a `distill accept` report, so an
engine's acceptance stands beside the bundled decoder's (served versus offline)."""

from __future__ import annotations

from typing import Any


def _task_row(report: dict[str, Any], draft: str) -> dict[str, Any] | None:
    tasks = report["drafts"][draft].get("tasks", {})
    return tasks.get("gsm8k", tasks.get("gsm8k@default"))  # a report of several templates names the task's own prompt gsm8k@default


def ours_acceptance(
    report: dict[str, Any] | None, family: str, k: int, n: int, max_new_tokens: int, mode: str = "greedy", dtype: str | None = None
) -> dict[str, Any] | None:
    """The decoder's GSM8K acceptance for the draft `family` (a report's draft name, or a name it prefixes as
    NAME-suffix), with the settings in which the report differs from the engine's run (None when alike)."""
    if report is None:
        return None
    names = sorted((d for d in report.get("drafts", {}) if family == d or family.startswith(f"{d}-")), key=len)
    if not names or (row := _task_row(report, names[-1])) is None:
        return None
    settings = report.get("settings") or {}
    samples = settings.get("num_samples")
    theirs = {
        "num_draft_tokens": settings.get("num_draft_tokens"),
        "num_samples": samples.get("gsm8k") if isinstance(samples, dict) else samples,
        "max_new_tokens": (settings.get("max_new_tokens_per_task") or {}).get("gsm8k", settings.get("max_new_tokens")),
        "mode": settings.get("mode"),
        "dtype": settings.get("dtype"),
    }
    wanted = {"num_draft_tokens": k, "num_samples": n, "max_new_tokens": max_new_tokens, "mode": mode, "dtype": dtype}
    differ = {key: theirs[key] for key in wanted if wanted[key] is not None and theirs[key] is not None and theirs[key] != wanted[key]}
    return {
        "draft": names[-1],
        "acceptance": row.get("acceptance_rate"),
        "per_position": row.get("per_position_acceptance"),
        "interval": (row.get("intervals") or {}).get("acceptance_rate"),
        "settings_differ": differ or None,
    }


def ours_difference(ours: dict[str, Any] | None, draft: str | None, reference: str | None) -> dict[str, Any] | None:
    """The decoder's paired acceptance difference `draft` − `reference` on GSM8K from a `distill accept` report, if it has one."""
    for c in (ours or {}).get("comparisons") or []:
        if c.get("task") in ("gsm8k", "gsm8k@default") and (c.get("draft"), c.get("reference")) == (draft, reference):
            return c.get("acceptance_rate")
    return None
