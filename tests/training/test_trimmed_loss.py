"""The distillation loss of a trimmed draft (distill.training.losses with `draft_to_target`): the teacher
renormalised over the kept ids, or with an explicit "other" bucket; from dense logits and from a top-k
teacher; materialised and fused alike; and the trainer's evaluation of a trimmed draft."""

from __future__ import annotations

import pytest
import torch

from distill.training import losses

V, K, H = 12, 5, 8
KEEP = torch.tensor([0, 2, 3, 7, 10])


def _data(seed=0, width=K, n=(2, 3)):
    gen = torch.Generator().manual_seed(seed)
    student = torch.randn(*n, width, generator=gen, dtype=torch.float64) * 2
    teacher = torch.randn(*n, V + 4, generator=gen, dtype=torch.float64) * 2  # padded past the shared V
    return student, teacher


def _reference(name, student, teacher, other, temperature=1.0, beta=0.5):
    """The bucket distributions written out by hand: teacher's kept ids (+ the mass of the others)."""
    p = torch.softmax(teacher[..., :V] / temperature, -1)
    kept = p[..., KEEP]
    if other:
        t = torch.cat([kept, 1 - kept.sum(-1, keepdim=True)], -1)
    else:
        t = kept / kept.sum(-1, keepdim=True)
    s = torch.log_softmax(student / temperature, -1)
    fn = {"forward_kl": losses.forward_kl, "reverse_kl": losses.reverse_kl, "tvd": losses.tvd, "jsd": lambda a, b: losses.jsd(a, b, beta)}[name]
    return fn(s, t.log()).mean()


