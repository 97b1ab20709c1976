"""Which distillation recipe buys the most acceptance? A DistillSpec-style grid on the GSM8K tiny
pair of `scripts/bench_train.py gsm8k` (same target, draft init, steps and seed): training data
{dataset responses, target-generated responses, on-policy λ = 0.5} × divergence {forward KL,
reverse KL, JSD β = 0.5, TVD}, plus the cross-entropy baseline. Each draft is measured greedily
and sampled (temperature 0.7) under `distill.speculative` on held-out test questions, with its
held-out 1 − TVD, training time (target generations included) and acceptance gained per second.

    OMP_NUM_THREADS=1 python scripts/bench_recipes.py --rows 7473 --target-steps 1000 --steps 400
    OMP_NUM_THREADS=1 python scripts/bench_recipes.py --adaspec 0.2 0.4 0.6     # AdaSPEC against the winner

`--adaspec F ...` trains selective distillation (distill.training.selection) at each kept fraction F, with the
grid's winner, forward KL on target responses, as the reference (trained first when it is not yet),
and writes the `bench_adaspec` section instead: the winner and the AdaSPEC drafts side by side, the
reference's training time added to each AdaSPEC draft's.

Finished drafts are kept in <work>/recipes/results.json and skipped on a rerun with the same
settings (`--only` trains a subset). Prints the table with its command, rewrites the
`bench_recipes` section of docs/benchmarks.md and draws docs/recipes-acceptance.png.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import PreTrainedTokenizerBase

from distill.commands.demo import measure
from distill.commands.gsm8k_pair import gsm8k_pair
from distill.common.benchmarks import command_line, report
from distill.common.clock import Clock
from distill.common.docs import table
from distill.common.io import read_jsonl, write_json
from distill.common.models import load_model
from distill.common.prompts import chat_prompts
from distill.common.provenance import MachineLoad
from distill.common.ranks import spearman
from distill.speculative import SpeculativeDecoder
from distill.training.data import generate_responses, load_examples
from distill.training.grid import CE, DIVERGENCES, SOURCES, WINNER, adaspec_grid, recipe_grid
from distill.training.recipe import load_recipe
from distill.training.train import build_trainer, train

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "benchmarks.md"
TINY_RECIPE = REPO / "recipes" / "tiny-cpu.yaml"
GSM8K_DIR = REPO.parent / "shared" / "data" / "gsm8k"
PLOT = REPO / "docs" / "recipes-acceptance.png"
HEADER = [
    "recipe",
    "steps",
    "greedy acceptance",
    "× CE",
    "tokens / target forward",
    "sampled acceptance (T = 0.7)",
    "sampled tokens / forward",
    "held-out 1 − TVD",
    "train wall s",
    "train CPU s",
    "Δ acceptance vs CE per 100 CPU s",
]


def target_generations(recipe: dict[str, Any], target: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> float:
    """Generate (once) the target's responses the target-source recipes train on, into their
    generation cache, exactly as `distill.training.data` would; returns the seconds that first generation
    took (kept beside the cache, so a rerun still reports it)."""
    spec = load_recipe(recipe).data
    timing = Path(f"{spec.generation_cache}.seconds.json")
    if Path(spec.generation_cache).exists() and timing.exists():
        return json.loads(timing.read_text())["seconds"]
    examples = load_examples(spec.dataset, spec.adapter, spec.split, spec.num_samples, recipe["seed"], subset=spec.subset)
    clock = Clock()
    generate_responses(
        target,
        tokenizer,
        examples,
        spec.generation_max_new_tokens,
        spec.generation_cache,
        batch_size=spec.generation_batch_size,
        max_prompt_length=spec.max_prompt_length,
    )
    seconds = clock.elapsed()
    write_json(timing, {"seconds": seconds, "prompts": len(examples)})
    return seconds


def held_out_tvd(recipe: dict[str, Any], draft_dir: Path, eval_split: str, eval_samples: int) -> float:
    """Held-out 1 − TVD of a trained draft, computed by the trainer's own evaluation (the figure
    training logs as eval_expected_acceptance) on the same test rows with the dataset's answers
    for every recipe, so target-source drafts are not scored on their own kind of text."""
    recipe = copy.deepcopy(recipe)
    recipe["draft"] = {"name_or_path": str(draft_dir), "dtype": "float32"}
    recipe["data"] = {**recipe["data"], "response_source": "dataset", "num_samples": 16, "eval_split": eval_split, "eval_samples": eval_samples}
    recipe["loss"]["lmbda"] = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        recipe["output_dir"] = tmp
        return build_trainer(load_recipe(recipe)).evaluate()["eval_expected_acceptance"]


def sampled(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[torch.Tensor],
    k: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
) -> dict[str, float]:
    """Acceptance and tokens per target forward under lossless rejection sampling at `temperature`
    (prompt i sampled with seed + i, so every draft meets the same random stream)."""
    decoder = SpeculativeDecoder(target, draft, num_draft_tokens=k, tokenizer=tokenizer)
    stats = [
        decoder.generate(
            ids,
            max_new_tokens=max_new_tokens,
            do_sample=True,
            temperature=temperature,
            seed=seed + i,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        ).stats
        for i, ids in enumerate(prompts)
    ]
    proposed, accepted = sum(s.proposed for s in stats), sum(s.accepted for s in stats)
    new_tokens, forwards = sum(s.new_tokens for s in stats), sum(s.sequence_forwards for s in stats)
    return {"acceptance_rate": accepted / proposed if proposed else 0.0, "tokens_per_target_forward": new_tokens / forwards if forwards else 0.0}


def run_recipe(
    recipe: dict[str, Any],
    target: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[torch.Tensor],
    args: argparse.Namespace,
    generation_s: float,
    reference_s: float = 0.0,
) -> dict[str, Any]:
    """Train one draft from scratch (its output_dir is replaced) and measure it greedy and sampled;
    `generation_s` and `reference_s` (an AdaSPEC reference's training) count as its training time."""
    out = Path(recipe["output_dir"])
    shutil.rmtree(out, ignore_errors=True)
    clock, cpu = Clock(), time.process_time()
    train(load_recipe(recipe))
    wall, cpu = clock.elapsed(), time.process_time() - cpu
    draft = load_model(out / "draft", dtype=torch.float32)
    greedy = measure(target, draft, tokenizer, prompts, args.k, args.max_new_tokens)
    sample = sampled(target, draft, tokenizer, prompts, args.k, args.max_new_tokens, args.temperature, args.seed)
    test_file = str(Path(args.gsm8k_dir).resolve() / "test.jsonl")
    return {
        "steps": recipe["training"]["max_steps"],
        "acceptance_rate": greedy["acceptance_rate"],
        "tokens_per_target_forward": greedy["tokens_per_target_forward"],
        "greedy_identity": greedy["greedy_identity"],
        "sampled_acceptance_rate": sample["acceptance_rate"],
        "sampled_tokens_per_target_forward": sample["tokens_per_target_forward"],
        "held_out_expected_acceptance": held_out_tvd(recipe, out / "draft", test_file, args.eval_samples),
        "train_wall_s": wall + generation_s + reference_s,
        "train_cpu_s": cpu + generation_s + reference_s,
        "generation_s": generation_s,
        "reference_s": reference_s,
    }


def rows_for(results: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """Table rows in HEADER's order, best greedy acceptance first; gains are over the CE draft."""
    ce = results.get(CE)
    table = []
    for name, r in sorted(results.items(), key=lambda kv: -kv[1]["acceptance_rate"]):
        ratio = f"{r['acceptance_rate'] / ce['acceptance_rate']:.2f}×" if ce else "-"
        gain = f"{100 * (r['acceptance_rate'] - ce['acceptance_rate']) / r['train_cpu_s']:+.4f}" if ce and name != CE else "-"
        table.append(
            [
                name,
                r["steps"],
                r["acceptance_rate"],
                ratio,
                r["tokens_per_target_forward"],
                r["sampled_acceptance_rate"],
                r["sampled_tokens_per_target_forward"],
                r["held_out_expected_acceptance"],
                f"{r['train_wall_s']:.0f}",
                f"{r['train_cpu_s']:.0f}",
                gain,
            ]
        )
    return table


ADASPEC_HEADER = [
    "draft",
    "steps",
    "greedy acceptance",
    "Δ vs reference",
    "tokens / target forward",
    "sampled acceptance (T = 0.7)",
    "Δ sampled",
    "sampled tokens / forward",
    "held-out 1 − TVD",
    "own training CPU s",
    "CPU s in all (generation + reference + own)",
]


def adaspec_rows(results: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """ADASPEC_HEADER rows: the reference (the grid's winner) first, then each AdaSPEC draft in the
    order run, its acceptance as points over the reference's and its own training apart from the
    generations and the reference's training that it also paid for."""
    ref = results[WINNER]
    table = []
    for name, r in results.items():
        own = r["train_cpu_s"] - r["generation_s"] - r["reference_s"]
        delta = {key: "-" if name == WINNER else f"{100 * (r[key] - ref[key]):+.1f} pts" for key in ("acceptance_rate", "sampled_acceptance_rate")}
        table.append(
            [
                "reference: " + name if name == WINNER else name,
                r["steps"],
                f"{r['acceptance_rate']:.3f}",
                delta["acceptance_rate"],
                f"{r['tokens_per_target_forward']:.2f}",
                f"{r['sampled_acceptance_rate']:.3f}",
                delta["sampled_acceptance_rate"],
                f"{r['sampled_tokens_per_target_forward']:.2f}",
                f"{r['held_out_expected_acceptance']:.3f}",
                f"{own:.0f}",
                f"{r['train_cpu_s']:.0f}",
            ]
        )
    return table


def plot(results: dict[str, dict[str, Any]], path: Path) -> Path:
    """Greedy acceptance against training CPU seconds, one point per recipe (marker = data source,
    colour = divergence, the CE baseline as a black star)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    markers = dict(zip(SOURCES, "o^s"))
    colours = {name: f"C{i}" for i, name in enumerate(DIVERGENCES)}
    fig, ax = plt.subplots(figsize=(7, 4.6), layout="constrained")
    for name, r in results.items():
        if name == CE:
            ax.scatter(r["train_cpu_s"], r["acceptance_rate"], marker="*", s=180, color="black", label=CE, zorder=3)
            continue
        div, source = name.split(" · ")
        ax.scatter(r["train_cpu_s"], r["acceptance_rate"], marker=markers[source], s=60, color=colours[div], label=name, zorder=3)
    ax.set(
        xlabel="training CPU seconds (target generations included)",
        ylabel="greedy acceptance rate, k = 4",
        title="Acceptance vs training cost per recipe (GSM8K tiny pair)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def notes(
    results: dict[str, dict[str, Any]],
    args: argparse.Namespace,
    target: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    n_rows: int,
    n_prompts: int,
    plot_path: Path,
    missing: Sequence[str],
) -> str:
    """What was measured and how, the proxy's rank correlation and the best recipe against CE."""
    names = list(results)
    rho_greedy = spearman([results[n]["held_out_expected_acceptance"] for n in names], [results[n]["acceptance_rate"] for n in names])
    rho_sampled = spearman([results[n]["held_out_expected_acceptance"] for n in names], [results[n]["sampled_acceptance_rate"] for n in names])
    best = max(names, key=lambda n: results[n]["acceptance_rate"])
    best_sampled = max(names, key=lambda n: results[n]["sampled_acceptance_rate"])
    ce = results.get(CE)
    lines = [
        f"![acceptance vs training time]({os.path.relpath(plot_path, args.docs.parent)})",
        "",
        f"- best greedy recipe: **{best}**, acceptance {results[best]['acceptance_rate']:.3f}"
        + (f" = {results[best]['acceptance_rate'] / ce['acceptance_rate']:.2f}× the CE draft's {ce['acceptance_rate']:.3f}" if ce else ""),
        f"- best sampled recipe (T = {args.temperature}): **{best_sampled}**, acceptance {results[best_sampled]['sampled_acceptance_rate']:.3f}"
        + (f" = {results[best_sampled]['sampled_acceptance_rate'] / ce['sampled_acceptance_rate']:.2f}× CE's" if ce else ""),
        f"- proxy check over the {len(names)} drafts: Spearman ρ(held-out 1 − TVD, greedy acceptance) = {rho_greedy:.2f}, "
        f"ρ(held-out 1 − TVD, sampled acceptance) = {rho_sampled:.2f}",
        *([f"- not trained in this run: {', '.join(missing)}"] if missing else []),
        "",
        f"GSM8K tiny pair of `scripts/bench_train.py gsm8k`: tokenizer ({len(tokenizer)} tokens) and target (hidden 128, 4 layers, "
        f"{target.config.vocab_size} embedding rows, {args.target_steps} CE steps) on the first {n_rows} train rows; every draft "
        f"(tiny-cpu.yaml: hidden 64, 1 layer, {len(tokenizer) + 8} rows) from the same seed-0 init, {args.steps} steps, batch 16, "
        f"lr 3e-3, on the same rows. Target responses: the target's greedy answers to those prompts (≤ "
        f"{args.generation_max_new_tokens} new tokens), generated once; their generation time is added to each target-source "
        f"draft's training time. On-policy: a λ = 0.5 share of batches answered by the draft itself (sampled at T = 1, ≤ "
        f"{args.on_policy_max_new_tokens} new tokens, GKD style). Held-out 1 − TVD: the trainer's evaluation on {args.eval_samples} "
        f"test rows with the dataset's answers, the same rows for every draft. Acceptance: distill.speculative, k = {args.k}, "
        f"the first {n_prompts} test.jsonl questions, {args.max_new_tokens} new tokens, greedy (output identical to the target's "
        f"for {sum(r['greedy_identity'] == 1.0 for r in results.values())}/{len(results)} drafts on every prompt) and sampled at "
        f"T = {args.temperature} (prompt i with seed {args.seed} + i). CPU seconds are this process's (1 thread, so other jobs on the "
        f"shared CPU do not inflate them); wall seconds were measured on a CPU shared with other jobs. Δ per 100 CPU s = "
        f"(acceptance − CE's) / training CPU s × 100.",
    ]
    return "\n".join(lines)


def adaspec_notes(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    """What the AdaSPEC table measured, and the best against the reference."""
    best = max(results, key=lambda n: results[n]["acceptance_rate"])
    ref = results[WINNER]
    return "\n".join(
        [
            f"- best greedy: **{best}**, acceptance {results[best]['acceptance_rate']:.3f} against the reference's {ref['acceptance_rate']:.3f} "
            f"({100 * (results[best]['acceptance_rate'] - ref['acceptance_rate']):+.1f} points); sampled (T = {args.temperature}) "
            f"{results[best]['sampled_acceptance_rate']:.3f} against {ref['sampled_acceptance_rate']:.3f}",
            "",
            f"The reference is the grid's winner ({WINNER}, the bench_recipes section: same tiny pair, data, init, {args.steps} steps, seed). "
            "Each AdaSPEC draft trains from the same init on the same target responses with the same budget, its forward KL taken per "
            "batch on the kept fraction of response tokens with the largest (draft − reference) loss. Own training CPU s: the draft's "
            "training alone (for AdaSPEC, the reference's forward pass on every batch included); in all: the target's generations, "
            "which both paid, plus for AdaSPEC the reference's own training. Acceptance as in bench_recipes: k = "
            f"{args.k}, the first {args.prompts} test.jsonl questions, {args.max_new_tokens} new tokens, greedy and sampled at T = {args.temperature}.",
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    """The study's options."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gsm8k-dir", default=str(GSM8K_DIR), help="directory with GSM8K train.jsonl and test.jsonl")
    parser.add_argument("--rows", type=int, default=7473, help="GSM8K train rows (tokenizer, target and drafts)")
    parser.add_argument("--vocab-size", type=int, default=1024, help="tokenizer size built on GSM8K text")
    parser.add_argument("--target-steps", type=int, default=1000, help="CE steps for the tiny target")
    parser.add_argument("--steps", type=int, default=400, help="draft training steps, the same for every draft")
    parser.add_argument("--generation-max-new-tokens", type=int, default=192, help="target responses: new tokens at most")
    parser.add_argument("--on-policy-max-new-tokens", type=int, default=128, help="on-policy draft samples: new tokens at most")
    parser.add_argument("--prompts", type=int, default=16, help="held-out questions measured")
    parser.add_argument("--eval-samples", type=int, default=64, help="held-out rows for 1 − TVD")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--k", type=int, default=4, help="draft tokens per round")
    parser.add_argument("--temperature", type=float, default=0.7, help="sampled decoding's temperature")
    parser.add_argument("--seed", type=int, default=0, help="sampled decoding's seed")
    parser.add_argument("--only", nargs="+", metavar="RECIPE", help="train only these recipes (names as in the table)")
    parser.add_argument("--adaspec", nargs="+", type=float, metavar="KEEP", help="measure AdaSPEC at these kept fractions against the winner")
    parser.add_argument("--work", default=str(REPO / "runs" / "gsm8k"))
    parser.add_argument("--docs", type=Path, default=DOCS, help="the benchmarks file whose section is rewritten")
    parser.add_argument("--plot", type=Path, default=PLOT, help="where the acceptance-vs-time plot goes")
    return parser


def run_wanted(
    grid: dict[str, dict[str, Any]],
    wanted: Sequence[str],
    adaspec: dict[str, dict[str, Any]],
    target: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[torch.Tensor],
    args: argparse.Namespace,
    work: Path,
) -> dict[str, dict[str, Any]]:
    """Train and measure each `wanted` recipe not yet in <work>/results.json under the same settings,
    saving the results after each; returns every result those settings have."""
    settings = json.loads(json.dumps({k: v for k, v in vars(args).items() if k not in ("only", "docs", "plot", "adaspec")}, default=str))
    results_path = work / "results.json"
    saved = json.loads(results_path.read_text()) if results_path.exists() else {}
    results = saved.get("results", {}) if saved.get("settings") == settings else {}
    generation_s = None
    for name in wanted:
        if name in results:
            continue
        recipe = grid[name]
        from_target = recipe["data"].get("response_source") == "target"
        if from_target and generation_s is None:
            generation_s = target_generations(recipe, target, tokenizer)
        print(f"--- {name}", flush=True)
        before = results[WINNER]["train_cpu_s"] - results[WINNER]["generation_s"] if name in adaspec else 0.0  # the reference's training
        results[name] = run_recipe(recipe, target, tokenizer, prompts, args, generation_s if from_target else 0.0, before)
        write_json(results_path, {"settings": settings, "results": results})
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """`python scripts/bench_recipes.py [options]`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not (Path(args.gsm8k_dir) / "train.jsonl").is_file():
        parser.error(f"no train.jsonl in {args.gsm8k_dir}: pass --gsm8k-dir pointing at the GSM8K data")
    load, clock = MachineLoad().start(), Clock()
    base = yaml.safe_load(TINY_RECIPE.read_text())
    target, tokenizer, base, rows = gsm8k_pair(args.gsm8k_dir, args.rows, args.vocab_size, args.target_steps, args.work, base)
    work = Path(args.work).resolve() / "recipes"
    work.mkdir(parents=True, exist_ok=True)
    grid = recipe_grid(base, work, args.steps, args.generation_max_new_tokens, args.on_policy_max_new_tokens)
    adaspec = adaspec_grid(grid, args.adaspec, work) if args.adaspec else {}
    grid |= adaspec
    unknown = sorted(set(args.only or []) - set(grid))
    if unknown:
        parser.error(f"unknown recipes {unknown}: choose from {sorted(grid)}")
    prompts = chat_prompts(tokenizer, [r["question"] for r in read_jsonl(Path(args.gsm8k_dir) / "test.jsonl", args.prompts)])
    wanted = [WINNER, *adaspec] if adaspec else args.only or [n for n in grid if n not in adaspec]
    results = run_wanted(grid, wanted, adaspec, target, tokenizer, prompts, args, work)
    cmd = "OMP_NUM_THREADS=1 " + command_line("bench_recipes", argv)  # one thread, as the study ran
    if adaspec:
        shown = {n: results[n] for n in wanted}
        title = "Selective distillation (AdaSPEC) against its reference (GSM8K tiny pair)"
        report("bench_adaspec", title, cmd, [table(ADASPEC_HEADER, adaspec_rows(shown)), adaspec_notes(shown, args)], args.docs, load)
    else:
        plot_path = plot(results, args.plot)
        text = notes(results, args, target, tokenizer, len(rows), len(prompts), plot_path, [n for n in grid if n not in results])
        title = "Which distillation recipe buys the most acceptance (GSM8K text, DistillSpec-style grid)"
        report("bench_recipes", title, cmd, [table(HEADER, rows_for(results)), text], args.docs, load)
    print(f"({clock.elapsed():.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
