"""`distill rehearse`: every real Qwen2.5 path, end to end, on random-weight stand-ins.

The stand-ins are built from recipes/model_configs/*.json, shrunk in depth and width but with the
real `vocab_size` (152,064 / 151,936 rows), `tie_word_embeddings`, head ratio and the real
Qwen2.5-Instruct tokenizer (151,665 tokens). The shipped recipes then run unchanged except for
`--set` overrides of model paths, data paths, step counts and batch size: LoRA and full, plain
and under `accelerate launch` with the ZeRO-2 config, `cache-teacher` then training from the
cache, `eval/acceptance.py --tasks gsm8k` on the real GSM8K test questions, `distill bench`, and
`scripts/publish.py` with and without `--pad-vocab-to-target`. Each step checks what a user relies
on and stops the rehearsal with a RehearsalError naming what broke.

Stand-in weights are random, so two things are set by hand to behave like a trained checkpoint:
the target's padding rows (ids >= 151,665) are the mean of its real rows (never the greedy choice)
and its `<|im_end|>` row is scaled x3, so replies end within a few dozen tokens. The drafts' padding
rows are made adversarial instead (large enough to win nearly every argmax), so any path that lets
a draft propose a padding id is caught.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import resource
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from distill.common.docs import markdown_table, write_section
from distill.common.models import load_model, load_tokenizer
from distill.common.provenance import versions

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
TOKENIZER_DIR = SHARED / "qwen2.5-tokenizer"
GSM8K_DIR = SHARED / "gsm8k"
MODEL_CONFIGS = REPO / "recipes" / "model_configs"
REAL_VOCAB = 151_665  # len(tokenizer) of Qwen2.5-Instruct
IM_END, ENDOFTEXT = 151_645, 151_643
SYSTEM_PROMPT = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
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


class RehearsalError(RuntimeError):
    """A rehearsal step failed or a check a user relies on did not hold."""


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
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps({"messages": [{"role": "user", "content": r["question"]}]}) + "\n" for r in rows))
    return out


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
    return usage.ru_maxrss / 1024  # Linux reports KiB


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


def check(condition: bool, what: str, checks: list[str]) -> None:
    """Record `what` as checked, or stop the rehearsal saying it does not hold."""
    if not condition:
        raise RehearsalError(f"check failed: {what}")
    checks.append(what)


def check_ids(rows: Sequence[Sequence[int]], where: str, checks: list[str], max_new_tokens: int | None = None) -> None:
    """Every id is a real token (< 151,665); with `max_new_tokens`, every row that ended early ended
    at <|im_end|>, nothing follows it, and at least one row did stop (so stopping was exercised)."""
    bad = sorted({t for row in rows for t in row if t >= REAL_VOCAB})
    check(not bad, f"{where}: no id >= {REAL_VOCAB} emitted" + (f" (found {bad[:5]})" if bad else ""), checks)
    if max_new_tokens is None:
        return
    short = [list(row) for row in rows if len(row) < max_new_tokens]
    ok = bool(short) and all(row[-1] == IM_END and IM_END not in row[:-1] for row in short)
    check(ok, f"{where}: generation stops at <|im_end|> ({len(short)}/{len(rows)} rows stopped early)", checks)


# --------------------------------------------------------------------------------------------- the rehearsal


class Rehearsal:
    """The rehearsal's state: output folder, stand-in paths, the overrides every recipe gets, the steps done."""

    def __init__(self, out: Path, quick: bool, tokenizer_dir: Path = TOKENIZER_DIR, gsm8k_dir: Path = GSM8K_DIR):
        self.out, self.quick = out.absolute(), quick
        self.tokenizer_dir, self.gsm8k_dir = tokenizer_dir, gsm8k_dir
        self.models = self.out / "models"
        self.steps: list[Step] = []
        self.env = {
            **os.environ,
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "PYTHONPATH": str(REPO),
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
        }
        self.samples = {"train": 8 if quick else 16, "eval": 2 if quick else 8, "steps": 1 if quick else 2, "batch": 2}
        self.max_new = 48  # the stand-in target ends most replies within this (see EOS_ROW_SCALE)

    # ------------------------------------------------------------------ helpers

    def path(self, name: str) -> str:
        return str(self.models / name)

    def overrides(self, run: str, *, draft: str | None = None, gsm8k: bool = True) -> list[str]:
        """The `--set` list that points a shipped recipe at the stand-ins and local data, shortened."""
        s = self.samples
        sets = [
            f"output_dir={self.out / 'runs' / run}",
            f"target.name_or_path={self.path('qwen2.5-7b-instruct')}",
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

    def distill(self, verb: str, *args: str) -> tuple[list[str], str]:
        return [sys.executable, "-m", "distill.cli", verb, *args], shlex.join(["distill", verb, *args])

    def script(self, script: str, *args: str) -> tuple[list[str], str]:
        return [sys.executable, str(REPO / script), *args], shlex.join(["python", script, *args])

    def accelerate(self, config: str, recipe: str, *args: str) -> tuple[list[str], str]:
        launcher = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or "accelerate"
        flags = ["--config_file", config, "--num_processes", "1", "--mixed_precision", "no", "--main_process_port", str(29500 + os.getpid() % 1000)]
        argv = [launcher, "launch", *flags, str(REPO / "scripts/train.py"), recipe, *args]
        return argv, shlex.join(["accelerate", "launch", *flags[:6], "scripts/train.py", recipe, *args])

    # ------------------------------------------------------------------ steps

    def build(self) -> None:
        start = time.perf_counter()
        checks: list[str] = []
        names = ["qwen2.5-7b-instruct", "qwen2.5-0.5b-instruct"] + ([] if self.quick else ["qwen2.5-1.5b-instruct"])
        tok = load_tokenizer(self.tokenizer_dir)
        check(
            len(tok) == REAL_VOCAB and tok.eos_token_id == IM_END and tok.pad_token_id == ENDOFTEXT,
            f"real tokenizer: {len(tok):,} tokens, eos <|im_end|> {tok.eos_token_id}, pad <|endoftext|> {tok.pad_token_id}",
            checks,
        )
        for i, name in enumerate(names):
            build_standin(name, self.models / name, self.tokenizer_dir, seed=i)
            real = json.loads((MODEL_CONFIGS / STANDINS[name][0]).read_text())
            cfg = json.loads((self.models / name / "config.json").read_text())
            same = all(cfg[k] == real[k] for k in ("vocab_size", "tie_word_embeddings"))
            ratio = cfg["num_attention_heads"] / cfg["num_key_value_heads"] == real["num_attention_heads"] / real["num_key_value_heads"]
            check(
                same and ratio,
                f"{name} stand-in: vocab_size {cfg['vocab_size']:,}, tied {cfg['tie_word_embeddings']}, "
                f"heads {cfg['num_attention_heads']}/{cfg['num_key_value_heads']} as the real ratio, hidden {cfg['hidden_size']}, "
                f"{cfg['num_hidden_layers']} layer(s)",
                checks,
            )
        other_tokenizer_draft(self.models / "other-tokenizer")
        write_chat_data(self.gsm8k_dir / "train.jsonl", self.out / "data" / "chat-train.jsonl", self.samples["train"])
        write_chat_data(self.gsm8k_dir / "test.jsonl", self.out / "data" / "chat-eval.jsonl", self.samples["eval"])
        self.steps.append(Step("stand-ins", "distill.commands.rehearse.build_standin for " + ", ".join(names), time.perf_counter() - start, None, checks))

    def check_data(self) -> None:
        """The training examples of the LoRA recipe carry the Instruct template and end at <|im_end|>."""
        from distill.common.models import load_target
        from distill.training.data import build_train_dataset
        from distill.training.recipe import load_recipe

        start, checks = time.perf_counter(), []
        recipe = load_recipe(REPO / "recipes/qwen2.5-0.5b-from-7b-lora.yaml", self.overrides("data-check")[1::2])
        tok = load_tokenizer(recipe.target.name_or_path)
        target = load_target(recipe.target.name_or_path, dtype=recipe.target.dtype)
        rows = build_train_dataset(recipe.data, tok, target=target, seed=recipe.seed)  # the LoRA run's cached generations
        texts = [tok.decode(r["input_ids"]) for r in rows]
        check(
            all(t.startswith(SYSTEM_PROMPT + "<|im_start|>user\n") for t in texts),
            "training prompts carry the Instruct template and its default system prompt",
            checks,
        )
        starts = [r["labels"].index(next(x for x in r["labels"] if x != -100)) for r in rows]
        check(
            all(tok.decode(r["input_ids"][:s]).endswith("<|im_start|>assistant\n") for r, s in zip(rows, starts)),
            "the loss starts right after `<|im_start|>assistant\\n` (prompt masked)",
            checks,
        )
        cut = recipe.data.generation_max_new_tokens
        check(
            all(r["labels"][-1] == IM_END or sum(x != -100 for x in r["labels"]) >= cut or len(r["input_ids"]) >= recipe.data.max_length for r in rows),
            f"every response ends with <|im_end|> (151645) in the labels, or runs to the {cut}-token generation limit verbatim",
            checks,
        )
        self.steps.append(
            Step("training data", "distill.training.data.build_train_dataset on the LoRA recipe's data", time.perf_counter() - start, None, checks)
        )

    def train_steps(self) -> None:
        lora, full, full15 = (str(REPO / f"recipes/{r}.yaml") for r in ("qwen2.5-0.5b-from-7b-lora", "qwen2.5-0.5b-from-7b-full", "qwen2.5-1.5b-from-7b-full"))
        small = self.path("qwen2.5-0.5b-instruct")
        argv, shown = self.distill("train", lora, *self.overrides("lora", draft=small))
        self.step("train LoRA", argv, shown, lambda c: self._check_run("lora", c, lora=True))
        if self.quick:
            return
        zero2 = str(REPO / "recipes/accelerate/zero2.yaml")
        argv, shown = self.accelerate(zero2, lora, *self.overrides("lora-zero2", draft=small))
        self.step("train LoRA, ZeRO-2", argv, shown, lambda c: self._check_run("lora-zero2", c, lora=True, same_as="lora"))
        argv, shown = self.distill("cache-teacher", full, *self.overrides("full", draft=small, gsm8k=False))
        self.step("cache-teacher", argv, shown, self._check_cache)
        argv, shown = self.distill("train", full, *self.overrides("full", draft=small, gsm8k=False))
        self.step("train full from the cache", argv, shown, lambda c: self._check_run("full", c))
        argv, shown = self.accelerate(zero2, full, *self.overrides("full-zero2", draft=small, gsm8k=False))
        self.step("train full from the cache, ZeRO-2", argv, shown, lambda c: self._check_run("full-zero2", c, same_as="full"))
        argv, shown = self.distill("train", full15, *self.overrides("full-1.5b", draft=self.path("qwen2.5-1.5b-instruct")))
        self.step("train 1.5B full, online teacher", argv, shown, lambda c: self._check_run("full-1.5b", c))

    def _check_run(self, run: str, checks: list[str], lora: bool = False, same_as: str | None = None) -> None:
        out = self.out / "runs" / run
        info = json.loads((out / "run_info.json").read_text())
        loss = info["metrics"].get("train_loss")
        check(loss is not None and 0 < loss < float("inf"), f"finite train loss {loss:.4g}", checks)
        check(
            "eval_expected_acceptance" in info["metrics"],
            f"held-out eval ran (expected acceptance {info['metrics'].get('eval_expected_acceptance', 0):.3g})",
            checks,
        )
        cfg = json.loads((out / "draft" / "config.json").read_text())
        if lora:
            check(not (out / "draft" / "adapter_config.json").exists(), "LoRA merged on save (a full model in draft/)", checks)
        check(cfg["vocab_size"] == 151_936, f"saved draft keeps vocab_size {cfg['vocab_size']:,}", checks)
        if same_as is not None:
            check(info["deepspeed"] is True, "ran under DeepSpeed (ZeRO-2)", checks)
            losses = [json.loads((self.out / "runs" / r / "run_info.json").read_text())["metrics"]["train_loss"] for r in (run, same_as)]
            check(abs(losses[0] - losses[1]) <= 1e-2 * abs(losses[1]), f"train loss {losses[0]:.6g} within 1% of the plain run's {losses[1]:.6g}", checks)

    def _check_cache(self, checks: list[str]) -> None:
        from distill.training.teacher import TeacherCache

        gens = [json.loads(line) for line in (self.out / "cache/chat-generations.jsonl").read_text().splitlines()]
        check(
            len(gens) == self.samples["train"] + self.samples["eval"] and all(g["messages"][-1]["role"] == "assistant" for g in gens),
            f"seq-KD: the target answered all {len(gens)} prompts",
            checks,
        )
        cache = TeacherCache(self.out / "cache/teacher-top32/train")
        _, ids, lps = cache.example(0)
        check(
            cache.manifest["vocab_size"] == REAL_VOCAB and int(ids.max()) < REAL_VOCAB,
            f"top-{cache.top_k} cache over the real vocabulary only (max id {int(ids.max())} < {REAL_VOCAB})",
            checks,
        )
        check(bool(torch.all(lps.exp().sum(-1) <= 1 + 1e-4)), "cached log-probs are a sub-distribution", checks)

    def accept(self) -> None:
        target, drafts = self.path("qwen2.5-7b-instruct"), ["lora=" + str(self.out / "runs/lora")]
        if not self.quick:
            drafts += ["full=" + str(self.out / "runs/full"), "target-as-draft=" + target]
        n, new = (2, self.max_new) if self.quick else (4, self.max_new)
        args = [
            "--target",
            target,
            *[a for d in drafts for a in ("--draft", d)],
            "--tasks",
            "gsm8k",
            "--data-file",
            f"gsm8k={self.gsm8k_dir / 'test.jsonl'}",
            "--num-samples",
            str(n),
            "--max-new-tokens",
            str(new),
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--cost-repeats",
            "2",
            "--output-dir",
            str(self.out / "accept"),
        ]
        if not self.quick:
            args += ["--ks", "1,2"]
        argv, shown = self.script("eval/acceptance.py", *args)
        self.step("acceptance on GSM8K", argv, shown, self._check_accept)

    def _check_accept(self, checks: list[str]) -> None:
        report = json.loads((self.out / "accept/report.json").read_text())
        lines = (self.out / "accept/records.jsonl").read_text().splitlines()[1:]
        records = [json.loads(line) for line in lines]
        check_ids([row for r in records for row in r["new"]], "GSM8K generations (target-only and speculative)", checks, self.max_new)
        for name, entry in report["drafts"].items():
            row = entry["tasks"]["gsm8k"]
            check(row["greedy_identity"] == 1.0, f"{name}: greedy identity {row['greedy_identity']:.0%} (acceptance {row['acceptance_rate']:.1%})", checks)
        tok = load_tokenizer(self.path("qwen2.5-7b-instruct"))
        from distill.eval.tasks import gsm8k

        ex = gsm8k.load(self.gsm8k_dir / "test.jsonl", num_samples=1)[0]
        text = tok.apply_chat_template(ex.messages, add_generation_prompt=True, tokenize=False)
        check(text.startswith(SYSTEM_PROMPT) and text.endswith("<|im_start|>assistant\n"), "GSM8K prompts carry the Instruct template", checks)

    def bench(self) -> None:
        args = [
            "--target",
            self.path("qwen2.5-7b-instruct"),
            "--draft",
            str(self.out / "runs/lora/draft"),
            "--ks",
            "1,2",
            "--repeats",
            "3",
            "--num-prompts",
            "2",
            "--prompt-len",
            "32",
            "--max-new-tokens",
            "16",
            "--device",
            "cpu",
            "--json",
            str(self.out / "bench.json"),
        ]
        argv, shown = self.distill("bench", *args)

        def checks(c: list[str]) -> None:
            report = json.loads((self.out / "bench.json").read_text())
            costs = report["costs"]
            check(costs["c"] > 0 and all(v > 0 for v in costs["v"].values()), f"c = {costs['c']:.3g}, v(k) {costs['v']}", c)

        self.step("distill bench", argv, shown, checks)

    def publish(self) -> None:
        target = self.path("qwen2.5-7b-instruct")
        for padded in (False, True):
            out = self.out / "published" / ("lora-padded" if padded else "lora")
            args = [str(self.out / "runs/lora"), "--out", str(out), "--eval-report", str(self.out / "accept/report.json"), "--force"]
            argv, shown = self.script("scripts/publish.py", *args, *(["--pad-vocab-to-target"] if padded else []))
            self.step(
                "publish" + (" --pad-vocab-to-target" if padded else ""),
                argv,
                shown,
                lambda c, out=out, padded=padded: self._check_published(out, target, padded, c),
            )

    def _check_published(self, folder: Path, target_dir: str, padded: bool, checks: list[str]) -> None:
        cfg = json.loads((folder / "config.json").read_text())
        want = 152_064 if padded else 151_936
        check(cfg["vocab_size"] == want, f"config.json vocab_size {cfg['vocab_size']:,}" + (" = the target's (vLLM draft_model)" if padded else ""), checks)
        draft = load_model(folder, dtype=None)
        target = load_model(target_dir, dtype=None)
        check(isinstance(draft, PreTrainedModel), "loads with AutoModelForCausalLM", checks)
        tok = load_tokenizer(folder)
        ref, spec, proposed = [], [], []
        for ex in _gsm8k_chats(self.gsm8k_dir, 2):
            enc = tok.apply_chat_template(ex, add_generation_prompt=True, return_tensors="pt", return_dict=True)
            plain = dict(do_sample=False, max_new_tokens=self.max_new, repetition_penalty=1.0, top_k=None, top_p=None, temperature=None)
            ref.append(target.generate(**enc, **plain)[0, enc["input_ids"].shape[1] :].tolist())
            extra = {} if padded else {"tokenizer": tok, "assistant_tokenizer": tok}
            with _recording_candidates(proposed):
                spec.append(target.generate(**enc, assistant_model=draft, **plain, **extra)[0, enc["input_ids"].shape[1] :].tolist())
        card = (folder / "README.md").read_text()
        if not padded:
            try:
                target.generate(**enc, assistant_model=draft, max_new_tokens=2)
            except ValueError as err:
                refused = "different tokenizers" in str(err)
            else:
                refused = False
            check(
                refused and "assistant_tokenizer=tokenizer" in card,
                "plain assistant_model= refuses unequal vocab sizes (transformers), so the model card's snippet passes tokenizer= and assistant_tokenizer=",
                checks,
            )
        else:
            check("assistant_tokenizer" not in card, "the model card's snippet is the plain assistant_model=draft", checks)
        how = "assistant_model=draft" if padded else "assistant_model=draft with tokenizer= and assistant_tokenizer= (vocab sizes differ)"
        check(spec == ref, f"`target.generate({how})` gives the target's own greedy output", checks)
        check_ids(spec, "assistant_model= output", checks, self.max_new)
        bad = sorted({t for t in proposed if t >= REAL_VOCAB})
        check(
            proposed and not bad,
            f"as assistant_model the published draft proposed {len(proposed)} ids, none >= {REAL_VOCAB}" + (f" (proposed {bad[:5]})" if bad else ""),
            checks,
        )

    def decoder(self) -> None:
        """The bundled decoder with the trained draft and the real template: identity, stops, only real ids proposed."""
        from distill.speculative import SpeculativeDecoder

        start, checks = time.perf_counter(), []
        target = load_model(self.path("qwen2.5-7b-instruct"), dtype=None)
        draft = load_model(self.out / "runs/lora/draft", dtype=torch.float32)
        tok = load_tokenizer(self.path("qwen2.5-7b-instruct"))
        fed: list[int] = []
        draft.get_input_embeddings().register_forward_hook(lambda m, inp, out: fed.extend(inp[0].flatten().tolist()))
        decoder = SpeculativeDecoder(target, draft, num_draft_tokens=4, tokenizer=tok, draft_tokenizer=tok)
        ref, spec = [], []
        for chat in _gsm8k_chats(self.gsm8k_dir, 2):
            enc = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
            n = enc["input_ids"].shape[1]
            ref.append(
                target.generate(
                    **enc,
                    do_sample=False,
                    max_new_tokens=self.max_new,
                    eos_token_id=IM_END,
                    pad_token_id=ENDOFTEXT,
                    repetition_penalty=1.0,
                    top_k=None,
                    top_p=None,
                    temperature=None,
                )[0, n:].tolist()
            )
            out = decoder.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=self.max_new, eos_token_id=IM_END, pad_token_id=ENDOFTEXT)
            spec.append(_trim(out.sequences[0, n:].tolist()))
        check(spec == [_trim(r) for r in ref], "SpeculativeDecoder greedy output equals target.generate (2 GSM8K chats)", checks)
        check_ids(spec, "SpeculativeDecoder output", checks, self.max_new)
        check(max(fed) < REAL_VOCAB, f"the draft (adversarial padding rows) never proposed an id >= {REAL_VOCAB} ({len(fed)} ids fed to it)", checks)
        self.steps.append(
            Step("speculative decoder", "distill.speculative.SpeculativeDecoder(target, trained LoRA draft)", time.perf_counter() - start, None, checks)
        )

    def refusals(self) -> None:
        """A draft with another tokenizer is refused with a clear error by train and publish."""
        other, target = str(self.models / "other-tokenizer"), self.path("qwen2.5-7b-instruct")
        lora = str(REPO / "recipes/qwen2.5-0.5b-from-7b-lora.yaml")
        start, checks = time.perf_counter(), []
        cases = {
            "distill train": self.distill("train", lora, *self.overrides("refused", draft=other))[0],
            "scripts/publish.py": self.script("scripts/publish.py", "--draft", other, "--target", target, "--out", str(self.out / "published/refused"))[0],
        }
        if not self.quick:
            cases["eval/acceptance.py"] = self.script(
                "eval/acceptance.py",
                "--target",
                target,
                "--draft",
                other,
                "--tasks",
                "gsm8k",
                "--data-file",
                f"gsm8k={self.gsm8k_dir / 'test.jsonl'}",
                "--num-samples",
                "1",
                "--output-dir",
                str(self.out / "accept-refused"),
            )[0]
        for name, argv in cases.items():
            run = subprocess.run(argv, capture_output=True, text=True, env=self.env, cwd=REPO)
            said = (run.stdout + run.stderr)[-3000:]
            check(run.returncode != 0 and "tokenizers disagree" in said, f'{name} refuses a draft with another tokenizer ("tokenizers disagree")', checks)
        self.steps.append(Step("other tokenizer refused", ", ".join(cases), time.perf_counter() - start, None, checks))

    def run(self) -> list[Step]:
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


