"""The static-cache loop (distill.speculative.static): token for token the eager loop's output and
decisions in fp32, its round steps free of host synchronisation (what CUDA graph capture needs),
the backend choice, and the prepared GPU check's CPU dry run."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import distill.speculative.decoder as decoder_module
from batches import left_padded_batch
from distill.common.tiny import tiny_qwen2
from distill.speculative import SpeculativeDecoder
from distill.speculative.costs import measure_costs_static
from distill.speculative.loop import SpecLoop, target_only_generate

REPO = Path(__file__).resolve().parents[2]
DECISIONS = ("proposed", "accepted", "rounds", "new_tokens", "target_forwards", "sequence_forwards", "position_proposed", "position_accepted")


def _both(target, draft, enc, **kwargs):
    gen = dict(max_new_tokens=kwargs.pop("max_new_tokens", 24), **{k: kwargs.pop(k) for k in ("eos_token_id", "pad_token_id") if k in kwargs})
    eager = SpeculativeDecoder(target, draft, backend="eager", **kwargs).generate(enc["input_ids"], enc["attention_mask"], **gen)
    static = SpeculativeDecoder(target, draft, backend="static", **kwargs).generate(enc["input_ids"], enc["attention_mask"], **gen)
    return eager, static


@pytest.mark.parametrize("draft_kind", ["noisy", "small"])
@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_static_equals_eager_token_for_token(pair, tokenizer, examples, draft_kind, k, batch_size):
    target, drafts = pair
    enc = left_padded_batch(tokenizer, examples, batch_size)
    assert batch_size == 1 or (enc["attention_mask"] == 0).any(), "the batch must be left-padded"
    eager, static = _both(target, drafts[draft_kind], enc, num_draft_tokens=k)
    assert static.sequences.tolist() == eager.sequences.tolist()
    # Same decisions, round by round: the static loop is the eager loop on other caches.
    assert {n: getattr(static.stats, n) for n in DECISIONS} == {n: getattr(eager.stats, n) for n in DECISIONS}
    if draft_kind == "noisy":
        assert 0 < static.stats.acceptance_rate < 1


def test_ids_past_the_drafts_embedding_are_fed_safely(tokenizer, examples):
    """Target padded +32 rows, draft +8 (7B vs 0.5B): the target emits padding-row ids the draft
    cannot embed, and the static loop must still match the eager one."""
    target = tiny_qwen2(len(tokenizer) + 32, tokenizer=tokenizer, seed=5, tie_word_embeddings=False, initializer_range=0.3)
    draft = tiny_qwen2(len(tokenizer) + 8, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, tokenizer=tokenizer, seed=6)
    enc = left_padded_batch(tokenizer, examples, 2)
    eager, static = _both(target, draft, enc, num_draft_tokens=3, max_new_tokens=30, tokenizer=tokenizer, draft_tokenizer=tokenizer)
    assert (static.sequences >= len(tokenizer) + 8).any(), "the case needs a target that emits ids past the draft's rows"
    assert static.sequences.tolist() == eager.sequences.tolist()


def test_eos_inside_an_accepted_block_stops_there(pair, tokenizer, examples):
    target, drafts = pair
    enc = left_padded_batch(tokenizer, examples, 3)
    free = target.generate(**enc, max_new_tokens=20, do_sample=False)
    prompt_len = enc["input_ids"].shape[1]
    eos = int(free[0, prompt_len + 5])  # emitted by row 0 inside a fully accepted block of k = 6
    expected = target.generate(**enc, max_new_tokens=20, do_sample=False, eos_token_id=eos, pad_token_id=0)
    eager, static = _both(target, drafts["self"], enc, num_draft_tokens=6, max_new_tokens=20, eos_token_id=eos, pad_token_id=0)
    assert static.sequences.tolist() == expected.tolist() == eager.sequences.tolist()
    row0 = static.sequences[0, prompt_len:].tolist()
    assert row0.index(eos) <= 5 and all(t == 0 for t in row0[row0.index(eos) + 1 :])


def test_a_finished_row_no_longer_holds_the_batch_back(pair, tokenizer, examples):
    target, drafts = pair
    enc = left_padded_batch(tokenizer, examples, 3)
    free = target.generate(**enc, max_new_tokens=30, do_sample=False)
    eos = int(free[0, enc["input_ids"].shape[1] + 3])  # row 0 ends early; the others go on
    eager, static = _both(target, drafts["noisy"], enc, num_draft_tokens=4, max_new_tokens=30, eos_token_id=eos, pad_token_id=0)
    assert static.sequences.tolist() == eager.sequences.tolist()
    assert {n: getattr(static.stats, n) for n in DECISIONS} == {n: getattr(eager.stats, n) for n in DECISIONS}


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 13])
def test_max_new_tokens_inside_a_block_is_never_overshot(pair, tokenizer, examples, max_new_tokens):
    target, drafts = pair
    enc = left_padded_batch(tokenizer, examples, 2)
    expected = target.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
    decoder = SpeculativeDecoder(target, drafts["self"], num_draft_tokens=5, backend="static")
    out = decoder.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=max_new_tokens)
    assert out.sequences.tolist() == expected.tolist()
    assert out.sequences.shape[1] == enc["input_ids"].shape[1] + max_new_tokens
    if max_new_tokens > 1:
        # The last round emits fewer than k + 1 tokens but runs the k = 5 steps: no step of another
        # k, hence no CUDA graph captured just for the end of a generation.
        assert decoder._loops["static"].steps == {("draft", 5, False), ("verify", 5, False)}


@pytest.mark.parametrize("draft_kind", ["noisy", "self", "small"])
def test_adaptive_k_is_supported_and_identical(pair, tokenizer, examples, draft_kind):
    target, drafts = pair
    enc = left_padded_batch(tokenizer, examples, 1)
    eager, static = _both(target, drafts[draft_kind], enc, num_draft_tokens=3, schedule="adaptive", max_new_tokens=40)
    assert static.sequences.tolist() == eager.sequences.tolist()
    if draft_kind == "self":  # all accepted: k grows past its start
        assert len(static.stats.position_proposed) > 3
    if draft_kind == "small":  # nothing accepted: k falls to 1
        assert static.stats.position_proposed[1] < static.stats.position_proposed[0]


def test_buffers_are_reused_across_calls_and_reallocated_when_too_small(pair, tokenizer, examples):
    target, drafts = pair
    decoder = SpeculativeDecoder(target, drafts["noisy"], num_draft_tokens=3, backend="static")
    enc = left_padded_batch(tokenizer, examples, 2)
    first = decoder.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=10).sequences
    cache = decoder._loops["static"].tside.cache
    again = decoder.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=10).sequences
    assert decoder._loops["static"].tside.cache is cache and again.tolist() == first.tolist()
    longer = decoder.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=300)
    assert decoder._loops["static"].tside.cache is not cache
    assert longer.sequences.tolist() == target.generate(**enc, max_new_tokens=300, do_sample=False).tolist()


def test_target_only_generate_is_target_greedy(pair, tokenizer, examples):
    target, _ = pair
    ids = left_padded_batch(tokenizer, examples, 2)["input_ids"][1:]
    out = target_only_generate(target, ids, 20, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    assert out.sequences.tolist() == target.generate(ids, max_new_tokens=20, do_sample=False).tolist()
    assert out.stats.target_forwards == out.stats.new_tokens and out.stats.proposed == 0


def test_measure_costs_static_times_every_step(pair):
    target, drafts = pair
    costs = measure_costs_static(target, drafts["small"], ks=[1, 4], prompt_len=8, repeats=2, warmup=1)
    assert sorted(costs.v) == [1, 4] and costs.target_step_s > 0 and costs.c == pytest.approx(costs.draft_step_s / costs.target_step_s)
    assert costs.c_first > 0  # the two-token first draft step of a round
    with pytest.raises(ValueError, match="ks"):
        measure_costs_static(target, drafts["small"], ks=[0])


# --- graph capture: what torch allows on a CPU ---------------------------------------------


def _dynamo_fullgraph(fn):
    """Trace fn as one graph (no breaks): a break is exactly what a host sync (.item(), .tolist(),
    data-dependent Python branching) causes, and what CUDA graph capture cannot contain."""
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="eager")


def test_round_steps_trace_as_one_graph_with_no_host_sync(pair, tokenizer, examples):
    """CUDA graphs need a CUDA device; what can be checked here is that the draft steps and the
    verify step are single graphs (dynamo fullgraph) and that the traced round computes the same."""
    target, drafts = pair
    enc = left_padded_batch(tokenizer, examples, 2)
    loop = SpecLoop.for_decoder(SpeculativeDecoder(target, drafts["noisy"], num_draft_tokens=3, backend="static"), "static")
    loop.generate(enc["input_ids"], enc["attention_mask"], 6, [], 0)  # fills the buffers mid-generation
    saved = [t.clone() for t in loop._state()]

    def round_():
        loop._draft_steps(3)
        loop._verify(3)

    with torch.inference_mode():
        round_()
        eager = [t.clone() for t in loop._state()]
        for t, s in zip(loop._state(), saved):
            t.copy_(s)
        _dynamo_fullgraph(round_)()
    assert all(torch.equal(a, b) for a, b in zip(eager, loop._state()))


def test_the_trace_check_catches_a_host_sync():
    """Guards the test above: a step that reads a value on the host must fail the same check."""
    x = torch.ones(3)

    def syncing():
        if x.sum().item() > 0:
            x.add_(1)

    with pytest.raises(Exception, match="(?i)graph break|data-dependent|item"):
        _dynamo_fullgraph(syncing)()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_graphed_loop_equals_eager_on_cuda(pair, tokenizer, examples):
    target, drafts = pair
    target, draft = target.cuda(), drafts["noisy"].cuda()
    try:
        enc = {k: v.cuda() for k, v in left_padded_batch(tokenizer, examples, 3).items()}
        eager = SpeculativeDecoder(target, draft, num_draft_tokens=4, backend="eager").generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=24)
        graphed = SpeculativeDecoder(target, draft, num_draft_tokens=4)  # auto: static + graphs on CUDA
        out = graphed.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=24)
        captured = graphed._loops["static"].captures
        assert captured >= 2 and out.sequences.tolist() == eager.sequences.tolist()
        graphed.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=24)
        assert graphed._loops["static"].captures == captured  # replayed, not captured again
    finally:  # the module's fixtures stay on the CPU for the other tests
        target.cpu()
        draft.cpu()


# --- the compiled draft (backend="compiled", the CPU fast path) ---------------------------------


def test_compiled_backend_emits_the_targets_greedy_tokens_and_compiles_the_draft(pair, tokenizer, examples):
    """The draft's k steps run as one inductor graph; the emitted tokens stay the target's own, and
    the decisions match the static loop's (the compiled draft proposes what the eager one does)."""
    target, drafts = pair
    enc = left_padded_batch(tokenizer, examples, 2)
    torch._dynamo.reset()
    compiled = SpeculativeDecoder(target, drafts["small"], num_draft_tokens=3, backend="compiled")
    out = compiled.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=16)
    static = SpeculativeDecoder(target, drafts["small"], num_draft_tokens=3, backend="static").generate(
        enc["input_ids"], enc["attention_mask"], max_new_tokens=16
    )
    reference = target.generate(**enc, max_new_tokens=16, do_sample=False)
    assert out.sequences.tolist() == static.sequences.tolist() == reference.tolist()
    assert [getattr(out.stats, d) for d in DECISIONS] == [getattr(static.stats, d) for d in DECISIONS]
    loop = compiled._loops["static"]
    assert loop._draft_fn != loop._draft_steps and not loop.graphs_enabled
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # dynamo did compile the draft steps


