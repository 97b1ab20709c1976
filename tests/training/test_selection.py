"""AdaSPEC token selection (distill.training.selection): which tokens are kept, and the trainer that trains on
them, with an online teacher or a teacher cache, full or LoRA."""

from __future__ import annotations

import copy

import pytest
import torch
import yaml

from distill.training import losses
from distill.training.recipe import RecipeError, load_recipe
from distill.training.selection import select_tokens, token_losses
from distill.training.teacher import cache_teacher
from distill.training.train import build_trainer, main, train


def test_selection_keeps_exactly_the_top_fraction_by_draft_minus_reference_loss():
    mask = torch.tensor(
        [
            [False, True, True, True, True, False],  # row 0: prompt, 4 response tokens, padding
            [False, False, True, True, True, True],
        ]
    )
    draft = torch.tensor([[9.0, 0.5, 3.0, 1.0, 2.0, 9.0], [9.0, 9.0, 4.0, 0.2, 1.0, 5.0]])
    reference = torch.tensor([[0.0, 0.4, 1.0, 1.0, 0.5, 0.0], [0.0, 0.0, 1.0, 0.1, 1.0, 1.0]])
    # gaps on the 8 response tokens: 0.1, 2.0, 0.0, 1.5 | 3.0, 0.1, 0.0, 4.0
    kept = select_tokens(draft, reference, mask, 0.5)
    assert kept.tolist() == [[False, False, True, False, True, False], [False, False, True, False, False, True]]
    assert select_tokens(draft, reference, mask, 0.3).sum() == 3  # ceil(0.3 x 8)
    assert select_tokens(draft, reference, mask, 1.0).tolist() == mask.tolist()
    # ties keep the earlier token; a masked-out position never wins, however large its gap
    tie = select_tokens(torch.ones(1, 4), torch.zeros(1, 4), torch.tensor([[True, False, True, True]]), 0.5)
    assert tie.tolist() == [[True, False, True, False]]
    with pytest.raises(ValueError, match=r"keep_fraction=0 must be in \(0, 1\]"):
        select_tokens(draft, reference, mask, 0)


def test_token_losses_are_the_divergence_of_each_masked_token():
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 3, 10), torch.randn(2, 3, 10)
    mask = torch.tensor([[True, False, True], [False, True, True]])
    got = token_losses("forward_kl", lambda sel: student[sel], {"teacher_logits": teacher}, mask, vocab_size=10, chunk_size=2)
    t, s = torch.log_softmax(teacher, -1), torch.log_softmax(student, -1)
    expected = (t.exp() * (t - s)).sum(-1) * mask
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("signal", ["dense", "top-k cache"])
@pytest.mark.parametrize("name", losses.DIVERGENCES)
def test_token_losses_average_to_the_training_loss_for_every_divergence(name, signal):
    """Selection ranks tokens by the very loss the draft trains on: the per-token values, averaged
    over the mask, are the trainer's loss, for every divergence, dense or from the teacher cache."""
    torch.manual_seed(1)
    student, teacher = torch.randn(2, 5, 12), torch.randn(2, 5, 12)
    mask = torch.tensor([[False, True, True, True, False], [True, True, False, True, True]])
    options = dict(temperature=2.0, beta=0.3, vocab_size=12)
    if signal == "dense":
        given = {"teacher_logits": teacher}
        mean = losses.divergence(name, student, teacher, mask, **options)
    else:
        top = torch.log_softmax(teacher, -1).topk(4, dim=-1)
        given = {"teacher_topk_ids": top.indices, "teacher_topk_logprobs": top.values}
        mean = losses.sparse_divergence(name, student, top.indices, top.values, mask, **options)
    per_token = token_losses(name, lambda sel: student[sel], given, mask, chunk_size=3, **options)
    assert (per_token[~mask] == 0).all() and (per_token[mask] > 0).all()
    torch.testing.assert_close(per_token.sum() / mask.sum(), mean)


@pytest.fixture(scope="module")
def tiny(tiny_run, tokenizer):
    """A saved target, a saved reference draft (a noisy copy of a small draft), 16 training and 4 eval examples."""
    from distill.common.tiny import tiny_qwen2

    run = tiny_run(
        "selection",
        train_rows=16,
        eval_rows=4,
        training={
            "max_steps": 2,
            "per_device_train_batch_size": 4,
            "logging_steps": 1,
            "save_steps": 2,
            "report_to": ["none"],
        },
    )
    reference = tiny_qwen2(len(tokenizer) + 8, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, tokenizer=tokenizer, seed=5)
    reference.save_pretrained(run / "reference")
    tokenizer.save_pretrained(run / "reference")
    return run


