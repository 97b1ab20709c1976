"""`distill rehearse`: every real Qwen2.5 path, end to end, on random-weight stand-ins.

The stand-ins are built from recipes/model_configs/*.json, shrunk in depth and width but with the
real `vocab_size` (152,064 / 151,936 rows), `tie_word_embeddings`, head ratio and the real
Qwen2.5-Instruct tokenizer (151,665 tokens). The shipped recipes then run unchanged except for
`--set` overrides of model paths, data paths, step counts and batch size: LoRA and full, plain
and under `accelerate launch` with the ZeRO-2 config, `cache-teacher` then training from the
cache, `eval/acceptance.py --tasks gsm8k` on the real GSM8K test questions, `distill bench`, and
`scripts/publish.py` with and without `--pad-vocab-to-target`. Each step checks what a user relies
on (the checks are distill.commands.rehearse_checks) and stops the rehearsal with a RehearsalError
naming what broke. This module builds the stand-ins, runs the steps and writes the report.

Stand-in weights are random, so two things are set by hand to behave like a trained checkpoint:
the target's padding rows (ids >= 151,665) are the mean of its real rows (never the greedy choice)
and its `<|im_end|>` row is scaled x3, so replies end within a few dozen tokens. The drafts' padding
rows are made adversarial instead (large enough to win nearly every argmax), so any path that lets
a draft propose a padding id is caught.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from distill.commands.rehearse_checks import (
    ENDOFTEXT,
    IM_END,
    REAL_VOCAB,
    RehearsalError,
    check_acceptance,
    check_bench,
    check_cache,
    check_decoder,
    check_published,
    check_refused,
    check_run,
    check_standin,
    check_tokenizer,
    check_training_data,
)
from distill.common.benchmarks import report as write_benchmark
from distill.common.docs import Block, table
from distill.common.io import atomic_write, write_json
from distill.common.models import load_tokenizer
from distill.common.provenance import MachineLoad, environment

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data"
TOKENIZER_DIR = SHARED / "qwen2.5-tokenizer"
GSM8K_DIR = SHARED / "gsm8k"
MODEL_CONFIGS = REPO / "recipes" / "model_configs"
# generation_config.json as the Qwen2.5-7B-Instruct checkpoint ships it (0.5B/1.5B: repetition_penalty 1.1):
# sampling extras that distill's greedy paths must ignore, and both stop ids.
GENERATION_CONFIG = {
    "bos_token_id": ENDOFTEXT,
    "pad_token_id": ENDOFTEXT,
    "do_sample": True,
    "eos_token_id": [IM_END, ENDOFTEXT],
    "repetition_penalty": 1.05,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
}
STANDINS = {  # stand-in name -> (real config, layers); width: head_dim 8 x (heads / kv heads) heads, one KV head
    "qwen2.5-7b-instruct": ("qwen2.5-7b-instruct.json", 2),
    "qwen2.5-0.5b-instruct": ("qwen2.5-0.5b-instruct.json", 1),
    "qwen2.5-1.5b-instruct": ("qwen2.5-1.5b-instruct.json", 1),
}
HEAD_DIM = 8
GENERATION_TOKENS = 32
EOS_ROW_SCALE = 3.0
COMMAND_THREADS = "1"  # OMP_NUM_THREADS of the rehearsed commands when the caller set none


# --------------------------------------------------------------------------------------------- stand-ins


def standin_config(real: dict[str, Any], num_layers: int, head_dim: int = HEAD_DIM) -> dict[str, Any]:
    """The real config shrunk: `num_layers` layers, one KV head and heads/kv_heads query heads of
    `head_dim`, the intermediate size in the real ratio; vocab_size, tying and the rest kept."""
    heads, kv = real["num_attention_heads"], real["num_key_value_heads"]
    if heads % kv:
        raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    hidden = head_dim * (heads // kv)
    intermediate = 8 * round(hidden * real["intermediate_size"] / real["hidden_size"] / 8)
    return {
        **real,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads // kv,
        "num_key_value_heads": 1,
        "hidden_size": hidden,
        "head_dim": head_dim,
        "intermediate_size": intermediate,
        "max_window_layers": num_layers,
        "torch_dtype": "float32",
    }


def build_standin(name: str, out_dir: Path, tokenizer_dir: Path = TOKENIZER_DIR, seed: int = 0) -> Path:
    """Write a random-weight stand-in of recipes/model_configs/<name>'s config with the real tokenizer to `out_dir`."""
    config_file, layers = STANDINS[name]
    real = json.loads((MODEL_CONFIGS / config_file).read_text())
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**standin_config(real, layers))).eval()
    is_target = not real["tie_word_embeddings"]  # the 7B: untied, 152,064 rows
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        norm = head[:REAL_VOCAB].norm(dim=1).mean()
        if is_target:
            head[REAL_VOCAB:] = head[:REAL_VOCAB].mean(0)
        else:
            gen = torch.Generator().manual_seed(seed + 1)
            pad = torch.randn(head.shape[0] - REAL_VOCAB, head.shape[1], generator=gen)
            head[REAL_VOCAB:] = pad / pad.norm(dim=1, keepdim=True) * norm * 6
        head[IM_END] = head[IM_END] / head[IM_END].norm() * norm * EOS_ROW_SCALE
    model.generation_config.update(**GENERATION_CONFIG)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(tokenizer_dir / f, out_dir / f)
    return out_dir


