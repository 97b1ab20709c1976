"""distill.engines.vllm (scripts/bench_vllm.py): the drafts served by vLLM's own engine, beside its target alone.

vLLM runs in its own environment (`distill vllm-env`), driven through `vllm_worker.py`: one engine for the
target alone and one for the target with each draft (`"method": "draft_model"`), both alive while a draft
is measured. Greedy (or sampled) on the evaluation's GSM8K prompts (the first `--num-prompts` of the seeded
draw `distill accept` measures, rendered by vLLM's own tokenizer and chat template; every prompt's ids are
checked equal to this project's):

- one request at a time, the target alone and the draft interleaved prompt by prompt (one timing run):
  vLLM's cumulative speculative counters read before and after each prompt give its drafted, accepted and
  per-position counts; its request metrics give TTFT and TPOT; output ids are compared with the target
  alone's (greedy identity);
- `--concurrency 1,2,4,8`: the same prompts with that many requests in flight (continuous batching; a new
  request starts as one finishes), the target alone and each draft: output tokens/s, per-request TPOT,
  acceptance (from vLLM's per-request counts), tokens per round and what a round costs in target steps, the
  two terms of the speed model whose ratio is the speedup.

A draft vLLM refuses is recorded with vLLM's own message, and with the line this project prints first (the
vLLM rule of `distill.commands.engines`). Each prompt's pair is journalled beside the report as it finishes
(NAME.records.jsonl): the same command run again resumes. Without vLLM's environment the benchmark says so
and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from distill.commands.engines import check_vllm
from distill.commands.engines import describe as describe_model
from distill.common.benchmarks import report as write_benchmark
from distill.common.docs import Block, markdown_table
from distill.common.docs import table as table_block
from distill.common.io import file_stamp, write_json
from distill.common.models import ModelLoadError, load_tokenizer
from distill.common.provenance import MachineLoad, cpu_record, describe, versions, warn
from distill.engines.inputs import DEFAULT_DATA, Prompt, gsm8k_prompts, journal_path, parse_drafts, prompt_key, prompt_mismatch
from distill.engines.ours import ours_acceptance, ours_difference
from distill.engines.vllm_env import default_venv, engine_env, python_of, ready
from distill.eval.intervals import bootstrap, difference, format_interval, ratio, ratio_of_ratios
from distill.eval.journal import Journal, Run, busiest
from distill.eval.report import difference_text

WORKER = Path(__file__).with_name("vllm_worker.py")
REPLY = "@@distill-vllm "  # vllm_worker.REPLY: the worker's replies among vLLM's log lines
COUNTERS = {"drafts": "vllm:spec_decode_num_drafts", "drafted": "vllm:spec_decode_num_draft_tokens", "accepted": "vllm:spec_decode_num_accepted_tokens"}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
TARGET = "target alone"


class EngineError(RuntimeError):
    """vLLM refused a configuration or failed; the message is vLLM's own."""


@dataclass(frozen=True)
class Counts:
    """vLLM's speculative counters: verify rounds, drafted and accepted tokens, accepted tokens per draft position."""

    drafts: int = 0
    drafted: int = 0
    accepted: int = 0
    per_position: tuple[int, ...] = ()

    def __sub__(self, before: Counts) -> Counts:
        width = max(len(self.per_position), len(before.per_position))
        pad = lambda v: tuple(v) + (0,) * (width - len(v))  # noqa: E731
        out = Counts(
            self.drafts - before.drafts,
            self.drafted - before.drafted,
            self.accepted - before.accepted,
            tuple(a - b for a, b in zip(pad(self.per_position), pad(before.per_position))),
        )
        if min(out.drafts, out.drafted, out.accepted, *out.per_position, 0) < 0:
            raise EngineError(f"vLLM's cumulative counters went back ({before} -> {self}): the engine restarted between two readings")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "per_position": list(self.per_position)}


def read_counters(snapshot: dict[str, Any]) -> Counts:
    """vLLM's speculative counters from one `LLM.get_metrics()` reading (as the worker sends it); zeros for an
    engine without a draft, which has none."""
    return Counts(**{key: int(snapshot.get(name) or 0) for key, name in COUNTERS.items()}, per_position=tuple(int(v) for v in snapshot.get(PER_POSITION) or ()))


def counts_of(reply: dict[str, Any]) -> Counts:
    """What one generate call added to the counters: the reading after minus the reading before."""
    return read_counters(reply["counters_after"]) - read_counters(reply["counters_before"])


def request_counts(result: dict[str, Any], k: int) -> Counts:
    """One request's own counts, from vLLM's per-request metrics (its accepted and drafted tokens per round):
    what a request contributes when several share the counters."""
    accepted, drafted = result.get("per_step_accepted") or [], result.get("per_step_drafted") or []
    per_position = tuple(sum(a > j for a in accepted) for j in range(k))
    return Counts(len(drafted), sum(drafted), sum(accepted), per_position)


def counted_as_distill(result: dict[str, Any], max_new_tokens: int) -> tuple[int, int]:
    """(accepted, drafted) of one request counted as this project's decoder counts: it proposes at most the
    tokens the length limit leaves (k shrinks in the last rounds), where vLLM drafts k every round and counts
    accepted tokens past `max_tokens` too."""
    produced, accepted, drafted = 1, 0, 0  # the prefill's token
    for a, d in zip(result.get("per_step_accepted") or [], result.get("per_step_drafted") or []):
        room = max_new_tokens - produced
        if room <= 1:
            break
        proposed = min(d, room - 1)
        accepted, drafted, produced = accepted + min(a, proposed), drafted + proposed, produced + a + 1
    return accepted, drafted


