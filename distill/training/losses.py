"""Distillation losses: forward KL, reverse KL, generalized JSD(β) and total variation distance
between the draft's (student's) and the target's (teacher's) next-token distributions.

Each divergence is one small function on log-prob tensors `[..., V] -> [...]`. The public entry
points compose them: `divergence` (dense teacher logits), `sparse_divergence` (the teacher's
top-k log-probs plus a tail bucket), `distillation_loss` (divergence + ce_weight × CE) and
`fused_divergence` (from the student's hidden states and LM head, chunked, so the full student
logits and their gradient never exist at once). All of them:

- compare the two models on the shared real vocabulary: both sides are sliced to `vocab_size`
  (default: the smaller of the two logit widths) before the softmax, so the teacher's padding rows
  are dropped and the student's padding rows stay out of its softmax (and get no gradient);
- divide both sides' logits by `temperature` (no T² rescaling; TRL's GKD has none either);
- return the mean over the tokens where `mask` is True (all tokens when `mask` is None);
- treat the teacher as a fixed target: no gradient flows into the teacher's inputs.

A draft with a trimmed head (`draft_to_target`: row i scores target id draft_to_target[i], see
`distill.common.trim`) is compared on its kept ids (`trimmed_vocab`): "renormalise" takes the teacher's
distribution renormalised over the kept set; "other_bucket" adds one bucket for every other id, which
the draft scores with one extra head row (its last). From a top-k teacher the kept top-k ids are buckets
of their own, the cache's tail goes to the rest of the kept set, and top-k ids outside it to "other".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from distill.common.trim import TRIMMED_LOSSES

DIVERGENCES = ("forward_kl", "reverse_kl", "jsd", "tvd")
IGNORE_INDEX = -100
# Stands in for log 0 in the sparse buckets: exp() of it is exactly 0, and unlike -inf it keeps
# 0·log 0 terms and their gradients finite.
_LOG_ZERO = torch.finfo(torch.float32).min


# --------------------------------------------------------------------------------------------
# The divergences, per token, on log-probs of shape [..., V]


def kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) = Σ p (log p − log q) over the last dimension."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def forward_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """KL(teacher ‖ student): mass-covering, the classic distillation loss."""
    return kl(teacher_logp, student_logp)


def reverse_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """KL(student ‖ teacher): mode-seeking."""
    return kl(student_logp, teacher_logp)


def jsd(student_logp: torch.Tensor, teacher_logp: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """Generalized JSD as TRL's `generalized_jsd_loss` defines it: with m = (1−β)·student + β·teacher,
    β·KL(teacher ‖ m) + (1−β)·KL(student ‖ m); β=0 is forward KL and β=1 reverse KL."""
    if beta == 0:
        return forward_kl(student_logp, teacher_logp)
    if beta == 1:
        return reverse_kl(student_logp, teacher_logp)
    log_m = torch.logaddexp(student_logp + math.log1p(-beta), teacher_logp + math.log(beta))
    return beta * kl(teacher_logp, log_m) + (1 - beta) * kl(student_logp, log_m)


def tvd(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """Total variation ½ Σ |p − q| = 1 − Σ min(p, q); 1 − TVD is speculative sampling's acceptance rate."""
    return 0.5 * (student_logp.exp() - teacher_logp.exp()).abs().sum(-1)


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """float32 for half-precision inputs (the softmax needs it), float64 stays float64."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _divergence_fn(name: str, beta: float):
    return {"forward_kl": forward_kl, "reverse_kl": reverse_kl, "jsd": partial(jsd, beta=beta), "tvd": tvd}[name]


def sparse_log_probs(
    student_logits: torch.Tensor, topk_ids: torch.Tensor, topk_logprobs: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Student and teacher log-probs over k+1 buckets: the teacher's top-k ids, then one tail bucket
    for every other id. The teacher's tail mass is 1 − Σ exp(top-k); the student's is its softmax
    mass outside the top-k ids. The temperature divides the student's logits and, since only the
    teacher's top-k survive, the teacher's k+1 bucket log-probs: exact at temperature 1 or when
    k = vocabulary, an approximation (the tail tempered as one outcome) otherwise."""
    s = student_logits if temperature == 1 else student_logits / temperature
    log_z = s.logsumexp(-1, keepdim=True)
    s_tail = s.scatter(-1, topk_ids, _LOG_ZERO).logsumexp(-1, keepdim=True)
    student = (torch.cat([s.gather(-1, topk_ids), s_tail], -1) - log_z).clamp(min=_LOG_ZERO)
    if topk_ids.shape[-1] == s.shape[-1]:  # nothing outside the top-k: no tail, not a rounding residue
        t_tail = torch.full_like(topk_logprobs[..., :1], -math.inf)
    else:
        t_tail = torch.log1p(-topk_logprobs.exp().sum(-1, keepdim=True).clamp(max=1))
    teacher = torch.cat([topk_logprobs, t_tail], -1)
    if temperature != 1:
        teacher = torch.log_softmax(teacher / temperature, -1)
    return student, teacher.clamp(min=_LOG_ZERO)


