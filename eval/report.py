"""Render an acceptance report: report.json, report.md (a table per task, the k sweep) and two PNG
plots (per-position acceptance per draft; measured speedup vs k next to the predicted curve).
Every file is written to a temporary name beside its destination and renamed into place."""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

ACCEPTANCE_PLOT = "acceptance_per_position.png"
SPEEDUP_PLOT = "speedup_vs_k.png"


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual permissions of a new file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _short(name: str, parts: int = 2) -> str:
    """A model reference short enough for a plot title: a Hub id as is, a long path by its last parts."""
    path = Path(name)
    return name if len(name) <= 40 or len(path.parts) <= parts else str(Path(*path.parts[-parts:]))


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    return buf.getvalue()


def acceptance_plot(report: dict[str, Any]) -> bytes:
    """One panel per task: P(draft token j accepted) against j, a line per draft."""
    tasks = list(report["target_only"])
    fig = Figure(figsize=(4.2 * len(tasks), 4.2), layout="constrained")
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, task in zip(axes, tasks):
        depth = 1
        for name, entry in report["drafts"].items():
            values = entry["tasks"][task]["per_position_acceptance"]
            depth = max(depth, len(values))
            ax.plot(range(1, len(values) + 1), values, marker="o", label=_short(name))
        ax.set_title(task)
        ax.set_xlabel("draft position j")
        ax.set_xticks(range(1, depth + 1))
        ax.set_ylim(-0.03, 1.05)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("P(token j accepted)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)), fontsize="small")
    fig.suptitle(f"Per-position acceptance under {_short(report['target'])}")
    return _png(fig)


def speedup_plot(report: dict[str, Any]) -> bytes:
    """Measured speedup against k (markers) and the speedup predicted from the measured α, c, v(k) (dashed)."""
    fig = Figure(figsize=(7.2, 5.4), layout="constrained")
    ax = fig.subplots()
    for i, (name, entry) in enumerate(report["drafts"].items()):
        colour = f"C{i}"
        ks = [p["k"] for p in entry["sweep"]]
        ax.plot(ks, [p["measured_speedup"] for p in entry["sweep"]], marker="o", color=colour, label=f"{_short(name)}: measured")
        curve = entry.get("predicted_curve") or []
        if curve:
            ax.plot(
                [p["k"] for p in curve],
                [p["predicted_speedup"] for p in curve],
                linestyle="--",
                color=colour,
                label=f"{_short(name)}: predicted (α={entry['alpha']:.2f}, c={entry['costs']['c']:.2f})",
            )
    ax.axhline(1.0, color="grey", linewidth=1, label="target only")
    ax.set_xlabel("draft tokens per round k")
    ax.set_ylabel("speedup over target-only decoding")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncols=2, fontsize="small")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"Speedup vs k under {_short(report['target'])}")
    return _png(fig)


def _f(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def markdown(report: dict[str, Any]) -> str:
    """report.md: the settings, then per task a row for target-only and one per draft, then the k sweep."""
    env, st = report["environment"], report["settings"]
    lines = [
        "# Acceptance evaluation",
        "",
        f"Target `{report['target']}`; {st['mode']} decoding"
        + (f" (temperature {st['temperature']}, top-p {st['top_p']})" if st["mode"] == "sampling" else "")
        + f", k = {st['num_draft_tokens']} ({st['schedule']}), batch size {st['batch_size']}, seed {st['seed']}.",
        f"{env['device_name']} ({env['device']}), {env['dtype']}; torch {env['torch']}, transformers {env['transformers']}, distill {env['distill']}.",
        "",
        f"`{env['command']}`",
        "",
        *([f"**Warning:** {report['machine_load']['warning']}", ""] if (report.get("machine_load") or {}).get("busy") else []),
        "Speedup = target-only wall time / speculative wall time on the same prompts. Greedy identity = share of prompts "
        "whose speculative output equals the target-only output token for token. Predicted = (1 − α^(k+1)) / (1 − α) / "
        "(k·c + v(k)) with α fitted from this run and c, v(k) measured on this device.",
    ]
    for task, base in report["target_only"].items():
        lines += [
            "",
            f"## {task} ({base['num_prompts']} prompts, {base['quality_metric']}, max {st['max_new_tokens_per_task'][task]} new tokens)",
            "",
            "| system | quality | greedy identity | acceptance | mean accepted length | tokens / target forward "
            "| per position | TTFT ms | TPOT ms | tokens/s | speedup | predicted | draft alone |",
            "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
            f"| target only | {base['quality']:.3f} | – | – | – | 1.00 | – | {base['ttft_s'] * 1e3:.1f} | {base['tpot_s'] * 1e3:.2f} "
            f"| {base['tokens_per_s']:.1f} | 1.00× | – | – |",
        ]
        for name, entry in report["drafts"].items():
            r = entry["tasks"][task]
            lines.append(
                f"| {name} | {r['quality']:.3f} | {_f(r['greedy_identity'], '.1%')} | {r['acceptance_rate']:.1%} "
                f"| {r['mean_accepted_length']:.2f} | {r['tokens_per_target_forward']:.2f} "
                f"| {' / '.join(format(p, '.2f') for p in r['per_position_acceptance'])} | {r['ttft_s'] * 1e3:.1f} "
                f"| {r['tpot_s'] * 1e3:.2f} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}× "
                f"| {_f(r.get('predicted_speedup'), '.2f')}× | {_f(r.get('draft_alone_quality'), '.3f')} |"
            )
            for m in r.get("mismatches") or []:
                lines.append(
                    f"|  ↳ {m['example']} differs | at token {m['position']}: target {m['target_token']}, speculative "
                    f"{m['speculative_token']}, target's top-2 logit margin {m['target_top2_margin']:.3g} |||||||||||"
                )
    lines += ["", "## Speedup vs k (all tasks pooled)", ""]
    k0 = st["num_draft_tokens"]
    for name, entry in report["drafts"].items():
        costs = entry.get("costs") or {}
        lines += [
            f"**{name}** (`{entry['path']}`): α = {entry['alpha']:.3f}, c = {_f(costs.get('c'), '.3f')}, "
            f"best k = {entry.get('best_k', '–')} (α fitted at k = {k0}).",
            "",
            f"| k | measured speedup | predicted (α at k = {k0}) | predicted (α at this k) | α at this k | acceptance | tokens / target forward |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for p in entry["sweep"]:
            lines.append(
                f"| {p['k']} | {p['measured_speedup']:.2f}× | {_f(p.get('predicted_speedup'), '.2f')}× "
                f"| {_f(p.get('predicted_speedup_own_alpha'), '.2f')}× | {p['alpha']:.3f} | {p['acceptance_rate']:.1%} "
                f"| {p['tokens_per_target_forward']:.2f} |"
            )
        lines.append("")
    lines += [f"![per-position acceptance]({ACCEPTANCE_PLOT})", "", f"![speedup vs k]({SPEEDUP_PLOT})", ""]
    return "\n".join(lines)


def write_outputs(report: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write report.json, report.md and the two plots into `out_dir`; return their paths."""
    out_dir = Path(out_dir)
    files = {
        "report.json": (json.dumps(report, indent=2) + "\n").encode(),
        "report.md": markdown(report).encode(),
        ACCEPTANCE_PLOT: acceptance_plot(report),
        SPEEDUP_PLOT: speedup_plot(report),
    }
    for name, data in files.items():
        write_atomic(out_dir / name, data)
    return [out_dir / name for name in files]
