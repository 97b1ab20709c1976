"""Target-only `generate`, transformers' `assistant_model=` and distill's SpeculativeDecoder on one
pair and one prompt set, interleaved in one run: wall time, tokens/s, acceptance, tokens per
target forward, the loop's own overhead per round, and the ratios.

    python scripts/bench_decode.py                          # tiny pair built on the spot (CPU, minutes)
    python scripts/bench_decode.py --target PATH --draft PATH --num-prompts 20 --max-new-tokens 128
    python scripts/bench_decode.py --target T --draft D --gsm8k ../shared/data/gsm8k/test.jsonl --dtype bfloat16 \
        --num-draft-tokens 3 --skip-compiled --section bench_decode-real    # a real pair on GSM8K test prompts
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from distill.common.benchmarks import command_line, report
from distill.common.clock import Clock
from distill.common.docs import Block, table
from distill.common.models import load_model, load_tokenizer
from distill.common.prompts import chat_prompts
from distill.common.provenance import MachineLoad, environment
from distill.common.tiny import make_examples, random_pair
from distill.speculative import SpeculativeDecoder

COMPILED = "distill SpeculativeDecoder (compiled draft)"
HEADER = ["method", "total s", "median ms / prompt", "tokens/s", "tokens / target forward", "loop overhead ms / round", "speedup vs target-only"]


def default_pair(seed: int = 0):
    """A ~40M-parameter target and a ~1M draft (random weights, untied heads) and their tokenizer."""
    return random_pair(
        {"hidden_size": 640, "num_layers": 8, "num_heads": 8, "num_kv_heads": 2, "intermediate_size": 2048},
        {"hidden_size": 160, "num_layers": 3, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 480},
        seed,
    )


class ForwardTimer:
    """Counts and times a model's forward calls on the host's clock (the calls as the loop makes
    them), to split wall time into model time and loop overhead."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.reset()
        self.attach()

    def attach(self) -> None:
        self._handles = [
            self.model.register_forward_pre_hook(lambda *_: setattr(self, "_start", self.clock.mark())),
            self.model.register_forward_hook(lambda *_: self._done()),
        ]

    def detach(self) -> None:
        """No hooks while a compiled graph runs the model (dynamo would trace the clock into it)."""
        for h in self._handles:
            h.remove()

    def _done(self) -> None:
        self.calls += 1
        self.clock.mark()
        self.seconds += self.clock.seconds(self._start, -1)

    def reset(self) -> None:
        self.calls, self.seconds, self.clock, self._start = 0, 0.0, Clock(), 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="Hub id or path (default: tiny pair built on the spot)")
    ap.add_argument("--draft", help="Hub id or path")
    ap.add_argument("--num-draft-tokens", "-k", type=int, default=5)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="passes over the prompt set (medians over all)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--gsm8k", help="a GSM8K JSONL file: its first questions, asked as `distill accept` asks them, are the prompts")
    ap.add_argument("--skip-compiled", action="store_true", help="leave out the compiled-draft backend (its one-off compile)")
    ap.add_argument(
        "--output",
        default="docs/benchmarks.md",
        help="Markdown file whose bench_decode section is rewritten, its report kept in results/ beside it ('' to skip)",
    )
    ap.add_argument("--section", help="the section of --output to rewrite (default bench_decode, or bench_decode-custom for --target)")
    args = ap.parse_args(argv)
    if bool(args.target) != bool(args.draft):
        ap.error("give both --target and --draft, or neither for the built-in tiny pair")
    return args


def load_pair(args: argparse.Namespace):
    """Target, draft and tokenizer on the device: the given pair, or the built-in tiny one."""
    dtype = getattr(torch, args.dtype)
    if args.target:
        tok = load_tokenizer(args.target)
        return load_model(args.target, dtype=dtype, device=args.device), load_model(args.draft, dtype=dtype, device=args.device), tok
    target, draft, tok = default_pair()
    return target.to(args.device, dtype), draft.to(args.device, dtype), tok