# --------------------------------------------------------------------------------------------
# Rows, teacher and the loss over a block of rows (shared by every entry point)


@dataclass(frozen=True)
class _Trim:
    """A trimmed student: `keep` [K] target ids of its first K rows, `lookup` [vocab] each id's row (-1
    outside), `other` whether row K is an "other" bucket."""

    keep: torch.Tensor
    lookup: torch.Tensor
    other: bool

    @property
    def width(self) -> int:
        return self.keep.numel() + int(self.other)


@dataclass(frozen=True)
class _Spec:
    name: str
    beta: float
    temperature: float
    vocab_size: int
    divergence_weight: float = 1.0
    trim: _Trim | None = None

    @property
    def student_width(self) -> int:
        """The student logits compared: the shared vocabulary, or a trimmed head's rows."""
        return self.vocab_size if self.trim is None else self.trim.width


@dataclass
class _Teacher:
    """The teacher's signal on flattened token rows: dense logits [N, V_t], or top-k ids/log-probs [N, k]."""

    logits: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
    topk_logprobs: torch.Tensor | None = None


@dataclass
class _Rows:
    """The flattened token rows that count, and each row's weight in the divergence and CE means."""

    index: torch.Tensor | None  # None: every row, in order
    count: int
    div_weight: torch.Tensor  # [count]
    ce_weight: torch.Tensor | None  # [count], None when there is no CE term
    labels: torch.Tensor | None  # [count]

    def take(self, flat: torch.Tensor | None, start: int, end: int) -> torch.Tensor | None:
        if flat is None:
            return None
        return flat[start:end] if self.index is None else flat.index_select(0, self.index[start:end])

    def put(self, flat: torch.Tensor, start: int, end: int, values: torch.Tensor) -> None:
        if self.index is None:
            flat[start:end] = values
        else:
            flat.index_copy_(0, self.index[start:end], values)

    def chunks(self, chunk_size: int | None) -> list[tuple[int, int]]:
        step = chunk_size or max(self.count, 1)
        return [(s, min(s + step, self.count)) for s in range(0, self.count, step)]

    def loss(self, spec: _Spec, student_logits: torch.Tensor, teacher: _Teacher, start: int, end: int) -> torch.Tensor:
        """The loss terms of rows start:end, given those rows' student logits [end - start, V_s]."""
        block = _Teacher(*(self.take(t, start, end) for t in (teacher.logits, teacher.topk_ids, teacher.topk_logprobs)))
        ce_weight = None if self.ce_weight is None else self.ce_weight[start:end]
        labels = None if self.labels is None else self.labels[start:end]
        return _rows_loss(spec, student_logits, block, self.div_weight[start:end], ce_weight, labels)


def _log_probs(spec: _Spec, logits: torch.Tensor, teacher: _Teacher) -> tuple[torch.Tensor, torch.Tensor]:
    """Student and teacher log-probs of a block of rows (logits already on the shared vocabulary,
    upcast): over the whole vocabulary for a dense teacher, over k+1 buckets for a top-k one."""
    t = spec.temperature
    if spec.trim is not None:
        return _trimmed_log_probs(spec, logits, teacher)
    if teacher.logits is not None:
        t_logits = _upcast(teacher.logits[:, : spec.vocab_size].detach())
        return torch.log_softmax(logits if t == 1 else logits / t, -1), torch.log_softmax(t_logits if t == 1 else t_logits / t, -1)
    return sparse_log_probs(logits, teacher.topk_ids, _upcast(teacher.topk_logprobs.detach()), t)


