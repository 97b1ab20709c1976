"""The acceptance report's figures from journalled calls: quality, identity, acceptance, timing,
the two speedups, the per-round decomposition, predictions, and a 95% interval on each headline
figure (a bootstrap over prompts, `distill.eval.intervals`).

Speedups use pairs only: a speculative call and the target-only call on the same prompts, timed in
the same run. End-to-end speedup = Σ target wall time / Σ speculative wall time (whole calls, time
to first token included); decode speedup = target time per output token after the first over the
speculative one, each pooled (Σ decode time / Σ tokens after the first). The speed model predicts
the decode speedup.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from distill.eval.intervals import Interval, bootstrap, difference, ratio, ratio_of_ratios
from distill.eval.tasks import Task, TaskExample
from distill.speculative.costs import Costs, expected_tokens_per_round, fit_alpha

SCHEMA_VERSION = 2  # 2: runs, paired timings, end-to-end and decode speedups, intervals, per-round decomposition
ONE = "one"  # the column of ones beside per-prompt scores (_with_ones): its sum is the number of prompts drawn


def outputs(records: Iterable[dict]) -> dict[int, list[int]]:
    """Example index -> the new tokens decoded for it, over journalled generate calls."""
    return {i: row for r in records for i, row in zip(r["examples"], r["new"])}


def decode_columns(record: dict) -> tuple[float, float]:
    """(decode seconds, tokens after the first per row) of one call: its time after the first token."""
    per_row = sum(len(row) for row in record["new"]) / len(record["new"])
    return (record["wall_s"] - record["ttft_s"], per_row - 1) if per_row > 1 else (0.0, 0.0)


def timing(records: list[dict]) -> dict[str, float]:
    """TTFT (mean per call), TPOT (pooled decode time over tokens after the first), tokens/s, totals."""
    wall = sum(r["wall_s"] for r in records)
    tokens = sum(len(row) for r in records for row in r["new"])
    decode = [decode_columns(r) for r in records]
    decode_s, decode_tokens = sum(d[0] for d in decode), sum(d[1] for d in decode)
    return {
        "ttft_s": statistics.fmean(r["ttft_s"] for r in records) if records else 0.0,
        "tpot_s": decode_s / decode_tokens if decode_tokens else 0.0,
        "tokens_per_s": tokens / wall if wall else 0.0,
        "wall_s": wall,
        "new_tokens": tokens,
    }


def acceptance(records: list[dict]) -> dict[str, Any]:
    """Acceptance figures summed over the calls' stats."""
    total = {key: sum(r["stats"][key] for r in records) for key in ("proposed", "accepted", "new_tokens", "sequence_forwards", "rounds")}
    depth = max((len(r["stats"]["position_proposed"]) for r in records), default=0)
    proposed, accepted = [0] * depth, [0] * depth
    for r in records:
        for j, (p, a) in enumerate(zip(r["stats"]["position_proposed"], r["stats"]["position_accepted"])):
            proposed[j] += p
            accepted[j] += a
    return {
        "acceptance_rate": total["accepted"] / total["proposed"] if total["proposed"] else 0.0,
        "mean_accepted_length": total["accepted"] / proposed[0] if proposed and proposed[0] else 0.0,
        "tokens_per_target_forward": total["new_tokens"] / total["sequence_forwards"] if total["sequence_forwards"] else 0.0,
        "per_position_acceptance": [a / p if p else 0.0 for a, p in zip(accepted, proposed)],
        "alpha": fit_alpha(proposed, accepted),
        "proposed": total["proposed"],
        "accepted": total["accepted"],
        "rounds": total["rounds"],
        "target_forwards": total["sequence_forwards"],
        "position_proposed": proposed,
        "position_accepted": accepted,
    }


def quality(task: Task, texts: list[str], examples: list[TaskExample], seed: int = 0) -> dict[str, Any]:
    """The task's metrics averaged over its examples; `quality` is the primary one, with its 95%
    interval over the prompts (`intervals.quality`)."""
    per_example = [task.scores(text, ex) for text, ex in zip(texts, examples)]
    metrics = {name: statistics.fmean(s[name] for s in per_example) for name in per_example[0]}
    scores = [s[task.metric_name] for s in per_example]
    return {
        "quality": metrics[task.metric_name],
        "quality_metric": task.metric_name,
        "metrics": metrics,
        "per_example_quality": scores,
        "intervals": {"quality": bootstrap(_with_ones(score=scores), ratio("score", ONE), seed=seed).to_dict()},
    }


