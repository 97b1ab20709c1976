"""Does distillation buy acceptance? Trains the same draft twice for the same steps, once with
forward-KL distillation from the target and once with cross-entropy on the same text only, and
measures both with `distill.speculative` on held-out prompts; then compares our trainer with TRL's
`DistillationTrainer` (its defaults) on throughput and the acceptance reached.

    python scripts/bench_train.py tiny     # recipes/tiny-cpu.yaml on the generated corpus
    python scripts/bench_train.py gsm8k    # a tiny target trained on GSM8K text, GSM8K test prompts
    python scripts/bench_train.py trl      # ours vs trl.DistillationTrainer on the tiny pair

Each prints a Markdown table with its command line and rewrites its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import PreTrainedTokenizerBase, TrainerCallback

from distill.commands.demo import measure
from distill.commands.gsm8k_pair import gsm8k_pair
from distill.commands.prepare_tiny import prepare
from distill.common.benchmarks import command_line, report
from distill.common.clock import Clock
from distill.common.docs import table
from distill.common.io import read_jsonl
from distill.common.models import load_model, load_tokenizer
from distill.common.prompts import chat_prompts
from distill.common.provenance import MachineLoad, environment
from distill.training.grid import objective_recipes
from distill.training.recipe import load_recipe
from distill.training.train import train
from distill.training.trl_baseline import run_trl_trainer

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "benchmarks.md"
TINY_RECIPE = REPO / "recipes" / "tiny-cpu.yaml"
GSM8K_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"

HEADER = ["draft", "steps", "acceptance rate", "tokens / target forward", "greedy identity", "held-out 1 − TVD", "train tokens/s", "train s"]

LOAD = MachineLoad().start()  # what else ran while this benchmark ran, from its start


class TokensSeen(TrainerCallback):
    """Records the trainer's count of non-padding tokens trained on (for tokens/s)."""

    def __init__(self) -> None:
        self.tokens = 0

    def on_train_end(self, args, state, control, **kwargs):  # noqa: D102
        self.tokens = int(state.num_input_tokens_seen)


def base_recipe() -> dict[str, Any]:
    """recipes/tiny-cpu.yaml as a plain dict (validated by load_recipe when each run starts)."""
    return yaml.safe_load(TINY_RECIPE.read_text())


def train_and_measure(
    recipe: dict[str, Any], target: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, prompts: list[torch.Tensor], k: int, max_new_tokens: int
) -> dict[str, Any]:
    """Train one draft from scratch (its output_dir is replaced) and measure it under the decoder."""
    out = Path(recipe["output_dir"])
    if out.exists():
        shutil.rmtree(out)
    seen = TokensSeen()
    metrics = train(load_recipe(recipe), callbacks=[seen])
    draft = load_model(out / "draft", dtype=torch.float32)
    result = measure(target, draft, tokenizer, prompts, k, max_new_tokens)
    result["steps"] = recipe["training"]["max_steps"]
    result["eval_expected_acceptance"] = metrics.get("eval_expected_acceptance", float("nan"))
    result["train_s"] = metrics["train_runtime"]
    result["train_tokens_per_s"] = seen.tokens / metrics["train_runtime"]
    return result


def row(name: str, r: dict[str, Any]) -> list[Any]:
    """One table row in HEADER's order."""
    return [
        name,
        r["steps"],
        r["acceptance_rate"],
        r["tokens_per_target_forward"],
        f"{r['greedy_identity']:.0%}",
        r["eval_expected_acceptance"],
        f"{r['train_tokens_per_s']:.0f}",
        f"{r['train_s']:.0f}",
    ]


def pair_sizes(tokenizer: PreTrainedTokenizerBase, target: torch.nn.Module, recipe: dict[str, Any]) -> str:
    """The embedding sizes actually trained on, as measured (not as the recipe comment assumes)."""
    return f"tokenizer {len(tokenizer)} tokens, target {target.config.vocab_size} embedding rows, draft {recipe['draft']['config']['vocab_size']} rows"


def conditions() -> str:
    """Where the timings ran, from the one environment record: device, threads, precision, libraries."""
    env = environment()
    libs = ", ".join(f"{name} {env[name]}" for name in ("torch", "transformers", "tokenizers", "datasets", "accelerate", "trl") if env.get(name))
    return f"{env['device_name']} ({env['device']}), {env['torch_threads']} threads, fp32, {libs}"


# ---------------------------------------------------------------------------------------- tiny