def token_divergence(
    name: str,
    student_logits: torch.Tensor,
    *,
    teacher_logits: torch.Tensor | None = None,
    teacher_topk_ids: torch.Tensor | None = None,
    teacher_topk_logprobs: torch.Tensor | None = None,
    temperature: float = 1.0,
    beta: float = 0.5,
    vocab_size: int | None = None,
    draft_to_target: torch.Tensor | None = None,
    trimmed_vocab: str = "renormalise",
) -> torch.Tensor:
    """The divergence of each row [n] between student logits [n, V_s] and the teacher's rows (dense
    [n, V_t] or top-k [n, k]): what the mean losses above average, one value per token."""
    _check_options(name, beta, temperature, None)
    teacher = _teacher(student_logits.shape[:-1], teacher_logits, teacher_topk_ids, teacher_topk_logprobs)
    v_s = student_logits.shape[-1]
    vocab = _vocab_for(vocab_size, v_s, None if teacher.logits is None else teacher.logits.shape[-1], draft_to_target is not None)
    spec = _Spec(name, float(beta), float(temperature), vocab, trim=_trim(draft_to_target, trimmed_vocab, vocab, v_s, student_logits.device))
    return _divergence_fn(name, beta)(*_log_probs(spec, _upcast(student_logits[:, : spec.student_width]), teacher))


def _trimmed_log_probs(spec: _Spec, logits: torch.Tensor, teacher: _Teacher) -> tuple[torch.Tensor, torch.Tensor]:
    """Student and teacher log-probs of a trimmed student's block of rows (logits [n, K(+1)], upcast).
    Dense teacher: over the K kept ids (+ the other bucket), the teacher's tempered distribution
    renormalised there (exact). Top-k teacher: buckets [the k top ids (kept ones only: an id outside the
    set is log 0 on both sides), the rest of the kept set (takes the cache's tail mass), other (top-k mass
    outside the set)], the teacher's buckets renormalised and tempered as `sparse_log_probs` does."""
    trim, t = spec.trim, spec.temperature
    k = trim.keep.numel()
    s = logits if t == 1 else logits / t
    if teacher.logits is not None:
        full = _upcast(teacher.logits[:, : spec.vocab_size].detach())
        full = full if t == 1 else full / t
        kept = full.index_select(-1, trim.keep)
        if trim.other:
            kept = torch.cat([kept, full.index_fill(-1, trim.keep, -math.inf).logsumexp(-1, keepdim=True)], -1)
        return torch.log_softmax(s, -1), torch.log_softmax(kept, -1).clamp(min=_LOG_ZERO)
    ids, lps = teacher.topk_ids, _upcast(teacher.topk_logprobs.detach())
    pos = trim.lookup[ids]
    inside = pos >= 0
    log_z = s.logsumexp(-1, keepdim=True)
    hit = torch.zeros(s.shape[0], k + 1, dtype=torch.bool, device=s.device).scatter_(-1, torch.where(inside, pos, k), True)[:, :k]
    student = [torch.where(inside, s.gather(-1, pos.clamp(min=0)) - log_z, _LOG_ZERO), s[:, :k].masked_fill(hit, _LOG_ZERO).logsumexp(-1, keepdim=True) - log_z]
    if ids.shape[-1] >= spec.vocab_size:  # the whole vocabulary cached: no tail
        tail = torch.full_like(lps[:, :1], -math.inf)
    else:
        tail = torch.log1p(-lps.exp().sum(-1, keepdim=True).clamp(max=1))
    slots = torch.where(inside, lps, _LOG_ZERO)
    if trim.other:
        student.append(s[:, k:] - log_z)
        buckets = [slots, tail, torch.where(inside, -math.inf, lps).logsumexp(-1, keepdim=True)]
    else:  # all the cached mass outside the set: the unknown rest of the set takes the renormalised mass
        empty = ~inside.any(-1, keepdim=True) & (tail == -math.inf)
        buckets = [slots, tail.masked_fill(empty, 0.0)]
    teacher_logp = torch.cat(buckets, -1).clamp(min=_LOG_ZERO)
    teacher_logp = torch.log_softmax(teacher_logp if t == 1 else teacher_logp / t, -1)
    return torch.cat(student, -1).clamp(min=_LOG_ZERO), teacher_logp.clamp(min=_LOG_ZERO)


