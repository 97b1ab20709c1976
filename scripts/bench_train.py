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
import copy
import json
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import PreTrainedTokenizerBase, TrainerCallback

from distill.commands.demo import measure
from distill.commands.prepare_tiny import DEFAULTS as TINY_DEFAULTS
from distill.commands.prepare_tiny import prepare, saved_tokenizer, train_target
from distill.common.docs import markdown_table, write_section
from distill.common.models import load_model, load_tokenizer
from distill.common.provenance import MachineLoad, describe, versions, warn
from distill.training.recipe import load_recipe
from distill.training.train import train

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "benchmarks.md"
TINY_RECIPE = REPO / "recipes" / "tiny-cpu.yaml"
GSM8K_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"

# The two objectives compared: the same draft, data, seed and steps; only the loss differs.
OBJECTIVES = {
    "cross-entropy only": {"divergence_weight": 0.0, "ce_weight": 1.0},
    "KL-distilled (forward KL)": {"divergence": "forward_kl", "divergence_weight": 1.0, "ce_weight": 0.0},
}
HEADER = ["draft", "steps", "acceptance rate", "tokens / target forward", "greedy identity", "held-out 1 − TVD", "train tokens/s", "train s"]

LOAD = MachineLoad().start()  # what else ran while this benchmark ran, from its start


class TokensSeen(TrainerCallback):
    """Records the trainer's count of non-padding tokens trained on (for tokens/s)."""

    def __init__(self) -> None:
        self.tokens = 0

    def on_train_end(self, args, state, control, **kwargs):  # noqa: D102
        self.tokens = int(state.num_input_tokens_seen)


def chat_prompts(tokenizer: PreTrainedTokenizerBase, questions: Sequence[str]) -> list[torch.Tensor]:
    """Each question as a one-turn chat with the generation prompt, as [1, T] input ids."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_tensors="pt")["input_ids"] for q in questions]


def read_jsonl(path: Path, n: int | None = None) -> list[dict[str, Any]]:
    """The first `n` rows of a JSONL file (all when n is None)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: prepare it first (or pass the right directory)")
    rows = []
    with path.open() as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
                if n is not None and len(rows) == n:
                    break
    return rows


def base_recipe() -> dict[str, Any]:
    """recipes/tiny-cpu.yaml as a plain dict (validated by load_recipe when each run starts)."""
    return yaml.safe_load(TINY_RECIPE.read_text())


def objective_recipes(base: dict[str, Any], work: Path, steps: int) -> dict[str, dict[str, Any]]:
    """One recipe per objective from `base`: own output_dir under `work`, same seed and steps."""
    recipes = {}
    for i, (name, loss) in enumerate(OBJECTIVES.items()):
        recipe = copy.deepcopy(base)
        recipe["output_dir"] = str(work / ("draft-ce" if i == 0 else "draft-kd"))
        recipe["loss"] = {**recipe.get("loss", {}), **loss}
        recipe["training"] = {**recipe["training"], "max_steps": steps, "eval_steps": steps, "save_steps": 10 * steps}
        recipes[name] = recipe
    return recipes


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


def command_line(argv: Sequence[str] | None) -> str:
    """The exact command that produced a table."""
    args = list(sys.argv[1:] if argv is None else argv)
    return "python scripts/bench_train.py " + " ".join(shlex.quote(a) for a in args)


def report(section: str, title: str, cmd: str, table: str, notes: str, docs: Path) -> str:
    """Print the table with its command and write it as `section` of docs/benchmarks.md, with the
    machine's load since this script started (its timings are only as good as the machine was idle)."""
    load = LOAD.report()
    text = f"## {title}\n\n```\n{cmd}\n```\n\n{table}\n\n{notes}\n\n{describe(load)}\n"
    print(text)
    warn(load, "bench")
    write_section(docs, section, text)
    return text


def pair_sizes(tokenizer: PreTrainedTokenizerBase, target: torch.nn.Module, recipe: dict[str, Any]) -> str:
    """The embedding sizes actually trained on, as measured (not as the recipe comment assumes)."""
    return f"tokenizer {len(tokenizer)} tokens, target {target.config.vocab_size} embedding rows, draft {recipe['draft']['config']['vocab_size']} rows"


def _environment() -> str:
    found = versions()
    libs = ", ".join(f"{name} {found[name]}" for name in ("torch", "transformers", "tokenizers", "datasets", "accelerate", "trl") if found.get(name))
    return f"CPU, {torch.get_num_threads()} threads, fp32, {libs}"


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
        f"target-only `generate`. {_environment()}."
    )
    table = markdown_table(HEADER, [row(n, r) for n, r in results.items()])
    report("bench_train_tiny", "Training: KL distillation vs cross-entropy (tiny-cpu.yaml)", cmd, table, notes, args.docs)
    return results


# ---------------------------------------------------------------------------------------- gsm8k


