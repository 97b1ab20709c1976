"""`distill demo`: the whole pipeline on a CPU in minutes. Builds a tokenizer and a corpus here,
trains a tiny target, trains two drafts of one tiny size (cross-entropy only, and KL-distilled
from the target), measures both under the speculative decoder against target-only decoding, and
writes the side-by-side report with plots to ./demo-output/."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from distill.commands.prepare_tiny import prepare
from distill.common.benchmarks import report as write_benchmark
from distill.common.docs import Block, markdown_table
from distill.common.docs import table as table_block
from distill.common.io import atomic_write, write_json
from distill.common.models import load_model, load_tokenizer
from distill.common.provenance import MachineLoad, environment, warn
from distill.speculative import SpeculativeDecoder
from distill.speculative.costs import fit_alpha, measure_costs
from distill.training.recipe import load_recipe
from distill.training.train import train

# The full demo and --quick differ only in sizes and step counts.
SIZES = {
    "full": {"target_steps": 250, "train_examples": 4000, "draft_steps": 150, "eval_prompts": 16, "max_new_tokens": 48, "ks": [1, 2, 4, 6], "sweep_prompts": 6},
    "quick": {"target_steps": 150, "train_examples": 1500, "draft_steps": 60, "eval_prompts": 6, "max_new_tokens": 32, "ks": [1, 2, 4], "sweep_prompts": 3},
}
# A deep, narrow target: on a CPU its step costs several draft steps, as a 7B's does a 0.5B's.
TARGET = {"hidden_size": 128, "num_layers": 8, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 512}
NUM_DRAFT_TOKENS = 4

# The two drafts: the same tiny architecture and data, different objectives (as recipes/tiny-cpu.yaml:
# 484 embedding rows under the target's 508, over the tokenizer's 476 tokens).
DRAFT_RECIPE = {
    "seed": 0,
    "target": {"dtype": "float32"},
    "draft": {
        "dtype": "float32",
        "config": {
            "vocab_size": 484,
            "hidden_size": 64,
            "intermediate_size": 256,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 512,
            "tie_word_embeddings": True,
            "rope_theta": 10000.0,
        },
    },
    "data": {"adapter": "prompt_response", "eval_samples": 64, "max_prompt_length": 64, "max_length": 128},
    "teacher": {"mode": "online"},
    "training": {
        "per_device_train_batch_size": 16,
        "learning_rate": 3.0e-3,
        "lr_scheduler_type": "cosine",
        "warmup_ratio": 0.05,
        "logging_steps": 20,
        "save_steps": 100000,
        "bf16": False,
    },
}
OBJECTIVES = {
    "cross-entropy": {"divergence_weight": 0.0, "ce_weight": 1.0},
    "KL-distilled": {"divergence": "forward_kl", "divergence_weight": 1.0, "ce_weight": 0.0},
}


def _recipe(name: str, objective: dict[str, Any], work: Path, steps: int) -> Any:
    recipe = json.loads(json.dumps(DRAFT_RECIPE))
    recipe["output_dir"] = str(work / "drafts" / name)
    recipe["target"]["name_or_path"] = str(work / "tiny" / "target")
    recipe["data"].update(dataset=str(work / "tiny" / "train.jsonl"), eval_split=str(work / "tiny" / "eval.jsonl"))
    recipe["loss"] = objective
    recipe["training"]["max_steps"] = steps
    recipe["training"]["eval_steps"] = steps
    return load_recipe(recipe)


def _prompts(tokenizer, work: Path, n: int) -> list[torch.Tensor]:
    rows = [json.loads(line) for line in (work / "tiny" / "eval.jsonl").read_text().splitlines()[:n]]
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, return_tensors="pt")["input_ids"] for r in rows
    ]


def measure(target, draft, tokenizer, prompts: list[torch.Tensor], k: int, max_new_tokens: int) -> dict[str, Any]:
    """Target-only `generate` and speculative decoding on the same prompts, interleaved prompt by
    prompt: speedup (ratio of summed wall times), acceptance, and greedy identity."""
    decoder = SpeculativeDecoder(target, draft, num_draft_tokens=k, tokenizer=tokenizer)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    base_s = spec_s = 0.0
    same, stats = 0, []
    for ids in prompts:
        start = time.perf_counter()
        expected = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=pad)
        base_s += time.perf_counter() - start
        out = decoder.generate(ids, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad)
        spec_s += out.stats.wall_s
        same += out.sequences.tolist() == expected.tolist()
        stats.append(out.stats)
    proposed, accepted = [sum(s.proposed for s in stats), sum(s.accepted for s in stats)]
    depth = max(len(s.position_proposed) for s in stats)
    pos_p = [sum(s.position_proposed[j] for s in stats if j < len(s.position_proposed)) for j in range(depth)]
    pos_a = [sum(s.position_accepted[j] for s in stats if j < len(s.position_accepted)) for j in range(depth)]
    new_tokens, forwards = sum(s.new_tokens for s in stats), sum(s.sequence_forwards for s in stats)
    return {
        "k": k,
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        "alpha": fit_alpha(pos_p, pos_a),
        "mean_accepted_length": accepted / pos_p[0] if pos_p and pos_p[0] else 0.0,
        "tokens_per_target_forward": new_tokens / forwards if forwards else 0.0,
        "per_position_acceptance": [a / p if p else 0.0 for a, p in zip(pos_a, pos_p)],
        "speedup": base_s / spec_s,
        "target_only_s": base_s,
        "speculative_s": spec_s,
        "tokens_per_s": new_tokens / spec_s,
        "ttft_s": sum(s.ttft_s for s in stats) / len(stats),
        "tpot_s": sum(s.tpot_s for s in stats) / len(stats),
        "greedy_identity": same / len(prompts),
    }


def _plots(report: dict[str, Any], out: Path) -> list[Path]:
    """acceptance.png (per-position acceptance per draft) and speedup.png (measured vs predicted vs k)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    paths = []
    fig, ax = plt.subplots(figsize=(6, 4.2), layout="constrained")
    for name, entry in report["drafts"].items():
        values = entry["per_position_acceptance"]
        ax.plot(range(1, len(values) + 1), values, marker="o", label=f"{name} (α = {entry['alpha']:.2f})")
    ax.set(
        xlabel="draft position j",
        ylabel="P(draft token j accepted)",
        ylim=(0, 1.05),
        title=f"Per-position acceptance, k = {report['settings']['num_draft_tokens']}",
    )
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend()
    paths.append(out / "acceptance.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4.2), layout="constrained")
    for i, (name, entry) in enumerate(report["drafts"].items()):
        ks = [p["k"] for p in entry["sweep"]]
        ax.plot(ks, [p["speedup"] for p in entry["sweep"]], marker="o", color=f"C{i}", label=f"{name}: measured")
        ax.plot(ks, [p["predicted_speedup"] for p in entry["sweep"]], linestyle="--", color=f"C{i}", label=f"{name}: predicted")
    ax.axhline(1.0, color="grey", linewidth=1, label="target only")
    ax.set(
        xlabel="draft tokens per round k", ylabel="speedup over target-only generate", ylim=(0, None), title="Speedup vs k (predicted from measured α, c, v(k))"
    )
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize="small")
    paths.append(out / "speedup.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


HEADER = ["draft", "acceptance rate", "accepted length", "tokens / target forward", "end-to-end speedup vs target-only", "greedy identity", "held-out 1 − TVD"]
TITLE = "`distill demo` (tiny target trained here, two drafts of one size)"


def _rows(report: dict[str, Any]) -> list[list[Any]]:
    """One row per draft, in HEADER's order."""
    return [
        [
            name,
            e["acceptance_rate"],
            e["mean_accepted_length"],
            e["tokens_per_target_forward"],
            f"{e['speedup']:.2f}×",
            f"{e['greedy_identity']:.0%}",
            e["eval_expected_acceptance"],
        ]
        for name, e in report["drafts"].items()
    ]


def table(report: dict[str, Any]) -> str:
    """The side-by-side Markdown table the demo prints."""
    return markdown_table(HEADER, _rows(report))


def docs_blocks(report: dict[str, Any]) -> list[Block]:
    """The demo's section of the benchmarks page: the setting, the drafts side by side, measured / predicted speedup by k."""
    st, env = report["settings"], report["environment"]
    ks = [p["k"] for p in next(iter(report["drafts"].values()))["sweep"]]
    sweep = [[name] + [f"{p['speedup']:.2f} / {p['predicted_speedup']:.2f}" for p in e["sweep"]] for name, e in report["drafts"].items()]
    libs = ", ".join(f"{name} {env[name]}" for name in ("torch", "transformers", "tokenizers", "datasets", "numpy") if env.get(name))
    return [
        f"{env['device_name']} ({env['device']}), fp32, {env['torch_threads']} torch threads, k = {st['num_draft_tokens']}, "
        f"{st['eval_prompts']} held-out prompts, {st['max_new_tokens']} new tokens, greedy; target {st['target_steps']} CE steps "
        f"(hidden {st['target_shape']['hidden_size']}, {st['target_shape']['num_layers']} layers); drafts {st['draft_steps']} steps each "
        f"(hidden 64, 1 layer). Whole demo {report['wall_s']:.0f} s. {libs}. The acceptance figures are deterministic on one CPU model "
        "(the same with 1 or 2 torch threads); tiny models' float arithmetic differs between CPU models, so another processor may give others.",
        table_block(HEADER, _rows(report)),
        f"Measured / predicted end-to-end speedup by k, on the first {st['sweep_prompts']} prompts (prediction from the measured α, c, c₂ and v(k)):",
        table_block(["draft"] + [f"k = {k}" for k in ks], sweep),
    ]


def run(out_dir: str | os.PathLike = "demo-output", quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Run the demo; returns the report it writes to `out_dir`/report.json."""
    size = SIZES["quick" if quick else "full"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    load = MachineLoad().start()
    torch.manual_seed(seed)
    print(f"[1/4] tiny target: tokenizer, corpus and {size['target_steps']} training steps")
    prepare(out / "tiny", steps=size["target_steps"], train_examples=size["train_examples"], seed=seed, **{k: v for k, v in TARGET.items()})
    drafts = {}
    for i, (name, objective) in enumerate(OBJECTIVES.items()):
        print(f"[{i + 2}/4] draft trained with {name}: {size['draft_steps']} steps")
        run_dir = out / "drafts" / name
        if run_dir.exists():
            shutil.rmtree(run_dir)
        metrics = train(_recipe(name, objective, out, size["draft_steps"]))
        drafts[name] = {"path": str(run_dir / "draft"), "train_metrics": metrics}

    print("[4/4] speculative decoding of both drafts against target-only decoding")
    tokenizer = load_tokenizer(out / "tiny" / "target")
    target = load_model(out / "tiny" / "target", dtype=torch.float32)
    prompts = _prompts(tokenizer, out, size["eval_prompts"])
    for _name, entry in tqdm(drafts.items(), desc="evaluating drafts"):
        draft = load_model(entry["path"], dtype=torch.float32)
        entry.update(measure(target, draft, tokenizer, prompts, NUM_DRAFT_TOKENS, size["max_new_tokens"]))
        entry["eval_expected_acceptance"] = entry["train_metrics"].get("eval_expected_acceptance", float("nan"))
        costs = measure_costs(target, draft, ks=size["ks"], prompt_len=prompts[0].shape[1], repeats=10)
        entry["costs"] = costs.to_dict()
        entry["sweep"] = []
        for k in size["ks"]:
            point = measure(target, draft, tokenizer, prompts[: size["sweep_prompts"]], k, size["max_new_tokens"])
            point["predicted_speedup"] = costs.speedup(point["alpha"], k)
            entry["sweep"].append({key: point[key] for key in ("k", "speedup", "predicted_speedup", "alpha", "acceptance_rate")})

    load.stop()
    report = {
        "target": str(out / "tiny" / "target"),
        "settings": {**size, "num_draft_tokens": NUM_DRAFT_TOKENS, "seed": seed, "quick": quick, "target_shape": TARGET},
        "environment": environment("cpu"),
        "machine_load": load.report(),
        "drafts": drafts,
        "wall_s": time.perf_counter() - started,
    }
    write_json(out / "report.json", report)
    busy = f"\n\n**Warning:** {report['machine_load']['warning']}\n" if report["machine_load"]["busy"] else ""
    md = f"# distill demo\n\n{table(report)}\n\nk = {NUM_DRAFT_TOKENS}, {len(prompts)} held-out prompts, greedy, fp32, CPU; {report['wall_s']:.0f} s in all.\n{busy}"
    atomic_write(out / "report.md", md)
    _plots(report, out)
    return report


def main(argv: list[str] | None = None) -> int:
    """`distill demo [--quick] [--out demo-output] [--docs docs/benchmarks.md]`."""
    from distill.arguments import parser

    args = parser("demo").parse_args(argv)
    report = run(args.out, quick=args.quick, seed=args.seed)
    print()
    print(table(report))
    if args.docs:
        section = "demo-quick" if args.quick else "demo"
        for plot in ("acceptance", "speedup"):  # the plots beside the page, as the section links them
            atomic_write(Path(args.docs).parent / f"{section}-{plot}.png", (Path(args.out) / f"{plot}.png").read_bytes())
        cmd = "distill demo" + (" --quick" if args.quick else "") + (f" --seed {args.seed}" if args.seed else "")
        blocks = [*docs_blocks(report), f"Plots: [per-position acceptance]({section}-acceptance.png), [speedup vs k]({section}-speedup.png)."]
        write_benchmark(section, TITLE, cmd, blocks, args.docs, report["machine_load"], "distill demo")
    print(f"\nReport, plots and models in {args.out}/ ({report['wall_s']:.0f} s).")
    warn(report["machine_load"], "distill demo")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
