"""Batched speculative decoding against batched target-only `generate`, interleaved in one run: for
each batch size, tokens per row per target forward, acceptance, wall speedup, throughput, TTFT,
TPOT and greedy identity per row, greedy and sampled.

    python scripts/bench_batch.py                               # the `distill demo` pair (trained first if absent)
    python scripts/bench_batch.py --target PATH --draft PATH --prompts prompts.jsonl --batch-sizes 1 8 32
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from distill.common.benchmarks import command_line, report
from distill.common.clock import Clock
from distill.common.docs import Block, table
from distill.common.io import read_jsonl
from distill.common.models import load_model, load_tokenizer
from distill.common.prompts import chat_prompt_ids
from distill.common.provenance import MachineLoad, environment
from distill.common.vocab import cut_at_eos
from distill.speculative import SpeculativeDecoder
from distill.speculative.batch import left_pad

TITLE = "Decoder: batched speculative decoding, every row at its own accepted length"
HEADER = [
    "mode",
    "batch",
    "tokens / row / target forward",
    "acceptance",
    "wall speedup vs target-only",
    "tokens/s (ours)",
    "tokens/s (target-only)",
    "TTFT ms (median)",
    "TPOT ms (median)",
    "greedy identity (rows)",
]


def demo_pair(demo_dir: Path) -> tuple[Path, Path, Path]:
    """Target, KL-distilled draft and held-out prompts of a `distill demo` run, running it if absent."""
    target, draft, prompts = demo_dir / "tiny" / "target", demo_dir / "drafts" / "KL-distilled" / "draft", demo_dir / "tiny" / "eval.jsonl"
    if not (target / "config.json").exists() or not (draft / "config.json").exists():
        from distill.commands.demo import run

        print(f"no demo pair in {demo_dir}: running `distill demo --out {demo_dir}` first")
        run(demo_dir)
    return target, draft, prompts


def load_prompts(path: Path | None, tokenizer: PreTrainedTokenizerBase, n: int) -> list[list[int]]:
    """The first `n` rows' "prompt" fields of a JSONL file, each in the chat template."""
    if path is None or not path.exists():
        raise SystemExit(f'no prompt file at {path}: pass --prompts FILE.jsonl (one {{"prompt": ...}} per line)')
    rows = read_jsonl(path, n)
    if len(rows) < n or any("prompt" not in r for r in rows):
        raise SystemExit(f'{path} needs {n} rows with a "prompt" field (has {len(rows)}): lower --num-prompts or fix the file')
    return [chat_prompt_ids(tokenizer, r["prompt"]) for r in rows]


@dataclass
class Totals:
    """Sums over the batches and passes of one (mode, batch size)."""

    base_s: float = 0.0
    spec_s: float = 0.0
    new_tokens: int = 0
    base_tokens: int = 0
    forwards: int = 0
    accepted: int = 0
    proposed: int = 0
    same: int = 0
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)

    def add(self, expected: torch.Tensor, out: Any, width: int, eos: set[int]) -> None:
        """One batch's target-only output and speculative output, both cut at their first EOS per row."""
        theirs = [cut_at_eos(r[width:], eos) for r in expected.tolist()]
        mine = [cut_at_eos(r[width:], eos) for r in out.sequences.tolist()]
        self.same += sum(a == c for a, c in zip(mine, theirs))
        self.base_tokens += sum(map(len, theirs))
        s = out.stats
        self.new_tokens, self.forwards = self.new_tokens + s.new_tokens, self.forwards + s.sequence_forwards
        self.accepted, self.proposed = self.accepted + s.accepted, self.proposed + s.proposed
        self.ttft.append(s.ttft_s)
        self.tpot.append(s.tpot_s)

    def row(self, mode: str, batch: int, prompts: int, repeats: int) -> dict[str, Any]:
        return {
            "mode": mode,
            "batch": batch,
            "tokens_per_row_per_forward": self.new_tokens / self.forwards,
            "acceptance_rate": self.accepted / max(1, self.proposed),
            "target_only_s": self.base_s,
            "speculative_s": self.spec_s,
            "speedup": self.base_s / self.spec_s,
            "tokens_per_s": self.new_tokens / self.spec_s,
            "target_only_tokens_per_s": self.base_tokens / self.base_s,
            "ttft_ms": statistics.median(self.ttft) * 1e3,
            "tpot_ms": statistics.median(self.tpot) * 1e3,
            "greedy_identity": f"{self.same}/{prompts * repeats}" if mode != "sampled" else "-",
        }


def bench_one(target, decoder, batches, mode: str, gen_kwargs: dict, spec_kwargs: dict, eos: set[int], repeats: int, device: str, seed: int) -> Totals:
    """Target-only `generate` and the decoder over every batch `repeats` times, alternating batch by
    batch who goes first, after one warm-up of each (for a compiled backend, its compile)."""
    sampled = mode == "sampled"
    ids, mask = batches[0]
    target.generate(input_ids=ids, attention_mask=mask, **gen_kwargs)
    decoder.generate(ids, mask, do_sample=sampled, seed=0, **spec_kwargs)
    totals = Totals()
    for rep in range(repeats):
        for j, (ids, mask) in enumerate(batches):
            for first in (True, False) if (rep + j) % 2 == 0 else (False, True):
                if first:
                    clock = Clock(device)
                    expected = target.generate(input_ids=ids, attention_mask=mask, **gen_kwargs)
                    totals.base_s += clock.elapsed()
                else:
                    out = decoder.generate(ids, mask, do_sample=sampled, seed=seed + 1000 * rep + j, **spec_kwargs)
                    totals.spec_s += out.stats.wall_s
            totals.add(expected, out, ids.shape[1], eos)
    return totals


