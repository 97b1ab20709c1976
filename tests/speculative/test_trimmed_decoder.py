"""A draft with a trimmed head (distill.common.trim) under the bundled decoder: greedy output identical to
the target's, sampled output distributed as the target's (the draft's probability is 0 outside its kept
ids, the residual rule unchanged), target tokens outside the kept set, every backend; with and without the
prompt rows that widen the set per call by the prompt's own tokens."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import distill.speculative.loop as loop_module
from distill.common import trim
from distill.common.tiny import noisy_copy, tiny_qwen2
from distill.speculative import SpeculativeDecoder
from distill.speculative.loop import SpecLoop
from distill.speculative.sampling import sample, warp

DECISIONS = ("proposed", "accepted", "rounds", "new_tokens", "target_forwards", "sequence_forwards", "position_proposed", "position_accepted")


def _kept(tokenizer) -> torch.Tensor:
    """Two thirds of the tokenizer's ids (every id not divisible by 3) plus the always-kept ones."""
    ids = {i for i in range(len(tokenizer)) if i % 3} | set(trim.always_kept(tokenizer))
    return torch.tensor(sorted(ids))


@pytest.fixture(scope="module")
def pairs(tiny_pair):
    """(target, trimmed draft) pairs: the target that emits tokenizer ids only under a trimmed noisy copy of
    itself (partly accepted), and the padded target under the trimmed small draft (padding-row ids emitted)."""
    target = tiny_pair.real_vocab_target
    keep = _kept(tiny_pair.tokenizer)
    return {
        "noisy": (target, trim.trimmed_copy(noisy_copy(target, 0.05, 13), keep)),
        "small": (tiny_pair.target, trim.trimmed_copy(tiny_pair.draft, keep)),
    }


def _batch(tokenizer, examples, n):
    tokenizer.padding_side = "left"
    texts = [examples[i]["prompt"] + " " + examples[i]["response"][: 7 * i] for i in range(n)]
    return tokenizer(texts, return_tensors="pt", padding=True)


def test_trimmed_head_scores_the_kept_rows_of_the_full_one(tiny_pair):
    draft = tiny_pair.draft
    keep = _kept(tiny_pair.tokenizer)
    trimmed = trim.trimmed_copy(draft, keep)
    ids = torch.arange(20)[None]
    with torch.no_grad():
        full, cut = draft(ids).logits, trimmed(ids).logits
    assert cut.shape[-1] == len(keep) and torch.equal(trimmed.draft_to_target, keep)
    torch.testing.assert_close(cut, full[..., keep])
    assert draft.lm_head.weight.shape[0] == draft.config.vocab_size  # the original is untouched


@pytest.mark.parametrize("backend", ["eager", "static"])
@pytest.mark.parametrize("kind,k,batch_size", [("noisy", 1, 1), ("noisy", 4, 4), ("small", 3, 4)])
def test_greedy_equals_target_generate(pairs, tokenizer, examples, kind, k, batch_size, backend):
    target, draft = pairs[kind]
    enc = _batch(tokenizer, examples, batch_size)
    expected = target.generate(**enc, max_new_tokens=30, do_sample=False)
    out = SpeculativeDecoder(target, draft, num_draft_tokens=k, backend=backend).generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=30)
    assert out.sequences.tolist() == expected.tolist()
    new = expected[:, enc["input_ids"].shape[1] :]
    outside = ~torch.isin(new, draft.draft_to_target)
    assert outside.any(), "the case needs target tokens outside the kept set"
    if kind == "noisy":
        assert (~outside).any() and 0 < out.stats.acceptance_rate < 1


def test_static_loop_makes_the_eager_loops_decisions(pairs, tokenizer, examples):
    target, draft = pairs["noisy"]
    enc = _batch(tokenizer, examples, 4)
    runs = [
        SpeculativeDecoder(target, draft, num_draft_tokens=3, backend=b).generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=24)
        for b in ("eager", "static")
    ]
    assert runs[0].sequences.tolist() == runs[1].sequences.tolist()
    assert {n: getattr(runs[0].stats, n) for n in DECISIONS} == {n: getattr(runs[1].stats, n) for n in DECISIONS}