class Engine(Protocol):
    """One running vLLM engine (the target alone, or with a draft)."""

    info: dict[str, Any]

    def generate(self, prompts: Sequence[Sequence[dict[str, str]]], sampling: dict[str, Any], concurrency: int) -> dict[str, Any]: ...

    def close(self) -> None: ...


Launcher = Callable[[dict[str, Any]], Engine]  # an engine configuration -> the started engine (EngineError when vLLM refuses it)


class WorkerEngine:
    """vLLM in its own environment: `vllm_worker.py` started by that environment's Python, spoken to in JSON lines."""

    def __init__(self, venv: Path, config: dict[str, Any], threads: int, load: MachineLoad, log: Path | None = None):
        self.log = open(log, "a") if log else subprocess.DEVNULL  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [str(python_of(venv)), str(WORKER), json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=engine_env(venv, threads),
        )
        self.load, self.cpu_s = load, 0.0
        first = self._read()
        if "error" in first:
            self.close()
            raise EngineError(first["error"])
        self.info = first["ready"]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                reply = json.loads(line[len(REPLY) :])
                # the worker's CPU seconds so far count as this benchmark's own: not reaped yet, the system counts them as others'
                self.load.credit(reply.get("cpu_s", self.cpu_s) - self.cpu_s)
                self.cpu_s = reply.get("cpu_s", self.cpu_s)
                return reply
        raise EngineError(f"vLLM's worker exited ({self.proc.wait()}) without a reply; its log says why")

    def generate(self, prompts: Sequence[Sequence[dict[str, str]]], sampling: dict[str, Any], concurrency: int) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": "generate", "prompts": [list(p) for p in prompts], "sampling": sampling, "concurrency": concurrency}) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        if "error" in reply:
            raise EngineError(reply["error"])
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=120)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.load.credit(-self.cpu_s)  # reaped: its time is now the benchmark's children's
        self.cpu_s = 0.0
        if self.log is not subprocess.DEVNULL:
            self.log.close()


def worker_launcher(venv: Path, threads: int, log: Path | None, load: MachineLoad) -> Launcher:
    """Start engines as vLLM worker processes, their CPU time counted as this benchmark's own in `load`."""
    return lambda config: WorkerEngine(venv, config, threads, load, log)


@dataclass
class Settings:
    """What every engine of one benchmark shares (scripts/bench_vllm.py's options)."""

    target: str
    dtype: str
    num_draft_tokens: int
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int
    max_model_len: int
    kv_cache_bytes: int
    max_num_batched_tokens: int
    max_num_seqs: int
    tokenizer: str | None

    def engine(self, draft: str | None = None, draft_sample_method: str = "greedy") -> dict[str, Any]:
        """The worker's configuration for the target alone (`draft` None) or with `draft`."""
        return {
            "model": self.target,
            "tokenizer": self.tokenizer,
            "draft": draft,
            "draft_sample_method": draft_sample_method,
            "dtype": self.dtype,
            "num_draft_tokens": self.num_draft_tokens,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "kv_cache_memory_bytes": self.kv_cache_bytes,
            "seed": self.seed,
        }

    def sampling(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_new_tokens, "seed": self.seed if self.temperature > 0 else None}


@dataclass
class System:
    """A draft as measured: its folder and vLLM's draft sampling (`greedy`: argmax proposals, q one-hot)."""

    name: str
    path: str
    method: str = "greedy"


@dataclass
class Engines:
    """The target alone's engine and one draft's, each started when first needed. With `exclusive`, only one
    runs at a time (starting one closes the other): two float32 engines of the 1.5B target do not fit 24 GB."""

    launch: Launcher
    settings: Settings
    exclusive: bool = False
    alone: Engine | None = None
    current: tuple[str, Engine] | None = None
    started: list[str] = field(default_factory=list)

    def target(self) -> Engine:
        if self.alone is None:
            if self.exclusive:
                self.close_draft()
            self.alone = self.launch(self.settings.engine())
            self.started.append(TARGET)
        return self.alone

    def draft(self, system: System) -> Engine:
        if self.current is None or self.current[0] != system.name:
            self.close_draft()
            if self.exclusive:
                self.close_target()
            self.current = (system.name, self.launch(self.settings.engine(system.path, system.method)))
            self.started.append(system.name)
        return self.current[1]

    def close_draft(self) -> None:
        if self.current is not None:
            self.current[1].close()
            self.current = None

    def close_target(self) -> None:
        if self.alone is not None:
            self.alone.close()
            self.alone = None

    def close(self) -> None:
        self.close_draft()
        self.close_target()


def model_bytes(folder: str | os.PathLike, dtype: str) -> int:
    """What a model folder's weights take in memory in `dtype` (its safetensors' size, scaled from the stored dtype)."""
    folder = Path(folder)
    stored = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    width = {"float32": 4, "bfloat16": 2, "float16": 2}
    return stored * width.get(dtype, 4) // width.get(str(config.get("dtype") or config.get("torch_dtype") or dtype), 4)


ENGINE_OVERHEAD = 2 << 30  # measured here: a float32 Coder-1.5B engine holds ~2.2 GB beyond its weights and KV cache


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None off Linux)."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def two_engines_fit(settings: Settings, systems: Sequence[System]) -> bool:
    """Whether the target alone's engine and the largest draft's engine fit in memory at once."""
    target = model_bytes(settings.target, settings.dtype)
    draft = max((model_bytes(s.path, settings.dtype) for s in systems), default=0)
    need = 2 * target + draft + 3 * settings.kv_cache_bytes + 2 * ENGINE_OVERHEAD
    free = available_bytes()
    return free is not None and need < 0.9 * free


