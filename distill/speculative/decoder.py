"""`SpeculativeDecoder`: the user-facing API of the bundled decoder. It checks the pair and the
inputs, picks the backend, and runs the draft -> verify -> accept loop of
`distill.speculative.loop`, in which every row of a batch keeps its own accepted length."""

from __future__ import annotations

import time

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from distill.common.trim import PROMPT_ROWS, add_prompt_rows, draft_to_target
from distill.common.vocab import check_special_ids_agree, check_tokenizers_agree, shared_vocab_size
from distill.speculative.loop import SpecLoop
from distill.speculative.schedule import make_schedule
from distill.speculative.static import BACKENDS, graphs_available, layer_kinds, static_problem
from distill.speculative.stats import SpecOutput


def _context_length(model: PreTrainedModel) -> int:
    return getattr(model.config.get_text_config(), "max_position_embeddings", None) or 1 << 30


def _ids(value: int | list[int] | None) -> list[int]:
    return [] if value is None else [value] if isinstance(value, int) else list(value)


class SpeculativeDecoder:
    """Lossless speculative decoding of `target` with proposals from `draft`.

    Greedy output equals `target.generate(do_sample=False)` token for token; sampled output
    follows the target's distribution exactly. Pass the tokenizers to have them checked; the
    draft's logits are limited to the vocabulary both models share (`vocab_size`). A draft with a
    trimmed head (`distill.common.trim`) proposes through its map and has probability 0 outside it;
    verification and the acceptance rule stay over the target's whole vocabulary. Its set is widened
    per call by up to `prompt_rows` of the prompt's own tokens (`PromptRows`: rows from the full head
    it was cut from; 0 turns this off), since answers copy names and numbers from their question.

    `backend`: "eager" (caches that grow), "static" (preallocated caches, each round replayed as
    CUDA graphs on CUDA), "compiled" (static caches with the draft's k steps as one torch.compile
    graph: the fast path on CPU, after a compile of about a minute per k and decoding mode), or
    "auto": static on CUDA, eager elsewhere. Every backend decodes greedily or samples."""

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel,
        num_draft_tokens: int = 5,
        schedule: str = "constant",
        tokenizer: PreTrainedTokenizerBase | None = None,
        draft_tokenizer: PreTrainedTokenizerBase | None = None,
        vocab_size: int | None = None,
        backend: str = "auto",
        prompt_rows: int = PROMPT_ROWS,
    ):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
        if num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be at least 1, got {num_draft_tokens}")
        t_dev, d_dev = next(target.parameters()).device, next(draft.parameters()).device
        if t_dev != d_dev:
            raise ValueError(f"target is on {t_dev} but draft is on {d_dev}: move both to one device (draft.to({str(t_dev)!r}))")
        if target.dtype != draft.dtype:
            raise ValueError(f"target dtype {target.dtype} differs from draft dtype {draft.dtype}: load both in one dtype (draft.to({target.dtype}))")
        if tokenizer is not None and draft_tokenizer is not None:
            check_tokenizers_agree(tokenizer, draft_tokenizer)
        check_special_ids_agree(target, draft)
        self.target, self.draft, self.device = target, draft, t_dev
        self.num_draft_tokens, self.schedule_name = num_draft_tokens, schedule
        make_schedule(schedule, num_draft_tokens)  # validate the name now
        self.vocab_size = vocab_size or shared_vocab_size(target, draft, tokenizer)
        self.target_vocab = target.config.get_text_config().vocab_size
        self.draft_rows = draft.get_input_embeddings().num_embeddings
        if draft_to_target(target) is not None:
            raise ValueError("the target has a trimmed head: verification needs the target's whole vocabulary; load the full target")
        d2t = draft_to_target(draft)
        if d2t is not None and int(d2t.max()) >= self.vocab_size:
            raise ValueError(
                f"the draft's trimmed head maps a row to token id {int(d2t.max())}, past the {self.vocab_size} tokens both models share: "
                "trim the draft over the tokenizer's vocabulary (distill trim-vocab keeps tokenizer ids only)"
            )
        if prompt_rows < 0:
            raise ValueError(f"prompt_rows must be >= 0 (0: the trimmed set alone), got {prompt_rows}")
        add_prompt_rows(draft, prompt_rows)
        self.context = min(_context_length(target), _context_length(draft))
        problems = [p for p in (static_problem(target, "target"), static_problem(draft, "draft")) if p]
        if backend in ("static", "compiled") and problems:
            raise ValueError(problems[0])
        self.backend, self._loops, self._static_ok = backend, {}, not problems
        # Holes in a cache would shift sliding windows: such models advance rows in lockstep.
        self.ragged = (layer_kinds(target) | layer_kinds(draft)) == {"full_attention"}

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int = 64,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        seed: int | None = None,
    ) -> SpecOutput:
        """Generate up to `max_new_tokens` per row; rows stop at their first EOS."""
        start = time.perf_counter()
        input_ids, mask = self._check_inputs(input_ids, attention_mask, max_new_tokens, temperature, top_p)
        gen_cfg = self.target.generation_config
        eos = _ids(eos_token_id if eos_token_id is not None else gen_cfg.eos_token_id)
        pad = pad_token_id if pad_token_id is not None else gen_cfg.pad_token_id
        pad = pad if pad is not None else (eos[0] if eos else 0)
        generator = torch.Generator(self.device).manual_seed(seed) if seed is not None else None
        cache = "static" if self._uses_static() else "dynamic"
        if cache not in self._loops:
            self._loops[cache] = SpecLoop.for_decoder(self, cache)
        return self._loops[cache].generate(
            input_ids, mask, max_new_tokens, eos, pad, start, do_sample=do_sample, temperature=temperature, top_p=top_p, generator=generator
        )

    def _uses_static(self) -> bool:
        auto = self.backend == "auto" and self._static_ok and graphs_available(self.device)
        return self.backend in ("static", "compiled") or auto

    def _check_inputs(self, input_ids, attention_mask, max_new_tokens, temperature, top_p):
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must be a non-empty [batch, length] tensor, got shape {tuple(input_ids.shape)}")
        input_ids = input_ids.to(self.device)
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(self.device)
        if mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask shape {tuple(mask.shape)} does not match input_ids {tuple(input_ids.shape)}")
        if (mask.sum(-1) == 0).any():
            raise ValueError("a prompt is empty (its attention_mask is all zeros): give every row at least one token")
        if input_ids.shape[1] > self.context:
            raise ValueError(f"prompt of {input_ids.shape[1]} tokens exceeds the models' context of {self.context}: truncate it")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (use do_sample=False for greedy), got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        return input_ids, mask