def _trimmed_labels(trim: _Trim, labels: torch.Tensor) -> torch.Tensor:
    """Target-id labels as rows of a trimmed head: ids outside the set go to the other row, or are ignored."""
    row = trim.lookup[labels.clamp(min=0)]
    if trim.other:
        row = torch.where(row < 0, trim.keep.numel(), row)
    return torch.where((labels == IGNORE_INDEX) | (row < 0), IGNORE_INDEX, row)


def _rows_loss(
    spec: _Spec,
    student_logits: torch.Tensor,
    teacher: _Teacher,
    div_weight: torch.Tensor,
    ce_weight: torch.Tensor | None,
    labels: torch.Tensor | None,
) -> torch.Tensor:
    """Σ div_weight·divergence (+ Σ ce_weight·CE) over a block of rows; student_logits [n, V_s]."""
    logits = _upcast(student_logits[:, : spec.student_width])
    student_logp, teacher_logp = _log_probs(spec, logits, teacher)
    if spec.trim is not None and labels is not None:
        labels = _trimmed_labels(spec.trim, labels)
    loss = logits[:0].sum()
    if spec.divergence_weight:
        loss = loss + spec.divergence_weight * (div_weight * _divergence_fn(spec.name, spec.beta)(student_logp, teacher_logp)).sum()
    if ce_weight is not None:
        loss = loss + (ce_weight * F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="none")).sum()
    return loss


# --------------------------------------------------------------------------------------------
# Checks and preparation


def _check_options(name: str, beta: float, temperature: float, chunk_size: int | None, ce_weight: float = 0.0, divergence_weight: float = 1.0) -> None:
    if name not in DIVERGENCES:
        raise ValueError(f"unknown divergence {name!r}: choose one of {', '.join(DIVERGENCES)}")
    if not 0 <= beta <= 1:
        raise ValueError(f"beta={beta} is outside [0, 1]: 0 is forward KL, 1 reverse KL, in between the JSD mixture weight")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature={temperature} must be a positive finite number (1.0 leaves the logits as they are)")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size={chunk_size!r} must be a positive number of tokens, or None for one chunk")
    if not (math.isfinite(divergence_weight) and divergence_weight >= 0):
        raise ValueError(f"divergence_weight={divergence_weight} must be a finite number >= 0 (0 trains on cross-entropy alone)")
    if not (math.isfinite(ce_weight) and ce_weight >= 0):
        raise ValueError(f"ce_weight={ce_weight} must be a finite number >= 0 (0 turns the cross-entropy term off)")


def _check_lead(what: str, tensor: torch.Tensor, lead: torch.Size, suffix: str = "") -> None:
    if tuple(tensor.shape[: len(lead)]) != tuple(lead) or tensor.dim() != len(lead) + (1 if suffix else 0):
        want = f"[{', '.join(map(str, lead))}{', ' + suffix if suffix else ''}]"
        raise ValueError(f"{what} has shape {list(tensor.shape)}, expected {want} to match the student's tokens")


def _resolve_vocab(vocab_size: int | None, student_width: int, teacher_width: int | None) -> int:
    """The shared real vocabulary: vocab_size, else the smaller of the two logit widths."""
    widths = [w for w in (student_width, teacher_width) if w is not None]
    if vocab_size is None:
        return min(widths)
    if not 0 < vocab_size <= min(widths):
        raise ValueError(
            f"vocab_size={vocab_size} must be between 1 and the smaller logit width {min(widths)} "
            f"(student {student_width}, teacher {teacher_width}): pass len(tokenizer), the shared real vocabulary"
        )
    return vocab_size


def _vocab_for(vocab_size: int | None, student_width: int, teacher_width: int | None, trimmed: bool) -> int:
    """The shared vocabulary; a trimmed student's logits are no bound on it (its teacher's width is)."""
    if not trimmed:
        return _resolve_vocab(vocab_size, student_width, teacher_width)
    if vocab_size is None and teacher_width is None:
        raise ValueError("a trimmed student with a top-k teacher needs vocab_size: pass len(tokenizer), the shared real vocabulary")
    return _resolve_vocab(vocab_size, teacher_width if teacher_width is not None else vocab_size, teacher_width)