def quality_difference(target: Sequence[float], system: Sequence[float], seed: int = 0) -> dict[str, Any]:
    """A system's quality minus target-only quality on the same prompts (per-prompt scores in the same
    order), with the paired bootstrap's interval: what speculative decoding did to the task's answers."""
    return _with_verdict(bootstrap(_with_ones(system=system, target=target), difference(ratio("system", ONE), ratio("target", ONE)), seed=seed))


def _with_ones(**scores: Sequence[float]) -> dict[str, Sequence[float]]:
    """Per-prompt score columns and the column ONE of ones, so that ratio(score, ONE) is a score's mean over the prompts drawn."""
    return {**scores, ONE: [1.0] * len(next(iter(scores.values())))}


def _with_verdict(iv: Interval) -> dict[str, Any]:
    """A difference's interval record and whether it excludes 0 (a change outside noise)."""
    return {**iv.to_dict(), "outside_noise": iv.excludes(0.0)}


# ---------------------------------------------------------------------------------------------
# Columns per call, and the intervals over them


def acceptance_columns(records: Sequence[dict], prefix: str = "") -> dict[str, list[float]]:
    """Per call: accepted and proposed draft tokens, per position, emitted tokens and target forwards."""
    depth = max((len(r["stats"]["position_proposed"]) for r in records), default=0)
    cols: dict[str, list[float]] = {f"{prefix}{n}": [] for n in ("accepted", "proposed", "emitted", "forwards")}
    for j in range(depth):
        cols[f"{prefix}pa{j}"], cols[f"{prefix}pp{j}"] = [], []
    for r in records:
        s = r["stats"]
        for name, value in (("accepted", s["accepted"]), ("proposed", s["proposed"]), ("emitted", s["new_tokens"]), ("forwards", s["sequence_forwards"])):
            cols[f"{prefix}{name}"].append(value)
        for j in range(depth):
            cols[f"{prefix}pa{j}"].append(s["position_accepted"][j] if j < len(s["position_accepted"]) else 0)
            cols[f"{prefix}pp{j}"].append(s["position_proposed"][j] if j < len(s["position_proposed"]) else 0)
    return cols


def speed_columns(pairs: Sequence[tuple[dict, dict]], prefix: str = "") -> dict[str, list[float]]:
    """Per pair (target-only call, speculative call of the same run): wall and decode times and tokens."""
    cols: dict[str, list[float]] = {f"{prefix}{n}": [] for n in ("t_wall", "s_wall", "t_dec_s", "t_dec_n", "s_dec_s", "s_dec_n")}
    for target, spec in pairs:
        for side, r in (("t", target), ("s", spec)):
            dec_s, dec_n = decode_columns(r)
            cols[f"{prefix}{side}_wall"].append(r["wall_s"])
            cols[f"{prefix}{side}_dec_s"].append(dec_s)
            cols[f"{prefix}{side}_dec_n"].append(dec_n)
    return cols


def _end_to_end(prefix: str = ""):
    return ratio(f"{prefix}t_wall", f"{prefix}s_wall")


def _decode(prefix: str = ""):
    return ratio_of_ratios(f"{prefix}t_dec_s", f"{prefix}t_dec_n", f"{prefix}s_dec_s", f"{prefix}s_dec_n")


def intervals(records: Sequence[dict], pairs: Sequence[tuple[dict, dict]], seed: int = 0) -> dict[str, Any]:
    """95% intervals of acceptance, per-position acceptance, tokens per target forward and (over the
    timed pairs) both speedups, each a bootstrap over the calls (prompts, at batch size 1)."""
    cols = acceptance_columns(records)
    out: dict[str, Any] = {
        "acceptance_rate": bootstrap(cols, ratio("accepted", "proposed"), seed=seed).to_dict(),
        "tokens_per_target_forward": bootstrap(cols, ratio("emitted", "forwards"), seed=seed).to_dict(),
        "per_position_acceptance": [bootstrap(cols, ratio(f"pa{j}", f"pp{j}"), seed=seed).to_dict() for j in range(sum(1 for c in cols if c.startswith("pp")))],
    }
    if pairs:
        speed = speed_columns(pairs)
        out["end_to_end_speedup"] = bootstrap(speed, _end_to_end(), seed=seed).to_dict()
        out["decode_speedup"] = bootstrap(speed, _decode(), seed=seed).to_dict()
    return out