def other_tokenizer_draft(out_dir: Path) -> Path:
    """A small draft with a tokenizer trained on the spot (not Qwen2.5's): every path must refuse it."""
    from distill.common.tiny import build_tokenizer, corpus_texts, make_examples, tiny_qwen2

    tok = build_tokenizer(corpus_texts(make_examples(200)), vocab_size=384)
    model = tiny_qwen2(len(tok) + 8, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, tokenizer=tok)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def write_chat_data(gsm8k_file: Path, out: Path, n: int, offset: int = 0) -> Path:
    """GSM8K questions as chat `messages` rows with no answer: data for the seq-KD (full) recipe,
    whose target writes the responses, as ultrachat's prompts would be."""
    rows = [json.loads(line) for line in gsm8k_file.read_text().splitlines()[offset : offset + n]]
    return atomic_write(out, "".join(json.dumps({"messages": [{"role": "user", "content": r["question"]}]}) + "\n" for r in rows))


# --------------------------------------------------------------------------------------------- running steps


@dataclass
class Step:
    """One rehearsed command: what ran, how long, its peak memory and what was checked."""

    name: str
    command: str
    wall_s: float = 0.0
    peak_rss_mb: float | None = None
    checks: list[str] = field(default_factory=list)


def _peak_rss_mb(usage: resource.struct_rusage) -> float:
    """Peak resident memory in MB from `wait4`'s usage (Linux reports KiB)."""
    return usage.ru_maxrss / 1024


