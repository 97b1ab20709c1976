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
import sys
import time
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from distill.common.docs import markdown_table, write_section
from distill.common.models import load_model, load_tokenizer
from distill.common.provenance import MachineLoad, describe, warn
from distill.speculative import SpeculativeDecoder


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
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:n]
    if len(rows) < n or any("prompt" not in r for r in rows):
        raise SystemExit(f'{path} needs {n} rows with a "prompt" field (has {len(rows)}): lower --num-prompts or fix the file')
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        for r in rows
    ]


def left_pad(prompts: list[list[int]], pad: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


def trim(row: list[int], eos: set[int]) -> list[int]:
    """A row's new tokens up to and including its first EOS."""
    for i, t in enumerate(row):
        if t in eos:
            return row[: i + 1]
    return row


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
    eos = {eos_id}
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    rows = []
    for mode in modes:
        sampled = mode == "sampled"
        gen_kwargs = dict(max_new_tokens=max_new_tokens, eos_token_id=eos_id, pad_token_id=pad, do_sample=sampled)
        if sampled:
            gen_kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
        for b in batch_sizes:
            batches = [left_pad(prompts[i : i + b], pad, device) for i in range(0, len(prompts), b)]
            if len(prompts) % b:
                raise SystemExit(f"--num-prompts {len(prompts)} is not a multiple of batch size {b}")

            def ours(ids, mask, seed_=None, sampled=sampled):
                return decoder.generate(
                    ids, mask, max_new_tokens=max_new_tokens, do_sample=sampled, temperature=temperature, eos_token_id=eos_id, pad_token_id=pad, seed=seed_
                )

            ids, mask = batches[0]
            target.generate(input_ids=ids, attention_mask=mask, **gen_kwargs)  # warm-up (and, compiled, the compile)
            ours(ids, mask, 0)
            base_s = spec_s = 0.0
            new_tokens = base_tokens = forwards = accepted = proposed = same = 0
            ttft, tpot = [], []
            for rep in range(repeats):
                for j, (ids, mask) in enumerate(batches):
                    for first in (True, False) if (rep + j) % 2 == 0 else (False, True):
                        sync()
                        start = time.perf_counter()
                        if first:
                            expected = target.generate(input_ids=ids, attention_mask=mask, **gen_kwargs)
                        else:
                            out = ours(ids, mask, seed + 1000 * rep + j)
                        sync()
                        if first:
                            base_s += time.perf_counter() - start
                        else:
                            spec_s += out.stats.wall_s
                    width = ids.shape[1]
                    theirs = [trim(r[width:], eos) for r in expected.tolist()]
                    mine = [trim(r[width:], eos) for r in out.sequences.tolist()]
                    same += sum(a == c for a, c in zip(mine, theirs))
                    base_tokens += sum(map(len, theirs))
                    s = out.stats
                    new_tokens, forwards = new_tokens + s.new_tokens, forwards + s.sequence_forwards
                    accepted, proposed = accepted + s.accepted, proposed + s.proposed
                    ttft.append(s.ttft_s)
                    tpot.append(s.tpot_s)
            rows.append(
                {
                    "mode": mode,
                    "batch": b,
                    "tokens_per_row_per_forward": new_tokens / forwards,
                    "acceptance_rate": accepted / max(1, proposed),
                    "target_only_s": base_s,
                    "speculative_s": spec_s,
                    "speedup": base_s / spec_s,
                    "tokens_per_s": new_tokens / spec_s,
                    "target_only_tokens_per_s": base_tokens / base_s,
                    "ttft_ms": statistics.median(ttft) * 1e3,
                    "tpot_ms": statistics.median(tpot) * 1e3,
                    "greedy_identity": f"{same}/{len(prompts) * repeats}" if not sampled else "-",
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
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
    ap.add_argument("--output", default="docs/benchmarks.md", help="Markdown file whose bench_batch section is rewritten ('' to skip)")
    args = ap.parse_args(argv)
    if bool(args.target) != bool(args.draft):
        ap.error("give both --target and --draft, or neither for the demo pair")
    if args.target:
        target_path, draft_path, prompt_path = args.target, args.draft, None
    else:
        target_path, draft_path, prompt_path = demo_pair(Path(args.demo_dir))
    prompt_path = Path(args.prompts) if args.prompts else prompt_path
    dtype = getattr(torch, args.dtype)
    tokenizer = load_tokenizer(target_path)
    target = load_model(target_path, dtype=dtype, device=args.device)
    draft = load_model(draft_path, dtype=dtype, device=args.device)
    prompts = load_prompts(prompt_path, tokenizer, args.num_prompts)
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

    table = markdown_table(
        [
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
        ],
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
    command = "python scripts/bench_batch.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = "\n".join(
        [
            "## Decoder: batched speculative decoding, every row at its own accepted length",
            "",
            "```",
            command.strip(),
            "```",
            "",
            table,
            "",
            f"Target {target_path}, draft {draft_path}; k = {args.num_draft_tokens}, {args.num_prompts} held-out prompts "
            f"(chat template, left-padded batches), {args.max_new_tokens} new tokens, {args.repeats} passes, backend {args.backend}, "
            f"{args.device}, {args.dtype}, torch {torch.__version__}, {torch.get_num_threads()} threads. Target-only = "
            "`target.generate` on the same left-padded batches, interleaved batch by batch (who goes first alternates); "
            f"sampled = temperature {args.temperature}, top-k and top-p off, on both sides. tokens / row / target forward = "
            "emitted tokens / (target forwards × rows they served), prefill included. Greedy identity: rows whose output equals "
            "target-only `generate`'s, up to EOS.",
            "",
            describe(load.report()),
        ]
    )
    print(md)
    warn(load.report(), "bench_batch")
    if args.output:
        write_section(args.output, "bench_batch" + ("" if not args.target else "-custom"), md)
    greedy = [r for r in rows if r["mode"] == "greedy"]
    return 0 if all(r["greedy_identity"].split("/")[0] == r["greedy_identity"].split("/")[1] for r in greedy) else 1


if __name__ == "__main__":
    raise SystemExit(main())
