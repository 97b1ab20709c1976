"""`distill train | cache-teacher | accept | bench | publish | demo | rehearse`: each verb is a module's main()."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "demo": ("distill.demo", "the whole pipeline end to end on tiny models built here"),
    "train": ("distill.train", "train a draft from a recipe (run under `accelerate launch` for GPUs)"),
    "cache-teacher": ("distill.teacher", "run the target once and cache its top-k log-probs"),
    "accept": ("distill.eval.acceptance", "acceptance, speedup and task quality of drafts under a target"),
    "bench": ("distill.speedup", "measure c and v(k), predict speedup, pick the best k"),
    "publish": ("distill.publish", "write (and optionally upload) a ready draft checkpoint"),
    "rehearse": ("distill.rehearse", "run every real Qwen2.5 path on random-weight stand-ins with the real tokenizer"),
    "memory": ("distill.memory", "training memory per GPU of a recipe at the real shapes (1 GPU, ZeRO-2/3)"),
    "convert-gguf": ("distill.models", "dequantise a .gguf file once into a Hugging Face folder (safetensors, tokenizer)"),
    "prepare-tiny": ("distill.prepare_tiny", "build the tiny target and corpus that recipes/tiny-cpu.yaml trains on"),
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the verb's module; `distill` alone runs the demo, the embedded default."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print("usage: distill {" + ",".join(COMMANDS) + "} [options]\n")
        for name, (_, text) in COMMANDS.items():
            print(f"  {name:<14} {text}")
        return 0
    verb = argv.pop(0) if argv and not argv[0].startswith("-") else "demo"
    if verb not in COMMANDS:
        print(f"distill: unknown command {verb!r}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[verb][0])
    return int(module.main(argv) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