def run_command(argv: list[str], log: Path, env: dict[str, str]) -> tuple[float, float]:
    """Run `argv` to completion (output to `log`); (wall seconds, peak RSS in MB of it and its children).
    A non-zero exit is a RehearsalError carrying the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RehearsalError(f"`{shlex.join(argv)}` exited with {proc.returncode}; last output:\n{log.read_text()[-4000:]}")
    return wall, _peak_rss_mb(usage)


def distill_argv(verb: str, *args: str) -> tuple[list[str], str]:
    """`distill VERB ARGS` run with this Python, and as the report shows it."""
    return [sys.executable, "-m", "distill.cli", verb, *args], shlex.join(["distill", verb, *args])


def script_argv(script: str, *args: str) -> tuple[list[str], str]:
    """`python SCRIPT ARGS` for a script of the repository, and as the report shows it."""
    return [sys.executable, str(REPO / script), *args], shlex.join(["python", script, *args])


def accelerate_argv(config: str, recipe: str, *args: str) -> tuple[list[str], str]:
    """scripts/train.py under `accelerate launch` with `config` on one process, and as the report shows it."""
    launcher = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or "accelerate"
    flags = ["--config_file", config, "--num_processes", "1", "--mixed_precision", "no", "--main_process_port", str(29500 + os.getpid() % 1000)]
    argv = [launcher, "launch", *flags, str(REPO / "scripts/train.py"), recipe, *args]
    return argv, shlex.join(["accelerate", "launch", *flags[:6], "scripts/train.py", recipe, *args])


def recipe_path(name: str) -> str:
    """The shipped recipe recipes/NAME.yaml."""
    return str(REPO / f"recipes/{name}.yaml")


# --------------------------------------------------------------------------------------------- the rehearsal

TARGET, DRAFT, DRAFT_15 = "qwen2.5-7b-instruct", "qwen2.5-0.5b-instruct", "qwen2.5-1.5b-instruct"
LORA, FULL, FULL_15 = (recipe_path(r) for r in ("qwen2.5-0.5b-from-7b-lora", "qwen2.5-0.5b-from-7b-full", "qwen2.5-1.5b-from-7b-full"))


class Rehearsal:
    """The rehearsal's state: output folder, stand-in paths, the overrides every recipe gets, the steps done.
    Each step runs a shipped command (or code in process) and hands what it wrote to rehearse_checks."""

    def __init__(self, out: Path, quick: bool, tokenizer_dir: Path = TOKENIZER_DIR, gsm8k_dir: Path = GSM8K_DIR):
        """Set up the rehearsal into `out`: the commands' environment and the sample, step and batch counts."""
        self.out, self.quick = out.absolute(), quick
        self.tokenizer_dir, self.gsm8k_dir = tokenizer_dir, gsm8k_dir
        self.models = self.out / "models"
        self.steps: list[Step] = []
        self.env = {
            **os.environ,
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", COMMAND_THREADS),
            "PYTHONPATH": str(REPO),
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
        }
        self.samples = {"train": 8 if quick else 16, "eval": 2 if quick else 8, "steps": 1 if quick else 2, "batch": 2}
        self.max_new = 48  # the stand-in target ends most replies within this (see EOS_ROW_SCALE)

    # ------------------------------------------------------------------ helpers

    def path(self, name: str) -> str:
        """The stand-in `name`'s folder."""
        return str(self.models / name)

    def overrides(self, run: str, *, draft: str | None = None, gsm8k: bool = True) -> list[str]:
        """The `--set` list that points a shipped recipe at the stand-ins and local data, shortened."""
        s = self.samples
        sets = [
            f"output_dir={self.out / 'runs' / run}",
            f"target.name_or_path={self.path(TARGET)}",
            f"training.max_steps={s['steps']}",
            f"training.save_steps={s['steps']}",
            f"training.eval_steps={s['steps']}",
            f"training.per_device_train_batch_size={s['batch']}",
            f"data.num_samples={s['train']}",
            f"data.eval_samples={s['eval']}",
        ]
        if draft is not None:
            sets.append(f"draft.name_or_path={draft}")
        if self.quick:  # bf16 matmuls over 152k rows are ~10x slower than float32 on a CPU
            sets += ["target.dtype=float32", "draft.dtype=float32"]
        if gsm8k:
            sets += [
                f"data.dataset={self.gsm8k_dir / 'train.jsonl'}",
                "data.subset=null",
                f"data.eval_split={self.gsm8k_dir / 'test.jsonl'}",
                f"data.generation_cache={self.out / 'cache/gsm8k-generations.jsonl'}",
            ]
        else:
            sets += [
                f"data.dataset={self.out / 'data/chat-train.jsonl'}",
                "data.split=train",
                f"data.eval_split={self.out / 'data/chat-eval.jsonl'}",
                f"data.generation_cache={self.out / 'cache/chat-generations.jsonl'}",
                f"teacher.cache_dir={self.out / 'cache/teacher-top32'}",
            ]
        sets.append(f"data.generation_max_new_tokens={GENERATION_TOKENS}")  # seq-KD replies: the recipes' 256 cut short
        return [a for item in sets for a in ("--set", item)]

    def step(self, name: str, argv: list[str], shown: str, checks: Callable[[list[str]], None] | None = None) -> Step:
        """Run one command, then its checks; record the step."""
        print(f"[rehearse] {name}: {shown}", flush=True)
        step = Step(name, shown)
        step.wall_s, step.peak_rss_mb = run_command(argv, self.out / "logs" / f"{name}.log", self.env)
        if checks is not None:
            checks(step.checks)
        self.steps.append(step)
        print(f"[rehearse] {name}: ok in {step.wall_s:.1f} s, peak RSS {step.peak_rss_mb:.0f} MB; " + "; ".join(step.checks), flush=True)
        return step

    def in_process(self, name: str, shown: str, work: Callable[[list[str]], None]) -> Step:
        """Run `work` (which checks as it goes) in this process, timed; record the step (no peak RSS of its own)."""
        start, checks = time.perf_counter(), []
        work(checks)
        step = Step(name, shown, time.perf_counter() - start, None, checks)
        self.steps.append(step)
        return step

    # ------------------------------------------------------------------ steps

    def build(self) -> None:
        """The stand-ins, the other-tokenizer draft and the chat data every later step uses."""
        names = [TARGET, DRAFT] + ([] if self.quick else [DRAFT_15])
        self.in_process("stand-ins", "distill.commands.rehearse.build_standin for " + ", ".join(names), lambda checks: self._build(names, checks))

    def _build(self, names: list[str], checks: list[str]) -> None:
        """Check the real tokenizer, build and check each stand-in, then write the other draft and the chat data."""
        check_tokenizer(load_tokenizer(self.tokenizer_dir), checks)
        for i, name in enumerate(names):
            build_standin(name, self.models / name, self.tokenizer_dir, seed=i)
            check_standin(name, self.models / name, json.loads((MODEL_CONFIGS / STANDINS[name][0]).read_text()), checks)
        other_tokenizer_draft(self.models / "other-tokenizer")
        write_chat_data(self.gsm8k_dir / "train.jsonl", self.out / "data" / "chat-train.jsonl", self.samples["train"])
        write_chat_data(self.gsm8k_dir / "test.jsonl", self.out / "data" / "chat-eval.jsonl", self.samples["eval"])

    def check_data(self) -> None:
        """The training examples of the LoRA recipe carry the Instruct template and end at <|im_end|>."""
        self.in_process("training data", "distill.training.data.build_train_dataset on the LoRA recipe's data", self._training_data)

    def _training_data(self, checks: list[str]) -> None:
        """Build the LoRA recipe's training examples (from the LoRA run's cached generations) and check them."""
        from distill.common.models import load_target
        from distill.training.data import build_train_dataset
        from distill.training.recipe import load_recipe

        recipe = load_recipe(LORA, self.overrides("data-check")[1::2])
        tok = load_tokenizer(recipe.target.name_or_path)
        target = load_target(recipe.target.name_or_path, dtype=recipe.target.dtype)
        rows = build_train_dataset(recipe.data, tok, target=target, seed=recipe.seed)
        check_training_data(rows, tok, recipe.data.generation_max_new_tokens, recipe.data.max_length, checks)

    def train_steps(self) -> None:
        """Train with the shipped recipes: LoRA; in full, also under ZeRO-2, seq-KD from a teacher cache, and the 1.5B draft."""
        runs, small = self.out / "runs", self.path(DRAFT)
        self.step("train LoRA", *distill_argv("train", LORA, *self.overrides("lora", draft=small)), lambda c: check_run(runs, "lora", c, lora=True))
        if self.quick:
            return
        zero2 = str(REPO / "recipes/accelerate/zero2.yaml")
        argv, shown = accelerate_argv(zero2, LORA, *self.overrides("lora-zero2", draft=small))
        self.step("train LoRA, ZeRO-2", argv, shown, lambda c: check_run(runs, "lora-zero2", c, lora=True, same_as="lora"))
        full = self.overrides("full", draft=small, gsm8k=False)
        expected = self.samples["train"] + self.samples["eval"]
        self.step("cache-teacher", *distill_argv("cache-teacher", FULL, *full), lambda c: check_cache(self.out / "cache", expected, c))
        self.step("train full from the cache", *distill_argv("train", FULL, *full), lambda c: check_run(runs, "full", c))
        argv, shown = accelerate_argv(zero2, FULL, *self.overrides("full-zero2", draft=small, gsm8k=False))
        self.step("train full from the cache, ZeRO-2", argv, shown, lambda c: check_run(runs, "full-zero2", c, same_as="full"))
        argv, shown = distill_argv("train", FULL_15, *self.overrides("full-1.5b", draft=self.path(DRAFT_15)))
        self.step("train 1.5B full, online teacher", argv, shown, lambda c: check_run(runs, "full-1.5b", c))

    def accept(self) -> None:
        """eval/acceptance.py on the real GSM8K test questions with the trained drafts (and, in full, the target as its own draft)."""
        target, drafts = self.path(TARGET), ["lora=" + str(self.out / "runs/lora")]
        if not self.quick:
            drafts += ["full=" + str(self.out / "runs/full"), "target-as-draft=" + target]
        n = 2 if self.quick else 4
        args = ["--target", target, *[a for d in drafts for a in ("--draft", d)], "--tasks", "gsm8k", "--data-file", f"gsm8k={self.gsm8k_dir / 'test.jsonl'}"]
        args += ["--num-samples", str(n), "--max-new-tokens", str(self.max_new), "--dtype", "float32", "--device", "cpu", "--cost-repeats", "2"]
        args += ["--output-dir", str(self.out / "accept"), *([] if self.quick else ["--ks", "1,2"])]
        argv, shown = script_argv("eval/acceptance.py", *args)
        self.step("acceptance on GSM8K", argv, shown, lambda c: check_acceptance(self.out / "accept", target, self.gsm8k_dir, self.max_new, c))

    def bench(self) -> None:
        """`distill bench` on the target and the LoRA draft: it measures the costs c and v(k)."""
        args = ["--target", self.path(TARGET), "--draft", str(self.out / "runs/lora/draft"), "--ks", "1,2", "--repeats", "3", "--num-prompts", "2"]
        args += ["--prompt-len", "32", "--max-new-tokens", "16", "--device", "cpu", "--json", str(self.out / "bench.json")]
        self.step("distill bench", *distill_argv("bench", *args), lambda c: check_bench(self.out / "bench.json", c))

    def publish(self) -> None:
        """scripts/publish.py on the LoRA run, as is and with --pad-vocab-to-target, each published folder checked."""
        target = self.path(TARGET)
        for padded in (False, True):
            out = self.out / "published" / ("lora-padded" if padded else "lora")
            args = [str(self.out / "runs/lora"), "--out", str(out), "--eval-report", str(self.out / "accept/report.json"), "--force"]
            argv, shown = script_argv("scripts/publish.py", *args, *(["--pad-vocab-to-target"] if padded else []))
            checks = partial(check_published, out, target, self.gsm8k_dir, padded, self.max_new)
            self.step("publish" + (" --pad-vocab-to-target" if padded else ""), argv, shown, checks)

    def decoder(self) -> None:
        """The bundled decoder with the trained draft and the real template: identity, stops, only real ids proposed."""
        shown = "distill.speculative.SpeculativeDecoder(target, trained LoRA draft)"
        draft = self.out / "runs/lora/draft"
        self.in_process("speculative decoder", shown, lambda c: check_decoder(self.path(TARGET), draft, self.gsm8k_dir, self.max_new, c))

    def refusal_commands(self) -> dict[str, list[str]]:
        """The commands given the draft with another tokenizer: train and publish (and, in full, acceptance)."""
        other, target = str(self.models / "other-tokenizer"), self.path(TARGET)
        cases = {
            "distill train": distill_argv("train", LORA, *self.overrides("refused", draft=other))[0],
            "scripts/publish.py": script_argv("scripts/publish.py", "--draft", other, "--target", target, "--out", str(self.out / "published/refused"))[0],
        }
        if not self.quick:
            data = f"gsm8k={self.gsm8k_dir / 'test.jsonl'}"
            args = [
                "--target",
                target,
                "--draft",
                other,
                "--tasks",
                "gsm8k",
                "--data-file",
                data,
                "--num-samples",
                "1",
                "--output-dir",
                str(self.out / "accept-refused"),
            ]
            cases["eval/acceptance.py"] = script_argv("eval/acceptance.py", *args)[0]
        return cases

    def refusals(self) -> None:
        """A draft with another tokenizer is refused with a clear error by train and publish."""
        cases = self.refusal_commands()

        def work(checks: list[str]) -> None:
            """Run each refusal command and check it failed naming the tokenizers."""
            for name, argv in cases.items():
                check_refused(name, subprocess.run(argv, capture_output=True, text=True, env=self.env, cwd=REPO), checks)

        self.in_process("other tokenizer refused", ", ".join(cases), work)

    def run(self) -> list[Step]:
        """Every step in order (bench only in the full rehearsal); the steps done, each with its checks."""
        for phase in (
            self.build,
            self.train_steps,
            self.check_data,
            self.accept,
            self.decoder,
            self.publish,
            *(() if self.quick else (self.bench,)),
            self.refusals,
        ):
            phase()
        return self.steps