def _proposals(monkeypatch) -> list[torch.Tensor]:
    """Every round's proposals, as the verify step sees them."""
    proposals = []
    verify = SpecLoop._verify

    def spy(self, k):
        proposals.append(self.tokens[:, 1 : k + 1].clone())
        return verify(self, k)

    monkeypatch.setattr(SpecLoop, "_verify", spy)
    return proposals


def test_a_token_outside_the_set_is_never_proposed_and_always_comes_from_the_target(pairs, tokenizer, examples, monkeypatch):
    """Without prompt rows every proposal is a kept id; a target token outside the set ends the round as the target's own token."""
    target, draft = pairs["noisy"]
    proposals = _proposals(monkeypatch)
    enc = _batch(tokenizer, examples, 2)
    out = SpeculativeDecoder(target, draft, num_draft_tokens=4, backend="eager", prompt_rows=0).generate(
        enc["input_ids"], enc["attention_mask"], max_new_tokens=30
    )
    assert trim.prompt_rows(draft) is None
    assert proposals and all(torch.isin(p, draft.draft_to_target).all() for p in proposals)
    assert out.sequences.tolist() == target.generate(**enc, max_new_tokens=30, do_sample=False).tolist()


# --- prompt rows: the prompt's own tokens join the set for the call --------------------------


@pytest.fixture(scope="module")
def copy_pair(tiny_pair):
    """A target and its trimmed noisy copy whose kept set leaves out every token of the prompts below (special
    tokens aside): whatever of the prompt the target repeats, the draft can propose only through prompt rows."""
    target = tiny_pair.real_vocab_target
    prompt_ids = {i for shift in (0, 2) for i in _copy_prompts(tiny_pair.tokenizer, shift)["input_ids"].flatten().tolist()}
    keep = sorted((set(range(len(tiny_pair.tokenizer))) - prompt_ids) | set(trim.always_kept(tiny_pair.tokenizer)))
    return target, trim.trimmed_copy(noisy_copy(target, 0.05, 13), keep)


def _copy_prompts(tokenizer, shift: int = 0):
    tokenizer.padding_side = "left"
    words = ["alpha beta gamma delta", "one two three four five six", "red green blue", "north south east west"]
    texts = [" ".join([words[(i + shift) % 4]] * 4) for i in range(2)]
    return tokenizer(texts, return_tensors="pt", padding=True)


def test_prompt_extras_are_the_most_frequent_prompt_ids_outside_the_set():
    in_set = torch.zeros(10, dtype=torch.bool)
    in_set[[0, 1, 2]] = True
    prompt = torch.tensor([[5, 5, 7, 1, 9, 9, 9, 3, 12]])  # 12 lies past the vocabulary; 1 is kept already
    assert trim.prompt_extras(prompt, in_set, 10, 8).tolist() == [3, 5, 7, 9]
    assert trim.prompt_extras(prompt, in_set, 10, 2).tolist() == [5, 9]  # the two most frequent
    assert trim.prompt_extras(prompt, in_set, 10, 3).tolist() == [3, 5, 9]  # ties to the lower id
    assert trim.prompt_extras(prompt, in_set, 8, 8).tolist() == [3, 5, 7]  # ids >= vocab are never proposed