def _trim(draft_to_target: torch.Tensor | None, mode: str, vocab: int, student_width: int, device: torch.device) -> _Trim | None:
    """The trimmed student's spec from its map, checked against the vocabulary and the student's logits."""
    if draft_to_target is None:
        return None
    if mode not in TRIMMED_LOSSES:
        raise ValueError(f"trimmed_vocab={mode!r}: choose one of {', '.join(TRIMMED_LOSSES)}")
    keep = torch.as_tensor(draft_to_target).to(device=device, dtype=torch.long)
    if keep.dim() != 1 or keep.numel() == 0 or int(keep.min()) < 0 or int(keep.max()) >= vocab:
        raise ValueError(f"draft_to_target must be a non-empty list of ids in [0, {vocab}) (the shared vocabulary)")
    lookup = torch.full((vocab,), -1, dtype=torch.long, device=device)
    lookup[keep] = torch.arange(keep.numel(), device=device)
    if int((lookup >= 0).sum()) != keep.numel():
        raise ValueError("draft_to_target repeats an id: each kept id has one row")
    other = mode == "other_bucket"
    if student_width != keep.numel() + other:
        extra = " plus the other row" if other else ""
        raise ValueError(f"the student has {student_width} logits but its head is trimmed to {keep.numel()} ids{extra}: {keep.numel() + other} expected")
    return _Trim(keep, lookup, other)


def _teacher(
    lead: torch.Size,
    teacher_logits: torch.Tensor | None,
    topk_ids: torch.Tensor | None,
    topk_logprobs: torch.Tensor | None,
) -> _Teacher:
    """Check the teacher's tensors against the student's token shape and flatten them to rows."""
    dense, sparse = teacher_logits is not None, topk_ids is not None or topk_logprobs is not None
    if dense == sparse:
        raise ValueError("give the teacher either as teacher_logits or as teacher_topk_ids + teacher_topk_logprobs, not both or neither")
    if dense:
        _check_lead("teacher_logits", teacher_logits, lead, "V_t")
        return _Teacher(logits=teacher_logits.reshape(-1, teacher_logits.shape[-1]))
    if topk_ids is None or topk_logprobs is None:
        raise ValueError("the sparse teacher needs both teacher_topk_ids and teacher_topk_logprobs")
    _check_lead("teacher_topk_ids", topk_ids, lead, "k")
    if topk_logprobs.shape != topk_ids.shape:
        raise ValueError(f"teacher_topk_logprobs has shape {list(topk_logprobs.shape)}, expected {list(topk_ids.shape)} like teacher_topk_ids")
    k = topk_ids.shape[-1]
    return _Teacher(topk_ids=topk_ids.reshape(-1, k).long(), topk_logprobs=topk_logprobs.reshape(-1, k))


def _check_ids(teacher: _Teacher, vocab: int) -> None:
    ids = teacher.topk_ids
    if ids is None or ids.numel() == 0:
        return
    if ids.shape[-1] > vocab:
        raise ValueError(f"top-k of {ids.shape[-1]} exceeds the shared vocabulary of {vocab}")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(f"teacher_topk_ids must lie in [0, {vocab}) (the shared vocabulary); got ids up to {int(ids.max())}")


def _rows(
    lead: torch.Size,
    mask: torch.Tensor | None,
    labels: torch.Tensor | None,
    ce_weight: float,
    vocab: int,
    like: torch.Tensor,
) -> _Rows:
    """The rows that count and their weights. Without a mask, labels != -100 is the mask when
    labels are given, every token otherwise. CE counts where labels != -100. The weights take
    `like`'s device and (at least float32) precision."""
    n, device, dtype = math.prod(lead), like.device, torch.promote_types(like.dtype, torch.float32)
    if mask is not None:
        _check_lead("mask", mask, lead)
        mask = mask.reshape(-1).to(device=device, dtype=torch.bool)
    if labels is not None:
        _check_lead("labels", labels, lead)
        labels = labels.reshape(-1).to(device=device, dtype=torch.long)
        valid = labels != IGNORE_INDEX
        if valid.any() and (int(labels[valid].min()) < 0 or int(labels[valid].max()) >= vocab):
            raise ValueError(f"labels must be -100 or ids in [0, {vocab}) (the shared vocabulary)")
        mask = valid if mask is None else mask
    elif ce_weight > 0:
        raise ValueError(f"ce_weight={ce_weight} needs labels (the ground-truth next tokens, -100 where ignored)")
    use_ce = labels is not None and ce_weight > 0
    if mask is None:
        return _Rows(None, n, torch.full((n,), 1.0 / max(n, 1), device=device, dtype=dtype), None, None)
    counted = mask | valid if use_ce else mask
    index = counted.nonzero().squeeze(-1)
    div_weight = mask[index].to(dtype) / mask.sum().clamp(min=1)
    if not use_ce:
        return _Rows(index, index.numel(), div_weight, None, None)
    ce = ce_weight * valid[index].to(dtype) / valid.sum().clamp(min=1)
    return _Rows(index, index.numel(), div_weight, ce, labels[index])