def _one(reply: dict[str, Any], prompt: Prompt) -> dict[str, Any]:
    """The single request of a reply, its prompt ids checked equal to this project's."""
    [result] = reply["results"]
    if (problem := prompt_mismatch(prompt, "vLLM's tokenizer and chat template", result["prompt_ids"])) is not None:
        raise EngineError(problem)
    return {key: v for key, v in result.items() if key != "prompt_ids"} | {"prompt_tokens": len(result["prompt_ids"])}


def measure_block(engines: Engines, system: System, block: Sequence[Prompt]) -> list[dict[str, Any]]:
    """Prompts one request at a time, the target alone then the target with the draft: prompt by prompt when
    both engines run at once, else the block's prompts on the target alone, then on the draft. The draft's
    counts are the counters' difference over its call (vLLM's per-request counts kept beside them)."""
    sampling, k = engines.settings.sampling(), engines.settings.num_draft_tokens
    alone: dict[str, dict[str, Any]] = {}
    out = []

    def target(prompt: Prompt) -> None:
        alone[prompt.id] = _one(engines.target().generate([prompt.messages], sampling, 1), prompt)

    if engines.exclusive:
        for prompt in block:
            target(prompt)
    for prompt in block:
        if prompt.id not in alone:
            target(prompt)
        reply = engines.draft(system).generate([prompt.messages], sampling, 1)
        spec = _one(reply, prompt)
        counts = {"counts": counts_of(reply).to_dict(), "request_counts": request_counts(spec, k).to_dict()}
        out.append({"target": alone[prompt.id], "draft": {**spec, **counts}, "prompt": prompt.id})
    return out


def _tokens(r: dict[str, Any]) -> int:
    return len(r["output_ids"])


def summarize(system: System, pairs: Sequence[dict[str, Any]], k: int, max_new_tokens: int) -> dict[str, Any]:
    """A draft's pooled figures over its prompts, each with its 95% bootstrap interval over prompts."""
    spec = [p["draft"] for p in pairs]
    alone = [p["target"] for p in pairs]
    counts = [p["draft"]["counts"] for p in pairs]
    drafts, drafted, accepted = (sum(c[key] for c in counts) for key in ("drafts", "drafted", "accepted"))
    positions = [sum(c["per_position"][j] for c in counts) for j in range(k)]
    cols: dict[str, list[float]] = {
        "a": [c["accepted"] for c in counts],
        "d": [c["drafted"] for c in counts],
        "r": [c["drafts"] for c in counts],
        "n": [_tokens(r) for r in spec],
        "f": [1 + c["drafts"] for c in counts],  # target forwards: the prefill, then one per verify round
        "ws": [r["wall_s"] for r in spec],
        "nt": [_tokens(r) for r in alone],
        "wt": [r["wall_s"] for r in alone],
        "ms": [_tokens(r) - 1 for r in spec],
        "ds": [r["decode_s"] for r in spec],
        "mt": [_tokens(r) - 1 for r in alone],
        "dt": [r["decode_s"] for r in alone],
        **{f"p{j}": [c["per_position"][j] for c in counts] for j in range(k)},
    }
    clipped = [counted_as_distill(r, max_new_tokens) for r in spec]
    cols["ca"], cols["cd"] = [a for a, _ in clipped], [d for _, d in clipped]
    same = sum(s["output_ids"] == t["output_ids"] for s, t in zip(spec, alone))
    agree = sum(p["draft"]["request_counts"]["accepted"] == p["draft"]["counts"]["accepted"] for p in pairs)
    return {
        "path": system.path,
        "draft_sample_method": system.method,
        "prompts": len(pairs),
        "drafts": drafts,
        "drafted": drafted,
        "accepted": accepted,
        "per_position_accepted": positions,
        "acceptance": bootstrap(cols, ratio("a", "d")).to_dict() if drafted else None,
        "per_position": [bootstrap(cols, ratio(f"p{j}", "r")).to_dict() for j in range(k)] if drafts else None,
        "acceptance_counted_as_distill": bootstrap(cols, ratio("ca", "cd")).to_dict() if sum(cols["cd"]) else None,
        "tokens_per_target_forward": bootstrap(cols, ratio("n", "f")).to_dict(),
        "end_to_end_speedup": bootstrap(cols, ratio_of_ratios("n", "ws", "nt", "wt")).to_dict(),
        "decode_speedup": bootstrap(cols, ratio_of_ratios("dt", "mt", "ds", "ms")).to_dict(),  # TPOT alone / TPOT with the draft
        "ttft_s": sum(r["ttft_s"] for r in spec) / len(spec),
        "tpot_s": sum(cols["ds"]) / max(1, sum(cols["ms"])),
        "tokens_per_s": sum(cols["n"]) / sum(cols["ws"]),
        "identical_outputs": same,
        "request_counts_agree": agree,
    }