# --- backend choice and errors ---------------------------------------------------------------


class _Recorder:
    """Stands in for SpecLoop in the decoder's namespace: records which caches were chosen."""

    built: list[str] = []

    @classmethod
    def for_decoder(cls, decoder, cache):
        cls.built.append(cache)
        return SpecLoop.for_decoder(decoder, cache)


def test_auto_picks_eager_on_cpu_and_static_for_greedy_on_cuda(pair, tokenizer, examples, monkeypatch):
    target, drafts = pair
    enc = left_padded_batch(tokenizer, examples, 1)
    monkeypatch.setattr(decoder_module, "SpecLoop", _Recorder)
    _Recorder.built = []
    auto = SpeculativeDecoder(target, drafts["noisy"], num_draft_tokens=2)
    auto.generate(enc["input_ids"], max_new_tokens=5)
    assert _Recorder.built == ["dynamic"]  # CPU: eager
    monkeypatch.setattr(decoder_module, "graphs_available", lambda device: True)  # as on CUDA
    out = auto.generate(enc["input_ids"], max_new_tokens=5)
    assert _Recorder.built == ["dynamic", "static"] and out.sequences.shape[1] == enc["input_ids"].shape[1] + 5
    auto.generate(enc["input_ids"], max_new_tokens=5, do_sample=True, seed=0)  # sampling: static too, built once
    assert _Recorder.built == ["dynamic", "static"]