# --------------------------------------------------------------------------------------------
# From materialised student logits


def distillation_loss(
    name: str,
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor | None = None,
    *,
    teacher_topk_ids: torch.Tensor | None = None,
    teacher_topk_logprobs: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    ce_weight: float = 0.0,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    beta: float = 0.5,
    chunk_size: int | None = None,
    vocab_size: int | None = None,
    divergence_weight: float = 1.0,
    draft_to_target: torch.Tensor | None = None,
    trimmed_vocab: str = "renormalise",
) -> torch.Tensor:
    """The combined objective: divergence_weight × mean divergence over `mask` + ce_weight × mean CE of the student's
    (untempered) logits on `labels` (aligned with the logits, already shifted; -100 ignored).
    With chunk_size, rows are processed in chunks recomputed in backward (activation checkpointing).
    A trimmed student (`draft_to_target`, see the module's docstring) is compared on its kept ids; its CE
    counts the labels in the set (and the others as the other row, with "other_bucket")."""
    _check_options(name, beta, temperature, chunk_size, ce_weight, divergence_weight)
    if student_logits.dim() < 2:
        raise ValueError(f"student_logits has shape {list(student_logits.shape)}, expected [B, T, V_s]")
    lead, v_s = student_logits.shape[:-1], student_logits.shape[-1]
    teacher = _teacher(lead, teacher_logits, teacher_topk_ids, teacher_topk_logprobs)
    vocab = _vocab_for(vocab_size, v_s, None if teacher.logits is None else teacher.logits.shape[-1], draft_to_target is not None)
    _check_ids(teacher, vocab)
    rows = _rows(lead, mask, labels, ce_weight, vocab, student_logits)
    trim = _trim(draft_to_target, trimmed_vocab, vocab, v_s, student_logits.device)
    spec = _Spec(name, float(beta), float(temperature), vocab, float(divergence_weight), trim)
    flat = student_logits.reshape(-1, v_s)
    loss = flat[:0].sum()  # zero, on the graph: a batch with no counted token still backpropagates
    for start, end in rows.chunks(chunk_size):
        args = (spec, rows.take(flat, start, end), teacher, start, end)
        loss = loss + (checkpoint(rows.loss, *args, use_reentrant=False) if chunk_size else rows.loss(*args))
    return loss


def divergence(
    name: str,
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    beta: float = 0.5,
    chunk_size: int | None = None,
    vocab_size: int | None = None,
) -> torch.Tensor:
    """Mean per-token divergence between student logits [B, T, V_s] and teacher logits [B, T, V_t]."""
    return distillation_loss(
        name,
        student_logits,
        teacher_logits,
        mask=mask,
        temperature=temperature,
        beta=beta,
        chunk_size=chunk_size,
        vocab_size=vocab_size,
    )


def sparse_divergence(
    name: str,
    student_logits: torch.Tensor,
    teacher_topk_ids: torch.Tensor,
    teacher_topk_logprobs: torch.Tensor,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    beta: float = 0.5,
    chunk_size: int | None = None,
    vocab_size: int | None = None,
) -> torch.Tensor:
    """Mean per-token divergence against the teacher's top-k log-probs [B, T, k] (at temperature 1)
    plus its tail bucket; the student's probabilities are aggregated into the same k+1 buckets."""
    return distillation_loss(
        name,
        student_logits,
        teacher_topk_ids=teacher_topk_ids,
        teacher_topk_logprobs=teacher_topk_logprobs,
        mask=mask,
        temperature=temperature,
        beta=beta,
        chunk_size=chunk_size,
        vocab_size=vocab_size,
    )


# --------------------------------------------------------------------------------------------
# Fused with the LM head: hidden states in, loss out, logits one chunk at a time


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype


