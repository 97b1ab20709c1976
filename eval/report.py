"""Render an acceptance report: report.json, report.md (a table per task, the k sweep) and two PNG
plots (per-position acceptance per draft; measured speedup vs k next to the predicted curve).
Every file is written to a temporary name beside its destination and renamed into place."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from distill.common.docs import markdown_table
from distill.common.io import atomic_write, to_json
from distill.eval.intervals import format_interval

ACCEPTANCE_PLOT = "acceptance_per_position.png"
SPEEDUP_PLOT = "speedup_vs_k.png"


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
    """One panel per task (per task and template under --template, up to 4 to a row): P(draft token j
    accepted) against j, a line per draft."""
    tasks = list(report["target_only"])
    cols = min(4, len(tasks))
    rows = -(-len(tasks) // cols)
    fig = Figure(figsize=(4.2 * cols, 4.2 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[len(tasks) :]:
        ax.set_visible(False)
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
    for ax in axes[::cols]:
        ax.set_ylabel("P(token j accepted)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)), fontsize="small")
    fig.suptitle(f"Per-position acceptance under {_short(report['target'])}")
    return _png(fig)


def speedup_plot(report: dict[str, Any]) -> bytes:
    """Measured decode speedup against k (markers) and the speedup predicted from the measured α, c, v(k) (dashed)."""
    fig = Figure(figsize=(7.2, 5.4), layout="constrained")
    ax = fig.subplots()
    for i, (name, entry) in enumerate(report["drafts"].items()):
        colour = f"C{i}"
        if entry["sweep"]:  # a draft left out of --sweep-drafts has its predicted curve only
            ks = [p["k"] for p in entry["sweep"]]
            ax.plot(ks, [p["decode_speedup"] or 0.0 for p in entry["sweep"]], marker="o", color=colour, label=f"{_short(name)}: measured decode speedup")
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


def with_interval(row: dict[str, Any], name: str, fmt: str, suffix: str = "") -> str:
    """A figure with its 95% interval, "0.870 [0.850, 0.889]", from a row's `intervals` (schema 2), else the figure alone."""
    iv = (row.get("intervals") or {}).get(name)
    if isinstance(iv, dict):
        return format_interval(iv, fmt, suffix)
    return _f(row.get(name), fmt) + (suffix if row.get(name) is not None else "")


def difference_text(figure: dict[str, Any] | None) -> str:
    """A paired difference, "+0.030 [+0.015, +0.047]*" (* = its interval excludes 0); – when absent."""
    return format_interval(figure, "+.3f") + ("*" if (figure or {}).get("outside_noise") else "")


def _task_table(report: dict[str, Any], task: str, base: dict[str, Any]) -> list[str]:
    """One task: target-only, then each draft (figures with intervals), then each greedy mismatch."""
    st = report["settings"]
    lines = [
        "",
        f"## {task} ({base['num_prompts']} prompts, {base['quality_metric']}, max {st['max_new_tokens_per_task'][task]} new tokens)",
        "",
        "| system | quality | quality − target only | greedy identity | acceptance | per position | tokens / target forward "
        "| TTFT ms | TPOT ms | tokens/s | end-to-end speedup | decode speedup | predicted decode | draft alone |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| target only | {with_interval(base, 'quality', '.3f')} | – | – | – | – | 1.00 | {base['ttft_s'] * 1e3:.1f} | {base['tpot_s'] * 1e3:.2f} "
        f"| {base['tokens_per_s']:.1f} | 1.00× | 1.00× | – | – |",
    ]
    for name, entry in report["drafts"].items():
        r = entry["tasks"][task]
        per_position = " / ".join(format(p, ".2f") for p in r["per_position_acceptance"])
        predicted = (r.get("decomposition") or {}).get("predicted_decode_speedup")
        lines.append(
            f"| {name} | {with_interval(r, 'quality', '.3f')} | {difference_text(r.get('quality_vs_target'))} | {_f(r['greedy_identity'], '.1%')} | {with_interval(r, 'acceptance_rate', '.3f')} | {per_position} "
            f"| {with_interval(r, 'tokens_per_target_forward', '.2f')} | {r['ttft_s'] * 1e3:.1f} | {r['tpot_s'] * 1e3:.2f} | {r['tokens_per_s']:.1f} "
            f"| {with_interval(r, 'end_to_end_speedup', '.2f', '×')} | {with_interval(r, 'decode_speedup', '.2f', '×')} | {_f(predicted, '.2f')}× "
            f"| {_f(r.get('draft_alone_quality'), '.3f')} |"
        )
        for m in r.get("mismatches") or []:
            lines.append(
                f"|  ↳ {m['example']} differs | at token {m['position']}: target {m['target_token']}, speculative "
                f"{m['speculative_token']}, target's top-2 logit margin {m['target_top2_margin']:.3g} ||||||||||||"
            )
    return lines