def run_tiny(args: argparse.Namespace, cmd: str) -> dict[str, Any]:
    """KD vs CE on recipes/tiny-cpu.yaml, measured on eval.jsonl prompts."""
    work = Path(args.work)
    prepare(work, steps=args.target_steps)
    base = base_recipe()
    base["target"]["name_or_path"] = str(work / "target")
    base["data"].update(dataset=str(work / "train.jsonl"), eval_split=str(work / "eval.jsonl"))
    tokenizer = load_tokenizer(work / "target")
    target = load_model(work / "target", dtype=torch.float32)
    prompts = chat_prompts(tokenizer, [r["prompt"] for r in read_jsonl(work / "eval.jsonl", args.prompts)])
    results = {
        name: train_and_measure(recipe, target, tokenizer, prompts, args.k, args.max_new_tokens)
        for name, recipe in objective_recipes(base, work, args.steps).items()
    }
    notes = (
        f"recipes/tiny-cpu.yaml ({pair_sizes(tokenizer, target, base)}), target prepared with "
        f"{args.target_steps} CE steps; both drafts trained {args.steps} steps (the recipe says "
        f"{load_recipe(TINY_RECIPE).training.max_steps}), seed 0, batch 16, lr 3e-3. Measured with "
        f"distill.speculative, greedy, k = {args.k}, {len(prompts)} held-out prompts from eval.jsonl, "
        f"{args.max_new_tokens} new tokens; greedy identity = share of prompts whose output equals "
        f"target-only `generate`. {conditions()}."
    )
    blocks = [table(HEADER, [row(n, r) for n, r in results.items()]), notes]
    report("bench_train_tiny", "Training: KL distillation vs cross-entropy (tiny-cpu.yaml)", cmd, blocks, args.docs, LOAD)
    return results


# ---------------------------------------------------------------------------------------- gsm8k


def run_gsm8k(args: argparse.Namespace, cmd: str) -> dict[str, Any]:
    """KD vs CE on GSM8K text: target and drafts trained on train.jsonl, measured on test questions."""
    data = Path(args.gsm8k_dir).resolve()
    target, tokenizer, base, rows = gsm8k_pair(args.gsm8k_dir, args.rows, args.vocab_size, args.target_steps, args.work, base_recipe())
    work = Path(args.work).resolve()
    prompts = chat_prompts(tokenizer, [r["question"] for r in read_jsonl(data / "test.jsonl", args.prompts)])
    results = {
        name: train_and_measure(recipe, target, tokenizer, prompts, args.k, args.max_new_tokens)
        for name, recipe in objective_recipes(base, work, args.steps).items()
    }
    notes = (
        f"GSM8K text from {data.name}/ (never copied into the repo): tokenizer ({len(tokenizer)} tokens) built on the "
        f"first {len(rows)} train rows; tiny target (hidden 128, 4 layers, {target.config.vocab_size} embedding rows) "
        f"trained {args.target_steps} CE steps on them; drafts as tiny-cpu.yaml (hidden 64, 1 layer, "
        f"{len(tokenizer) + 8} rows) trained {args.steps} steps on the same rows (gsm8k adapter, question → answer), "
        f"seed 0, batch 16, lr 3e-3; held-out 1 − TVD on 64 test rows. Measured with distill.speculative, greedy, "
        f"k = {args.k}, the first {len(prompts)} test.jsonl questions with the chat template, {args.max_new_tokens} "
        f"new tokens. {conditions()}."
    )
    blocks = [table(HEADER, [row(n, r) for n, r in results.items()]), notes]
    report("bench_train_gsm8k", "Training: KL distillation vs cross-entropy (GSM8K text)", cmd, blocks, args.docs, LOAD)
    return results


# ---------------------------------------------------------------------------------------- trl


