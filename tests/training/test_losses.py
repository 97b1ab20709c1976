"""distill.training.losses against hand computations, against their definitions and against TRL's
`generalized_jsd_loss`; chunked, sparse and fused forms against the plain dense computation."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from distill.training.losses import (
    DIVERGENCES,
    distillation_loss,
    divergence,
    fused_divergence,
    sparse_divergence,
)

# Two tokens over a 3-token vocabulary: teacher p, student q (hand-checked numbers below).
P = [[0.5, 0.25, 0.25], [0.2, 0.2, 0.6]]
Q = [[0.8, 0.1, 0.1], [0.2, 0.2, 0.6]]


def _logits(probs) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log().unsqueeze(0)  # [1, T, V]


def _random(b=2, t=5, v=11, seed=0, scale=2.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    s = (torch.randn(b, t, v, generator=g, dtype=dtype) * scale).requires_grad_()
    te = torch.randn(b, t, v, generator=g, dtype=dtype) * scale
    mask = torch.rand(b, t, generator=g) > 0.3
    mask[0, 0] = True
    return s, te, mask


def _grad(loss, *inputs):
    return torch.autograd.grad(loss, inputs)


# --------------------------------------------------------------------------------------------
# Each divergence against its definition and a hand computation


def test_forward_kl_is_nonnegative_and_zero_only_for_equal_distributions():
    s, t, _ = _random(seed=1)
    assert divergence("forward_kl", s, t) > 0.1
    per_token = [divergence("forward_kl", s[:, i : i + 1], t[:, i : i + 1]) for i in range(s.shape[1])]
    assert all(x > 0 for x in per_token)
    assert divergence("forward_kl", t, t).abs() < 1e-12
    # equal distributions, different logits (a constant shift): still zero
    assert divergence("forward_kl", t + 3.0, t).abs() < 1e-12


def test_each_divergence_matches_the_hand_computation():
    s, t = _logits(Q), _logits(P)
    ln = math.log
    # token 0: KL(p||q) = .5 ln(.5/.8) + 2 * .25 ln(.25/.1) = .5 ln(.625 * 2.5) = ln 1.25; token 1: p == q, 0
    fkl = (ln(1.25) + 0) / 2
    rkl = (0.8 * ln(0.8 / 0.5) + 0.2 * ln(0.1 / 0.25)) / 2
    tvd = 0.5 * (0.3 + 0.15 + 0.15) / 2
    # β = 0.5: m = (q + p)/2 = [.65, .175, .175]; JSD = .5 KL(p||m) + .5 KL(q||m)
    kl_pm = 0.5 * ln(0.5 / 0.65) + 0.5 * ln(0.25 / 0.175)
    kl_qm = 0.8 * ln(0.8 / 0.65) + 0.2 * ln(0.1 / 0.175)
    jsd = (0.5 * kl_pm + 0.5 * kl_qm) / 2
    # β = 0.25: m = .75 q + .25 p = [.725, .1375, .1375]; JSD = .25 KL(p||m) + .75 KL(q||m)
    m = [0.725, 0.1375, 0.1375]
    jsd_quarter = (0.25 * sum(a * ln(a / b) for a, b in zip(P[0], m)) + 0.75 * sum(a * ln(a / b) for a, b in zip(Q[0], m))) / 2
    assert divergence("forward_kl", s, t).item() == pytest.approx(fkl, rel=1e-12)
    assert divergence("forward_kl", s, t).item() == pytest.approx(0.1115718, rel=1e-6)
    assert divergence("reverse_kl", s, t).item() == pytest.approx(rkl, rel=1e-12)
    assert divergence("tvd", s, t).item() == pytest.approx(tvd, rel=1e-12)
    assert divergence("jsd", s, t, beta=0.5).item() == pytest.approx(jsd, rel=1e-12)
    assert divergence("jsd", s, t, beta=0.25).item() == pytest.approx(jsd_quarter, rel=1e-12)
    assert divergence("jsd", s, t, beta=0.0).item() == pytest.approx(fkl, rel=1e-12)
    assert divergence("jsd", s, t, beta=1.0).item() == pytest.approx(rkl, rel=1e-12)


def test_tvd_equals_one_minus_overlap_and_half_l1():
    s, t, mask = _random(seed=2)
    p, q = s.detach().softmax(-1), t.softmax(-1)
    overlap = 1 - torch.minimum(p, q).sum(-1)
    half_l1 = 0.5 * (p - q).abs().sum(-1)
    torch.testing.assert_close(overlap, half_l1)
    assert divergence("tvd", s, t, mask).item() == pytest.approx(overlap[mask].mean().item(), rel=1e-12)
    assert 0 < divergence("tvd", s, t).item() < 1


@pytest.fixture(scope="module")
def trl_jsd():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gkd = pytest.importorskip("trl.experimental.gkd.gkd_trainer")
    return gkd.GKDTrainer.generalized_jsd_loss


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_jsd_equals_trl_generalized_jsd_loss(trl_jsd, beta, temperature):
    s, t, mask = _random(seed=3)
    labels = torch.where(mask, 1, -100)
    ours = divergence("jsd", s, t, mask, temperature=temperature, beta=beta)
    theirs = trl_jsd(s, t, labels=labels, beta=beta, temperature=temperature)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    torch.testing.assert_close(_grad(ours, s)[0], _grad(theirs, s)[0], rtol=1e-5, atol=1e-9)
    if beta in (0.0, 1.0):
        endpoint = "forward_kl" if beta == 0 else "reverse_kl"
        assert ours.item() == pytest.approx(divergence(endpoint, s, t, mask, temperature=temperature).item(), rel=1e-12)


# --------------------------------------------------------------------------------------------
# Mask, temperature, chunking


@pytest.mark.parametrize("name", DIVERGENCES)
def test_mask_averages_over_counted_tokens_only(name):
    s, t, mask = _random(seed=4)
    garbage = s.detach().clone()
    garbage[~mask] = 1e4 * torch.randn_like(garbage[~mask])
    garbage.requires_grad_()
    expected = torch.stack([divergence(name, s[b : b + 1, i : i + 1], t[b : b + 1, i : i + 1]) for b, i in mask.nonzero()]).mean()
    loss = divergence(name, garbage, t, mask)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-9)
    assert divergence(name, garbage, t, mask.long()).item() == pytest.approx(expected.item(), rel=1e-9)
    (g,) = _grad(loss, garbage)
    assert g[~mask].abs().max() == 0 and g[mask].abs().max() > 0
    # nothing counted: zero, and backward still works
    empty = divergence(name, s, t, torch.zeros_like(mask))
    assert empty.item() == 0 and _grad(empty, s)[0].abs().max() == 0


@pytest.mark.parametrize("name", DIVERGENCES)
def test_temperature_divides_both_sides_logits(name):
    s, t, mask = _random(seed=5)
    hot = divergence(name, s, t, mask, temperature=2.5)
    assert hot.item() == pytest.approx(divergence(name, s / 2.5, t / 2.5, mask).item(), rel=1e-12)
    assert hot < divergence(name, s, t, mask)  # flatter distributions are closer


def test_temperature_hand_value():
    # logits ln(p) at T = 2 give p^(1/2) renormalised: [.5,.25,.25] -> [.4142, .2929, .2929]
    s, t = _logits(Q)[:, :1], _logits(P)[:, :1]
    p = [x**0.5 for x in P[0]]
    q = [x**0.5 for x in Q[0]]
    p, q = [x / sum(p) for x in p], [x / sum(q) for x in q]
    expected = sum(a * math.log(a / b) for a, b in zip(p, q))
    assert divergence("forward_kl", s, t, temperature=2.0).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", DIVERGENCES)
@pytest.mark.parametrize("chunk_size", [1, 3, 7])
def test_chunked_equals_unchunked(name, chunk_size):
    s, t, mask = _random(seed=6)
    full = divergence(name, s, t, mask, temperature=1.5, beta=0.3)
    chunked = divergence(name, s, t, mask, temperature=1.5, beta=0.3, chunk_size=chunk_size)
    assert chunked.item() == pytest.approx(full.item(), rel=1e-12)
    torch.testing.assert_close(_grad(chunked, s)[0], _grad(full, s)[0], rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------------
# Sparse top-k teacher


@pytest.mark.parametrize("name", DIVERGENCES)
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_sparse_with_k_equal_to_vocab_equals_dense(name, temperature):
    s, t, mask = _random(seed=7)
    logp, ids = t.log_softmax(-1).topk(t.shape[-1], -1)
    dense = divergence(name, s, t, mask, temperature=temperature, beta=0.3)
    sparse = sparse_divergence(name, s, ids, logp, mask, temperature=temperature, beta=0.3, chunk_size=4)
    assert sparse.item() == pytest.approx(dense.item(), rel=1e-9)
    torch.testing.assert_close(_grad(sparse, s)[0], _grad(dense, s)[0], rtol=1e-8, atol=1e-12)


def test_sparse_tail_bucket_hand_value():
    # teacher [.5, .3, .15, .05] keeps ids (1, 0) -> buckets [.3, .5 | tail .2];
    # student [.4, .4, .1, .1] aggregated the same way -> [.4, .4 | .2]
    teacher = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    s = torch.tensor([0.4, 0.4, 0.1, 0.1], dtype=torch.float64).log().view(1, 1, 4).requires_grad_()
    ids = torch.tensor([1, 0]).view(1, 1, 2)
    logp = teacher[[1, 0]].log().view(1, 1, 2)
    ln = math.log
    expected = {
        "forward_kl": 0.3 * ln(0.3 / 0.4) + 0.5 * ln(0.5 / 0.4) + 0.2 * ln(0.2 / 0.2),
        "reverse_kl": 0.4 * ln(0.4 / 0.3) + 0.4 * ln(0.4 / 0.5) + 0.0,
        "tvd": 0.5 * (0.1 + 0.1 + 0.0),
    }
    for name, value in expected.items():
        assert sparse_divergence(name, s, ids, logp).item() == pytest.approx(value, rel=1e-12), name
    # without its tail bucket the teacher's top-2 would renormalise to [.375, .625]: a different number
    assert sparse_divergence("forward_kl", s, ids, logp).item() != pytest.approx(0.375 * ln(0.375 / 0.5) + 0.625 * ln(0.625 / 0.5), rel=1e-3)
    (g,) = _grad(sparse_divergence("jsd", s, ids, logp), s)
    assert torch.isfinite(g).all()


def test_sparse_gradients_are_finite_with_a_zero_tail():
    # the teacher's top-k carry all its mass (tail exactly 0) while k < vocab
    s = torch.randn(1, 3, 6, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[0, 1]]).expand(1, 3, 2)
    logp = torch.tensor([0.5, 0.5], dtype=torch.float64).log().expand(1, 3, 2)
    for name in DIVERGENCES:
        loss = sparse_divergence(name, s, ids, logp)
        assert torch.isfinite(loss) and torch.isfinite(_grad(loss, s)[0]).all(), name


# --------------------------------------------------------------------------------------------
# Padded vocabularies (Qwen2.5: 7B pads to 152,064 rows, 0.5B to 151,936)


@pytest.mark.parametrize("name", DIVERGENCES)
def test_padded_vocabularies_equal_the_unpadded_computation(name):
    s, t, mask = _random(seed=8)
    v = s.shape[-1]
    s_pad = torch.cat([s.detach(), 50 * torch.randn(*s.shape[:2], 8, dtype=s.dtype)], -1).requires_grad_()
    t_pad = torch.cat([t, 50 * torch.randn(*t.shape[:2], 32, dtype=t.dtype)], -1)
    plain = divergence(name, s, t, mask)
    padded = divergence(name, s_pad, t_pad, mask, vocab_size=v)
    assert padded.item() == pytest.approx(plain.item(), rel=1e-12)
    (g,) = _grad(padded, s_pad)
    torch.testing.assert_close(g[..., :v], _grad(plain, s)[0])
    assert g[..., v:].abs().max() == 0  # student padding rows stay out of the softmax
    # vocab_size=None: the smaller width (the student's V+8) is compared
    assert divergence(name, s_pad, t_pad, mask).item() == pytest.approx(divergence(name, s_pad, t_pad[..., : v + 8], mask).item(), rel=1e-12)
    logp, ids = t.log_softmax(-1).topk(4, -1)
    assert sparse_divergence(name, s_pad, ids, logp, mask, vocab_size=v).item() == pytest.approx(sparse_divergence(name, s, ids, logp, mask).item(), rel=1e-12)


# --------------------------------------------------------------------------------------------
# Combined objective and the fused hidden-state form


def test_distillation_loss_adds_weighted_cross_entropy():
    s, t, mask = _random(seed=9)
    labels = torch.randint(0, s.shape[-1], mask.shape)
    labels[~mask] = -100
    ce = F.cross_entropy(s.reshape(-1, s.shape[-1]), labels.reshape(-1), ignore_index=-100)
    expected = divergence("forward_kl", s, t, mask, temperature=2.0) + 0.3 * ce
    # without a mask, labels != -100 is the mask
    got = distillation_loss("forward_kl", s, t, labels=labels, ce_weight=0.3, temperature=2.0, chunk_size=3)
    assert got.item() == pytest.approx(expected.item(), rel=1e-9)
    torch.testing.assert_close(_grad(got, s)[0], _grad(expected, s)[0])


@pytest.mark.parametrize("name", DIVERGENCES)
@pytest.mark.parametrize("teacher", ["dense", "sparse"])
def test_fused_equals_unfused_values_and_gradients(name, teacher):
    g = torch.Generator().manual_seed(10)
    v, h = 11, 6
    hidden = torch.randn(2, 5, h, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v + 8, h, generator=g, dtype=torch.float64, requires_grad=True)  # student padded V+8
    t = torch.randn(2, 5, v + 32, generator=g, dtype=torch.float64) * 2  # teacher padded V+32
    mask = torch.rand(2, 5, generator=g) > 0.3
    labels = torch.randint(0, v, (2, 5), generator=g)
    labels[0, :2] = -100
    if teacher == "dense":
        kw = {"teacher_logits": t}
    else:
        logp, ids = t[..., :v].log_softmax(-1).topk(4, -1)
        kw = {"teacher_topk_ids": ids, "teacher_topk_logprobs": logp}
    opts = dict(mask=mask, temperature=1.7, beta=0.4, vocab_size=v, labels=labels, ce_weight=0.5)
    plain = distillation_loss(name, hidden @ weight.T, **kw, **opts)
    fused = fused_divergence(name, hidden, weight, **kw, chunk_size=3, **opts)
    assert fused.item() == pytest.approx(plain.item(), rel=1e-12)
    gh, gw = _grad(fused, hidden, weight)
    ph, pw = _grad(plain, hidden, weight)
    torch.testing.assert_close(gh, ph)
    torch.testing.assert_close(gw, pw)
    assert gw[v:].abs().max() == 0 and gw[:v].abs().max() > 0
    # a scaled loss scales the gradient (the upstream gradient is applied)
    torch.testing.assert_close(_grad(3 * fused_divergence(name, hidden, weight, **kw, **opts), weight)[0], 3 * pw)


def test_fused_float32_chunked_matches_unchunked():
    g = torch.Generator().manual_seed(11)
    hidden = torch.randn(1, 64, 16, generator=g, requires_grad=True)
    weight = (torch.randn(300, 16, generator=g) * 0.25).requires_grad_()
    t = torch.randn(1, 64, 300, generator=g)
    plain = divergence("forward_kl", hidden @ weight.T, t)
    fused = fused_divergence("forward_kl", hidden, weight, teacher_logits=t, chunk_size=16)
    torch.testing.assert_close(fused, plain)
    for a, b in zip(_grad(fused, hidden, weight), _grad(plain, hidden, weight)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    with torch.no_grad():  # evaluation: the same value, no graph
        evaluated = fused_divergence("forward_kl", hidden, weight, teacher_logits=t, chunk_size=16)
    assert not evaluated.requires_grad
    torch.testing.assert_close(evaluated, plain.detach())


# --------------------------------------------------------------------------------------------
# Bad input


def test_errors_name_the_problem():
    s, t, mask = _random()
    with pytest.raises(ValueError, match="forward_kl, reverse_kl, jsd, tvd"):
        divergence("kl", s, t)
    with pytest.raises(ValueError, match="beta=1.5"):
        divergence("jsd", s, t, beta=1.5)
    with pytest.raises(ValueError, match="temperature=0"):
        divergence("jsd", s, t, temperature=0)
    with pytest.raises(ValueError, match="chunk_size=0"):
        divergence("tvd", s, t, chunk_size=0)
    with pytest.raises(ValueError, match=r"teacher_logits has shape \[2, 4, 11\]"):
        divergence("tvd", s, t[:, :4])
    with pytest.raises(ValueError, match="mask has shape"):
        divergence("tvd", s, t, mask[:, :3])
    with pytest.raises(ValueError, match="vocab_size=12"):
        divergence("tvd", s, t, vocab_size=12)
    with pytest.raises(ValueError, match="needs labels"):
        distillation_loss("tvd", s, t, ce_weight=1.0)
    with pytest.raises(ValueError, match="not both or neither"):
        distillation_loss("tvd", s)
    ids = torch.full((2, 5, 3), 11)
    with pytest.raises(ValueError, match=r"teacher_topk_ids must lie in \[0, 11\)"):
        sparse_divergence("tvd", s, ids, torch.full((2, 5, 3), -2.0))
    with pytest.raises(ValueError, match="same hidden size"):
        fused_divergence("tvd", torch.randn(2, 5, 6), torch.randn(11, 7), teacher_logits=t)


def test_divergence_weight_scales_the_divergence_and_zero_leaves_plain_cross_entropy():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 5, 11), torch.randn(2, 5, 11)
    labels = torch.randint(0, 11, (2, 5))
    div = distillation_loss("forward_kl", student, teacher, labels=labels)
    both = distillation_loss("forward_kl", student, teacher, labels=labels, ce_weight=1.0, divergence_weight=2.0)
    ce_only = distillation_loss("forward_kl", student, teacher, labels=labels, ce_weight=1.0, divergence_weight=0.0)
    ce = torch.nn.functional.cross_entropy(student.reshape(-1, 11), labels.reshape(-1))
    assert torch.allclose(ce_only, ce, atol=1e-6)
    assert torch.allclose(both, 2 * div + ce, atol=1e-6)
    with pytest.raises(ValueError, match="divergence_weight"):
        distillation_loss("forward_kl", student, teacher, divergence_weight=-1.0)


def test_fused_loss_evaluates_under_no_grad_with_a_parameter_head():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 13, bias=False)
    hidden, teacher = torch.randn(2, 4, 8), torch.randn(2, 4, 13)
    with torch.no_grad():
        fused = fused_divergence("jsd", hidden, head.weight, teacher_logits=teacher, chunk_size=3)
    assert torch.allclose(fused, divergence("jsd", hidden @ head.weight.detach().T, teacher), atol=1e-6)