def _gsm8k_chats(gsm8k_dir: Path, n: int) -> list[list[dict[str, str]]]:
    from distill.eval.tasks import gsm8k

    return [ex.messages for ex in gsm8k.load(gsm8k_dir / "test.jsonl", num_samples=n)]


@contextlib.contextmanager
def _recording_candidates(proposed: list[int]) -> Iterator[None]:
    """Within the block, every candidate id transformers' assisted generation takes from the
    assistant is appended to `proposed` (the wrapped `get_candidates` is restored after)."""
    from transformers.generation import candidate_generator as cg

    classes = (cg.AssistedCandidateGenerator, cg.AssistedCandidateGeneratorDifferentTokenizers)
    originals = [cls.__dict__["get_candidates"] for cls in classes]

    def wrap(original: Callable) -> Callable:
        def get_candidates(self: Any, input_ids: torch.LongTensor, **kwargs: Any) -> Any:
            ids, logits = original(self, input_ids, **kwargs)
            proposed.extend(ids[:, input_ids.shape[1] :].flatten().tolist())
            return ids, logits

        return get_candidates

    for cls, original in zip(classes, originals):
        cls.get_candidates = wrap(original)
    try:
        yield
    finally:
        for cls, original in zip(classes, originals):
            cls.get_candidates = original