def paired_difference(
    a: tuple[Sequence[dict], Sequence[tuple[dict, dict]]], b: tuple[Sequence[dict], Sequence[tuple[dict, dict]]], seed: int = 0
) -> dict[str, Any]:
    """b − a for two systems on the same prompts (calls in the same order): acceptance, tokens per
    target forward and (when both have timed pairs for every call) both speedups, each with the
    interval of the paired bootstrap, and whether it excludes 0 (a gain outside noise)."""
    (ra, pa), (rb, pb) = a, b
    cols = {**acceptance_columns(ra, "a_"), **acceptance_columns(rb, "b_")}
    figures = {
        "acceptance_rate": difference(ratio("b_accepted", "b_proposed"), ratio("a_accepted", "a_proposed")),
        "tokens_per_target_forward": difference(ratio("b_emitted", "b_forwards"), ratio("a_emitted", "a_forwards")),
    }
    if pa and pb and len(pa) == len(pb) == len(ra):
        cols |= {**speed_columns(pa, "a_"), **speed_columns(pb, "b_")}
        figures["end_to_end_speedup"] = difference(_end_to_end("b_"), _end_to_end("a_"))
        figures["decode_speedup"] = difference(_decode("b_"), _decode("a_"))
    return {name: _with_verdict(bootstrap(cols, figure, seed=seed)) for name, figure in figures.items()}


# ---------------------------------------------------------------------------------------------
# Where the decode time goes, and how well the speed model predicts it


def decomposition(pairs: Sequence[tuple[dict, dict]], k: int, alpha: float) -> dict[str, Any]:
    """Per round of the speculative calls: time in the draft, the verify and the bookkeeping (each
    timed on its own clock) and how their sum compares with the measured decode time; c, v(k) and the
    bookkeeping as measured in the loop (over the target-only time per token of the same pairs); the
    tokens per round the i.i.d.-α formula predicts against those measured. `add_predictions` adds what
    the microbenchmark's costs predict."""
    specs = [s for _, s in pairs]
    stats = [s["stats"] for s in specs]
    if not specs or "draft_s" not in stats[0]:
        return {}
    rounds = sum(s["rounds"] for s in stats)
    parts = {name: sum(s[name] for s in stats) for name in ("draft_s", "verify_s", "bookkeeping_s")}
    decode_s = sum(decode_columns(s)[0] for s in specs)
    tokens_after_first = sum(s["new_tokens"] - s["num_sequences"] for s in stats)
    t_dec = [decode_columns(t) for t, _ in pairs]
    target_tpot = sum(d[0] for d in t_dec) / max(1e-12, sum(d[1] for d in t_dec))
    per_round = {name.removesuffix("_s") + "_s_per_round": v / max(1, rounds) for name, v in parts.items()}
    tokens_per_round = tokens_after_first / max(1, sum(s["rounds"] * s["num_sequences"] for s in stats))
    out: dict[str, Any] = {
        "rounds": rounds,
        **per_round,
        "decode_s_per_round": decode_s / max(1, rounds),
        "parts_over_decode_time": sum(parts.values()) / decode_s if decode_s else None,
        "target_tpot_s": target_tpot,
        "in_loop": {
            "c": parts["draft_s"] / max(1, sum(s.get("draft_tokens_proposed", 0) for s in stats)) / target_tpot if target_tpot else None,
            "v": per_round["verify_s_per_round"] / target_tpot if target_tpot else None,
            "bookkeeping": per_round["bookkeeping_s_per_round"] / target_tpot if target_tpot else None,
        },
        "tokens_per_round": tokens_per_round,
        "predicted_tokens_per_round": expected_tokens_per_round(alpha, k),
    }
    return out


def add_predictions(entry: dict[str, Any], costs: Costs, k0: int) -> None:
    """Add the microbenchmark's costs, the speedups they predict (from α, and from the measured tokens
    per round) per task and per k, and the best k to one draft's entry."""
    entry["costs"] = costs.to_dict()
    for row in entry["tasks"].values():
        row["predicted_speedup"] = costs.speedup(row["alpha"], k0)
        if row.get("decomposition"):
            row["decomposition"] = {**row["decomposition"], **_prediction(row["decomposition"], k0, costs)}
    for point in entry["sweep"]:
        point["predicted_speedup"] = costs.speedup(entry["alpha"], point["k"])
        point["predicted_speedup_own_alpha"] = costs.speedup(point["alpha"], point["k"])
        if point.get("decomposition"):
            point["decomposition"] = {**point["decomposition"], **_prediction(point["decomposition"], point["k"], costs)}
    entry["predicted_curve"] = [{"k": k, "predicted_speedup": costs.speedup(entry["alpha"], k)} for k in sorted(costs.v)]


