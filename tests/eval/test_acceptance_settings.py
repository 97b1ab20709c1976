"""`distill accept` settings without models: per-task counts, shot files, templates and their report
labels, the journal's fingerprint and call keys, and data-file errors as one line with exit 2."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from distill.eval.acceptance import (
    DraftSource,
    Settings,
    load_examples,
    main,
    parse_fewshot_files,
    parse_num_samples,
    parse_templates,
    plan,
)
from distill.eval.tasks import TASKS as REGISTRY

TASKS = ["gsm8k", "mmlu", "cnndm"]


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    return {
        "gsm8k": _jsonl(tmp_path / "gsm8k.jsonl", [{"question": f"q{i} ?", "answer": f"#### {i}"} for i in range(12)]),
        "mmlu": _jsonl(
            tmp_path / "mmlu.jsonl",
            [{"question": f"m{i} ?", "subject": ["farm", "sky"][i % 2], "choices": ["a", "b", "c", "d"], "answer": i % 4} for i in range(12)],
        ),
        "cnndm": _jsonl(tmp_path / "cnndm.jsonl", [{"article": f"story {i} .", "highlights": f"h{i}", "id": f"c{i}"} for i in range(6)]),
    }


def test_num_samples_per_task_or_one_for_all():
    assert parse_num_samples("gsm8k=30,mmlu=200,cnndm=40", TASKS) == {"gsm8k": 30, "mmlu": 200, "cnndm": 40}
    assert parse_num_samples("30", TASKS) == {"gsm8k": 30, "mmlu": 30, "cnndm": 30}
    assert parse_num_samples(None, TASKS) == {} and parse_num_samples("mmlu=5", TASKS) == {"mmlu": 5}
    settings = Settings("t", [], TASKS, num_samples={"mmlu": 5})
    assert [settings.samples(t) for t in TASKS] == [300, 5, 200]  # the rest keep their defaults
    assert Settings("t", [], TASKS, num_samples=7).samples("cnndm") == 7 and Settings("t", [], TASKS).samples("gsm8k") == 300
    for bad, message in (("0", "positive integer"), ("gsm8k=x", "is not TASK=N"), ("squad=3", "not among --tasks"), ("gsm8k=3,4", "is not TASK=N")):
        with pytest.raises(ValueError, match=message):
            parse_num_samples(bad, TASKS)


def test_templates_resolve_to_names_groups_and_files_with_labels(tmp_path):
    chosen = parse_templates(["gsm8k=default,boxed,gsm8k-plain"], TASKS)
    assert chosen == {"gsm8k": ["gsm8k", "gsm8k-boxed", "gsm8k-plain"]}
    settings = Settings("t", [], TASKS, templates=chosen)
    assert settings.labels == ["gsm8k@default", "gsm8k@boxed", "gsm8k@plain", "mmlu", "cnndm"]
    both = parse_templates(["default,held-out"], TASKS)
    assert both == {
        "gsm8k": ["gsm8k", "gsm8k-boxed", "gsm8k-plain"],
        "mmlu": ["mmlu", "mmlu-exam", "mmlu-plain"],
        "cnndm": ["cnndm", "cnndm-tldr", "cnndm-bullets"],
    }
    assert parse_templates(["mmlu=train"], TASKS) == {"mmlu": ["mmlu", "mmlu-brief"]}
    mine = tmp_path / "polite.txt"
    mine.write_text("Please help with this: {question}")
    assert Settings("t", [], ["gsm8k"], templates=parse_templates([f"gsm8k=default,{mine}"], ["gsm8k"])).labels == ["gsm8k@default", "gsm8k@polite"]
    (tmp_path / "bad.txt").write_text("no field")
    for value, message in (
        ("gsm8k=exam", "'exam' is no gsm8k template"),
        ("gsm8k=mmlu-exam", "'mmlu-exam' is no gsm8k template"),
        ("boxed", "names no group"),
        ("squad=default", "not among --tasks"),
        (f"gsm8k={tmp_path / 'bad.txt'}", "needs a {question} field"),
        ("gsm8k=", "name at least one template"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_templates([value], TASKS)


def test_fewshot_files_are_mmlus_and_must_exist(files):
    assert parse_fewshot_files([f"mmlu={files['mmlu']}"], TASKS) == {"mmlu": files["mmlu"]}
    with pytest.raises(ValueError, match="only mmlu takes shots"):
        parse_fewshot_files([f"gsm8k={files['gsm8k']}"], TASKS)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        parse_fewshot_files(["mmlu=/nonexistent/dev.jsonl"], TASKS)


def test_calls_are_keyed_by_their_prompts_so_counts_and_templates_reuse_them(files, tmp_path):
    (tmp_path / "draft").mkdir()
    base = Settings("t", [DraftSource("kd", str(tmp_path / "draft"))], TASKS, data_files=files, num_samples={"gsm8k": 4, "mmlu": 4, "cnndm": 2})
    more = Settings(**{**vars(base), "num_samples": {"gsm8k": 8, "mmlu": 6, "cnndm": 4}, "templates": {"gsm8k": ["gsm8k", "gsm8k-boxed"]}})
    assert more.fingerprint() == base.fingerprint()  # counts and templates change which prompts are asked, not how: one journal
    assert Settings(**{**vars(base), "max_new_tokens": 3}).fingerprint() != base.fingerprint()
    keys = {c.key: c for calls in plan(base, load_examples(base)) for c in calls}
    again = {c.key: c for calls in plan(more, load_examples(more)) for c in calls}
    reused = set(keys) & set(again)
    # Nested samples: the first prompts' calls are kept, gsm8k's under its new label gsm8k@default too.
    assert {again[k].task for k in reused} == {"gsm8k@default", "mmlu", "cnndm"} and len(reused) == len(keys) == 2 * (4 + 4 + 2)
    assert {again[k].task for k in again} == {"gsm8k@default", "gsm8k@boxed", "mmlu", "cnndm"} and len(again) == 2 * (8 + 8 + 6 + 4)


def test_a_tasks_own_generation_length_is_part_of_its_calls_keys(files, tmp_path, monkeypatch):
    """A task whose own length changes (MMLU's went from 16 to 256 tokens) asks its prompts afresh; the
    other tasks' calls are reused. The length is not in the settings when it is the task's own."""
    (tmp_path / "draft").mkdir()
    settings = Settings("t", [DraftSource("kd", str(tmp_path / "draft"))], TASKS, data_files=files, num_samples=2)
    before = {c.key: c.task for calls in plan(settings, load_examples(settings)) for c in calls}
    monkeypatch.setitem(REGISTRY, "mmlu", dataclasses.replace(REGISTRY["mmlu"], max_new_tokens=8))
    after = {c.key: c.task for calls in plan(settings, load_examples(settings)) for c in calls}
    assert sorted(before[k] for k in set(before) - set(after)) == ["mmlu"] * 4  # target and draft, 2 prompts
    assert sorted(after[k] for k in set(after) - set(before)) == ["mmlu"] * 4


def test_a_bad_data_file_is_one_line_naming_file_and_line_and_exit_2(files, tmp_path, capsys):
    broken = Path(files["mmlu"])
    broken.write_text(broken.read_text() + '{"question": "x", "subject": "farm", "choices": ["a", "b", "c", "d"], "answer": 7}\n')
    args = ["--target", "t", "--draft", "d", "--tasks", "mmlu", "--data-file", f"mmlu={broken}", "--output-dir", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"distill accept: error: {broken}:13: 'answer' 7 is out of range: use an index 0-3 or a letter A-D"]
    assert main([*args[:-2], "--num-samples", "mmlu=0", "--output-dir", str(tmp_path / "out")]) == 2
    assert "--num-samples" in capsys.readouterr().err