def recipe(run, keep: float | None = 0.4, **sections) -> dict:
    """The run's recipe, with AdaSPEC selection of the `keep` fraction against the saved reference (None: none)."""
    selection = {} if keep is None else {"token_selection": {"reference": str(run / "reference"), "keep_fraction": keep}}
    return run.recipe(loss={**selection, **sections.pop("loss", {})}, **sections)


def _batch(trainer):
    return trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))


@pytest.mark.parametrize("teacher", ["online", "cache"])
def test_keep_fraction_one_is_the_plain_loss_bit_for_bit(tiny, tmp_path, teacher):
    extra = {"teacher": {"mode": "cache", "cache_dir": str(tmp_path / "cache"), "top_k": 8}, "loss": {"top_k": 8}} if teacher == "cache" else {}
    plain, selective = recipe(tiny, keep=None, **extra), recipe(tiny, keep=1.0, **extra)
    if teacher == "cache":
        cache_teacher(load_recipe(plain))
    t_plain, t_sel = build_trainer(load_recipe(plain)), build_trainer(load_recipe(selective))
    batch = _batch(t_plain)
    loss_plain = t_plain.compute_loss(t_plain.model, batch)
    loss_sel = t_sel.compute_loss(t_sel.model, copy.deepcopy(batch))
    assert torch.equal(loss_plain, loss_sel) and loss_plain > 0
    assert t_sel.selection.take_stats() == 1.0


def test_a_smaller_fraction_trains_on_fewer_tokens_and_logs_what_it_kept(tiny, tmp_path):
    d = {**recipe(tiny, keep=0.25), "output_dir": str(tmp_path / "run")}
    trainer = build_trainer(load_recipe(d))
    batch = _batch(trainer)
    kept = []
    real = trainer.selection.select
    trainer.selection.select = lambda *a, **k: kept.append(real(*a, **k)) or kept[-1]
    trainer.compute_loss(trainer.model, batch)
    mask = batch["labels"][:, 1:] != -100
    assert kept[0].sum() == -(-int(mask.sum()) // 4)  # ceil(0.25 n)
    assert not (kept[0][:, :-1] & ~mask).any()  # only response tokens
    result = trainer.train()
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert result.training_loss > 0 and all(h["kept_fraction"] == pytest.approx(0.25, abs=0.02) for h in history)


def test_lora_draft_from_the_teacher_cache_trains_with_selection(tiny, tmp_path):
    d = recipe(tiny, keep=0.4, teacher={"mode": "cache", "cache_dir": str(tmp_path / "cache"), "top_k": 8}, loss={"top_k": 8})
    d["output_dir"] = str(tmp_path / "run")
    d["draft"] = {"name_or_path": str(tiny / "reference"), "dtype": "float32", "lora": {"r": 4, "alpha": 8}}
    cache_teacher(load_recipe(d))
    metrics = train(load_recipe(d))
    assert metrics["train_loss"] > 0 and (tmp_path / "run" / "draft" / "model.safetensors").exists()


@pytest.mark.parametrize("keep", [0, 1.5, -0.2])
def test_a_fraction_outside_zero_one_is_a_recipe_error(tiny, keep):
    with pytest.raises(RecipeError, match=r"loss.token_selection.keep_fraction: must be in \(0, 1\]"):
        load_recipe(recipe(tiny, keep=keep))


def test_a_reference_with_another_tokenizer_is_refused(tiny, tmp_path, capsys):
    from distill.common.tiny import build_tokenizer, tiny_qwen2

    other = build_tokenizer(["a corpus of entirely other words"] * 20, vocab_size=300)
    tiny_qwen2(len(other), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, tokenizer=other).save_pretrained(tmp_path / "other")
    other.save_pretrained(tmp_path / "other")
    d = recipe(tiny)
    d["loss"]["token_selection"]["reference"] = str(tmp_path / "other")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(d))
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert f"loss.token_selection.reference {tmp_path / 'other'}: the target and reference tokenizers disagree" in err