# --------------------------------------------------------------------------------------------- report


TITLE = "Rehearsal of the real Qwen2.5 paths (`distill rehearse`)"


def docs_blocks(steps: Sequence[Step], total_s: float, env: dict[str, Any]) -> list[Block]:
    """The rehearsal's section of docs/benchmarks.md: per step the time, peak memory and checks, then the
    commands; `env` is the `provenance.environment()` record of where the rehearsal ran."""
    rows = [[s.name, f"{s.wall_s:.1f}", f"{s.peak_rss_mb:.0f}" if s.peak_rss_mb is not None else "in-process", "; ".join(s.checks)] for s in steps]
    commands = "\n".join(f"- {s.name}: `{re.sub(str(REPO) + '/', '', s.command)}`" for s in steps)
    omp = env["omp_num_threads"] or COMMAND_THREADS  # what the rehearsed commands ran with (Rehearsal.env)
    return [
        f"{total_s / 60:.1f} min in all on {env['device_name']} with OMP_NUM_THREADS={omp} "
        f"({env['torch_threads']} torch threads in process), torch {env['torch']}, transformers {env['transformers']}. "
        "Random-weight stand-ins of recipes/model_configs/*.json with the real vocab_size (152,064 target / 151,936 drafts), "
        "tying and head ratio, the real Qwen2.5-Instruct tokenizer (151,665 tokens), the shipped recipes with `--set` "
        "overrides of paths, steps (1–2) and batch size (2). Peak RSS is the command's own process tree (`os.wait4`). "
        "See docs/gpu-plan.md for the memory arithmetic at the real shapes.",
        table(["step", "wall s", "peak RSS MB", "checked"], rows),
        "Commands (paths under the rehearsal's output folder shortened):\n\n" + commands,
    ]


