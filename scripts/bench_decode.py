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
import sys
import time
from collections import defaultdict

import torch

from distill.common.docs import markdown_table, write_section
from distill.common.models import load_model, load_tokenizer
from distill.common.provenance import MachineLoad, describe, warn
from distill.common.tiny import make_examples, random_pair
from distill.speculative import SpeculativeDecoder


def default_pair(seed: int = 0):
    """A ~40M-parameter target and a ~1M draft (random weights, untied heads) and their tokenizer."""
    return random_pair(
        {"hidden_size": 640, "num_layers": 8, "num_heads": 8, "num_kv_heads": 2, "intermediate_size": 2048},
        {"hidden_size": 160, "num_layers": 3, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 480},
        seed,
    )


class ForwardTimer:
    """Counts and times a model's forward calls, to split wall time into model time and loop overhead."""

    def __init__(self, model: torch.nn.Module):
        self.model, self.calls, self.seconds, self._t = model, 0, 0.0, 0.0
        self.attach()

    def attach(self) -> None:
        self._handles = [
            self.model.register_forward_pre_hook(lambda *_: setattr(self, "_t", time.perf_counter())),
            self.model.register_forward_hook(lambda *_: self._done()),
        ]

    def detach(self) -> None:
        """No hooks while a compiled graph runs the model (dynamo would trace the clock into it)."""
        for h in self._handles:
            h.remove()

    def _done(self) -> None:
        self.calls += 1
        self.seconds += time.perf_counter() - self._t

    def reset(self) -> None:
        self.calls, self.seconds = 0, 0.0