def decomposition_table(report: dict[str, Any], heading: str = "##") -> list[str]:
    """Where each draft's decode time goes per round, and how well the speed model predicts it; nothing when
    no draft has the loop's own clocks."""
    header = [
        "",
        f"{heading} Where the decode time goes (per round, all tasks' prompts at the main k)",
        "",
        "| draft | task | draft ms | verify ms | bookkeeping ms | parts / decode time | c in loop | v(k) in loop | c bench | c₂ bench "
        "| tokens / round (measured) | (i.i.d. α) | round ms (measured) | (bench c, c₂, v) | target-only TPOT / bench step | decode speedup "
        "| predicted | (forwards only) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = []
    for name, entry in report["drafts"].items():
        for task, r in entry["tasks"].items():
            d = r.get("decomposition") or {}
            if "draft_s_per_round" not in d:  # a report without the loop's own clocks (older, or one without timings)
                continue
            loop, costs = d.get("in_loop") or {}, entry.get("costs") or {}
            rows.append(
                f"| {name} | {task} | {d['draft_s_per_round'] * 1e3:.1f} | {d['verify_s_per_round'] * 1e3:.1f} | {d['bookkeeping_s_per_round'] * 1e3:.2f} "
                f"| {_f(d.get('parts_over_decode_time'), '.3f')} | {_f(loop.get('c'), '.3f')} | {_f(loop.get('v'), '.3f')} "
                f"| {_f(costs.get('c'), '.3f')} | {_f(costs.get('c_first'), '.3f')} | {d['tokens_per_round']:.3f} | {d['predicted_tokens_per_round']:.3f} "
                f"| {d['decode_s_per_round'] * 1e3:.1f} | {_f(d.get('predicted_round_s') and d['predicted_round_s'] * 1e3, '.1f')} "
                f"| {_f(d.get('target_only_overhead'), '.3f')} | {_f(r.get('decode_speedup'), '.3f')}× | {_f(d.get('predicted_decode_speedup'), '.3f')}× "
                f"| {_f(d.get('predicted_decode_speedup_forwards_only'), '.3f')}× |"
            )
    return header + rows if rows else []


def vocab_table(report: dict[str, Any], heading: str = "##") -> list[str]:
    """Each trimmed draft's kept output rows and its coverage per task (the share of the target-only
    answers' tokens inside its set), then its prompt rows and the share inside the set as each call's
    prompt widened it ("–" in reports from before prompt rows); nothing when no draft is trimmed."""
    rows = [
        [name, f"{v['kept']:,}", task, f"{share:.2%}", v.get("prompt_rows", 0), _f(v.get("coverage_with_prompt_rows", {}).get(task), ".2%")]
        for name, entry in report["drafts"].items()
        if "vocab" in entry
        for v in [entry["vocab"]]
        for task, share in v["coverage"].items()
    ]
    if not rows:
        return []
    title = f"{heading} Trimmed output layers: coverage of the target's own output tokens"
    columns = ["draft", "output rows kept", "task", "coverage", "prompt rows", "coverage with the prompt's tokens"]
    return ["", title, "", markdown_table(columns, rows)]


def _comparison_table(report: dict[str, Any]) -> list[str]:
    """Each draft minus the first named, on the same prompts: paired differences with their intervals."""
    rows = report.get("comparisons") or []
    if not rows:
        return []
    lines = [
        "",
        "## Paired differences (draft − reference, same prompts; * = the interval excludes 0)",
        "",
        "| task | draft − reference | acceptance | tokens / target forward | end-to-end speedup | decode speedup |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for c in rows:
        cells = [difference_text(c.get(n)) for n in FIGURES]
        lines.append(f"| {c['task']} | {c['draft']} − {c['reference']} | " + " | ".join(cells) + " |")
    return lines


FIGURES = ("acceptance_rate", "tokens_per_target_forward", "end_to_end_speedup", "decode_speedup")


def _runs(report: dict[str, Any]) -> list[str]:
    """The timing runs behind the speed figures."""
    lines = ["", "Timing runs (each speedup pairs a speculative call with the target-only call of its own run):", ""]
    for run_id, run in (report.get("runs") or {}).items():
        load = (run.get("machine_load") or {}).get("others_cores")
        lines.append(
            f"- `{run_id}`: started {run.get('started')}, {run.get('device_name')}, {run.get('torch_threads')} torch threads, "
            f"other processes {_f(load, '.2f')} cores"
        )
    return lines


def markdown(report: dict[str, Any]) -> str:
    """report.md: the settings, per task a row for target-only and one per draft, paired differences,
    the decomposition of decode time, then the k sweep."""
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
        "End-to-end speedup = Σ target-only wall time / Σ speculative wall time (whole calls, TTFT included); decode speedup = "
        "target-only time per output token after the first / the speculative one (each pooled). Both pair each speculative call "
        "with the target-only call on the same prompts timed in the same run. [low, high]: 95% bootstrap interval over prompts. "
        "Greedy identity = share of prompts whose speculative output equals the target-only output token for token. "
        "Predicted decode = measured tokens per round × target-only TPOT / (target step × (c₂ + (k-1)·c + v(k)) + bookkeeping per round), "
        "c, c₂ (the round's first draft step, which reads two tokens), v(k) and the target step from this run's microbenchmark "
        "(c₂ = c in reports that did not measure it); (forwards only) = tokens per round / (c₂ + (k-1)·c + v(k)).",
    ]
    for task, base in report["target_only"].items():
        lines += _task_table(report, task, base)
    lines += _comparison_table(report) + vocab_table(report) + decomposition_table(report) + _runs(report) + sweep_tables(report)
    lines += [f"![per-position acceptance]({ACCEPTANCE_PLOT})", "", f"![speedup vs k]({SPEEDUP_PLOT})", ""]
    return "\n".join(lines)


def sweep_tables(report: dict[str, Any], heading: str = "##") -> list[str]:
    """Per draft, the k sweep: measured decode and end-to-end speedups with intervals against the speed
    model's predictions, and the error of the prediction from the measured tokens per round."""
    if not any(entry.get("sweep") for entry in report["drafts"].values()):
        return []
    k0 = report["settings"]["num_draft_tokens"]
    lines = ["", f"{heading} Speedup vs k (all tasks pooled)", ""]
    for name, entry in report["drafts"].items():
        if not entry.get("sweep"):
            continue
        costs = entry.get("costs") or {}
        lines += [
            f"**{name}**: α = {entry['alpha']:.3f}, c = {_f(costs.get('c'), '.3f')}, best k = {entry.get('best_k', '–')} (α fitted at k = {k0}).",
            "",
            "| k | prompts | decode speedup | end-to-end speedup | predicted decode (measured tokens / round) | error | predicted (α at this k) "
            "| α at this k | acceptance | tokens / target forward |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for p in entry.get("sweep") or []:
            predicted = (p.get("decomposition") or {}).get("predicted_decode_speedup")
            error = f"{(predicted / p['decode_speedup'] - 1) * 100:+.1f}%" if predicted and p.get("decode_speedup") else "–"
            lines.append(
                f"| {p['k']} | {p['num_prompts']} | {with_interval(p, 'decode_speedup', '.2f', '×')} | {with_interval(p, 'end_to_end_speedup', '.2f', '×')} "
                f"| {_f(predicted, '.2f')}× | {error} | {_f(p.get('predicted_speedup_own_alpha'), '.2f')}× "
                f"| {p['alpha']:.3f} | {with_interval(p, 'acceptance_rate', '.3f')} | {p['tokens_per_target_forward']:.2f} |"
            )
        lines.append("")
    return lines


def write_outputs(report: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write report.json, report.md and the two plots into `out_dir`; return their paths."""
    out_dir = Path(out_dir)
    files = {
        "report.json": to_json(report).encode(),
        "report.md": markdown(report).encode(),
        ACCEPTANCE_PLOT: acceptance_plot(report),
        SPEEDUP_PLOT: speedup_plot(report),
    }
    for name, data in files.items():
        atomic_write(out_dir / name, data)
    return [out_dir / name for name in files]