def rehearse(out: str | os.PathLike, quick: bool = False, markdown: str | None = None, command: str = "distill rehearse") -> dict[str, Any]:
    """Run the rehearsal into `out` (replaced); return and write out/rehearsal.json; with `markdown`,
    write its section there. A failed check raises RehearsalError."""
    for need in (TOKENIZER_DIR / "tokenizer.json", GSM8K_DIR / "test.jsonl"):
        if not need.is_file():
            raise FileNotFoundError(f"{need} is missing: the rehearsal needs the real Qwen2.5 tokenizer and GSM8K under {SHARED}")
    out = Path(out)
    if out.exists():  # replaced in place, not swapped: a failed rehearsal's logs and outputs are the evidence
        shutil.rmtree(out)
    start, load = time.perf_counter(), MachineLoad().start()
    steps = Rehearsal(out, quick).run()
    total = time.perf_counter() - start
    env = environment(load=load.stop())
    report = {"quick": quick, "total_s": total, "command": command, "environment": env, "steps": [asdict(s) for s in steps]}
    write_json(out / "rehearsal.json", report)
    if markdown:
        write_benchmark("rehearsal-quick" if quick else "rehearsal", TITLE, command, docs_blocks(steps, total, env), markdown, load, "distill rehearse")
    return report


def main(argv: list[str] | None = None) -> int:
    """`distill rehearse [--quick] [--out DIR] [--markdown docs/benchmarks.md]`."""
    from distill.arguments import parser

    args = parser("rehearse").parse_args(argv)
    command = shlex.join(["distill", "rehearse", *(sys.argv[1:] if argv is None else argv)])
    try:
        report = rehearse(args.out, args.quick, args.markdown, command)
    except (RehearsalError, FileNotFoundError) as err:
        print(f"distill rehearse: FAILED: {err}", file=sys.stderr)
        return 1
    print(
        f"distill rehearse: all {sum(len(s['checks']) for s in report['steps'])} checks passed in {report['total_s'] / 60:.1f} min; {Path(args.out) / 'rehearsal.json'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