def bench(
    target,
    draft,
    tokenizer,
    prompts: list[list[int]],
    batch_sizes: list[int],
    k: int,
    max_new_tokens: int,
    modes: list[str],
    backend: str,
    temperature: float,
    repeats: int,
    device: str,
    seed: int = 0,
) -> list[dict]:
    """One row per (batch size, mode): sums over the prompt set (split into batches) and repeats;
    target-only `generate` and the decoder alternate batch by batch, who goes first alternating."""
    decoder = SpeculativeDecoder(target, draft, num_draft_tokens=k, tokenizer=tokenizer, draft_tokenizer=tokenizer, backend=backend)
    eos_id, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    spec_kwargs = dict(max_new_tokens=max_new_tokens, temperature=temperature, eos_token_id=eos_id, pad_token_id=pad)
    rows = []
    for mode in modes:
        gen_kwargs = dict(max_new_tokens=max_new_tokens, eos_token_id=eos_id, pad_token_id=pad, do_sample=mode == "sampled")
        if mode == "sampled":
            gen_kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
        for b in batch_sizes:
            if len(prompts) % b:
                raise SystemExit(f"--num-prompts {len(prompts)} is not a multiple of batch size {b}")
            batches = [left_pad(prompts[i : i + b], pad, device) for i in range(0, len(prompts), b)]
            totals = bench_one(target, decoder, batches, mode, gen_kwargs, spec_kwargs, {eos_id}, repeats, device, seed)
            rows.append(totals.row(mode, b, len(prompts), repeats))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo-dir", default="demo-output", help="a `distill demo` output folder (run there if it has no models)")
    ap.add_argument("--target", help="Hub id or path (default: the demo's target)")
    ap.add_argument("--draft", help="Hub id or path (default: the demo's KL-distilled draft)")
    ap.add_argument("--prompts", help='JSONL with a "prompt" field per row (default: the demo\'s held-out eval.jsonl)')
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--num-draft-tokens", "-k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--modes", nargs="+", default=["greedy", "sampled"], choices=["greedy", "sampled"])
    ap.add_argument("--temperature", type=float, default=0.7, help="for the sampled mode (top-k and top-p off on both sides)")
    ap.add_argument("--backend", default="auto", choices=["auto", "eager", "static", "compiled"])
    ap.add_argument("--repeats", type=int, default=2, help="passes over the prompt set")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--output",
        default="docs/benchmarks.md",
        help="Markdown file whose bench_batch section is rewritten, its report kept in results/ beside it ('' to skip)",
    )
    args = ap.parse_args(argv)
    if bool(args.target) != bool(args.draft):
        ap.error("give both --target and --draft, or neither for the demo pair")
    return args


def render(rows: list[dict], args: argparse.Namespace, target_path: Any, draft_path: Any) -> list[Block]:
    """The bench_batch section's blocks: the table and what was measured."""
    measured = table(
        HEADER,
        [
            [
                r["mode"],
                r["batch"],
                r["tokens_per_row_per_forward"],
                r["acceptance_rate"],
                f"{r['speedup']:.2f}×",
                f"{r['tokens_per_s']:.0f}",
                f"{r['target_only_tokens_per_s']:.0f}",
                r["ttft_ms"],
                r["tpot_ms"],
                r["greedy_identity"],
            ]
            for r in rows
        ],
    )
    env = environment(args.device)
    return [
        measured,
        f"Target {target_path}, draft {draft_path}; k = {args.num_draft_tokens}, {args.num_prompts} held-out prompts "
        f"(chat template, left-padded batches), {args.max_new_tokens} new tokens, {args.repeats} passes, backend {args.backend}, "
        f"{args.device}, {args.dtype}, torch {env['torch']}, {env['torch_threads']} threads, {env['device_name']}. Target-only = "
        "`target.generate` on the same left-padded batches, interleaved batch by batch (who goes first alternates); "
        f"sampled = temperature {args.temperature}, top-k and top-p off, on both sides. tokens / row / target forward = "
        "emitted tokens / (target forwards × rows they served), prefill included. Greedy identity: rows whose output equals "
        "target-only `generate`'s, up to EOS.",
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.target:
        target_path, draft_path, prompt_path = args.target, args.draft, None
    else:
        target_path, draft_path, prompt_path = demo_pair(Path(args.demo_dir))
    prompt_path = Path(args.prompts) if args.prompts else prompt_path
    dtype = getattr(torch, args.dtype)
    tokenizer = load_tokenizer(target_path)
    prompts = load_prompts(prompt_path, tokenizer, args.num_prompts)  # before the models: a bad file fails in seconds
    target = load_model(target_path, dtype=dtype, device=args.device)
    draft = load_model(draft_path, dtype=dtype, device=args.device)
    load = MachineLoad().start()
    rows = bench(
        target,
        draft,
        tokenizer,
        prompts,
        args.batch_sizes,
        args.num_draft_tokens,
        args.max_new_tokens,
        args.modes,
        args.backend,
        args.temperature,
        args.repeats,
        args.device,
    )
    load.stop()
    blocks = render(rows, args, target_path, draft_path)
    report("bench_batch" + ("" if not args.target else "-custom"), TITLE, command_line("bench_batch", argv), blocks, args.output, load, "bench_batch")
    greedy = [r for r in rows if r["mode"] == "greedy"]
    return 0 if all(r["greedy_identity"].split("/")[0] == r["greedy_identity"].split("/")[1] for r in greedy) else 1


if __name__ == "__main__":
    raise SystemExit(main())