def summarize_target(pairs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The target alone's figures over the prompts of every draft's timing run."""
    alone = [p["target"] for p in pairs]
    return {
        "requests": len(alone),
        "ttft_s": sum(r["ttft_s"] for r in alone) / len(alone),
        "tpot_s": sum(r["decode_s"] for r in alone) / max(1, sum(_tokens(r) - 1 for r in alone)),
        "tokens_per_s": sum(_tokens(r) for r in alone) / sum(r["wall_s"] for r in alone),
    }


def paired(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Acceptance of `a` minus `b` over the same prompts (vLLM's counters), with its 95% interval."""
    cols = {
        "a1": [p["draft"]["counts"]["accepted"] for p in a],
        "d1": [p["draft"]["counts"]["drafted"] for p in a],
        "a0": [p["draft"]["counts"]["accepted"] for p in b],
        "d0": [p["draft"]["counts"]["drafted"] for p in b],
    }
    iv = bootstrap(cols, difference(ratio("a1", "d1"), ratio("a0", "d0")))
    return {**iv.to_dict(), "outside_noise": iv.excludes(0.0)}


def comparisons(pairs: dict[str, list[dict[str, Any]]], reference: str, ours: dict[str, Any] | None, ours_names: dict[str, str | None]) -> list[dict[str, Any]]:
    """Every draft's acceptance minus the reference's in vLLM, paired over the same prompts, beside this
    project's decoder's paired difference for the same two drafts (from `ours`): the served-versus-offline check."""
    out = []
    for name, rows in pairs.items():
        if name == reference:
            continue
        served = paired(rows, pairs[reference])
        mine = ours_difference(ours, ours_names.get(name), ours_names.get(reference))
        out.append(
            {"draft": name, "reference": reference, "vllm": served, "ours": mine, "vllm_minus_ours": None if mine is None else served["value"] - mine["value"]}
        )
    return out


def refusal(settings: Settings, system: System, launch: Launcher) -> dict[str, Any] | None:
    """None when this project's check of vLLM's rule passes; else its one line, and vLLM's own message when
    the engine is started anyway (recorded, so the two can be compared)."""
    check = check_vllm(describe_model(system.path), describe_model(settings.target), repo=system.path, k=settings.num_draft_tokens)
    if check.ok:
        return None
    line = f"distill: vLLM would refuse draft {system.name}: {check.reason}"
    print(line, file=sys.stderr)
    try:
        launch(settings.engine(system.path, system.method)).close()
        theirs = None
    except EngineError as err:
        theirs = str(err)
    return {"distill": line, "vllm": theirs}


def _slim(pair: dict[str, Any]) -> dict[str, Any]:
    """A journalled pair as the report keeps it: counts and timings, without the token ids (the journal has them)."""
    drop = ("output_ids", "per_step_accepted", "per_step_drafted")
    return {
        "prompt": pair.get("prompt"),
        "run_id": pair.get("run_id"),
        "same_output": pair["draft"]["output_ids"] == pair["target"]["output_ids"],
        **{side: {key: v for key, v in pair[side].items() if key not in drop} | {"tokens": _tokens(pair[side])} for side in ("target", "draft")},
    }


def bench(
    engines: Engines,
    systems: Sequence[System],
    prompts: Sequence[Prompt],
    *,
    journal: Journal,
    load: MachineLoad,
    refused: dict[str, dict[str, Any]],
    block: int = 1,
) -> dict[str, list[dict[str, Any]]]:
    """Every draft on every prompt, interleaved with the target alone in blocks of `block` prompts (one
    timing run per draft); each pair is journalled as its block finishes, and a pair already journalled is
    reused. Drafts in `refused` are skipped."""
    out: dict[str, list[dict[str, Any]]] = {}
    for system in systems:
        if system.name in refused:
            continue
        key = {p.id: f"{system.name}|{prompt_key(p.id, p.text)}" for p in prompts}
        todo = [p for p in prompts if journal.latest(key[p.id]) is None]
        for start in range(0, len(todo), block):
            for pair in measure_block(engines, system, todo[start : start + block]):
                journal.add(key[pair["prompt"]], {**pair, "machine_load": load.report()})
            print(f"{system.name}: {min(start + block, len(todo))}/{len(todo)} prompts measured", file=sys.stderr)
        engines.close_draft()
        out[system.name] = [journal.latest(key[p.id]) for p in prompts]
    return out


def concurrency_row(reply: dict[str, Any], prompts: Sequence[Prompt], k: int) -> dict[str, Any]:
    """One system at one concurrency: output tokens/s over the whole call, per-request TPOT, acceptance from
    vLLM's per-request counts (the counters are shared by the requests in flight), tokens per round."""
    results = reply["results"]
    for r, p in zip(results, prompts):
        if (problem := prompt_mismatch(p, "vLLM's tokenizer and chat template", r["prompt_ids"])) is not None:
            raise EngineError(problem)
    tokens = [_tokens(r) for r in results]
    counts = [request_counts(r, k) for r in results]
    drafted, accepted, rounds = sum(c.drafted for c in counts), sum(c.accepted for c in counts), sum(c.drafts for c in counts)
    total = counts_of(reply)
    return {
        "wall_s": reply["wall_s"],
        "tokens": sum(tokens),
        "tokens_per_s": sum(tokens) / reply["wall_s"],
        "tpot_s": sum(r["decode_s"] for r in results) / max(1, sum(t - 1 for t in tokens)),
        "tpot_per_request": [r["decode_s"] / max(1, t - 1) for r, t in zip(results, tokens)],
        "ttft_s": sum(r["ttft_s"] for r in results) / len(results),
        "drafted": drafted,
        "accepted": accepted,
        "rounds": rounds,
        "acceptance": accepted / drafted if drafted else None,
        "counters": total.to_dict(),
        "round_s": sum(r["decode_s"] for r in results) / rounds if rounds else None,
        "tokens_per_round": (sum(tokens) - len(tokens)) / rounds if rounds else None,
    }


def bench_concurrency(
    engines: Engines, systems: Sequence[System], prompts: Sequence[Prompt], levels: Sequence[int], *, journal: Journal, load: MachineLoad
) -> dict[str, Any]:
    """For each draft and each level: the target alone and the draft on all prompts with `level` requests in
    flight (level by level when both engines run at once, else the target at every level first); journalled
    per (draft, level), so a stopped study resumes. Speedups pair the two calls of a level."""
    sampling, k = engines.settings.sampling(), engines.settings.num_draft_tokens
    messages = [p.messages for p in prompts]
    out: dict[str, Any] = {}
    for system in systems:
        key = {c: f"concurrency|{system.name}|{c}|{len(prompts)}" for c in levels}
        todo = [c for c in levels if journal.latest(key[c]) is None]
        alone = {}
        for c in todo if engines.exclusive else []:
            alone[c] = concurrency_row(engines.target().generate(messages, sampling, c), prompts, k)
        for c in todo:
            if c not in alone:
                alone[c] = concurrency_row(engines.target().generate(messages, sampling, c), prompts, k)
            spec = concurrency_row(engines.draft(system).generate(messages, sampling, c), prompts, k)
            journal.add(key[c], {"target": alone[c], "draft": spec, "machine_load": load.report()})
            print(f"{system.name}: concurrency {c} done", file=sys.stderr)
        engines.close_draft()
        out[system.name] = {str(c): cost_terms(journal.latest(key[c])["target"], journal.latest(key[c])["draft"]) for c in levels}
    return out


def cost_terms(alone: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The speed model at one concurrency: the speedup is tokens per round over what a round costs in target
    steps (a round's time over the target alone's time per token, both per request at that concurrency)."""
    cost = spec["round_s"] / alone["tpot_s"] if spec.get("round_s") and alone["tpot_s"] else None
    return {
        "target": alone,
        "draft": spec,
        "speedup": spec["tokens_per_s"] / alone["tokens_per_s"],
        "tpot_speedup": alone["tpot_s"] / spec["tpot_s"] if spec["tpot_s"] else None,
        "round_cost_in_target_steps": cost,
        "predicted_decode_speedup": spec["tokens_per_round"] / cost if cost and spec.get("tokens_per_round") else None,
    }


def crossover(study: dict[str, Any]) -> dict[str, int | None]:
    """Per draft, the lowest concurrency at which it no longer pays (throughput ≤ the target alone's), None if it always pays."""
    return {name: next((int(c) for c, row in rows.items() if row["speedup"] <= 1.0), None) for name, rows in study.items()}


# --- rendering --------------------------------------------------------------------------------------------

HEADER = [
    "system",
    "acceptance (vLLM)",
    "counted as distill",
    "per position",
    "tokens / target forward",
    "end-to-end speedup",
    "decode speedup",
    "TTFT s",
    "TPOT ms",
    "same output as target alone",
    "acceptance (distill decoder)",
]
COMPARISON_HEADER = ["difference", "vLLM", "distill decoder", "vLLM − distill"]
CONCURRENCY_HEADER = [
    "draft",
    "requests in flight",
    "tokens/s alone",
    "tokens/s with draft",
    "speedup",
    "TPOT ms alone → with",
    "acceptance",
    "tokens / round",
    "round cost (target steps)",
]
REFUSAL_HEADER = ["draft", "this project's line", "vLLM's message"]


def _cell(iv: dict[str, Any] | None, fmt: str = ".3f", suffix: str = "") -> str:
    return "–" if iv is None else format_interval(iv, fmt, suffix)


def rows(report: dict[str, Any]) -> list[list[Any]]:
    t = report["target_only"]
    out = [[TARGET, "–", "–", "–", "1.00", "1.00×", "1.00×", f"{t['ttft_s']:.2f}", f"{t['tpot_s'] * 1e3:.0f}", "–", "–"]]
    for name, d in report["drafts"].items():
        ours = d.get("ours") or {}
        mine = "–" if ours.get("acceptance") is None else f"{ours['acceptance']:.3f}" + (" (other settings)" if ours.get("settings_differ") else "")
        out.append(
            [
                name,
                _cell(d["acceptance"]) + f" ({d['accepted']}/{d['drafted']})",
                _cell(d.get("acceptance_counted_as_distill")),
                " / ".join(f"{p['value']:.2f}" for p in d["per_position"] or []) or "–",
                _cell(d["tokens_per_target_forward"], ".2f"),
                _cell(d["end_to_end_speedup"], ".2f", "×"),
                _cell(d["decode_speedup"], ".2f", "×"),
                f"{d['ttft_s']:.2f}",
                f"{d['tpot_s'] * 1e3:.0f}",
                f"{d['identical_outputs']}/{d['prompts']}",
                mine,
            ]
        )
    return out


def comparison_rows(report: dict[str, Any]) -> list[list[Any]]:
    return [
        [
            f"{c['draft']} − {c['reference']}",
            difference_text(c["vllm"]),
            _cell(c["ours"], "+.3f"),
            "–" if c["vllm_minus_ours"] is None else f"{c['vllm_minus_ours']:+.3f}",
        ]
        for c in report.get("comparisons") or []
    ]


def concurrency_rows(report: dict[str, Any]) -> list[list[Any]]:
    out = []
    for name, levels in (report.get("concurrency") or {}).items():
        for c, row in levels.items():
            t, d = row["target"], row["draft"]
            out.append(
                [
                    name,
                    c,
                    f"{t['tokens_per_s']:.2f}",
                    f"{d['tokens_per_s']:.2f}",
                    f"{row['speedup']:.2f}×",
                    f"{t['tpot_s'] * 1e3:.0f} → {d['tpot_s'] * 1e3:.0f}",
                    "–" if d["acceptance"] is None else f"{d['acceptance']:.3f}",
                    "–" if d["tokens_per_round"] is None else f"{d['tokens_per_round']:.2f}",
                    "–" if row["round_cost_in_target_steps"] is None else f"{row['round_cost_in_target_steps']:.2f}",
                ]
            )
    return out


def refusal_rows(report: dict[str, Any]) -> list[list[Any]]:
    return [[name, r["distill"], r["vllm"] or "(vLLM started it)"] for name, r in (report.get("refused") or {}).items()]


def crossover_text(report: dict[str, Any]) -> str | None:
    found = report.get("crossover")
    if not found:
        return None
    parts = [f"{name}: from {c} request{'s' if c > 1 else ''} in flight" if c else f"{name}: pays at every level measured" for name, c in found.items()]
    return (
        "Where the draft stops paying (throughput with the draft ≤ the target alone's): "
        + "; ".join(parts)
        + ". Speedup = tokens per round ÷ round cost; the round cost is a round's time over the target alone's time per token at "
        "the same concurrency, so it rises as batching makes the target's own steps cheaper per request while the k draft steps "
        "and the (k+1)-token verification of every request in flight grow with the batch."
    )


def table(report: dict[str, Any]) -> str:
    """The report's tables as Markdown (what the command prints without --docs)."""
    parts = [markdown_table(HEADER, rows(report))] if report.get("drafts") else []
    for header, body in ((COMPARISON_HEADER, comparison_rows(report)), (CONCURRENCY_HEADER, concurrency_rows(report)), (REFUSAL_HEADER, refusal_rows(report))):
        if body:
            parts.append(markdown_table(header, body))
    if text := crossover_text(report):
        parts.append(text)
    return "\n\n".join(parts)


def docs_blocks(report: dict[str, Any]) -> list[Block]:
    st, env = report["settings"], report["vllm"]
    mode = "greedy" if st["temperature"] == 0 else f"sampled at T = {st['temperature']} (top-p {st['top_p']}, seed {st['seed']} + prompt index)"
    cpu = report["cpu"]
    interleaving = (
        "interleaved prompt by prompt (both engines running)"
        if st.get("block", 1) == 1
        else f"interleaved in blocks of {st['block']} prompts (one engine at a time: two do not fit in memory here)"
    )
    blocks: list[Block] = [
        f"vLLM {env.get('vllm') or '(version unknown)'} (CPU build, its own environment: torch {env.get('torch')}, transformers "
        f"{env.get('transformers')}), target `{Path(st['target']).name}` in {st['dtype']} on {cpu['name']} ({cpu['bf16']}); "
        f"{st['num_prompts']} GSM8K prompts from `{Path(st['data_file']).name}` (the first {st['num_prompts']} of the seed-{st['data_seed']} "
        f"shuffle `distill accept` draws, rendered by vLLM's chat template, every prompt's ids checked equal to this project's), ≤ "
        f"{st['max_new_tokens']} tokens, {mode}, `draft_model` with {st['num_draft_tokens']} draft tokens a round. Acceptance is vLLM's own "
        "counters (`vllm:spec_decode_num_accepted_tokens` / `..._num_draft_tokens`, read before and after each prompt); per position "
        "is `..._num_accepted_tokens_per_pos` / `..._num_drafts`. vLLM drafts k tokens every round and counts accepted ones past "
        "the length limit too; \"counted as distill\" recounts each request's rounds (vLLM's per-request counts) as the distill "
        "decoder does, proposing at most what the limit leaves; one timing run per draft, one request at a time, the target alone "
        f"and the draft {interleaving}; end-to-end speedup = tokens/s over whole requests, decode speedup = TPOT ratio "
        "(vLLM's first-to-last token timestamps). [low, high] = 95% bootstrap interval over prompts; the distill decoder's figures come "
        "from the `distill accept` report given with --ours, on the same prompts.",
    ]
    if report.get("drafts"):
        blocks.append(table_block(HEADER, rows(report)))
    if body := comparison_rows(report):
        blocks += ["Paired differences on the same prompts (* = the interval excludes 0):", table_block(COMPARISON_HEADER, body)]
    if body := concurrency_rows(report):
        blocks += [
            f"Many requests at once: the same {st['concurrency_prompts']} prompts with that many requests in flight (continuous batching, a new "
            "request as one finishes), the target alone and then the draft at each level; tokens/s = output tokens over the whole call; "
            "acceptance from vLLM's per-request counts; round cost = a round's time over the target alone's time per token.",
            table_block(CONCURRENCY_HEADER, body),
        ]
        if text := crossover_text(report):
            blocks.append(text)
    if body := refusal_rows(report):
        blocks += ["Drafts vLLM refuses beside this target:", table_block(REFUSAL_HEADER, body)]
    return blocks


# --- the command ------------------------------------------------------------------------------------------


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise ValueError(f"--concurrency {text}: expected request counts like 1,2,4,8") from None
    if not levels or min(levels) < 1:
        raise ValueError(f"--concurrency {text}: expected request counts >= 1 like 1,2,4,8")
    return levels


def systems_of(drafts: dict[str, str], methods: Sequence[str]) -> list[System]:
    """One system per draft and draft sampling method (named NAME@method when several are measured)."""
    return [System(name if len(methods) == 1 else f"{name}@{m}", path, m) for name, path in drafts.items() for m in methods]


def fingerprint(args: argparse.Namespace, systems: Sequence[System], vllm_version: str | None) -> str:
    """A hash of everything a timing depends on (the folders' files, the data, the engine settings), so a
    rerun with the same settings resumes and any change starts the journal afresh."""
    keyed = {
        "target": [args.target, file_stamp(Path(args.target))],
        "drafts": {s.name: [s.path, s.method, file_stamp(Path(s.path))] for s in systems},
        "data": file_stamp(Path(args.data_file)),
        "vllm": vllm_version,
        **{
            key: getattr(args, key)
            for key in (
                "seed",
                "max_new_tokens",
                "num_draft_tokens",
                "dtype",
                "temperature",
                "top_p",
                "threads",
                "max_model_len",
                "kv_cache_gib",
                "max_num_batched_tokens",
            )
        },
    }
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/bench_vllm.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="the target's Hugging Face folder (e.g. ~/.cache/distill-real/coder-1.5b, from distill convert-gguf)")
    p.add_argument("--draft", action="append", default=[], help="NAME=FOLDER: a full draft model folder, e.g. what scripts/publish.py wrote (repeatable)")
    p.add_argument("--venv", help="vLLM's environment (default: distill vllm-env's, $DISTILL_VLLM_VENV or ~/.cache/distill/vllm-venv)")
    p.add_argument("--data-file", default=DEFAULT_DATA, help=f"GSM8K JSONL with question/answer (default {DEFAULT_DATA})")
    p.add_argument("--num-prompts", type=int, default=30, help="prompts of the evaluation's seeded GSM8K draw (default 30)")
    p.add_argument(
        "--seed", type=int, default=0, help="the draw's seed, as `distill accept --seed`; with --temperature also vLLM's sampling seed (+ the prompt's index)"
    )
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--num-draft-tokens", "-k", type=int, default=3, help="draft tokens every round (default 3)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="vLLM's dtype for target and draft (greedy identity holds in float32)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument(
        "--draft-sample-methods",
        default="greedy",
        help="vLLM's draft_sample_method values, comma-separated: greedy (argmax proposals, q one-hot; vLLM's default) and/or probabilistic",
    )
    p.add_argument("--concurrency", help="also measure with this many requests in flight, e.g. 1,2,4,8 (the same prompts; see --concurrency-prompts)")
    p.add_argument("--concurrency-prompts", type=int, help="prompts of the concurrency study: the first N of the draw (default: --num-prompts)")
    p.add_argument(
        "--block",
        type=int,
        help="prompts per interleaving block: 1 = prompt by prompt with both engines running; more = one engine at a time, the target "
        "alone on the block's prompts, then the draft (default: 1 when both engines fit in memory, else 5)",
    )
    p.add_argument("--skip-single", action="store_true", help="only the concurrency study (no one-request-at-a-time timing run)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="cores vLLM binds its OpenMP threads to (0..N-1; default: every core)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--kv-cache-gib", type=float, default=0.5, help="KV cache per engine in GiB (vLLM's default claims 90%% of RAM)")
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=512,
        help="tokens one engine step may hold (longer prompts are prefilled in chunks); it sizes vLLM's logits buffer, "
        "1.2 GB per 2,048 tokens at Qwen2.5's 151,936 rows, and two engines (the target alone and with a draft) share the memory",
    )
    p.add_argument("--tokenizer", help="the tokenizer prompts are checked against (default: the target's)")
    p.add_argument("--ours", help="a `distill accept` JSON on the same prompts and dtype: this project's decoder's acceptance beside vLLM's")
    p.add_argument("--reference", help="the draft every other is compared with, paired over the prompts (default: the first)")
    p.add_argument(
        "--json", default="vllm-report.json", help="the report (default vllm-report.json); its journal NAME.records.jsonl beside it resumes a stopped run"
    )
    p.add_argument("--docs", help="also write the --section section of this Markdown file (docs/benchmarks.md), its report in results/ beside it")
    p.add_argument("--section", default="bench_vllm", help="the section of --docs and its results/NAME.json (default bench_vllm)")
    return p


def _check(args: argparse.Namespace) -> None:
    """Bad input, said in one line before any engine starts."""
    if args.num_draft_tokens < 1 or args.num_prompts < 1 or (args.block is not None and args.block < 1):
        raise ValueError("--num-draft-tokens, --num-prompts and --block must be >= 1")
    if not args.draft:
        raise ValueError("no --draft given: name at least one, e.g. --draft base=~/.cache/distill-real/coder-0.5b")
    if not (Path(args.target) / "config.json").is_file():
        raise ValueError(f"--target {args.target}: not a Hugging Face model folder (no config.json); convert a .gguf with distill convert-gguf")
    for spec in args.draft:
        path = Path(os.path.expanduser(spec.partition("=")[2]))
        if (path / "adapter_config.json").is_file():
            raise ValueError(f"--draft {spec}: a LoRA adapter; vLLM serves full drafts: merge it with python scripts/publish.py RUN --out DIR")
        if not (path / "config.json").is_file():
            raise ValueError(f"--draft {spec}: not a model folder (no config.json); a training output is served once published (scripts/publish.py)")
    bad = [m for m in args.draft_sample_methods.split(",") if m not in ("greedy", "probabilistic")]
    if bad:
        raise ValueError(f"--draft-sample-methods {','.join(bad)}: choose from greedy, probabilistic")


def main(argv: Sequence[str] | None = None, launcher: Launcher | None = None) -> int:
    """scripts/bench_vllm.py; 0 also when vLLM's environment is absent (skipped, said why), 2 on bad input."""
    args = parser().parse_args(argv)
    venv = Path(args.venv).expanduser() if args.venv else default_venv()
    env = {"vllm": "stand-in"} if launcher is not None else ready(venv)
    if env is None:
        print(f"bench_vllm: skipped: no vLLM environment at {venv}; make it with `distill vllm-env` (then pass --venv if elsewhere)")
        return 0
    started = time.time()
    load = MachineLoad().start()
    try:
        args.target = os.path.expanduser(args.target)
        _check(args)
        levels = parse_levels(args.concurrency) if args.concurrency else []
        systems = systems_of(parse_drafts(args.draft, "a full model folder"), args.draft_sample_methods.split(","))
        ours = json.loads(Path(args.ours).read_text()) if args.ours else None
        tokenizer = load_tokenizer(args.tokenizer or args.target)
        prompts = gsm8k_prompts(tokenizer, args.data_file, max(args.num_prompts, args.concurrency_prompts or 0), args.seed)
    except (ValueError, FileNotFoundError, ModelLoadError) as err:
        print(f"bench_vllm: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    settings = Settings(
        target=args.target,
        dtype=args.dtype,
        num_draft_tokens=args.num_draft_tokens,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        max_model_len=args.max_model_len,
        kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)),
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=max([1, *levels]),
        tokenizer=args.tokenizer,
    )
    json_path = Path(args.json)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    launch = launcher or worker_launcher(venv, args.threads, json_path.with_suffix(".vllm.log"), load)
    journal = Journal(journal_path(json_path), fingerprint(args, systems, env.get("vllm")), prog="bench_vllm")
    command = shlex.join(["python", "scripts/bench_vllm.py", *(sys.argv[1:] if argv is None else argv)])
    journal.begin(dataclasses.replace(Run.begin("cpu", command), torch_threads=args.threads))
    block = args.block or (1 if two_engines_fit(settings, systems) else 5)
    engines = Engines(launch, settings, exclusive=block > 1)
    refused: dict[str, dict[str, Any]] = {}
    try:
        for system in systems:
            if (r := refusal(settings, system, launch)) is not None:
                refused[system.name] = r
        single = {} if args.skip_single else bench(engines, systems, prompts[: args.num_prompts], journal=journal, load=load, refused=refused, block=block)
        served = [s for s in systems if s.name not in refused]
        study = (
            bench_concurrency(engines, served, prompts[: args.concurrency_prompts or args.num_prompts], levels, journal=journal, load=load) if levels else {}
        )
    except EngineError as err:
        print(f"bench_vllm: error: vLLM: {' '.join(str(err).split())} (its log: {json_path.with_suffix('.vllm.log')})", file=sys.stderr)
        return 1
    finally:
        engines.close()
    journal.end(load.stop().report())
    mode = "greedy" if args.temperature == 0 else "sampling"
    drafts, ours_names = {}, {}
    for system in systems:
        if system.name not in single:
            continue
        drafts[system.name] = summarize(system, single[system.name], args.num_draft_tokens, args.max_new_tokens)
        base_name = system.name.split("@")[0]
        drafts[system.name]["ours"] = ours_acceptance(ours, base_name, args.num_draft_tokens, args.num_prompts, args.max_new_tokens, mode, args.dtype)
        ours_names[system.name] = (drafts[system.name]["ours"] or {}).get("draft")
    reference = args.reference or next(iter(single), None)
    if reference is not None and reference not in single:
        print(f"bench_vllm: error: --reference {reference}: no such measured draft; choose from {', '.join(single)}", file=sys.stderr)
        return 2
    runs = {run_id: journal.run_with_load(run_id) for run_id in {r["run_id"] for rows in single.values() for r in rows} | {journal.run.run_id}}
    busy = busiest(runs.values())
    report = {
        "settings": {
            "target": args.target,
            "drafts": {s.name: s.path for s in systems},
            "num_prompts": args.num_prompts,
            "concurrency_prompts": args.concurrency_prompts or args.num_prompts,
            "data_seed": args.seed,
            "seed": args.seed,
            "data_file": args.data_file,
            "max_new_tokens": args.max_new_tokens,
            "num_draft_tokens": args.num_draft_tokens,
            "dtype": args.dtype,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "draft_sample_methods": args.draft_sample_methods.split(","),
            "concurrency": levels,
            "threads": args.threads,
            "max_model_len": args.max_model_len,
            "kv_cache_gib": args.kv_cache_gib,
            "block": block,
            "engines_at_once": 1 if block > 1 else 2,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "mode": mode,
        },
        "vllm": {**env, "venv": str(venv)},
        "cpu": cpu_record(),
        "environment": versions(("distill", "transformers")),
        "seconds": round(time.time() - started, 1),
        "machine_load": busy,
        "runs": runs,
        "target_only": summarize_target([p for rows in single.values() for p in rows]) if single else None,
        "drafts": drafts,
        "comparisons": comparisons(single, reference, ours, ours_names) if reference else [],
        "refused": refused,
        "concurrency": study,
        "crossover": crossover(study) if study else None,
        "records": {name: [_slim(p) for p in rows] for name, rows in single.items()},
    }
    write_json(json_path, report)
    if args.docs:
        title = f"vLLM's draft_model speculative decoding with the drafts, target {Path(args.target).name}, {args.dtype}"
        write_benchmark(args.section, title, command, docs_blocks(report), args.docs, busy, "bench_vllm")
    else:
        print(f"{table(report)}\n\n{describe(busy)}")
        warn(busy, "bench_vllm")
    print(f"wrote {json_path}")
    return 0
