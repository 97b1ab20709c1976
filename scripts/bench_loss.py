"""Peak memory and time of one distillation-loss forward+backward: the unchunked computation
(full student logits from hidden @ lm_head.T, then `distill.training.losses.distillation_loss`) against
`distill.training.losses.fused_divergence` (student logits one chunk of tokens at a time).

Each variant runs in its own fresh child process so their peaks cannot mix: on CPU the peak is
the child's RSS high-water mark (ru_maxrss), on CUDA `torch.cuda.max_memory_allocated`.
"Above inputs" subtracts what the child held before the loss ran (hidden, LM head, teacher signal).

    python scripts/bench_loss.py                          # 2,048 tokens x 151,936 vocab x hidden 896
    python scripts/bench_loss.py --teacher topk           # the same against a top-32 teacher cache
    python scripts/bench_loss.py --tokens 256 --vocab 32768 --hidden 256   # a quick small run

With --docs the table is written as the bench_loss (bench_loss-topk) section of that file, its report
kept in results/ beside it.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys

import torch

from distill.common.benchmarks import command_line, report
from distill.common.clock import Clock
from distill.common.docs import Block, table
from distill.common.provenance import MachineLoad, environment
from distill.training.losses import DIVERGENCES, distillation_loss, fused_divergence

MIB = 2**20


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=2048, help="batch x length, as one sequence")
    p.add_argument("--vocab", type=int, default=151936, help="LM head rows (Qwen2.5-0.5B: 151,936)")
    p.add_argument("--hidden", type=int, default=896, help="hidden size (Qwen2.5-0.5B: 896)")
    p.add_argument("--divergence", default="forward_kl", choices=DIVERGENCES)
    p.add_argument("--teacher", default="dense", choices=["dense", "topk"], help="full teacher logits, or a top-k cache")
    p.add_argument("--top-k", type=int, default=32, help="teacher ids per token with --teacher topk")
    p.add_argument("--chunk-sizes", type=int, nargs="+", default=[256], help="fused variants to run, tokens per chunk")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=2, help="timed runs per child, after one warm-up run")
    p.add_argument("--rounds", type=int, default=1, help="children per variant, alternated; the fastest time is kept")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--docs", help="Markdown file (docs/benchmarks.md) whose bench_loss section is rewritten, its report kept in results/ beside it")
    p.add_argument("--variant", help=argparse.SUPPRESS)  # set by the parent for its child processes
    return p


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _child(args: argparse.Namespace) -> dict:
    """Build the inputs, run the variant warm-up + repeats times, report its peak and times."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    # In-place scaling: building the inputs must not raise the high-water mark above the inputs.
    hidden = torch.randn(1, args.tokens, args.hidden, generator=gen).to(device, dtype).requires_grad_()
    weight = torch.randn(args.vocab, args.hidden, generator=gen).mul_(args.hidden**-0.5).to(device, dtype).requires_grad_()
    if args.teacher == "dense":
        teacher = {"teacher_logits": torch.randn(1, args.tokens, args.vocab, generator=gen).mul_(2).to(device, dtype)}
    else:  # k distinct ids per token (one per stride of the vocabulary), 90% of the mass, sorted
        k, stride = args.top_k, args.vocab // args.top_k
        ids = torch.arange(k) * stride + torch.randint(0, stride, (1, args.tokens, k), generator=gen)
        probs = torch.randn(1, args.tokens, k, generator=gen).mul_(2).softmax(-1).sort(-1, descending=True)
        teacher = {"teacher_topk_ids": ids.gather(-1, probs.indices).to(device), "teacher_topk_logprobs": (probs.values * 0.9).log().to(device)}
    cuda = device.type == "cuda"

    def step() -> float:
        hidden.grad = weight.grad = None
        if args.variant == "unchunked":
            loss = distillation_loss(args.divergence, hidden @ weight.T, **teacher)
        else:
            loss = fused_divergence(args.divergence, hidden, weight, **teacher, chunk_size=int(args.variant))
        loss.backward()
        return loss.item()

    if cuda:
        torch.cuda.synchronize()
        baseline = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        baseline = _rss_bytes()
    setup_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    clock, marks, loss = Clock(device), [], step()
    for _ in range(args.repeats):
        start = clock.mark()
        loss = step()
        marks.append((start, clock.mark()))
    if cuda:
        torch.cuda.synchronize()
    times = [clock.seconds(i, j) for i, j in marks]
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if not cuda and peak <= setup_peak:
        print(f"warning: {args.variant}: the peak was reached while building the inputs", file=sys.stderr)
    return {"variant": args.variant, "loss": loss, "peak": peak, "baseline": baseline, "times": times}


def _run_child(argv: list[str], variant: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *argv, "--variant", variant], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.variant:
        print(json.dumps(_child(args)))
        return
    variants = ["unchunked", *map(str, args.chunk_sizes)]
    results: dict[str, dict] = {}
    load = MachineLoad().start()
    for _ in range(args.rounds):
        for v in variants:
            r = _run_child(argv, v)
            best = results.setdefault(v, r)
            best["times"] = sorted(set(best["times"]) | set(r["times"]))
            best["peak"], best["baseline"] = max(best["peak"], r["peak"]), min(best["baseline"], r["baseline"])

    title, blocks = render(results, variants, args)
    report("bench_loss" + ("-topk" if args.teacher == "topk" else ""), title, command_line("bench_loss", argv), blocks, args.docs, load.stop(), "bench_loss")


def render(results: dict[str, dict], variants: list[str], args: argparse.Namespace) -> tuple[str, list[Block]]:
    """The section's title and blocks: the setting, peak and time per variant against the unchunked loss, every time."""
    base = results["unchunked"]
    base_time, base_peak, base_extra = min(base["times"]), base["peak"], base["peak"] - base["baseline"]
    env = environment(args.device)
    rows = []
    for v in variants:
        r = results[v]
        extra, t = r["peak"] - r["baseline"], min(r["times"])
        rows.append(
            [
                "unchunked (full logits)" if v == "unchunked" else f"fused, chunk {v}",
                f"{r['peak'] / MIB:,.0f}",
                f"{extra / MIB:,.0f}",
                f"{r['peak'] / base_peak:.0%}",
                f"{extra / max(base_extra, 1):.0%}",
                f"{t:.2f}",
                f"{t / base_time:.2f}×",
                f"{r['loss']:.6f}",
            ]
        )
    teacher = "dense teacher logits" if args.teacher == "dense" else f"top-{args.top_k} teacher"
    return f"Loss memory: fused chunked divergence vs unchunked ({teacher})", [
        f"{args.tokens:,} tokens × {args.vocab:,} vocab × hidden {args.hidden}, {args.divergence}, {teacher}, {args.dtype} on "
        f"{env['device_name']} ({args.device}, {env['torch_threads']} threads, torch {env['torch']}); forward + backward, fastest of "
        f"{args.rounds * args.repeats} timed runs after a warm-up; peak = the RSS high-water mark of a fresh child per variant "
        "(on CUDA its max_memory_allocated); above inputs = less what the child held before the loss ran (hidden states, LM head, teacher signal).",
        table(["computation", "peak MiB", "above inputs MiB", "peak vs unchunked", "above inputs vs unchunked", "time s", "time vs unchunked", "loss"], rows),
        "Target (issue 3): fused peak ≤ 25% of the unchunked peak, at ≤ 1.3× its time. Every timed run (s): "
        + "; ".join(f"{v}: {', '.join(f'{t:.2f}' for t in results[v]['times'])} (median {statistics.median(results[v]['times']):.2f})" for v in variants)
        + ".",
    ]


if __name__ == "__main__":
    main()