def test_prompt_rows_score_the_full_heads_rows_and_leave_the_state_dict_alone(tiny_pair):
    draft = tiny_pair.real_vocab_target
    trimmed = trim.trimmed_copy(draft, _kept(tiny_pair.tokenizer))
    keys = set(trimmed.state_dict())
    rows = trim.add_prompt_rows(trimmed, 8)
    added = rows.fill(torch.tensor([3, 6, 6, 9, 2]), len(tiny_pair.tokenizer))
    assert added.tolist() == [3, 6, 9] and set(trimmed.state_dict()) == keys
    ids = torch.arange(20)[None]
    with torch.no_grad():
        full, got = draft(ids).logits, trimmed(ids).logits
    k = len(trimmed.draft_to_target)
    assert got.shape[-1] == k + 8 and torch.equal(rows.map[: k + 3], torch.cat([trimmed.draft_to_target, added]))
    torch.testing.assert_close(got[..., : k + 3], full[..., rows.map[: k + 3]])
    assert torch.isinf(got[..., k + 3 :]).all() and (got[..., k + 3 :] < 0).all()
    assert trim.add_prompt_rows(trimmed, 0) is None and trimmed(ids).logits.shape[-1] == k  # 0 takes them off again


@pytest.mark.parametrize("backend", ["eager", "static", "compiled"])
def test_prompt_rows_propose_what_the_target_copies_from_the_prompt(copy_pair, tokenizer, backend, monkeypatch):
    """Greedy output stays the target's on every backend; the draft proposes prompt tokens outside its set,
    refilled per call (the second call's prompt differs: its rows must reach a captured or compiled step)."""
    target, draft = copy_pair
    if backend == "compiled":
        torch._dynamo.reset()
    decoder = SpeculativeDecoder(target, draft, num_draft_tokens=3, backend=backend)
    for shift in (0, 2):
        proposals = _proposals(monkeypatch)
        enc = _copy_prompts(tokenizer, shift)
        out = decoder.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=24)
        assert out.sequences.tolist() == target.generate(**enc, max_new_tokens=24, do_sample=False).tolist()
        proposed = torch.cat(proposals, 1)
        allowed = torch.cat([draft.draft_to_target, enc["input_ids"].flatten()])
        assert torch.isin(proposed, allowed).all()
        assert (~torch.isin(proposed, draft.draft_to_target)).any(), "no prompt token outside the set was proposed"


def test_prompt_rows_raise_acceptance_where_the_answer_copies_the_prompt(copy_pair, tokenizer):
    target, draft = copy_pair
    enc = _copy_prompts(tokenizer)
    rates = [
        SpeculativeDecoder(target, draft, num_draft_tokens=3, backend="eager", prompt_rows=rows)
        .generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=24)
        .stats.acceptance_rate
        for rows in (0, trim.PROMPT_ROWS)
    ]
    assert rates[1] > rates[0]


def test_a_map_past_the_shared_vocabulary_and_a_trimmed_target_are_refused(tiny_pair):
    draft = trim.trimmed_copy(tiny_pair.draft, [1, 2, len(tiny_pair.tokenizer) + 3])  # a padding row of the draft
    with pytest.raises(ValueError, match="past the .* tokens both models share"):
        SpeculativeDecoder(tiny_pair.target, draft, tokenizer=tiny_pair.tokenizer, draft_tokenizer=tiny_pair.tokenizer)
    with pytest.raises(ValueError, match="the target has a trimmed head"):
        SpeculativeDecoder(trim.trimmed_copy(tiny_pair.target, [1, 2, 3]), tiny_pair.draft)


# --- sampling: the output distribution is the target's -------------------------------------

VOCAB, KEEP = 6, [0, 2, 3, 5]  # ids 1 and 4 can only come from the target's residual and bonus draws


@pytest.fixture(scope="module")
def small_vocab_pair():
    target = tiny_qwen2(VOCAB, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=21, tie_word_embeddings=False, initializer_range=0.5)
    draft = tiny_qwen2(VOCAB, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=22, tie_word_embeddings=False, initializer_range=0.5)
    for m in (target, draft):
        m.generation_config.eos_token_id = None
        m.config.eos_token_id = m.config.pad_token_id = m.config.bos_token_id = None
    return target, trim.trimmed_copy(draft, KEEP)


