"""Every command's arguments, declared without importing torch or transformers, so `distill VERB
--help` answers at once; each command's `main` parses with the same parser (`parser(verb)`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

DTYPES = ["float32", "bfloat16", "float16", "auto"]
TASK_NAMES = ["cnndm", "gsm8k", "mmlu"]


def add_set_argument(parser: argparse.ArgumentParser) -> None:
    """The `--set KEY=VALUE` option (repeatable) that `distill.training.recipe.load_recipe(..., overrides)` applies."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe key before validation, e.g. --set training.max_steps=10 (repeatable; the value is read as YAML)",
    )


def _device(p: argparse.ArgumentParser, what: str = "") -> None:
    p.add_argument("--device", default=None, help=f"cuda, cuda:1 or cpu{what} (default: cuda when available, else cpu)")


def _demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="a 1-2 minute version (fewer steps and prompts)")
    p.add_argument("--out", default="demo-output", help="where the report, plots and models go")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--docs", help="also write the demo's section of this Markdown file (docs/benchmarks.md), its report kept in results/ beside it")


def _train(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", nargs="?", help="recipe YAML (required unless --help-recipe)")
    p.add_argument("--help-recipe", action="store_true", help="list every recipe key with its type, default and help, and exit")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint-N in output_dir")
    add_set_argument(p)


def _cache_teacher(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe YAML (its target, data and teacher sections are used)")
    p.add_argument("--cache-dir", default=None, help="override teacher.cache_dir")
    p.add_argument("--dtype", default="float32", choices=["float16", "float32"], help="stored log-prob precision (float16 halves the disk)")
    p.add_argument("--shard-size", type=int, default=256, help="examples per shard (the unit of resumption)")
    add_set_argument(p)


def _accept(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="Hub id, folder or .gguf of the target (its tokenizer and chat template are used)")
    p.add_argument(
        "--draft",
        action="append",
        required=True,
        help="draft Hub id, folder or .gguf, NAME=PATH to name it; repeatable or comma-separated; a training output folder resolves to its draft/",
    )
    p.add_argument("--tasks", default="gsm8k,mmlu,cnndm", help=f"comma-separated, from {TASK_NAMES}")
    p.add_argument(
        "--data-file",
        action="append",
        default=[],
        metavar="TASK=PATH",
        help="read a task from a local JSONL/JSON/Parquet file with the Hub's columns (repeatable)",
    )
    p.add_argument(
        "--num-samples",
        metavar="N|TASK=N,...",
        help="prompts per task: one count for every task (30) or TASK=N,... (gsm8k=30,mmlu=200,cnndm=40; the rest keep their default, e.g. 300 for gsm8k)",
    )
    p.add_argument("--seed", type=int, default=0, help="sampling of task examples, and of tokens when --temperature > 0")
    p.add_argument("--max-new-tokens", type=int, help="generation length for every task (default: each task's own)")
    p.add_argument("--num-draft-tokens", "-k", type=int, default=5, help="draft tokens per round for the main figures")
    p.add_argument("--ks", default="", help="also measure speedup at these k (e.g. 1,2,4,6,8), next to the prediction")
    p.add_argument("--sweep-samples", type=int, help="prompts per task used for the --ks sweep (default: all)")
    p.add_argument("--sweep-drafts", metavar="NAME,...", help="the drafts the --ks sweep measures (default: every draft; the rest run at -k only)")
    p.add_argument(
        "--compare",
        metavar="DRAFT:REFERENCE,...",
        help="also report these paired differences (DRAFT − REFERENCE on the same prompts; each draft is compared with the first named in any case)",
    )
    p.add_argument("--schedule", default="constant", choices=["constant", "adaptive"], help="draft length schedule")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples (identity not expected)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling when --temperature > 0")
    p.add_argument("--batch-size", type=int, default=1, help="prompts per generate call (1 gives per-request latency)")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="greedy identity is guaranteed in float32 only")
    _device(p)
    p.add_argument("--num-fewshot", type=int, default=0, help="MMLU shots from the same subject (0: none, 5: the usual; from --fewshot-file when given)")
    p.add_argument(
        "--fewshot-file",
        action="append",
        default=[],
        metavar="mmlu=PATH",
        help="the file MMLU's shots come from: its dev split (e.g. ../shared/data/mmlu/dev.jsonl)",
    )
    p.add_argument(
        "--template",
        action="append",
        default=[],
        metavar="[TASK=]NAMES",
        help="ask a task under these templates, each reported as TASK@VARIANT: TASK=NAME,... with names of distill.common.prompts.TEMPLATES "
        "(gsm8k=default,boxed,plain) or files holding a template with a {question} field; the groups default, train, held-out "
        "name a task's own, training and held-out templates, and a bare value of groups (--template default,held-out) applies to every task",
    )
    p.add_argument("--max-article-words", type=int, help="cut CNN/DailyMail articles to this many words (task default 512)")
    p.add_argument("--cost-repeats", type=int, default=20, help="timed repeats per measurement of c, c₂ (the two-token first draft step) and v(k)")
    p.add_argument("--draft-alone", action="store_true", help="also decode with each draft alone and report its own task quality")
    p.add_argument("--output-dir", default="eval-output", help="report.json, report.md, PNG plots and the resume journal")


def _bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="target: Hub id, folder or .gguf (default: a tiny pair built on the spot)")
    p.add_argument("--draft", help="draft: Hub id, folder or .gguf")
    p.add_argument("--model-config-target", help="a Qwen2Config JSON: random-weight target of that shape (no download)")
    p.add_argument("--model-config-draft", help="a Qwen2Config JSON: random-weight draft of that shape")
    p.add_argument("--ks", default="1..8", help="draft lengths, e.g. 1..8 or 1,2,4 (default 1..8)")
    p.add_argument("--alpha", help="acceptance rate(s) to predict at (default: the synthetic ones, else α measured with the real draft)")
    p.add_argument(
        "--synthetic-acceptance",
        help="run the verification loop at these controlled acceptance rates, e.g. 0.5,0.7,0.9, and report measured vs predicted speedup",
    )
    p.add_argument("--num-draft-tokens", type=int, default=5, help="k at which α of the real draft is measured (default 5)")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt length for costs and synthetic runs (default 128)")
    p.add_argument("--num-prompts", type=int, default=4, help="prompts per decoding run (default 4)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per prompt (default 64)")
    p.add_argument("--repeats", type=int, default=20, help="timed repeats per cost measurement (median; default 20)")
    p.add_argument(
        "--backend",
        default="auto",
        choices=["eager", "static", "auto"],
        help="the decoding loop timed: eager, static (static caches + CUDA graphs), or auto: static on CUDA, eager elsewhere (default)",
    )
    _device(p)
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="auto: bfloat16 on CUDA, float32 elsewhere")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write every figure, the settings and the environment to this JSON file")
    p.add_argument("--markdown", help="also write the tables into a named section of this Markdown file (e.g. docs/benchmarks.md)")
    p.add_argument("--section", default="distill-bench", help="section name in --markdown (default distill-bench)")
    p.add_argument(
        "--vocab-sizes",
        help="also cut the draft's LM head to each K (e.g. 8192,16384,32768,65536) and report coverage, c and predicted speedup per K "
        "(needs --vocab-from and --coverage-from)",
    )
    p.add_argument(
        "--vocab-from", nargs="+", action="extend", metavar="FILE", help="text whose most frequent tokens each K keeps (as distill trim-vocab --from)"
    )
    p.add_argument(
        "--coverage-from", metavar="FILE", help="held-out text (e.g. the target's answers to held-out prompts): coverage = its tokens' share in the set"
    )