def run_trl(args: argparse.Namespace, cmd: str) -> dict[str, Any]:
    """Ours (forward KL on the dataset's responses) vs trl.DistillationTrainer (defaults: on-policy,
    generalized JSD with beta=1) on the tiny pair: same steps, batch, lr, prompts; both measured alike."""
    work = Path(args.work)
    prepare(work, steps=args.target_steps)
    recipe = base_recipe()
    recipe["target"]["name_or_path"] = str(work / "target")
    recipe["data"].update(dataset=str(work / "train.jsonl"), eval_split=str(work / "eval.jsonl"))
    recipe["output_dir"] = str(work / "bench-trl" / "ours")
    recipe["training"].update(max_steps=args.steps, eval_steps=args.steps, save_steps=10 * args.steps)
    tokenizer = load_tokenizer(work / "target")
    target = load_model(work / "target", dtype=torch.float32)
    prompts = chat_prompts(tokenizer, [r["prompt"] for r in read_jsonl(work / "eval.jsonl", args.prompts)])
    ours = train_and_measure(recipe, target, tokenizer, prompts, args.k, args.max_new_tokens)
    rows = [row(f"distill (forward KL, dataset responses, {recipe['draft']['config']['vocab_size']}-row draft)", ours)]
    trl_out = work / "bench-trl" / "trl"
    shutil.rmtree(trl_out, ignore_errors=True)
    error = None
    try:
        trl_run = run_trl_trainer(
            work / "target",
            recipe["draft"]["config"],
            read_jsonl(work / "train.jsonl"),
            recipe["training"],
            trl_out,
            recipe["seed"],
            args.trl_completion_length,
        )
        draft = load_model(trl_out / "draft", dtype=torch.float32)
        trl_result = {
            **measure(target, draft, tokenizer, prompts, args.k, args.max_new_tokens),
            **trl_run,
            "steps": args.steps,
            "eval_expected_acceptance": float("nan"),
        }
        rows.append(row(f"trl.DistillationTrainer (defaults, β = {trl_run['beta']}, {target.config.vocab_size}-row draft)", trl_result))
    except Exception as exc:  # the benchmark records why TRL could not run on this pair
        error = f"{type(exc).__name__}: {exc}"
        trl_result = {"error": error}
    header = HEADER[:5] + ["held-out 1 − TVD (ours only)"] + HEADER[6:]
    notes = (
        f"Same pair (tiny-cpu.yaml: {pair_sizes(tokenizer, target, recipe)}; draft hidden 64 × 1 layer), seed 0, "
        f"{args.steps} steps, batch 16, lr 3e-3 (TRL's default lr is 1e-6), same train.jsonl prompts. TRL refuses embeddings of different sizes, "
        f"so its draft is built with the target's {target.config.vocab_size} rows; everything else in its DistillationConfig is left at the defaults (on-policy "
        f"student completions, generalized JSD β = 1 i.e. reverse KL, gradient checkpointing on, linear schedule) except "
        f"bf16=False/use_cpu on CPU, save_strategy='no' and max_completion_length={args.trl_completion_length} "
        f"(default 512; our max_length is 128). tokens/s = non-padding tokens trained on (TRL: prompt + generated "
        f"completion, generation time included) / train_runtime. Both drafts measured with distill.speculative, "
        f"greedy, k = {args.k}, {len(prompts)} eval.jsonl prompts, {args.max_new_tokens} new tokens. {conditions()}."
    )
    if error:
        notes += f"\n\nTRL's DistillationTrainer could not run on this pair:\n\n```\n{error}\n```"
    report("bench_train_trl", "Training: distill vs trl.DistillationTrainer (tiny pair)", cmd, [table(header, rows), notes], args.docs, LOAD)
    return {"ours": ours, "trl": trl_result}


def main(argv: Sequence[str] | None = None) -> int:
    """`python scripts/bench_train.py {tiny,gsm8k,trl} [options]`."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="bench", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--steps", type=int, default=200, help="draft training steps, the same for every draft")
    common.add_argument("--target-steps", type=int, default=300, help="CE steps for the tiny target")
    common.add_argument("--prompts", type=int, default=32, help="held-out prompts measured")
    common.add_argument("--max-new-tokens", type=int, default=48)
    common.add_argument("--k", type=int, default=4, help="draft tokens per round")
    common.add_argument("--docs", type=Path, default=DOCS, help="the benchmarks file whose section is rewritten")
    tiny = sub.add_parser("tiny", parents=[common], help="KD vs CE on recipes/tiny-cpu.yaml")
    tiny.add_argument("--work", default=str(REPO / "runs" / "tiny"))
    gsm = sub.add_parser("gsm8k", parents=[common], help="KD vs CE on GSM8K text")
    gsm.add_argument("--gsm8k-dir", default=str(GSM8K_DIR), help="directory with GSM8K train.jsonl and test.jsonl")
    gsm.add_argument("--rows", type=int, default=3000, help="GSM8K train rows used")
    gsm.add_argument("--vocab-size", type=int, default=1024, help="tokenizer size built on GSM8K text")
    gsm.add_argument("--work", default=str(REPO / "runs" / "gsm8k"))
    trl = sub.add_parser("trl", parents=[common], help="ours vs trl.DistillationTrainer on the tiny pair")
    trl.add_argument("--work", default=str(REPO / "runs" / "tiny"))
    trl.add_argument("--trl-completion-length", type=int, default=64, help="TRL's max_completion_length (default 512)")
    args = parser.parse_args(argv)
    if args.bench == "gsm8k" and not (Path(args.gsm8k_dir) / "train.jsonl").is_file():
        parser.error(f"no train.jsonl in {args.gsm8k_dir}: pass --gsm8k-dir pointing at the GSM8K data")
    clock = Clock()
    {"tiny": run_tiny, "gsm8k": run_gsm8k, "trl": run_trl}[args.bench](args, command_line("bench_train", argv))
    print(f"({clock.elapsed():.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
