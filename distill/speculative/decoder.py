"""The draft -> verify -> accept loop over two Hugging Face causal LMs with reused KV caches.

Each round the draft proposes k tokens one at a time from its cache; the target scores the last
emitted token and all k proposals in one forward; the acceptance rule keeps a prefix and adds one
token of the target's own. Both caches are cropped to the kept prefix, so neither model ever
recomputes it. Rows of a batch advance together by the shortest kept block, which keeps every
cache rectangular (no holes) and stays lossless: each emitted token is still the target's."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from distill.speculative.sampling import greedy_accept, rejection_accept, sample, warp
from distill.speculative.schedule import make_schedule
from distill.speculative.static import BACKENDS, StaticLoop, graphs_available, static_problem
from distill.speculative.stats import SpecStats
from distill.vocab import check_special_ids_agree, check_tokenizers_agree, shared_vocab_size


@dataclass
class SpecOutput:
    """`sequences` as `generate` returns them (prompt + new tokens, finished rows right-padded)."""

    sequences: torch.LongTensor
    stats: SpecStats


def _context_length(model: PreTrainedModel) -> int:
    return getattr(model.config.get_text_config(), "max_position_embeddings", None) or 1 << 30


def _ids(value: int | list[int] | None) -> list[int]:
    return [] if value is None else [value] if isinstance(value, int) else list(value)


class _Model:
    """One side of the pair: its KV cache and the forward call that extends it."""

    def __init__(self, model: PreTrainedModel, mask: torch.Tensor | None, offset: torch.Tensor | None, rows: int | None = None):
        self.model, self.cache, self.length = model, DynamicCache(config=model.config), 0
        self.mask, self.offset = mask, offset  # only when rows are left-padded
        self.rows, self.forwards = rows, 0  # set when ids past the embedding's rows can arrive

    def _embeddable(self, ids: torch.Tensor) -> torch.Tensor:
        """The target may emit ids past a smaller draft's embedding (padding rows): feed 0 instead.
        That changes only what the draft proposes next, never what is emitted."""
        return ids.masked_fill(ids >= self.rows, 0)

    def forward(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        """Logits of the last `keep` positions after appending `ids` [B, L] to the cache."""
        end = self.length + ids.shape[1]
        kwargs = {}
        if self.rows is not None:
            ids = self._embeddable(ids)
        if self.mask is not None:
            positions = torch.arange(self.length, end, device=ids.device)[None] - self.offset[:, None]
            kwargs = {"attention_mask": self.mask[:, :end], "position_ids": positions.clamp_min(0)}
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=keep, **kwargs)
        self.length, self.forwards = end, self.forwards + 1
        return out.logits

    def crop(self, drop: int) -> None:
        """Forget the last `drop` cached positions (rejected proposals)."""
        if drop > 0:
            self.cache.crop(-drop)
            self.length -= drop

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the rows `keep` (finished rows leave the batch)."""
        self.cache.batch_select_indices(keep)
        if self.mask is not None:
            self.mask, self.offset = self.mask[keep], self.offset[keep]


