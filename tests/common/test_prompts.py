"""The named templates: every task's own prompt, training templates and held-out ones that never meet."""

from __future__ import annotations

import pytest

from distill.common.prompts import FIELDS, HELD_OUT_TEMPLATES, TEMPLATES, TRAINING_TEMPLATES, apply_template, held_out_names, template_problem, variant


def test_held_out_and_training_templates_are_disjoint_by_name_and_by_text():
    assert set(TRAINING_TEMPLATES) == set(HELD_OUT_TEMPLATES) == set(FIELDS) == {"gsm8k", "mmlu", "cnndm"}
    for task in FIELDS:
        train, held = TRAINING_TEMPLATES[task], HELD_OUT_TEMPLATES[task]
        assert len(held) >= 2 and task in train  # the task's own prompt trains, at least two instructions never do
        assert not set(train) & set(held)
        assert not {TEMPLATES[n] for n in train} & {TEMPLATES[n] for n in held}
        for name in (*train, *held):
            assert name == task or name.startswith(f"{task}-")  # a template is named after its task
    named = [n for names in (*TRAINING_TEMPLATES.values(), *HELD_OUT_TEMPLATES.values()) for n in names]
    assert sorted(named) == sorted(TEMPLATES)  # every template is one or the other, once
    for task in FIELDS:
        texts = [TEMPLATES[n] for n in (*TRAINING_TEMPLATES[task], *HELD_OUT_TEMPLATES[task])]
        assert len(set(texts)) == len(texts)


def test_every_template_takes_its_tasks_fields():
    for name, text in TEMPLATES.items():
        task = name.split("-")[0]
        assert "{question}" in text and template_problem(name, task) is None
        if "{subject}" in text:
            assert task == "mmlu"
    assert "{subject}" in template_problem("mmlu-exam", "gsm8k")
    assert "neither a template name" in template_problem("no field here")
    assert template_problem("Q: {question}") is None


def test_apply_template_fills_the_fields_once():
    assert apply_template("gsm8k-plain", "What is 2 + 2?") == "What is 2 + 2?"
    assert apply_template("mmlu-exam", "Q?\nA. x\nAnswer:", subject="high school physics").startswith("You are taking an exam in high school physics.")
    assert apply_template("{question} ({subject})", "a {subject} b", subject="s") == "a {subject} b (s)"  # text put in is not read as a field
    assert apply_template("gsm8k-boxed", "Q") == "Q\nPlease reason step by step, and put your final answer within \\boxed{}."


@pytest.mark.parametrize(("name", "held"), [("gsm8k-boxed", True), ("{question}", True), ("gsm8k", False), ("Q: {question}", False)])
def test_a_held_out_template_is_known_by_name_or_text(name, held):
    assert bool(held_out_names(name)) is held


def test_report_variants():
    assert [variant("gsm8k", n) for n in ("gsm8k", "gsm8k-boxed", "gsm8k-plain")] == ["default", "boxed", "plain"]