def _publish(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="?", help="a training output folder (holding draft/, recipe.yaml, run_info.json)")
    p.add_argument("--out", required=True, help="the folder to write (must be empty or absent, unless --force)")
    p.add_argument("--draft", help="a draft folder (full model or peft adapter) instead of RUN")
    p.add_argument("--target", help="the target's folder, .gguf or Hub id (default: the recipe's target)")
    p.add_argument("--target-revision", help="the target's Hub revision (default: the recipe's)")
    p.add_argument("--eval-report", help="the `distill accept` JSON, or a folder whose newest report is used")
    p.add_argument("--keep-adapter", action="store_true", help="keep a LoRA adapter as an adapter instead of merging it")
    p.add_argument("--pad-vocab-to-target", action="store_true", help="pad embedding and LM head to the target's vocab_size (vLLM draft_model)")
    p.add_argument("--license", default="apache-2.0", help="the licence in the model card metadata (default: apache-2.0)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.add_argument("--push-to-hub", metavar="REPO", help="upload the folder to this Hub repo (token from HF_TOKEN)")
    p.add_argument("--public", action="store_true", help="create the Hub repo public (default: private)")
    p.add_argument("--gguf", action="store_true", help="also write the draft as OUT/draft-<outtype>.gguf for llama.cpp (distill export-gguf)")
    p.add_argument("--gguf-outtype", help="f16 (default), bf16 or q8_0; implies --gguf")


def _rehearse(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="rehearsal-output", help="working folder (replaced): stand-ins, runs, reports, logs")
    p.add_argument("--quick", action="store_true", help="the fast subset the test suite runs: LoRA, accept, decoder, publish, refusals")
    p.add_argument("--markdown", help="write the results as the `rehearsal` section of this file (e.g. docs/benchmarks.md)")


def _memory(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", nargs="?", help="recipe YAML")
    p.add_argument("--gpus", type=int, default=1, help="processes (GPUs) the run is launched on")
    p.add_argument("--zero", type=int, default=0, choices=(0, 2, 3), help="DeepSpeed ZeRO stage (0: none)")
    p.add_argument("--tokens", type=int, help="tokens per micro-batch (default: batch x data.max_length)")
    p.add_argument("--target-config", help="config.json of the target, instead of reading it from the Hub")
    p.add_argument("--draft-config", help="config.json of the draft, instead of reading it from the Hub")
    p.add_argument("--check", nargs="*", metavar="CONFIG", help="measure the per-token terms on this CPU for these config.json files")
    p.add_argument("--markdown", help="with --check: write the measurement as the memory_check section of this file, its report in results/ beside it")
    add_set_argument(p)


def _prepare_tiny(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/tiny", help="output directory (tiny-cpu.yaml reads runs/tiny)")
    p.add_argument("--steps", type=int, help="target training steps (default: distill.commands.prepare_tiny.DEFAULTS, 300)")
    p.add_argument("--seed", type=int, help="default: distill.commands.prepare_tiny.DEFAULTS, 0")
    p.add_argument("--force", action="store_true", help="rebuild even when the output is already there")


def _convert_gguf(p: argparse.ArgumentParser) -> None:
    p.add_argument("gguf", help="the .gguf file (e.g. ~/.cache/distill-real/qwen2.5-coder-0.5b-instruct.gguf)")
    p.add_argument("out", help="the folder to write; must not exist")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="weights on disk: float32 keeps the dequantised values exactly, bfloat16 halves the size",
    )


def _export_gguf(p: argparse.ArgumentParser) -> None:
    p.add_argument("draft", help="the draft: a folder (full model or LoRA adapter, merged first), a training output folder, or a Hub id")
    p.add_argument("out", help="the .gguf file to write (refused when it exists, unless --force)")
    p.add_argument("--outtype", default="f16", help="f16 (default), bf16 or q8_0: the 2-D tensors' type; norms and biases stay F32")
    p.add_argument("--tokenizer", help="take the tokenizer from here (the target's folder or Hub id) when the draft holds none")
    p.add_argument("--force", action="store_true", help="replace an existing OUT")


def _trim_vocab(p: argparse.ArgumentParser) -> None:
    p.add_argument("draft", help="the draft: a folder (with its tokenizer), a training output folder, a Hub id or a .gguf file")
    p.add_argument("out", help="the folder to write (must be empty or absent, unless --force)")
    p.add_argument("--size", type=int, required=True, metavar="K", help="rows the LM head keeps: the K target ids most frequent in --from")
    p.add_argument(
        "--from",
        dest="sources",
        nargs="+",
        action="extend",
        required=True,
        metavar="FILE",
        help="JSONL files (response-like fields, a generation cache's response_ids, chat messages) or plain-text files whose tokens are counted",
    )
    p.add_argument("--fields", help="JSONL fields to count, comma-separated (default: response,answer,completion,output,text,content)")
    p.add_argument("--force", action="store_true", help="replace a non-empty OUT")


def _pad_vocab(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="the model: a folder, a training output, a Hub id or a .gguf file")
    p.add_argument("out", help="the folder to write; must not exist")
    p.add_argument("--vocab-size", type=int, required=True, help="rows of the copy's embedding and LM head, e.g. 152064 (Qwen2.5-7B's)")


def _vllm_env(p: argparse.ArgumentParser) -> None:
    p.add_argument("--venv", help="where the environment goes (default $DISTILL_VLLM_VENV, else ~/.cache/distill/vllm-venv)")
    p.add_argument("--python", default=sys.executable, help="the Python the venv is made from (default: the one running distill)")


def _docs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check", action="store_true", help="exit 1 naming each section that differs from its report's rendering (nothing written)")
    p.add_argument("--root", default=".", help="the repository root (default: the current folder)")


# verb -> (module whose main() runs it, one line of help, its arguments)
COMMANDS: dict[str, tuple[str, str, Callable[[argparse.ArgumentParser], None]]] = {
    "demo": ("distill.commands.demo", "the whole pipeline end to end on tiny models built here", _demo),
    "train": ("distill.training.train", "train a draft from a recipe (run under `accelerate launch` for GPUs)", _train),
    "cache-teacher": ("distill.training.teacher", "run the target once and cache its top-k log-probs", _cache_teacher),
    "accept": ("distill.eval.acceptance", "acceptance, speedup and task quality of drafts under a target", _accept),
    "bench": ("distill.commands.bench", "measure c and v(k), predict speedup, pick the best k", _bench),
    "publish": ("distill.commands.publish", "write (and optionally upload) a ready draft checkpoint", _publish),
    "rehearse": ("distill.commands.rehearse", "run every real Qwen2.5 path on random-weight stand-ins with the real tokenizer", _rehearse),
    "memory": ("distill.commands.memory", "training memory per GPU of a recipe at the real shapes (1 GPU, ZeRO-2/3)", _memory),
    "convert-gguf": ("distill.commands.convert_gguf", "dequantise a .gguf file once into a Hugging Face folder (safetensors, tokenizer)", _convert_gguf),
    "export-gguf": ("distill.commands.export_gguf", "write a draft as a GGUF file llama.cpp loads (-md), f16, bf16 or q8_0", _export_gguf),
    "trim-vocab": ("distill.commands.trim_vocab", "cut a draft's LM head to the K target tokens most frequent in some text (lossless)", _trim_vocab),
    "pad-vocab": (
        "distill.commands.pad_vocab",
        "copy a model with its embedding and LM head grown to N rows that never win (as Qwen2.5-7B's 152,064)",
        _pad_vocab,
    ),
    "vllm-env": ("distill.engines.vllm_env", "make vLLM's CPU build a virtual environment of its own (pinned; what scripts/bench_vllm.py runs in)", _vllm_env),
    "docs": ("distill.commands.render_docs", "render the docs' measured tables from the reports committed under docs/results/", _docs),
    "prepare-tiny": ("distill.commands.prepare_tiny", "build the tiny target and corpus that recipes/tiny-cpu.yaml trains on", _prepare_tiny),
}


def parser(verb: str) -> argparse.ArgumentParser:
    """The argument parser of `distill VERB`."""
    _, text, add = COMMANDS[verb]
    p = argparse.ArgumentParser(prog=f"distill {verb}", description=text[0].upper() + text[1:] + ".")
    add(p)
    return p


def quiet_cpu_deepspeed() -> None:
    """On a machine without CUDA, tell DeepSpeed it runs on the CPU (what it would guess), so that its
    import (accelerate and transformers import it to save any model) prints no "Setting accelerator
    to CPU ... we were unable to detect it" warning into commands that do not use DeepSpeed."""
    import os

    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def default_device(device: str | None) -> str:
    """`--device` as given, else cuda when torch sees one, else cpu (torch imported only here, at run time)."""
    if device:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