class SpeculativeDecoder:
    """Lossless speculative decoding of `target` with proposals from `draft`.

    Greedy output equals `target.generate(do_sample=False)` token for token; sampled output
    follows the target's distribution exactly. Pass the tokenizers to have them checked; the
    draft's logits are limited to the vocabulary both models share (`vocab_size`).

    `backend`: "eager" (this loop, caches that grow), "static" (preallocated caches, each round
    replayed as CUDA graphs on CUDA; greedy only: `distill.speculative.static`), "compiled" (the
    static loop with the draft's k steps as one torch.compile graph: the fast path on CPU, after
    a compile of about a minute per k; greedy only), or "auto": static for greedy decoding on
    CUDA, eager otherwise."""

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
        self.context = min(_context_length(target), _context_length(draft))
        problems = [p for p in (static_problem(target, "target"), static_problem(draft, "draft")) if p]
        if backend in ("static", "compiled") and problems:
            raise ValueError(problems[0])
        self.backend, self._static, self._static_ok = backend, None, not problems

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
        if self._uses_static(do_sample):
            self._static = self._static or StaticLoop.for_decoder(self)
            return self._static.generate(input_ids, mask, max_new_tokens, eos, pad, start)
        eos_ids = torch.tensor(eos or [-1], device=self.device)
        generator = torch.Generator(self.device).manual_seed(seed) if seed is not None else None
        choose = (lambda logits: sample(warp(logits, temperature, top_p), generator)) if do_sample else (lambda logits: logits.argmax(-1))

        batch, prompt_len = input_ids.shape
        schedule = make_schedule(self.schedule_name, self.num_draft_tokens)
        k_cap = max(self.num_draft_tokens, getattr(schedule, "k_max", 0))
        padded = bool((mask == 0).any())
        full_mask = offset = None
        if padded:
            full_mask = torch.ones(batch, prompt_len + max_new_tokens + k_cap + 2, dtype=mask.dtype, device=self.device)
            full_mask[:, :prompt_len] = mask
            offset = prompt_len - mask.sum(-1)
        target = _Model(self.target, full_mask, offset)
        draft = _Model(self.draft, full_mask, offset, self.draft_rows if self.draft_rows < self.target_vocab else None)
        stats = SpecStats(num_sequences=batch)

        out = torch.full((batch, max_new_tokens), pad, dtype=torch.long, device=self.device)
        lengths = [max_new_tokens] * batch  # tokens kept per row; lowered when a row ends
        rows = list(range(batch))  # original index of each active row
        last = choose(target.forward(input_ids, keep=1)[:, -1])
        stats.sequence_forwards += batch
        out[:, 0] = last
        pending = torch.cat([input_ids, last[:, None]], 1)  # tokens the draft has not cached yet
        done = 1
        for i, ended in enumerate(torch.isin(last, eos_ids).tolist()):
            if ended:
                lengths[i] = 1
        stats.ttft_s = time.perf_counter() - start
        rows, last, pending = self._drop_finished(rows, lengths, done, last, pending, target, draft)

        while rows and done < max_new_tokens:
            remaining = min(max_new_tokens - done, self.context - prompt_len - done)
            if remaining <= 0:
                break
            k = min(schedule.next_k(), remaining - 1)
            t0 = time.perf_counter()
            drafts, qs = [], []
            for _ in range(k):
                logits = draft.forward(pending, keep=1)[:, -1, : self.vocab_size]
                if do_sample:
                    qs.append(warp(logits, temperature, top_p))
                    pending = sample(qs[-1], generator)[:, None]
                else:
                    pending = logits.argmax(-1, keepdim=True)
                drafts.append(pending)
            t1 = time.perf_counter()
            proposals = torch.cat(drafts, 1) if drafts else last[:, None][:, :0]
            logits = target.forward(torch.cat([last[:, None], proposals], 1), keep=k + 1)
            stats.sequence_forwards += len(rows)
            if do_sample:
                q = torch.stack(qs, 1) if qs else logits.new_zeros(len(rows), 0, self.target_vocab)
                q = torch.nn.functional.pad(q, (0, self.target_vocab - q.shape[-1]))
                n, nxt = rejection_accept(proposals, q, warp(logits, temperature, top_p), generator)
            else:
                n, nxt = greedy_accept(proposals, logits)
            # The round's one host sync: accepted counts and where EOS sits.
            is_eos = torch.isin(torch.cat([proposals, nxt[:, None]], 1), eos_ids)
            n_list, eos_rows = n.tolist(), is_eos.tolist()
            t2 = time.perf_counter()
            m = min(n_list)
            for n_i in n_list:
                schedule.update(k, n_i, t1 - t0, t2 - t1)
            stats.record_round(k, n_list)
            # Every row keeps drafts[:m] plus its token at m: its accepted draft or the target's own.
            y = torch.where(n > m, proposals[:, m], nxt) if m < k else nxt
            block = torch.cat([proposals[:, :m], y[:, None]], 1)
            out[rows, done : done + m + 1] = block
            for i, row in enumerate(rows):
                flags = eos_rows[i][:m] + [eos_rows[i][m] if n_list[i] > m else eos_rows[i][k]]
                if True in flags:
                    lengths[row] = done + flags.index(True) + 1
                    out[row, lengths[row] :] = pad
            done += m + 1
            target.crop(k - m)
            if m < k:
                draft.crop(k - 1 - m)
                pending = y[:, None]
            else:
                pending = torch.cat([proposals[:, -1:], y[:, None]], 1)
            last = y
            rows, last, pending = self._drop_finished(rows, lengths, done, last, pending, target, draft)

        lengths = [min(n, done) for n in lengths]
        stats.new_tokens = sum(lengths)
        stats.target_forwards, stats.draft_forwards = target.forwards, draft.forwards
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        stats.wall_s = time.perf_counter() - start
        return SpecOutput(torch.cat([input_ids, out[:, : max(lengths)]], 1), stats)

    def _uses_static(self, do_sample: bool) -> bool:
        if self.backend in ("static", "compiled") and do_sample:
            raise ValueError(f"the {self.backend} backend decodes greedily only: use backend='eager' (or 'auto') for do_sample=True")
        auto = self.backend == "auto" and self._static_ok and not do_sample and graphs_available(self.device)
        return self.backend in ("static", "compiled") or auto

    def _drop_finished(self, rows, lengths, done, last, pending, target: _Model, draft: _Model):
        """Remove rows that reached EOS from both caches and the loop state."""
        keep = [i for i, row in enumerate(rows) if lengths[row] > done]
        if len(keep) == len(rows) or not keep:
            return [rows[i] for i in keep], last, pending
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        target.select(idx)
        draft.select(idx)
        return [rows[i] for i in keep], last[idx], pending[idx]

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
            raise ValueError(
                f"prompt of {input_ids.shape[1]} tokens exceeds the models' context of {self.context}: truncate it"
            )
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (use do_sample=False for greedy), got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        return input_ids, mask