def _prediction(dec: dict[str, Any], k: int, costs: Costs) -> dict[str, Any]:
    """What the microbenchmark's costs predict: the time per round, `Costs.round_cost(k)` target steps
    (against the measured one), and the decode speedup from the measured tokens per round. The speed model as
    published counts the baseline as one target forward per token and no bookkeeping
    (`predicted_decode_speedup_forwards_only`); the decomposition shows both matter, so the prediction
    adds the round's measured bookkeeping and divides by the target-only time per token measured
    in the same pairs (transformers' generate costs more than a bare forward): the baseline's overhead
    over a forward is `target_only_overhead`."""
    step = costs.target_step_s
    round_s = step * costs.round_cost(k)
    overhead = dec["target_tpot_s"] / step
    return {
        "predicted_round_s": round_s,
        "target_only_overhead": overhead,
        "predicted_decode_speedup_forwards_only": dec["tokens_per_round"] / costs.round_cost(k),
        "predicted_decode_speedup": dec["tokens_per_round"] * dec["target_tpot_s"] / (round_s + dec["bookkeeping_s_per_round"]),
    }


def interval_of(row: dict[str, Any], name: str) -> Interval | None:
    """A row's interval for figure `name`, when the report has one (schema 2)."""
    iv = (row.get("intervals") or {}).get(name)
    return Interval(**iv) if isinstance(iv, dict) else None


# ---------------------------------------------------------------------------------------------
# The report


def timed_pairs(journal: Any, calls: Sequence[Any], target_keys: dict[tuple[str, int], str]) -> tuple[list[dict], list[tuple[dict, dict]], list[str]]:
    """For speculative `calls`: their newest records, the (target-only, speculative) pairs timed in
    one run, and the runs those pairs come from."""
    records, pairs = [], []
    for call in calls:
        spec = journal.latest(call.key)
        records.append(spec)
        target = journal.in_run(target_keys[(call.task, call.batch)], spec["run_id"])
        if target is not None:
            pairs.append((target, spec))
    return records, pairs, sorted({s["run_id"] for _, s in pairs})


def task_row(
    task: Task,
    examples: list[TaskExample],
    records: list[dict],
    pairs: list[tuple[dict, dict]],
    base_tokens: dict[int, list[int]],
    target_quality: Sequence[float],
    texts: list[str],
    greedy: bool,
    k: int,
    seed: int,
) -> dict[str, Any]:
    """One draft's figures on one task: quality and its paired difference from target-only's per-prompt
    `target_quality`, identity, acceptance, timing, both speedups, intervals."""
    tokens = outputs(records)
    n = len(examples)
    same = [tokens[i] == base_tokens[i] for i in range(n)]
    spec_timing = timing(records)
    paired_t, paired_s = timing([t for t, _ in pairs]), timing([s for _, s in pairs])
    q = quality(task, texts, examples, seed=seed)
    acc = acceptance(records)
    return {
        **acc,
        "end_to_end_speedup": paired_t["wall_s"] / paired_s["wall_s"] if pairs and paired_s["wall_s"] else None,
        "decode_speedup": paired_t["tpot_s"] / paired_s["tpot_s"] if pairs and paired_s["tpot_s"] else None,
        "timed_pairs": len(pairs),
        **spec_timing,
        "target_wall_s": paired_t["wall_s"],
        "quality": q["quality"],
        "quality_metric": q["quality_metric"],
        "metrics": q["metrics"],
        "per_example_quality": q["per_example_quality"],
        "quality_vs_target": quality_difference(target_quality, q["per_example_quality"], seed=seed),
        "greedy_identity": sum(same) / n if greedy else None,
        "identical_outputs": sum(same),
        "differing_examples": [examples[i].id for i in range(n) if not same[i]],
        "num_prompts": n,
        "intervals": {**intervals(records, pairs if len(pairs) == len(records) else [], seed=seed), **q["intervals"]},
        "decomposition": decomposition(pairs, k, acc["alpha"]),
    }