def load_questions(args: argparse.Namespace) -> list[str]:
    """GSM8K questions as `distill accept` draws and asks them (the first of its seed-0 shuffle), or made-up prompts."""
    if args.gsm8k:
        from distill.eval.tasks import gsm8k

        return [ex.messages[0]["content"] for ex in gsm8k.load(args.gsm8k, num_samples=args.num_prompts)]
    return [ex["prompt"] for ex in make_examples(args.num_prompts, seed=1234)]


Method = Callable[[torch.Tensor], tuple[torch.Tensor, Any]]


def methods_for(target, draft, tok, timers: dict[str, ForwardTimer], args: argparse.Namespace) -> dict[str, Method]:
    """Each method compared: prompt ids -> (sequences, the decoder's stats or None)."""
    k, eos, pad = args.num_draft_tokens, tok.eos_token_id, tok.pad_token_id
    # transformers' assisted generation, made comparable: constant k, no confidence early exit.
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    decoder = SpeculativeDecoder(target, draft, num_draft_tokens=k, tokenizer=tok, draft_tokenizer=tok, backend="eager")
    compiled = SpeculativeDecoder(target, draft, num_draft_tokens=k, tokenizer=tok, draft_tokenizer=tok, backend="compiled")
    gen_kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=pad)

    def ours(ids: torch.Tensor):
        out = decoder.generate(ids, max_new_tokens=args.max_new_tokens, eos_token_id=eos, pad_token_id=pad)
        return out.sequences, out.stats

    def ours_compiled(ids: torch.Tensor):
        timers["draft"].detach()  # the draft runs inside a compiled graph: hooks would be traced into it
        try:
            out = compiled.generate(ids, max_new_tokens=args.max_new_tokens, eos_token_id=eos, pad_token_id=pad)
        finally:
            timers["draft"].attach()
        return out.sequences, out.stats

    methods = {
        "target-only generate": lambda ids: (target.generate(ids, **gen_kwargs), None),
        "transformers assistant_model": lambda ids: (target.generate(ids, assistant_model=draft, **gen_kwargs), None),
        "distill SpeculativeDecoder (eager)": ours,
        COMPILED: ours_compiled,
    }
    if args.skip_compiled:
        del methods[COMPILED]
    return methods


@dataclass
class Measured:
    """What the interleaved passes measured, per method."""

    names: list[str]
    warmup_s: dict[str, float]
    walls: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    tokens: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    overhead: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    forwards: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    accepted: int = 0
    proposed: int = 0
    identical: bool = True

    def total(self, name: str) -> float:
        return sum(self.walls[name])


def warm_up(methods: dict[str, Method], prompt: torch.Tensor) -> dict[str, float]:
    """Run each method once; for the compiled draft this is its one torch.compile for this k."""
    warmup_s = {}
    for name, method in methods.items():
        clock = Clock()
        method(prompt)
        warmup_s[name] = clock.elapsed()
    return warmup_s


def run_one(m: Measured, name: str, method: Method, ids: torch.Tensor, timers: dict[str, ForwardTimer], pad: int, eos: int, device: str) -> list[int]:
    """One method on one prompt, timed; its new tokens."""
    for t in timers.values():
        t.reset()
    clock = Clock(device)
    seqs, stats = method(ids)
    wall = clock.elapsed()
    new = seqs[0, ids.shape[1] :].tolist()
    m.walls[name].append(wall)
    m.tokens[name] += len([t for t in new if t != pad]) if pad != eos else len(new)
    m.forwards[name] += timers["target"].calls
    rounds = max(1, timers["target"].calls - 1)
    m.overhead[name].append((wall - timers["target"].seconds - timers["draft"].seconds) / rounds)
    if stats is not None and name == m.names[2]:
        m.accepted, m.proposed = m.accepted + stats.accepted, m.proposed + stats.proposed
    return new


def measure(
    methods: dict[str, Method], prompts: list[torch.Tensor], timers: dict[str, ForwardTimer], tok, args: argparse.Namespace, warmup_s: dict[str, float]
) -> Measured:
    """Every method on every prompt, `args.repeats` passes, who goes first rotating prompt by prompt."""
    names = list(methods)
    m = Measured(names, warmup_s)
    for rep in range(args.repeats):
        for i, ids in enumerate(prompts):
            first = (i + rep) % len(names)
            outputs = {n: run_one(m, n, methods[n], ids, timers, tok.pad_token_id, tok.eos_token_id, args.device) for n in names[first:] + names[:first]}
            m.identical &= len({tuple(v) for v in outputs.values()}) == 1
    return m


