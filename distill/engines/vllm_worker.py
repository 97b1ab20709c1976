"""The process that drives vLLM, run by vLLM's own Python (`distill vllm-env` makes it) and by no other.

vLLM pins its own torch and transformers, so this file imports nothing from distill: `distill.engines.vllm`
starts it as `VENV/bin/python vllm_worker.py CONFIG_JSON` and talks to it in JSON lines, its replies on
stdout prefixed by `REPLY` (vLLM logs there too). It starts one `vllm.LLM` (the target alone, or with a
draft under `draft_model` speculative decoding), then answers each request line until `{"op": "quit"}`:

- `{"op": "generate", "prompts": [[messages], ...], "sampling": {...}, "concurrency": C}`: renders every
  prompt with vLLM's own tokenizer and chat template, keeps C requests in flight (a new one starts as one
  finishes) and replies with each request's prompt ids, output ids, timestamps and speculative counts,
  and vLLM's cumulative metrics read before and after (the host takes the differences).

A configuration vLLM refuses (e.g. a draft of another vocabulary size) is answered with vLLM's own message,
`{"error": ...}`, and exit 3. The engine spawns a process of its own, hence the `__main__` guard.
"""

import json
import os
import sys
import time
import traceback

# Run by path, this file's folder leads sys.path, and distill/engines/vllm.py would shadow vLLM itself.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

REPLY = "@@distill-vllm "
SPEC_METRICS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def reply(obj):
    sys.stdout.write(REPLY + json.dumps(obj) + "\n")
    sys.stdout.flush()


def tree_cpu_s():
    """CPU seconds used so far by this process and the engine processes it started (the host counts them as its own)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def metrics(llm):
    """vLLM's speculative counters as plain values (cumulative since the engine started)."""
    out = {}
    for m in llm.get_metrics():
        if m.name in SPEC_METRICS:
            out[m.name] = out.get(m.name, 0) + m.value
        elif m.name == PER_POSITION:
            old = out.get(m.name) or [0] * len(m.values)
            out[m.name] = [a + b for a, b in zip(old, m.values)]
    return out


def make_llm(config):
    from vllm import LLM

    spec = None
    if config.get("draft"):
        spec = {
            "model": config["draft"],
            "method": "draft_model",
            "num_speculative_tokens": config["num_draft_tokens"],
            "draft_sample_method": config.get("draft_sample_method") or "greedy",
        }
    return LLM(
        model=config["model"],
        tokenizer=config.get("tokenizer") or config["model"],
        dtype=config["dtype"],
        max_model_len=config["max_model_len"],
        max_num_seqs=config["max_num_seqs"],
        max_num_batched_tokens=config.get("max_num_batched_tokens"),
        kv_cache_memory_bytes=config["kv_cache_memory_bytes"],
        disable_log_stats=False,
        enforce_eager=config.get("enforce_eager", True),
        seed=config.get("seed", 0),
        speculative_config=spec,
        **({"per_request_spec_decode_metrics": "detailed"} if spec else {}),
    )


def record(out, started, finished):
    """One finished request: ids, vLLM's own timestamps and its per-request speculative counts."""
    completion = out.outputs[0]
    m = out.metrics
    spec = getattr(completion, "spec_decode_metrics", None)
    return {
        "prompt_ids": list(out.prompt_token_ids),
        "output_ids": list(completion.token_ids),
        "finish_reason": completion.finish_reason,
        "wall_s": finished - started,
        "ttft_s": None if m is None else m.first_token_latency,
        "decode_s": None if m is None else m.last_token_ts - m.first_token_ts,
        "queued_s": None if m is None else m.scheduled_ts - m.queued_ts,
        "per_step_accepted": None if spec is None else list(spec.per_step_accepted),
        "per_step_drafted": None if spec is None else list(spec.per_step_drafted),
    }


def generate(llm, request):
    """Keep `concurrency` requests in flight over `prompts`; each result in prompt order."""
    from vllm import SamplingParams

    tokenizer = llm.get_tokenizer()
    texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in request["prompts"]]
    s = request["sampling"]
    engine = llm.llm_engine
    pending = list(range(len(texts)))
    started, results = {}, [None] * len(texts)
    before = metrics(llm)
    t0 = time.perf_counter()

    def add(i):
        params = SamplingParams(
            temperature=s["temperature"],
            top_p=s.get("top_p", 1.0),
            max_tokens=s["max_tokens"],
            seed=None if s.get("seed") is None else s["seed"] + i,
            ignore_eos=False,
        )
        started[i] = time.perf_counter()
        engine.add_request(str(i), texts[i], params)

    while pending and len(started) < request["concurrency"]:
        add(pending.pop(0))
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                i = int(out.request_id)
                results[i] = record(out, started[i], time.perf_counter())
                if pending:
                    add(pending.pop(0))
    wall = time.perf_counter() - t0
    return {"results": results, "counters_before": before, "counters_after": metrics(llm), "wall_s": wall}


def main():
    config = json.loads(sys.argv[1])
    try:
        import vllm

        llm = make_llm(config)
    except Exception as err:  # vLLM's own refusal, whatever its type: the host records it as said
        reply({"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc(limit=3)})
        return 3
    reply({"ready": {"vllm": vllm.__version__, "vocab_size": llm.llm_engine.model_config.get_vocab_size()}, "cpu_s": tree_cpu_s()})
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "quit":
            break
        try:
            reply({**generate(llm, request), "cpu_s": tree_cpu_s()})
        except Exception as err:
            reply({"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc(limit=5)})
            return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