@pytest.mark.parametrize("name", losses.DIVERGENCES)
@pytest.mark.parametrize("mode", ["renormalise", "other_bucket"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_dense_teacher_matches_the_bucket_distributions_by_hand(name, mode, temperature):
    other = mode == "other_bucket"
    student, teacher = _data(width=K + other)
    got = losses.distillation_loss(name, student, teacher, vocab_size=V, temperature=temperature, draft_to_target=KEEP, trimmed_vocab=mode)
    torch.testing.assert_close(got, _reference(name, student, teacher, other, temperature))


@pytest.mark.parametrize("name", losses.DIVERGENCES)
def test_keeping_every_id_is_the_untrimmed_loss(name):
    gen = torch.Generator().manual_seed(1)
    student, teacher = torch.randn(2, 3, V, generator=gen, dtype=torch.float64), torch.randn(2, 3, V + 4, generator=gen, dtype=torch.float64)
    plain = losses.distillation_loss(name, student, teacher, vocab_size=V)
    trimmed = losses.distillation_loss(name, student, teacher, vocab_size=V, draft_to_target=torch.arange(V))
    torch.testing.assert_close(trimmed, plain)


@pytest.mark.parametrize("mode", ["renormalise", "other_bucket"])
def test_a_full_top_k_teacher_gives_the_dense_loss(mode):
    """With every id cached there is no tail: the top-k buckets hold exactly the dense distribution."""
    other = mode == "other_bucket"
    student, teacher = _data(width=K + other)
    lps, ids = torch.log_softmax(teacher[..., :V], -1).sort(-1, descending=True)
    dense = losses.distillation_loss("forward_kl", student, teacher, vocab_size=V, draft_to_target=KEEP, trimmed_vocab=mode)
    sparse = losses.distillation_loss(
        "forward_kl", student, teacher_topk_ids=ids, teacher_topk_logprobs=lps, vocab_size=V, draft_to_target=KEEP, trimmed_vocab=mode
    )
    torch.testing.assert_close(sparse, dense)


def test_a_short_top_k_teacher_puts_its_tail_on_the_rest_of_the_set_and_its_outside_ids_in_other():
    student = torch.tensor([[[0.5, -1.0, 2.0, 0.0, 1.0, 0.3]]], dtype=torch.float64)  # K rows + other
    ids = torch.tensor([[[2, 1, 7]]])  # 2 and 7 kept (rows 1 and 3), 1 outside
    p = torch.tensor([[[0.5, 0.2, 0.1]]], dtype=torch.float64)  # tail 0.2
    got = losses.token_divergence(
        "forward_kl", student[0], teacher_topk_ids=ids[0], teacher_topk_logprobs=p.log()[0], vocab_size=V, draft_to_target=KEEP, trimmed_vocab="other_bucket"
    )
    q = torch.softmax(student[0, 0], -1)
    s = torch.stack([q[1], q[3], q[0] + q[2] + q[4], q[5]])  # row of id 2, row of id 7, rest of the set, other
    t = torch.tensor([0.5, 0.1, 0.2, 0.2], dtype=torch.float64)
    torch.testing.assert_close(got[0], (t * (t.log() - s.log())).sum())
    renorm = losses.token_divergence(
        "forward_kl", student[0, :, :K], teacher_topk_ids=ids[0], teacher_topk_logprobs=p.log()[0], vocab_size=V, draft_to_target=KEEP
    )
    q = torch.softmax(student[0, 0, :K], -1)
    s, t = torch.stack([q[1], q[3], q[0] + q[2] + q[4]]), torch.tensor([0.5, 0.1, 0.2], dtype=torch.float64) / 0.8
    torch.testing.assert_close(renorm[0], (t * (t.log() - s.log())).sum())


def test_a_top_k_teacher_with_all_its_mass_outside_the_set_stays_finite():
    student = torch.randn(1, 1, K, dtype=torch.float64)
    ids, lps = torch.tensor([[[1, 4]]]), torch.tensor([[[0.0, -200.0]]], dtype=torch.float64)  # all the mass on id 1
    for mode, width in (("renormalise", K), ("other_bucket", K + 1)):
        s = torch.randn(1, 1, width, dtype=torch.float64, requires_grad=True)
        loss = losses.distillation_loss(
            "forward_kl", s, teacher_topk_ids=ids, teacher_topk_logprobs=lps, vocab_size=V, draft_to_target=KEEP, trimmed_vocab=mode
        )
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(s.grad).all()
    assert student.shape[-1] == K


@pytest.mark.parametrize("mode", ["renormalise", "other_bucket"])
@pytest.mark.parametrize("sparse", [False, True])
def test_fused_equals_materialised_with_gradients(mode, sparse):
    other = mode == "other_bucket"
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 4, H, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(K + other, H, generator=gen, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(2, 4, V + 4, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[True, True, False, True], [False, True, True, True]])
    labels = torch.tensor([[2, 1, -100, 7], [3, -100, 10, 5]])
    signal = {"teacher_logits": teacher}
    if sparse:
        lps, ids = torch.log_softmax(teacher[..., :V], -1).topk(4, -1)
        signal = {"teacher_topk_ids": ids, "teacher_topk_logprobs": lps}
    common = dict(mask=mask, vocab_size=V, labels=labels, ce_weight=0.3, draft_to_target=KEEP, trimmed_vocab=mode, **signal)
    fused = losses.fused_divergence("jsd", hidden, weight, chunk_size=3, **common)
    g_fused = torch.autograd.grad(fused, (hidden, weight))
    plain = losses.distillation_loss("jsd", hidden @ weight.T, **common)
    g_plain = torch.autograd.grad(plain, (hidden, weight))
    torch.testing.assert_close(fused, plain)
    for a, b in zip(g_fused, g_plain):
        torch.testing.assert_close(a, b)


def test_cross_entropy_counts_kept_labels_and_sends_the_others_to_the_other_row():
    student = torch.randn(1, 3, K + 1, dtype=torch.float64)
    teacher = torch.randn(1, 3, V, dtype=torch.float64)
    labels = torch.tensor([[2, 1, 10]])  # rows 1, (outside), 4
    ce_only = dict(vocab_size=V, labels=labels, ce_weight=1.0, divergence_weight=0.0, draft_to_target=KEEP)
    other = losses.distillation_loss("forward_kl", student, teacher, trimmed_vocab="other_bucket", **ce_only)
    logp = torch.log_softmax(student[0], -1)
    torch.testing.assert_close(other, -(logp[0, 1] + logp[1, K] + logp[2, 4]) / 3)
    renorm = losses.distillation_loss("forward_kl", student[..., :K], teacher, **ce_only)
    logp = torch.log_softmax(student[0, :, :K], -1)
    torch.testing.assert_close(renorm, -(logp[0, 1] + logp[2, 4]) / 3)  # the outside label counts nothing


def test_bad_trimmed_input_is_refused():
    student, teacher = _data()
    with pytest.raises(ValueError, match="trimmed to 5 ids plus the other row: 6 expected"):
        losses.distillation_loss("forward_kl", student, teacher, vocab_size=V, draft_to_target=KEEP, trimmed_vocab="other_bucket")
    with pytest.raises(ValueError, match="repeats an id"):
        losses.distillation_loss("forward_kl", student, teacher, vocab_size=V, draft_to_target=torch.tensor([0, 2, 2, 7, 10]))
    with pytest.raises(ValueError, match=r"ids in \[0, 12\)"):
        losses.distillation_loss("forward_kl", student, teacher, vocab_size=V, draft_to_target=torch.tensor([0, 2, 3, 7, 12]))
    with pytest.raises(ValueError, match="choose one of renormalise, other_bucket"):
        losses.distillation_loss("forward_kl", student, teacher, vocab_size=V, draft_to_target=KEEP, trimmed_vocab="renormalize")
    lps, ids = torch.log_softmax(teacher[..., :V], -1).topk(3, -1)
    with pytest.raises(ValueError, match="needs vocab_size"):
        losses.distillation_loss("forward_kl", student, teacher_topk_ids=ids, teacher_topk_logprobs=lps, draft_to_target=KEEP)


# --- the trainer ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trim_run(tiny_run):
    return tiny_run(
        "trimmed",
        train_rows=48,
        eval_rows=8,
        training={"max_steps": 2, "per_device_train_batch_size": 8, "learning_rate": 1e-2, "logging_steps": 1, "save_steps": 100, "report_to": ["none"]},
    )


@pytest.mark.parametrize("mode", ["renormalise", "other_bucket"])
@pytest.mark.parametrize("teacher", ["online", "cache"])
def test_a_trimmed_draft_trains_evaluates_and_saves_as_the_decoder_reads_it(trim_run, mode, teacher):
    from distill.common import trim
    from distill.common.models import load_model
    from distill.training.recipe import load_recipe
    from distill.training.train import train

    name = f"{mode}-{teacher}"
    draft = {**trim_run.recipe()["draft"], "vocab": {"size": 48}}
    sections = {"teacher": {"mode": "cache", "cache_dir": str(trim_run / f"cache-{name}"), "top_k": 8}} if teacher == "cache" else {}
    recipe = load_recipe(trim_run.recipe(name, draft=draft, loss={"trimmed_vocab": mode}, **sections))
    metrics = train(recipe)
    assert 0 < metrics["eval_teacher_mass_outside"] < 1 and 0 <= metrics["eval_expected_acceptance"] <= 1
    saved = load_model(trim_run / name / "draft")
    ids = saved.draft_to_target
    assert ids.numel() == 48 and saved.lm_head.weight.shape[0] == 48  # the other-bucket row is not saved
    info = trim.read_map(trim_run / name / "draft")[1]
    assert info["count_from"] == "training responses" and info["trained_with"] == mode
    assert trim.full_head(saved).shape[0] == saved.get_input_embeddings().weight.shape[0]


def test_trimmed_recipe_keys_are_checked():
    from distill.training.recipe import RecipeError, load_recipe

    base = {
        "output_dir": "x",
        "target": {"name_or_path": "t"},
        "draft": {"config": {"hidden_size": 8}, "vocab": {"size": 64}},
        "data": {"dataset": "d.jsonl"},
        "training": {"max_steps": 1},
    }
    assert load_recipe(base).draft.vocab.size == 64
    with pytest.raises(RecipeError, match="loss.lmbda: 0"):
        load_recipe({**base, "loss": {"lmbda": 0.5}})
    with pytest.raises(RecipeError, match="draft.vocab.size: must be > 0"):
        load_recipe({**base, "draft": {"config": {"hidden_size": 8}, "vocab": {"size": 0}}})
    with pytest.raises(RecipeError, match="'renormalise'"):
        load_recipe({**base, "loss": {"trimmed_vocab": "renormalize"}})
    lora = {"name_or_path": "d", "lora": {}, "vocab": {"size": 64}}
    assert load_recipe({**base, "draft": lora}).draft.lora is not None
    with pytest.raises(RecipeError, match="LoRA run keeps frozen"):
        load_recipe({**base, "draft": lora, "loss": {"trimmed_vocab": "other_bucket"}})