class _FusedLinearLoss(torch.autograd.Function):
    """The loss from hidden rows [N, H] and an LM head [V_s, H]. Like Liger-Kernel's fused linear
    losses, the gradients are computed chunk by chunk during the forward pass, so only one chunk's
    logits (and their gradient) exist at a time and no matmul is repeated in backward."""

    @staticmethod
    def forward(ctx, hidden, weight, spec: _Spec, rows: _Rows, teacher: _Teacher, chunk_size: int | None, grad_mode: bool):
        need_h, need_w = grad_mode and ctx.needs_input_grad[0], grad_mode and ctx.needs_input_grad[1]
        dtype = _compute_dtype(hidden)
        w = weight[: spec.student_width].to(dtype)
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        total = torch.zeros((), dtype=torch.promote_types(dtype, torch.float32), device=hidden.device)
        for start, end in rows.chunks(chunk_size):
            h = rows.take(hidden, start, end).to(dtype)
            with torch.enable_grad(), torch.autocast(hidden.device.type, enabled=False):
                logits = _upcast((h @ w.T).detach()).requires_grad_(need_h or need_w)
                loss = rows.loss(spec, logits, teacher, start, end)
            if need_h or need_w:
                (g,) = torch.autograd.grad(loss, logits)
                g = g.to(dtype)
                if need_h:
                    rows.put(grad_h, start, end, (g @ w).to(hidden.dtype))
                if need_w:
                    head = grad_w[: spec.student_width]
                    if head.dtype == dtype:
                        head.addmm_(g.T, h)
                    else:
                        head += (g.T @ h).to(head.dtype)
            total += loss.detach()
        ctx.save_for_backward(grad_h, grad_w)
        return total

    @staticmethod
    def backward(ctx, grad_output):
        grad_h, grad_w = ctx.saved_tensors
        if not torch.equal(grad_output, torch.ones_like(grad_output)):
            grad_h = None if grad_h is None else grad_h * grad_output.to(grad_h.dtype)
            grad_w = None if grad_w is None else grad_w * grad_output.to(grad_w.dtype)
        return grad_h, grad_w, None, None, None, None, None


def fused_divergence(
    name: str,
    student_hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    *,
    teacher_logits: torch.Tensor | None = None,
    teacher_topk_ids: torch.Tensor | None = None,
    teacher_topk_logprobs: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    beta: float = 0.5,
    chunk_size: int | None = 1024,
    vocab_size: int | None = None,
    labels: torch.Tensor | None = None,
    ce_weight: float = 0.0,
    divergence_weight: float = 1.0,
    draft_to_target: torch.Tensor | None = None,
    trimmed_vocab: str = "renormalise",
) -> torch.Tensor:
    """`distillation_loss` of the logits student_hidden [B, T, H] @ lm_head_weight[V_s, H].T,
    computed `chunk_size` counted tokens at a time: at most chunk_size × V_s student logits exist at
    once. The LM head must have no bias (true of Qwen2.5); gradients reach hidden and weight."""
    _check_options(name, beta, temperature, chunk_size, ce_weight, divergence_weight)
    if student_hidden.dim() < 2 or lm_head_weight.dim() != 2 or lm_head_weight.shape[1] != student_hidden.shape[-1]:
        raise ValueError(
            f"student_hidden {list(student_hidden.shape)} and lm_head_weight {list(lm_head_weight.shape)} "
            "must be [B, T, H] and [V_s, H] with the same hidden size H"
        )
    lead, v_s = student_hidden.shape[:-1], lm_head_weight.shape[0]
    teacher = _teacher(lead, teacher_logits, teacher_topk_ids, teacher_topk_logprobs)
    vocab = _vocab_for(vocab_size, v_s, None if teacher.logits is None else teacher.logits.shape[-1], draft_to_target is not None)
    _check_ids(teacher, vocab)
    rows = _rows(lead, mask, labels, ce_weight, vocab, student_hidden)
    trim = _trim(draft_to_target, trimmed_vocab, vocab, v_s, student_hidden.device)
    spec = _Spec(name, float(beta), float(temperature), vocab, float(divergence_weight), trim)
    hidden = student_hidden.reshape(-1, student_hidden.shape[-1])
    # Under no_grad (evaluation) the forward skips the gradient work it would otherwise do eagerly.
    return _FusedLinearLoss.apply(hidden, lm_head_weight, spec, rows, teacher, chunk_size, torch.is_grad_enabled())