def gsm8k_target(rows: list[dict[str, Any]], out: Path, settings: dict[str, Any]) -> Path:
    """A tiny target with a tokenizer built on GSM8K train text, trained briefly with CE on it,
    saved to `out`/target (reused when its settings match)."""
    from distill.common.tiny import build_tokenizer

    target_dir = out / "target"
    info_path = out / "target_info.json"
    if info_path.exists() and json.loads(info_path.read_text()).get("settings") == settings and (target_dir / "config.json").exists():
        return target_dir
    out.mkdir(parents=True, exist_ok=True)
    work = out / ".target.tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    texts = [t for r in rows for t in (r["question"], r["answer"])] + ["You are a helpful assistant.", "system user assistant"]
    tokenizer = saved_tokenizer(build_tokenizer(texts, vocab_size=settings["vocab_size"]), str(work))
    chats = [
        tokenizer.apply_chat_template([{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}], tokenize=False) for r in rows
    ]
    model, loss = train_target(tokenizer, chats, settings, str(work / "trainer"))
    shutil.rmtree(work / "trainer", ignore_errors=True)
    model.save_pretrained(work)
    tokenizer.save_pretrained(work)
    shutil.rmtree(target_dir, ignore_errors=True)
    work.rename(target_dir)
    info_path.write_text(
        json.dumps({"settings": settings, "final_train_loss": loss, "tokenizer_size": len(tokenizer), "embedding_rows": model.config.vocab_size}, indent=2)
    )
    return target_dir


def gsm8k_pair(args: argparse.Namespace) -> tuple[torch.nn.Module, PreTrainedTokenizerBase, dict[str, Any], list[dict[str, Any]]]:
    """The GSM8K tiny pair from `args` (gsm8k_dir, rows, vocab_size, target_steps, work): the trained
    target, its tokenizer, the base draft recipe on the train rows (test rows held out) and the rows."""
    data = Path(args.gsm8k_dir).resolve()
    train_file, test_file = data / "train.jsonl", data / "test.jsonl"
    rows = read_jsonl(train_file, args.rows)
    work = Path(args.work).resolve()
    settings = {**TINY_DEFAULTS, "vocab_size": args.vocab_size, "steps": args.target_steps, "max_position_embeddings": 1024, "rows": len(rows)}
    settings.pop("train_examples"), settings.pop("eval_examples")
    target_dir = gsm8k_target(rows, work, settings)
    tokenizer = load_tokenizer(target_dir)
    target = load_model(target_dir, dtype=torch.float32)
    base = base_recipe()
    base["target"]["name_or_path"] = str(target_dir)
    base["draft"]["config"]["vocab_size"] = len(tokenizer) + 8
    base["data"] = {
        "dataset": str(train_file),
        "adapter": "gsm8k",
        "num_samples": len(rows),
        "eval_split": str(test_file),
        "eval_samples": 64,
        "max_prompt_length": 192,
        "max_length": 384,
    }
    return target, tokenizer, base, rows


def run_gsm8k(args: argparse.Namespace, cmd: str) -> dict[str, Any]:
    """KD vs CE on GSM8K text: target and drafts trained on train.jsonl, measured on test questions."""
    data = Path(args.gsm8k_dir).resolve()
    target, tokenizer, base, rows = gsm8k_pair(args)
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
        f"new tokens. {_environment()}."
    )
    table = markdown_table(HEADER, [row(n, r) for n, r in results.items()])
    report("bench_train_gsm8k", "Training: KL distillation vs cross-entropy (GSM8K text)", cmd, table, notes, args.docs)
    return results


# ---------------------------------------------------------------------------------------- trl


def trl_dataset(rows: list[dict[str, Any]]):
    """TRL's conversational prompt format: {"prompt": [{"role": "user", "content": ...}]}."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}]} for r in rows])


def run_trl_trainer(
    target_dir: Path, draft_config: dict[str, Any], rows: list[dict[str, Any]], training: dict[str, Any], out: Path, seed: int, max_completion_length: int
) -> dict[str, Any]:
    """trl.DistillationTrainer with its defaults except the shared steps/batch/lr, fp32 on CPU and
    the completion length; the draft's embedding matches the target's (TRL requires it)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, set_seed
    from trl import DistillationConfig, DistillationTrainer

    tokenizer = load_tokenizer(target_dir)
    tokenizer.padding_side = "left"
    teacher = load_model(target_dir, dtype=torch.float32)
    config = Qwen2Config(**{**draft_config, "vocab_size": teacher.config.vocab_size})
    config.eos_token_id, config.pad_token_id, config.bos_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id, None
    set_seed(seed)
    student = Qwen2ForCausalLM(config)
    cpu = not torch.cuda.is_available()
    args = DistillationConfig(
        output_dir=str(out),
        seed=seed,
        max_steps=training["max_steps"],
        per_device_train_batch_size=training["per_device_train_batch_size"],
        learning_rate=training["learning_rate"],
        max_completion_length=max_completion_length,
        bf16=not cpu,
        use_cpu=cpu,
        save_strategy="no",
        report_to="none",
    )
    trainer = DistillationTrainer(model=student, teacher_model=teacher, args=args, train_dataset=trl_dataset(rows), processing_class=tokenizer)
    result = trainer.train()
    trainer.model.save_pretrained(out / "draft")
    tokenizer.save_pretrained(out / "draft")
    return {
        "train_s": result.metrics["train_runtime"],
        "train_tokens_per_s": trainer.state.num_input_tokens_seen / result.metrics["train_runtime"],
        "beta": args.beta,
        "gradient_checkpointing": args.gradient_checkpointing,
        "lr_scheduler": str(args.lr_scheduler_type),
    }


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
        f"greedy, k = {args.k}, {len(prompts)} eval.jsonl prompts, {args.max_new_tokens} new tokens. {_environment()}."
    )
    if error:
        notes += f"\n\nTRL's DistillationTrainer could not run on this pair:\n\n```\n{error}\n```"
    report("bench_train_trl", "Training: distill vs trl.DistillationTrainer (tiny pair)", cmd, markdown_table(header, rows), notes, args.docs)
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
    started = time.perf_counter()
    {"tiny": run_tiny, "gsm8k": run_gsm8k, "trl": run_trl}[args.bench](args, command_line(argv))
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