def _trim(row: list[int]) -> list[int]:
    return row[: row.index(IM_END) + 1] if IM_END in row else row


# --------------------------------------------------------------------------------------------- report


def render_markdown(steps: Sequence[Step], total_s: float, command: str, environment: dict[str, Any]) -> str:
    """The rehearsal section of docs/benchmarks.md: per step the command, time, peak memory and checks."""
    rows = [[s.name, f"{s.wall_s:.1f}", f"{s.peak_rss_mb:.0f}" if s.peak_rss_mb is not None else "in-process", "; ".join(s.checks)] for s in steps]
    commands = "\n".join(f"- {s.name}: `{re.sub(str(REPO) + '/', '', s.command)}`" for s in steps)
    return "\n".join(
        [
            "## Rehearsal of the real Qwen2.5 paths (`distill rehearse`)",
            "",
            f"`{command}`: {total_s / 60:.1f} min in all on {environment['cpu']} with OMP_NUM_THREADS={environment['omp_threads']} "
            "(the machine's 2 cores shared with other agents' jobs), torch " + environment["torch"] + ", transformers " + environment["transformers"] + ".",
            "Random-weight stand-ins of recipes/model_configs/*.json with the real vocab_size (152,064 target / 151,936 drafts), "
            "tying and head ratio, the real Qwen2.5-Instruct tokenizer (151,665 tokens), the shipped recipes with `--set` "
            "overrides of paths, steps (1–2) and batch size (2). Peak RSS is the command's own process tree (`os.wait4`). "
            "See docs/gpu-plan.md for the memory arithmetic at the real shapes.",
            "",
            markdown_table(["step", "wall s", "peak RSS MB", "checked"], rows),
            "",
            "Commands (paths under the rehearsal's output folder shortened):",
            "",
            commands,
        ]
    )


def _environment() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "omp_threads": os.environ.get("OMP_NUM_THREADS", "1"), **versions()}


def rehearse(out: str | os.PathLike, quick: bool = False, markdown: str | None = None, command: str = "distill rehearse") -> dict[str, Any]:
    """Run the rehearsal into `out` (replaced); return and write out/rehearsal.json; with `markdown`,
    write its section there. A failed check raises RehearsalError."""
    for need in (TOKENIZER_DIR / "tokenizer.json", GSM8K_DIR / "test.jsonl"):
        if not need.is_file():
            raise FileNotFoundError(f"{need} is missing: the rehearsal needs the real Qwen2.5 tokenizer and GSM8K under {SHARED}")
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    start = time.perf_counter()
    steps = Rehearsal(out, quick).run()
    total = time.perf_counter() - start
    env = _environment()
    report = {"quick": quick, "total_s": total, "command": command, "environment": env, "steps": [s.__dict__ for s in steps]}
    (out / "rehearsal.json").write_text(json.dumps(report, indent=2))
    if markdown:
        write_section(markdown, "rehearsal", render_markdown(steps, total, command, env))
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