def _exact_joint(target, prompt, steps, temperature, top_p):
    """P(t1..t_steps | prompt) for every sequence, by enumerating all VOCAB**steps continuations."""
    seqs = torch.tensor(list(itertools.product(range(VOCAB), repeat=steps)), device=prompt.device)
    ids = torch.cat([prompt.expand(len(seqs), -1), seqs], 1)
    with torch.no_grad():
        probs = warp(target(ids).logits, temperature, top_p)
    p = len(prompt[0])
    return probs[:, p - 1 : p - 1 + steps].gather(-1, seqs[..., None]).squeeze(-1).prod(-1).double()


def _chi_square_p(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's test of the counts against the expected counts, the cells expected below 5 pooled into one;
    the p-value from the Wilson-Hilferty normal approximation of the chi-square distribution."""
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    stat = float(((obs - exp) ** 2 / exp.clamp_min(1e-12)).sum())
    df = len(obs) - 1
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _sampled(target, draft, temperature, top_p, backend="eager", n=12000, steps=3, seed=0, loop=None, rows=0):
    """TVD and chi-square p of n sampled continuations of a prompt that holds ids 1 and 4 (outside the set):
    with `rows` prompt rows the draft may propose them, without it only the target emits them."""
    prompt = torch.tensor([[1, 4, 2]])
    exact = _exact_joint(target, prompt, steps, temperature, top_p)
    if loop is None:
        out = SpeculativeDecoder(target, draft, num_draft_tokens=2, backend=backend, prompt_rows=rows).generate(
            prompt.expand(n, -1), max_new_tokens=steps, do_sample=True, temperature=temperature, top_p=top_p, seed=seed
        )
        assert rows == 0 or trim.prompt_rows(draft).map[len(KEEP) : len(KEEP) + 2].tolist() == [1, 4]
    else:
        out = loop.generate(
            prompt.expand(n, -1),
            torch.ones(n, 3, dtype=torch.long),
            steps,
            [],
            0,
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            generator=torch.Generator().manual_seed(seed),
        )
    new = out.sequences[:, -steps:]
    assert out.stats.proposed > 0 and 0 < out.stats.acceptance_rate < 1  # rejections were exercised
    assert torch.isin(new, torch.tensor([1, 4])).any()  # tokens outside the kept set were emitted
    codes = (new * torch.tensor([VOCAB ** (steps - 1 - i) for i in range(steps)])).sum(-1)
    counts = torch.bincount(codes, minlength=VOCAB**steps).double()
    tvd = 0.5 * (counts / n - exact).abs().sum().item()
    return tvd, _chi_square_p(counts, exact * n)


TVD_BOUND = 0.075  # as tests/speculative/test_decoder.py: an exact sampler measured 0.007-0.027 there


@pytest.mark.parametrize("rows", [0, 4])
@pytest.mark.parametrize("backend", ["eager", "static"])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_sampling_follows_the_target_distribution(small_vocab_pair, temperature, top_p, backend, rows):
    tvd, p = _sampled(*small_vocab_pair, temperature, top_p, backend=backend, rows=rows)
    assert tvd < TVD_BOUND and p > 1e-3


@pytest.mark.parametrize("rows", [0, 4])
def test_compiled_draft_sampling_follows_the_target_distribution(small_vocab_pair, rows):
    """The compiled backend maps and scatters the trimmed draft's distribution inside its torch.compile graph."""
    torch._dynamo.reset()
    tvd, p = _sampled(*small_vocab_pair, 0.7, 0.9, backend="compiled", rows=rows)
    assert tvd < TVD_BOUND and p > 1e-3


class _RowsAsIds(SpecLoop):
    """A broken loop: it maps the proposal but writes q at the row indices instead of the mapped ids."""

    def _draft_steps(self, k):
        ids, positions = self.pending, self.pos[:, None] - 1 + self.steps_ahead[:2]
        for j in range(1, k + 1):
            logits = self.dside.forward(ids, positions, keep=1)[:, -1, : self.draft_width]
            choice, probs = self._choose(logits, self.uniforms[:, j - 1])
            self.tokens[:, j] = self.draft_to_target[choice]
            self.q[:, j - 1, : self.draft_width] = probs
            ids, positions = self.tokens[:, j : j + 1], self.pos[:, None] + j


def test_the_sampling_test_catches_a_q_written_at_the_rows_instead_of_the_ids(small_vocab_pair):
    target, draft = small_vocab_pair
    trim.add_prompt_rows(draft, 0)
    tvd, p = _sampled(target, draft, 1.0, 1.0, loop=_RowsAsIds(target, draft, 2, cache="dynamic"))
    assert tvd > TVD_BOUND and p < 1e-6


def _drop_residual(draft_tokens, q, p, u):
    """A broken rule: on rejection it samples from p instead of norm(max(0, p - q))."""
    k = draft_tokens.shape[1]
    idx = draft_tokens[..., None]
    p_d, q_d = p[:, :k].gather(-1, idx).squeeze(-1), q.gather(-1, idx).squeeze(-1)
    n = (u[:, :k] * q_d <= p_d).int().cumprod(-1).sum(-1)
    return n, sample(p.gather(1, n[:, None, None].expand(-1, 1, p.shape[-1])).squeeze(1), u[:, k])


def test_the_sampling_test_catches_a_sampler_that_drops_the_residual(small_vocab_pair, monkeypatch):
    monkeypatch.setattr(loop_module, "rejection_accept", _drop_residual)
    tvd, p = _sampled(*small_vocab_pair, 1.0, 1.0)
    assert tvd > TVD_BOUND and p < 1e-6


# --- CUDA: the graphed loop -----------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_graphed_loop_on_cuda_is_lossless(pairs, small_vocab_pair, tokenizer, examples):
    target, draft = (m.to("cuda") for m in pairs["noisy"])
    try:
        enc = _batch(tokenizer, examples, 4).to("cuda")
        expected = target.generate(**enc, max_new_tokens=30, do_sample=False)
        decoder = SpeculativeDecoder(target, draft, num_draft_tokens=3, backend="static")
        out = decoder.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=30)
        assert out.sequences.tolist() == expected.tolist()
        assert next(iter(decoder._loops.values())).captures > 0
        small_target, small_draft = (m.to("cuda") for m in small_vocab_pair)
        prompt = torch.tensor([[1, 4, 2]], device="cuda")
        exact = _exact_joint(small_target, prompt, 3, 1.0, 1.0).cpu()
        n = 12000
        out = SpeculativeDecoder(small_target, small_draft, num_draft_tokens=2, backend="static").generate(
            prompt.expand(n, -1), max_new_tokens=3, do_sample=True, seed=0
        )
        codes = (out.sequences[:, -3:].cpu() * torch.tensor([36, 6, 1])).sum(-1)
        counts = torch.bincount(codes, minlength=VOCAB**3).double()
        assert 0.5 * (counts / n - exact).abs().sum().item() < TVD_BOUND and _chi_square_p(counts, exact * n) > 1e-3
    finally:
        for m in (*pairs["noisy"], *small_vocab_pair):
            m.to("cpu")


@pytest.mark.parametrize("backend", ["eager", "static"])
def test_costs_time_the_head_the_decoder_runs(tiny_pair, backend):
    """c of a trimmed draft includes its prompt rows: the default ones when no decoder chose others first."""
    from distill.speculative.costs import measure_costs

    target = tiny_pair.real_vocab_target
    fresh, chosen = (trim.trimmed_copy(noisy_copy(target, 0.05, 13), _kept(tiny_pair.tokenizer)) for _ in range(2))
    SpeculativeDecoder(target, chosen, num_draft_tokens=2, prompt_rows=16)
    for draft in (fresh, chosen):
        measure_costs(target, draft, ks=[1], prompt_len=8, repeats=1, warmup=1, backend=backend)
    assert trim.prompt_rows(fresh).capacity == trim.PROMPT_ROWS and trim.prompt_rows(chosen).capacity == 16
