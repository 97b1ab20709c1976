"""`distill memory RECIPE`: training memory per GPU for a recipe at the real model shapes.

The estimate is arithmetic on the parameter counts and the micro-batch's tokens (weights,
gradients, AdamW states, activations, the teacher's logits and one loss chunk), with ZeRO-2/3
dividing what they shard. `--check` measures the per-token terms on this machine's CPU (one
real-width decoder layer, logits at the real vocabulary sizes) and prints measured / estimated,
which is how docs/gpu-plan.md's numbers were checked.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# float32 chunk x vocab tensors alive at the fused loss's peak: student and teacher logits, log-probs,
# probs and their products, the gradient, recomputed in backward (measured 9.9 by `--check`).
LOSS_CHUNK_COPIES = 10
GB = 1e9


def activation_values(hidden: int, intermediate: int) -> int:
    """Values one decoder layer keeps per token for backward: ~6h + 4i (q/k/v/attention/o and the
    norms' inputs; gate, up, their activation and product)."""
    return 6 * hidden + 4 * intermediate


def _attention_widths(cfg: dict[str, Any]) -> tuple[int, int]:
    """Output widths of the query and of each key/value projection."""
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim


def parameter_count(cfg: dict[str, Any]) -> int:
    """Exact parameter count of a Qwen2 causal LM from its config (q/k/v biases, untied or tied head)."""
    h, i, layers, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    q, kv = _attention_widths(cfg)
    layer = (h * q + q) + 2 * (h * kv + kv) + q * h + 3 * h * i + 2 * h
    return v * h * (1 if cfg.get("tie_word_embeddings") else 2) + layers * layer + h


def lora_parameter_count(cfg: dict[str, Any], r: int, modules: Sequence[str]) -> int:
    """Trainable parameters of LoRA rank `r` on `modules` of every decoder layer: r * (in + out) each."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    q, kv = _attention_widths(cfg)
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    return cfg["num_hidden_layers"] * sum(r * sum(shapes[m]) for m in modules)


def estimate(
    recipe: Any, target_cfg: dict[str, Any], draft_cfg: dict[str, Any], *, tokens: int | None = None, world_size: int = 1, zero_stage: int = 0
) -> dict[str, float]:
    """Bytes per GPU of each term of one training step, in order. `tokens` is one micro-batch's
    (default per_device_train_batch_size x data.max_length, the worst case). Mixed precision as the
    ZeRO paper counts it under DeepSpeed: bf16 weights and gradients, fp32 master weights and AdamW
    states, ZeRO-2 sharding gradients and optimizer, ZeRO-3 also the weights (and the frozen teacher)."""
    t = recipe.training
    tokens = tokens or t.per_device_train_batch_size * recipe.data.max_length
    n = world_size if zero_stage else 1
    p_draft = parameter_count(draft_cfg)
    lora = recipe.draft.lora
    trainable = lora_parameter_count(draft_cfg, lora.r, lora.target_modules) if lora else p_draft
    draft_bytes = BYTES.get(recipe.draft.dtype, 4)
    out: dict[str, float] = {}
    if recipe.teacher.mode == "online":
        out["target weights"] = parameter_count(target_cfg) * BYTES.get(recipe.target.dtype, 2) / (n if zero_stage == 3 else 1)
    if zero_stage:
        frozen = (p_draft - trainable) * draft_bytes if lora else 0
        out["draft weights"] = (frozen + 2 * trainable) / (n if zero_stage == 3 else 1)
        out["gradients"] = 2 * trainable / (n if zero_stage >= 2 else 1)
        out["fp32 master weights + AdamW states"] = 12 * trainable / n
    else:
        out["draft weights"] = (p_draft - trainable) * draft_bytes + trainable * 4 if lora else p_draft * draft_bytes
        out["gradients"] = trainable * (4 if lora else draft_bytes)
        out["AdamW states"] = trainable * 8
        if t.bf16 and not lora and draft_bytes == 4:
            out["bf16 autocast weight copies"] = 2 * p_draft
    h, i, layers = draft_cfg["hidden_size"], draft_cfg["intermediate_size"], draft_cfg["num_hidden_layers"]
    per_layer = tokens * activation_values(h, i) * 2
    out["activations"] = (per_layer + (layers - 1) * tokens * h * 2) if t.gradient_checkpointing else layers * per_layer
    chunk = min(recipe.loss.chunk_size or tokens, tokens)
    if recipe.teacher.mode == "online":
        out["teacher logits"] = tokens * target_cfg["vocab_size"] * BYTES.get(recipe.target.dtype, 2)
    else:
        out["cached top-k rows"] = tokens * (recipe.loss.top_k or recipe.teacher.top_k or 0) * 12
    out["loss chunk"] = chunk * draft_cfg["vocab_size"] * 4 * LOSS_CHUNK_COPIES
    return out


# --------------------------------------------------------------------------------------------- the CPU check


def _rss(key: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5" resets VmHWM, the peak RSS (Linux)
        f.write("5")


def measure(configs: dict[str, dict[str, Any]], tokens: int = 2048, chunk: int = 1024) -> list[dict[str, Any]]:
    """Measured / estimated bytes of the per-token terms, float32 on this CPU (Linux /proc): the
    activations one real-width decoder layer keeps for backward, the teacher's logits at the real
    vocabulary and the fused loss's peak over one chunk (real vocabulary, a tiny hidden size)."""
    import torch
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    from distill.training.losses import fused_divergence

    rows = []
    torch.manual_seed(0)
    for name, cfg in configs.items():
        qcfg = Qwen2Config(**{**cfg, "num_hidden_layers": 1})
        qcfg._attn_implementation = "sdpa"
        layer, rope = Qwen2DecoderLayer(qcfg, 0).requires_grad_(False), Qwen2RotaryEmbedding(qcfg)
        x = torch.randn(1, tokens, qcfg.hidden_size, requires_grad=True)
        pos = torch.arange(tokens)[None]
        emb = rope(x, pos)
        before = _rss()
        out = layer(x, attention_mask=None, position_ids=pos, position_embeddings=emb)
        held = _rss() - before - tokens * qcfg.hidden_size * 4  # the output itself is not kept for backward
        rows.append(
            {
                "term": f"activations, one {name} layer ({cfg['hidden_size']} / {cfg['intermediate_size']})",
                "tokens": tokens,
                "measured": held,
                "estimated": tokens * activation_values(cfg["hidden_size"], cfg["intermediate_size"]) * 4,
            }
        )
        del out, x, emb, layer
    target = next(c for c in configs.values() if not c.get("tie_word_embeddings"))
    draft = next(c for c in configs.values() if c.get("tie_word_embeddings"))
    hidden = 64
    head_t = torch.randn(target["vocab_size"], hidden) / hidden**0.5
    h_t = torch.randn(1, tokens, hidden)
    before = _rss()
    with torch.no_grad():
        logits = h_t @ head_t.T
    rows.append(
        {
            "term": f"teacher logits ({target['vocab_size']:,} rows)",
            "tokens": tokens,
            "measured": _rss() - before,
            "estimated": tokens * target["vocab_size"] * 4,
        }
    )
    head_d = (torch.randn(draft["vocab_size"], hidden) / hidden**0.5).requires_grad_(True)
    h_d = torch.randn(1, tokens, hidden, requires_grad=True)
    _reset_peak()
    before = _rss()
    fused_divergence("forward_kl", h_d, head_d, teacher_logits=logits[..., : draft["vocab_size"]].contiguous(), chunk_size=chunk).backward()
    extra = _rss("VmHWM") - before - 2 * head_d.numel() * 4  # less the weight's gradient and its accumulator
    rows.append(
        {
            "term": f"fused loss, one chunk of {chunk} ({draft['vocab_size']:,} rows), forward + backward",
            "tokens": chunk,
            "measured": extra,
            "estimated": chunk * draft["vocab_size"] * 4 * LOSS_CHUNK_COPIES,
        }
    )
    return rows


# --------------------------------------------------------------------------------------------- CLI


def _config(name_or_path: str, override: str | None, flag: str) -> dict[str, Any]:
    """The model's config.json: `override`, else the Hub or a local folder, else (offline) the copy
    shipped in recipes/model_configs/ for the Qwen2.5 checkpoints the recipes name."""
    if override:
        return json.loads(Path(override).read_text())
    from distill.common.models import ModelLoadError, load_config

    try:
        return load_config(name_or_path).to_dict()
    except ModelLoadError as err:
        from distill.commands.rehearse import MODEL_CONFIGS

        shipped = MODEL_CONFIGS / f"{Path(name_or_path).name.lower()}.json"
        if shipped.is_file():
            return json.loads(shipped.read_text())
        raise ValueError(f"cannot read the config of {name_or_path} ({str(err).splitlines()[0]}): pass {flag} config.json") from None


def render(terms: dict[str, float]) -> str:
    """The estimate as a two-column markdown table with its total."""
    lines = ["| term | GB per GPU |", "| --- | --- |", *(f"| {k} | {v / GB:.2f} |" for k, v in terms.items())]
    return "\n".join([*lines, f"| **total** (plus ~2-3 GB CUDA context and allocator slack) | **{sum(terms.values()) / GB:.1f}** |"])


def check(config_paths: Sequence[str], markdown: str | None, argv: Sequence[str] | None) -> int:
    """`distill memory --check CONFIG ...`: the estimate's per-token terms measured on this CPU, printed; with
    `markdown`, also written as the memory_check section of that file with its report beside it."""
    from distill.common.benchmarks import report
    from distill.common.docs import table
    from distill.common.provenance import MachineLoad

    load = MachineLoad().start()
    configs = {Path(p).stem: json.loads(Path(p).read_text()) for p in config_paths}
    header = ["term", "tokens", "measured MB", "estimated MB", "measured / estimated"]
    rows = [
        [r["term"], r["tokens"], round(r["measured"] / 2**20), round(r["estimated"] / 2**20), round(r["measured"] / r["estimated"], 2)]
        for r in measure(configs)
    ]
    notes = (
        f"float32 on this CPU, peak RSS from /proc in one process. The fused loss keeps ~{LOSS_CHUNK_COPIES} fp32 chunk × vocab "
        "copies at its peak; `distill memory RECIPE` uses that figure. docs/gpu-plan.md has the estimates at the real shapes."
    )
    cmd = "OMP_NUM_THREADS=1 distill memory " + shlex.join(sys.argv[1:] if argv is None else argv)
    report(
        "memory_check",
        "Training memory: the estimate's per-token terms measured on CPU",
        cmd,
        [table(header, rows), notes],
        markdown,
        load.stop(),
        "distill memory",
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`distill memory RECIPE [--gpus N --zero 2] [--tokens T] [--check]`."""
    from distill.arguments import parser
    from distill.training.recipe import load_recipe

    ap = parser("memory")
    args = ap.parse_args(argv)
    if args.check is not None:
        return check(args.check, args.markdown, argv)
    if not args.recipe:
        ap.error("give a recipe (or --check CONFIG ...)")
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        if recipe.draft.name_or_path is None and args.draft_config is None:
            draft_cfg = {**recipe.draft.config}
        else:
            draft_cfg = _config(recipe.draft.name_or_path, args.draft_config, "--draft-config")
        target_cfg = _config(recipe.target.name_or_path, args.target_config, "--target-config")
    except (ValueError, FileNotFoundError) as err:
        ap.error(str(err))
    print(render(estimate(recipe, target_cfg, draft_cfg, tokens=args.tokens, world_size=args.gpus, zero_stage=args.zero)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
