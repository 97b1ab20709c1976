"""`distill bench`: measure c and v(k) for a pair on the current device, predict the speedup per k
and α, pick k, and (with synthetic acceptance) measure the acceptance → speedup curve.

The cost model is `distill.speculative.costs`, the draft with controlled acceptance
`distill.commands.synthetic`; this module is the command and its report. Every measurement times the loop
the decoder runs (`--backend`: eager, or static caches with CUDA graphs), target-only baseline
included.

    distill bench                                            # tiny pair built on the spot (CPU)
    distill bench --target T --draft D --ks 1..8 --json bench.json
    distill bench --model-config-target recipes/model_configs/qwen2.5-7b-instruct.json \\
        --model-config-draft recipes/model_configs/qwen2.5-0.5b-instruct.json \\
        --synthetic-acceptance 0.5,0.7,0.9 --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import transformers
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config

from distill.commands.synthetic import merge_stats, synthetic_sweep
from distill.commands.vocab_sweep import check_sweep, parse_sizes, vocab_sweep, vocab_sweep_blocks
from distill.common.benchmarks import report as write_benchmark
from distill.common.docs import Block, table
from distill.common.io import write_json
from distill.common.models import ModelLoadError, load_model, load_tokenizer
from distill.common.provenance import MachineLoad, environment
from distill.common.tiny import make_examples, random_pair
from distill.common.trim import draft_to_target
from distill.common.vocab import check_special_ids_agree, check_tokenizers_agree
from distill.speculative import SpeculativeDecoder
from distill.speculative.costs import best_k, context_length, dtype_name, fit_alpha, measure_costs, resolve_backend

# ---------------------------------------------------------------------------------------------
# `distill bench`


def tiny_pair(seed: int = 0) -> tuple[PreTrainedModel, PreTrainedModel, transformers.PreTrainedTokenizerFast]:
    """A ~14M-parameter target and a ~0.3M draft (random weights, untied heads) with their tokenizer,
    big enough on a CPU that a target step costs several draft steps."""
    return random_pair(
        {"hidden_size": 512, "num_layers": 4, "num_heads": 8, "num_kv_heads": 2, "intermediate_size": 1536},
        {"hidden_size": 64, "num_layers": 1, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 192},
        seed,
    )


def _parse_ks(text: str) -> list[int]:
    """'1..8' or '1,2,4' (or both: '1..4,6,8')."""
    ks: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            lo, _, hi = part.partition("..")
            ks.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ks {text!r}: use a range '1..8' or a list '1,2,4'") from None
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"--ks {text!r}: give draft lengths >= 1")
    return sorted(ks)


def _parse_alphas(text: str) -> list[float]:
    try:
        alphas = [float(a) for a in text.split(",") if a.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give acceptance rates like 0.5,0.7,0.9") from None
    if not alphas or not all(0.0 <= a <= 1.0 for a in alphas):
        raise argparse.ArgumentTypeError(f"{text!r}: acceptance rates must lie in [0, 1]")
    return alphas


def _random_model(config_path: str, dtype: torch.dtype, device: str, seed: int) -> PreTrainedModel:
    """A random-weight model of the shape in a Qwen2Config JSON file, built directly on `device`."""
    path = Path(config_path)
    if not path.is_file():
        raise SystemExit(f"distill bench: model config {config_path!r} is not a file: give a Qwen2Config JSON (config.json)")
    config = Qwen2Config.from_json_file(path)
    if config.model_type != "qwen2":
        raise SystemExit(f"distill bench: {config_path} is a {config.model_type!r} config; give a Qwen2Config JSON")
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def _load(args: argparse.Namespace, dtype: torch.dtype):
    """(target, draft, tokenizer or None, names) from the command line, or the tiny pair."""
    sides = {"target": (args.target, args.model_config_target), "draft": (args.draft, args.model_config_draft)}
    for side, (path, cfg) in sides.items():
        if path and cfg:
            raise SystemExit(f"distill bench: give --{side} or --model-config-{side}, not both")
    given = {side: bool(path or cfg) for side, (path, cfg) in sides.items()}
    if given["target"] != given["draft"]:
        raise SystemExit(
            "distill bench: give both a target and a draft (--target/--model-config-target and "
            "--draft/--model-config-draft), or neither for the built-in tiny pair"
        )
    if not given["target"]:
        target, draft, tok = tiny_pair(args.seed)
        names = {"target": "tiny Qwen2 (random weights)", "draft": "tiny Qwen2 (random weights)"}
        return target.to(args.device, dtype), draft.to(args.device, dtype), tok, names
    models, names = {}, {}
    for i, (side, (path, cfg)) in enumerate(sides.items()):
        if cfg:
            models[side] = _random_model(cfg, dtype, args.device, args.seed + i)
            names[side] = f"random weights of {Path(cfg).name}"
        else:
            models[side] = load_model(path, dtype=dtype, device=args.device, what=side)
            names[side] = path
    tokenizers = {}
    for side in ("target", "draft"):
        if sides[side][0]:
            try:
                tokenizers[side] = load_tokenizer(sides[side][0], what=f"{side} tokenizer")
            except ModelLoadError:
                pass  # no tokenizer files: prompts are random ids, and the configs' special ids are compared instead
    if len(tokenizers) == 2:
        check_tokenizers_agree(tokenizers["target"], tokenizers["draft"])  # as `distill accept` does
    else:
        check_special_ids_agree(models["target"], models["draft"])
    return models["target"], models["draft"], tokenizers.get("target"), names


def _measure_alpha(target, draft, tok, prompts, k: int, max_new_tokens: int, backend: str) -> float:
    """α of the real draft: the decoder over `prompts`, EOS honoured, fitted from per-position counts."""
    decoder = SpeculativeDecoder(target, draft, num_draft_tokens=k, tokenizer=tok, draft_tokenizer=tok, backend=backend)
    bar = tqdm(prompts, desc="α of the real draft", unit="prompt", dynamic_ncols=True)
    total = merge_stats([decoder.generate(ids, max_new_tokens=max_new_tokens).stats for ids in bar])
    return fit_alpha(total.position_proposed, total.position_accepted)


def docs_blocks(report: dict[str, Any], args: argparse.Namespace) -> list[Block]:
    """The bench report's blocks: costs, predicted speedup per k and α with the best k, (with synthetic
    acceptance) measured vs predicted speedup per (α, k), the vocabulary sweep, and a hint when α ≈ 0."""
    costs, env = report["costs"], report["environment"]
    alphas, ks = report["alphas"], sorted(int(k) for k in costs["v"])
    pred = {(p["alpha"], p["k"]): p["predicted_speedup"] for p in report["predicted"]}
    best = {b["alpha"]: b for b in report["best_k"]}
    blocks: list[Block] = [
        f"{env['device_name']} ({env['device']}), {env['dtype']}, {report['backend']} loop, torch {env['torch']}, "
        f"transformers {env['transformers']}; costs on a warm cache of {costs['prompt_len']} tokens, median of {costs['repeats']}.",
        table(
            ["target step ms", "draft step ms", "c = draft / target", "c₂ = two-token draft step / target"],
            [[costs["target_step_s"] * 1e3, costs["draft_step_s"] * 1e3, costs["c"], costs.get("c_first")]],
        ),
        f"Predicted speedup = E[tokens per round] / (c₂ + (k-1)·c + v(k)) (the loop's first draft step of a round reads two tokens); α {report['alpha_source']}.",
        table(
            ["k", "v(k)"] + [f"α = {a:g}" for a in alphas],
            [[k, costs["v"][str(k)]] + [pred[(a, k)] for a in alphas] for k in ks]
            + [["best k", ""] + [f"{best[a]['best_k']} ({best[a]['predicted_speedup']:.2f}×)" for a in alphas]],
        ),
    ]
    if report["synthetic"]:
        rows = [
            [
                r["alpha"],
                r["k"],
                r["measured_alpha"],
                r["acceptance_rate"],
                r["tokens_per_target_forward"],
                r["speedup"],
                r["decode_speedup"],
                r["predicted_speedup"],
                f"{(r['decode_speedup'] / r['predicted_speedup'] - 1) * 100:+.1f}%",
                f"{r['greedy_identity'] * 100:.0f}%",
            ]
            for r in report["synthetic"]
        ]
        first = report["synthetic"][0]
        blocks += [
            f"Synthetic acceptance: the real verification loop with a draft that proposes the target's own token with "
            f"probability α per position ({first['num_prompts']} prompts × {first['max_new_tokens']} new tokens, greedy, "
            "EOS ignored). Decode speedup leaves out time to first token; predicted uses the measured α, c and v(k); "
            "error = decode speedup / predicted − 1.",
            table(
                ["α", "k", "measured α", "acceptance rate", "tokens / target forward", "speedup", "decode speedup", "predicted", "error", "greedy identity"],
                rows,
            ),
        ]
    if report["vocab_sweep"]:
        blocks += vocab_sweep_blocks(report["vocab_sweep"], args.vocab_from, args.coverage_from)
    if not args.synthetic_acceptance and max(report["alphas"]) < 0.05:
        blocks.append(
            "α ≈ 0: this draft shares next to nothing with the target (random weights?). "
            "Add --synthetic-acceptance 0.5,0.7,0.9 to measure the speedup curve at controlled acceptance."
        )
    return blocks


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """`distill bench`'s arguments, checked (exit 2 with argparse's message on bad input)."""
    from distill.arguments import default_device, parser

    ap = parser("bench")
    args = ap.parse_args(argv)
    args.device = default_device(args.device)
    try:
        args.ks = _parse_ks(args.ks)
        args.alpha = _parse_alphas(args.alpha) if args.alpha else None
        args.synthetic_acceptance = _parse_alphas(args.synthetic_acceptance) if args.synthetic_acceptance else None
        args.vocab_sizes = parse_sizes(args.vocab_sizes) if args.vocab_sizes else None
    except (argparse.ArgumentTypeError, ValueError) as err:
        ap.error(str(err))
    if args.vocab_sizes and (not args.vocab_from or not args.coverage_from):
        ap.error("--vocab-sizes needs --vocab-from FILE... (the text each K is counted in) and --coverage-from FILE (held-out text for coverage)")
    for name in ("num_draft_tokens", "prompt_len", "num_prompts", "max_new_tokens", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    args.error = ap.error
    return args


def _alphas(
    args: argparse.Namespace, target: PreTrainedModel, draft: PreTrainedModel, tok: Any, prompts: list[torch.Tensor], backend: str
) -> tuple[list[float], str, Any]:
    """The acceptance rates to predict at, where they come from, and (when measured) how to measure another draft's."""
    if args.alpha:
        return args.alpha, "given", None
    if args.synthetic_acceptance:
        return args.synthetic_acceptance, "as set for the synthetic runs", None
    if tok is not None:  # real text through the chat template
        chats = [[{"role": "user", "content": ex["prompt"]}] for ex in make_examples(args.num_prompts, seed=args.seed + 1234)]
        real = [tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")["input_ids"] for chat in chats]
    else:
        real = prompts
    real = [p.to(args.device) for p in real]
    k0 = args.num_draft_tokens

    def measure(d: PreTrainedModel) -> float:
        return _measure_alpha(target, d, tok, real, k0, args.max_new_tokens, backend)

    kind = "chat prompts" if tok is not None else "random-id prompts"
    return [measure(draft)], f"measured with the real draft (k = {k0}, {len(real)} {kind})", measure


def main(argv: list[str] | None = None) -> int:
    """`distill bench`: measure c and v(k), predict the speedup per k, pick k; optionally measure
    the acceptance → speedup curve with synthetic acceptance, and sweep trimmed vocabularies."""
    args = _parse(argv)
    dtype = (torch.bfloat16 if args.device.startswith("cuda") else torch.float32) if args.dtype == "auto" else getattr(torch, args.dtype)
    try:
        target, draft, tok, names = _load(args, dtype)
        if args.vocab_sizes:
            check_sweep(draft, tok, args.vocab_sizes, [*args.vocab_from, args.coverage_from])
        if args.synthetic_acceptance and draft_to_target(draft) is not None:
            raise ValueError("--synthetic-acceptance wraps a full-vocabulary draft: give the original draft, or its full-vocab/ export (distill publish)")
    except ValueError as err:
        print(f"distill bench: error: {err}", file=sys.stderr)
        return 2
    load = MachineLoad().start()
    context = min(context_length(target), context_length(draft))
    if args.prompt_len + args.max_new_tokens + max(args.ks) + 2 > context:
        args.error(f"--prompt-len + --max-new-tokens + k exceeds the models' context of {context}: lower them")
    rows = [m.get_input_embeddings().num_embeddings for m in (target, draft)] + ([len(tok)] if tok is not None else [])
    gen = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(0, min(rows), (1, args.prompt_len), generator=gen) for _ in range(args.num_prompts)]  # ids inside every vocabulary

    backend = resolve_backend(args.backend, target, draft)
    costs = measure_costs(target, draft, ks=args.ks, prompt_len=args.prompt_len, repeats=args.repeats, seed=args.seed, backend=backend)
    alphas, source, measure = _alphas(args, target, draft, tok, prompts, backend)
    synthetic = (
        synthetic_sweep(target, draft, args.synthetic_acceptance, args.ks, prompts, args.max_new_tokens, costs=costs, seed=args.seed, backend=backend)
        if args.synthetic_acceptance
        else []
    )
    vocab_rows = (
        vocab_sweep(
            target,
            draft,
            tok,
            args.vocab_sizes,
            args.vocab_from,
            args.coverage_from,
            ks=args.ks,
            prompt_len=args.prompt_len,
            repeats=args.repeats,
            seed=args.seed,
            backend=backend,
            alpha=alphas[0],
            measure_alpha=measure,
        )
        if args.vocab_sizes
        else []
    )
    settings = {k: v for k, v in vars(args).items() if k != "error"}
    report = {
        "names": names,
        "backend": backend,
        "environment": {**environment(args.device), "dtype": dtype_name(dtype)},
        "machine_load": load.stop().report(),
        "settings": {**settings, "command": "distill bench " + " ".join(sys.argv[1:] if argv is None else argv)},
        "costs": costs.to_dict(),
        "alphas": alphas,
        "alpha_source": source,
        "predicted": [{"alpha": a, "k": k, "predicted_speedup": costs.speedup(a, k)} for a in alphas for k in args.ks],
        "best_k": [{"alpha": a, "best_k": (b := best_k(a, costs, k_max=max(args.ks))), "predicted_speedup": costs.speedup(a, b)} for a in alphas],
        "synthetic": synthetic,
        "vocab_sweep": vocab_rows,
    }
    title, blocks = f"distill bench: {names['target']} / {names['draft']}", docs_blocks(report, args)
    if args.json:
        write_json(args.json, report)
    write_benchmark(args.section, title, report["settings"]["command"], blocks, args.markdown, report["machine_load"], "distill bench")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