def main(argv: list[str] | None = None) -> int:
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
    ap.add_argument("--output", default="docs/benchmarks.md", help="Markdown file whose bench_decode section is rewritten ('' to skip)")
    ap.add_argument("--section", help="the section of --output to rewrite (default bench_decode, or bench_decode-custom for --target)")
    args = ap.parse_args(argv)
    if bool(args.target) != bool(args.draft):
        ap.error("give both --target and --draft, or neither for the built-in tiny pair")

    dtype = getattr(torch, args.dtype)
    if args.target:
        tok = load_tokenizer(args.target)
        target = load_model(args.target, dtype=dtype, device=args.device)
        draft = load_model(args.draft, dtype=dtype, device=args.device)
    else:
        target, draft, tok = default_pair()
        target, draft = target.to(args.device, dtype), draft.to(args.device, dtype)
    k = args.num_draft_tokens
    # transformers' assisted generation, made comparable: constant k, no confidence early exit.
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    decoder = SpeculativeDecoder(target, draft, num_draft_tokens=k, tokenizer=tok, draft_tokenizer=tok, backend="eager")
    compiled = SpeculativeDecoder(target, draft, num_draft_tokens=k, tokenizer=tok, draft_tokenizer=tok, backend="compiled")

    if args.gsm8k:
        from distill.eval.tasks import gsm8k

        questions = [ex.messages[0]["content"] for ex in gsm8k.load(args.gsm8k, num_samples=args.num_prompts)]
    else:
        questions = [ex["prompt"] for ex in make_examples(args.num_prompts, seed=1234)]
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"].to(
            args.device
        )
        for q in questions
    ]
    timers = {"target": ForwardTimer(target), "draft": ForwardTimer(draft)}
    eos, pad = tok.eos_token_id, tok.pad_token_id
    gen_kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=pad)

    def run_compiled(ids: torch.Tensor):
        timers["draft"].detach()  # the draft runs inside a compiled graph: hooks would be traced into it
        try:
            return compiled.generate(ids, max_new_tokens=args.max_new_tokens, eos_token_id=eos, pad_token_id=pad)
        finally:
            timers["draft"].attach()

    methods = {
        "target-only generate": lambda ids: (target.generate(ids, **gen_kwargs), None),
        "transformers assistant_model": lambda ids: (target.generate(ids, assistant_model=draft, **gen_kwargs), None),
        "distill SpeculativeDecoder (eager)": lambda ids: (lambda o: (o.sequences, o.stats))(
            decoder.generate(ids, max_new_tokens=args.max_new_tokens, eos_token_id=eos, pad_token_id=pad)
        ),
        "distill SpeculativeDecoder (compiled draft)": lambda ids: (lambda o: (o.sequences, o.stats))(run_compiled(ids)),
    }
    if args.skip_compiled:
        del methods["distill SpeculativeDecoder (compiled draft)"]
    names = list(methods)
    warmup_s = {}
    for name in names:  # warm-up; for the compiled draft this is its one torch.compile for this k
        t0 = time.perf_counter()
        methods[name](prompts[0])
        warmup_s[name] = time.perf_counter() - t0

    load = MachineLoad().start()
    walls, tokens, overhead, forwards = defaultdict(list), defaultdict(int), defaultdict(list), defaultdict(int)
    accepted = proposed = 0
    identical = True
    for rep in range(args.repeats):
        for i, ids in enumerate(prompts):
            outputs = {}
            first = (i + rep) % len(names)
            order = names[first:] + names[:first]  # rotate who goes first
            for name in order:
                for t in timers.values():
                    t.reset()
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                start = time.perf_counter()
                seqs, stats = methods[name](ids)
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize()
                wall = time.perf_counter() - start
                outputs[name] = seqs[0, ids.shape[1] :].tolist()
                walls[name].append(wall)
                tokens[name] += len([t for t in outputs[name] if t != pad]) if pad != eos else len(outputs[name])
                forwards[name] += timers["target"].calls
                rounds = max(1, timers["target"].calls - 1)
                overhead[name].append((wall - timers["target"].seconds - timers["draft"].seconds) / rounds)
                if stats is not None and name == names[2]:
                    accepted, proposed = accepted + stats.accepted, proposed + stats.proposed
            identical &= len({tuple(v) for v in outputs.values()}) == 1

    load.stop()
    total = {n: sum(walls[n]) for n in names}
    rows = [
        [
            n,
            f"{total[n]:.2f}",
            f"{statistics.median(walls[n]) * 1e3:.1f}",
            f"{tokens[n] / total[n]:.1f}",
            f"{tokens[n] / forwards[n]:.2f}",
            f"{statistics.median(overhead[n]) * 1e3:.2f}" if n != names[0] else "-",
            f"{total[names[0]] / total[n]:.2f}",
        ]
        for n in names
    ]
    theirs = total[names[1]]
    n_params = lambda m: sum(p.numel() for p in m.parameters()) / 1e6  # noqa: E731
    command = "python scripts/bench_decode.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = "\n".join(
        [
            f"## Decoder: distill vs transformers assisted generation (k = {k})",
            "",
            f"`{command.strip()}` — target {args.target or 'tiny Qwen2 (random weights)'} ({n_params(target):.1f}M params), "
            f"draft {args.draft or 'tiny Qwen2 (random weights)'} ({n_params(draft):.2f}M), {args.device}, {args.dtype}, "
            f"{len(prompts)} prompts × {args.repeats} passes, {args.max_new_tokens} new tokens, greedy, interleaved. "
            f"torch {torch.__version__}, {torch.get_num_threads()} threads.",
            "",
            markdown_table(
                ["method", "total s", "median ms / prompt", "tokens/s", "tokens / target forward", "loop overhead ms / round", "speedup vs target-only"], rows
            ),
            "",
            f"- distill wall time / transformers assisted wall time: eager loop **{total[names[2]] / theirs:.2f}×**"
            + (f", compiled draft **{total[names[3]] / theirs:.2f}×**" if len(names) > 3 else "")
            + " (target ≤ 0.8×); median prompt "
            + " and ".join(f"{statistics.median(walls[n]) / statistics.median(walls[names[1]]):.2f}×" for n in names[2:]),
            *(
                [
                    f"- the compiled draft's one-off torch.compile for k = {k} (in the warm-up, not in the table): "
                    f"{warmup_s[names[3]] - warmup_s[names[2]]:.0f} s"
                ]
                if len(names) > 3
                else []
            ),
            f"- acceptance rate (distill stats): {accepted / max(1, proposed):.3f}; outputs identical across all methods: {'yes' if identical else 'NO'}",
            "- loop overhead = wall time minus time inside the two models' forward calls, per target forward after the prefill; "
            "the compiled draft's forwards run inside its graph, out of the hooks' sight, so its figure includes them.",
            f"- {describe(load.report())}",
        ]
    )
    print(md)
    warn(load.report(), "bench_decode")
    if args.output:
        write_section(args.output, args.section or ("bench_decode" + ("" if not args.target else "-custom")), md)
    return 0 if identical or args.dtype != "float32" else 1  # identity is guaranteed in float32 only


if __name__ == "__main__":
    raise SystemExit(main())