def render(m: Measured, args: argparse.Namespace, target, draft, n_prompts: int) -> tuple[str, list[Block]]:
    """The bench_decode section's title and blocks: the setting, the table, the ratios."""
    names, k, total = m.names, args.num_draft_tokens, {n: m.total(n) for n in m.names}
    rows = [
        [
            n,
            f"{total[n]:.2f}",
            f"{statistics.median(m.walls[n]) * 1e3:.1f}",
            f"{m.tokens[n] / total[n]:.1f}",
            f"{m.tokens[n] / m.forwards[n]:.2f}",
            f"{statistics.median(m.overhead[n]) * 1e3:.2f}" if n != names[0] else "-",
            f"{total[names[0]] / total[n]:.2f}",
        ]
        for n in names
    ]
    theirs = total[names[1]]
    n_params = lambda model: sum(p.numel() for p in model.parameters()) / 1e6  # noqa: E731
    env = environment(args.device)
    compiled = len(names) > 3
    compile_s = []
    if compiled:
        one_off = m.warmup_s[names[3]] - m.warmup_s[names[2]]
        compile_s.append(f"- the compiled draft's one-off torch.compile for k = {k} (in the warm-up, not in the table): {one_off:.0f} s")
    setting = (
        f"Target {args.target or 'tiny Qwen2 (random weights)'} ({n_params(target):.1f}M params), "
        f"draft {args.draft or 'tiny Qwen2 (random weights)'} ({n_params(draft):.2f}M), {args.device}, {args.dtype}, "
        f"{n_prompts} prompts ({f'the first {n_prompts} of a seed-0 shuffle of `{Path(args.gsm8k).name}`, as `distill accept` draws them' if args.gsm8k else 'made up, seed 1234'}) "
        f"× {args.repeats} passes, {args.max_new_tokens} new tokens, greedy, interleaved. "
        f"torch {env['torch']}, {env['torch_threads']} threads, {env['device_name']}."
    )
    ratios = "\n".join(
        [
            f"- distill wall time / transformers assisted wall time: eager loop **{total[names[2]] / theirs:.2f}×**"
            + (f", compiled draft **{total[names[3]] / theirs:.2f}×**" if compiled else "")
            + " (target ≤ 0.8×); median prompt "
            + " and ".join(f"{statistics.median(m.walls[n]) / statistics.median(m.walls[names[1]]):.2f}×" for n in names[2:]),
            *compile_s,
            f"- acceptance rate (distill stats): {m.accepted / max(1, m.proposed):.3f}; outputs identical across all methods: {'yes' if m.identical else 'NO'}",
            "- loop overhead = wall time minus time inside the two models' forward calls, per target forward after the prefill; "
            "the compiled draft's forwards run inside its graph, out of the hooks' sight, so its figure includes them.",
        ]
    )
    return f"Decoder: distill vs transformers assisted generation (k = {k})", [setting, table(HEADER, rows), ratios]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    target, draft, tok = load_pair(args)
    prompts = [p.to(args.device) for p in chat_prompts(tok, load_questions(args))]
    timers = {"target": ForwardTimer(target), "draft": ForwardTimer(draft)}
    methods = methods_for(target, draft, tok, timers, args)
    warmup_s = warm_up(methods, prompts[0])
    load = MachineLoad().start()
    m = measure(methods, prompts, timers, tok, args, warmup_s)
    load.stop()
    title, blocks = render(m, args, target, draft, len(prompts))
    report(
        args.section or ("bench_decode" + ("" if not args.target else "-custom")),
        title,
        command_line("bench_decode", argv),
        blocks,
        args.output,
        load,
        "bench_decode",
    )
    return 0 if m.identical or args.dtype != "float32" else 1  # identity is guaranteed in float32 only


if __name__ == "__main__":
    raise SystemExit(main())