def test_bad_backends_are_refused(pair, tokenizer, examples):
    target, drafts = pair
    with pytest.raises(ValueError, match="backend must be one of 'eager', 'static', 'compiled', 'auto'"):
        SpeculativeDecoder(target, drafts["noisy"], backend="graphs")
    other = copy.deepcopy(drafts["noisy"])
    other.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        SpeculativeDecoder(target, other, backend="static")
    assert SpeculativeDecoder(target, other).backend == "auto"  # auto falls back instead of failing
    sliding = copy.deepcopy(drafts["small"])
    sliding.config.layer_types = ["sliding_attention"]
    with pytest.raises(ValueError, match="full attention in every layer"):
        SpeculativeDecoder(target, sliding, backend="static")
    with pytest.raises(ValueError, match="CUDA graphs need static caches on a CUDA device"):
        SpecLoop(target, drafts["noisy"], 3, graphs=True)
    with pytest.raises(ValueError, match="num_draft_tokens=0"):
        SpecLoop(target, None, 3)


# --- the prepared GPU check, dry run -----------------------------------------------------------


def test_gpu_check_cpu_smoke_runs_every_stage(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--cpu-smoke", "--deadline-s", "240", "--markdown", str(tmp_path / "b.md")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [s["status"] for s in report["stages"]] == ["ok"] * 7
    assert {r["pair"].split(" vs ")[0] for r in report["identity"]["rows"]} >= {"static speculative (k = 5)"}
    assert all(r["identity_rate"] == 1.0 for r in report["identity"]["rows"])  # fp32: identical
    for mode in ("static", "eager"):
        runs = report["synthetic"][mode]
        assert sorted(r["alpha"] for r in runs) == [0.5, 0.5, 0.6, 0.6, 0.7, 0.7, 0.8, 0.8, 0.9, 0.9]
        assert all(r["greedy_identity"] == 1.0 and r["backend"] == mode for r in runs)
    assert report["check"]["verdict"] in ("PASS", "FAIL") and "informational" in report["check"]["summary"]
    table = proc.stdout[proc.stdout.rindex("## GPU verification loop") :]  # the table comes last
    assert "**Check**" in table and "| 0.5b | 0.9 |" in table
    assert "<!-- gpu_check-smoke -->" in (tmp_path / "b.md").read_text()
