"""Evaluation tasks: answer extraction, metrics, local-file loading, sampling, prompts."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from distill.common.io import DataFileError
from distill.eval.tasks import TASKS, TaskExample, cnndm, get_task, gsm8k, mmlu

GSM8K_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def gsm8k_rows(n: int) -> list[dict]:
    return [{"question": f"What is {i} plus {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i:,}"} for i in range(n)]


def mmlu_rows(counts: dict[str, int]) -> list[dict]:
    return [
        {
            "question": f"{subject} question {i}?",
            "subject": subject,
            "choices": [f"{subject}-{i}-opt{j}" for j in range(4)],
            "answer": i % 4,
        }
        for subject, n in counts.items()
        for i in range(n)
    ]


def cnndm_rows(n: int) -> list[dict]:
    return [
        {
            "article": f"Article {i} " + " ".join(f"w{j}" for j in range(50)),
            "highlights": f"Summary {i}.",
            "id": f"h{i:03d}",
        }
        for i in range(n)
    ]


def example(reference: str) -> TaskExample:
    return TaskExample(id="x", messages=[], reference=reference)


# --- GSM8K -----------------------------------------------------------------------------------


@pytest.mark.skipif(not (GSM8K_DIR / "test.jsonl").is_file(), reason=f"real GSM8K test set not found at {GSM8K_DIR}")
def test_gsm8k_gold_of_every_real_test_item_parses_to_an_integer():
    path = GSM8K_DIR / "test.jsonl"
    raw = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(raw) == 1319
    for row in raw:
        gold = gsm8k.extract_strict(row["answer"])
        assert gold is not None and re.fullmatch(r"-?\d+", gold), row["answer"][-60:]
        assert int(gold) == int(row["answer"].rsplit("#### ", 1)[1].replace(",", ""))
    examples = gsm8k.load(data_file=path, num_samples=None)
    assert [e.reference for e in examples] == [gsm8k.extract_strict(r["answer"]) for r in raw]
    # Commas in the gold ("#### 2,125") are normalised away.
    assert "2125" in {e.reference for e in examples}


@pytest.mark.parametrize(
    ("text", "strict", "flexible"),
    [
        ("6 * 3 = 18\n#### 18", "18", "18"),
        ("So she pays $1,000 in total.\n#### 1,000", "1000", "1000"),
        ("The total is $1,234.", None, "1234"),
        ("It got colder by 7 degrees, so it is -5", None, "-5"),
        ("#### -12", "-12", "-12"),
        ("Each share is 2.5 liters.", None, "2.5"),
        ("#### 42.", "42", "42"),
        ("First 3, then 4, so the answer is 12.", None, "12"),
        ("#### 7 and later 9", "7", "9"),
        ("I cannot solve this.", None, None),
    ],
)
def test_gsm8k_strict_and_flexible_extraction(text, strict, flexible):
    assert gsm8k.extract_strict(text) == strict
    assert gsm8k.extract_flexible(text) == flexible


def test_gsm8k_scores_report_every_extraction_with_the_combined_one_primary():
    gold = example("1000")
    all_ = {"exact_match": 1.0, "exact_match_flexible": 1.0, "exact_match_strict": 1.0}
    assert gsm8k.scores("So she pays $1,000.\n#### 1,000", gold) == all_
    assert gsm8k.scores("She pays $1,000.", gold) == {"exact_match": 1.0, "exact_match_flexible": 1.0, "exact_match_strict": 0.0}
    # `#### N` wins over what follows it; the flexible extraction alone takes the last number.
    assert gsm8k.scores("#### 1000 wait, no: 999", gold) == {"exact_match": 1.0, "exact_match_flexible": 0.0, "exact_match_strict": 1.0}
    assert gsm8k.scores("I don't know.", gold) == {"exact_match": 0.0, "exact_match_flexible": 0.0, "exact_match_strict": 0.0}
    assert gsm8k.score("She pays $1,000.", gold) == 1.0
    assert gsm8k.scores("#### -3", example("-3"))["exact_match_strict"] == 1.0
    assert gsm8k.scores("It is 2.5 now.", example("2")) == {"exact_match": 0.0, "exact_match_flexible": 0.0, "exact_match_strict": 0.0}


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Therefore, their combined weight is \\(\\boxed{623}\\) pounds, 2 more than 621.", "623"),  # boxed beats a later number
        ("\\[\n\\boxed{3,000 \\text{ dollars}}\n\\]", "3000"),
        ("First \\boxed{4}, then corrected: \\boxed{5}.", "5"),
        ("#### 18.00", "18"),
        ("The answer is 12.0", "12"),
        ("#### 7\nso \\boxed{8}", "7"),
        ("no number at all", None),
    ],
)
def test_gsm8k_primary_extraction_reads_the_forms_instruct_models_write(text, answer):
    assert gsm8k.extract_answer(text) == answer
    assert gsm8k.score(text, example("623")) == float(answer == "623")


def test_gsm8k_loads_a_local_file_as_chat_prompts(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", gsm8k_rows(600))
    examples = gsm8k.load(data_file=path, num_samples=3, seed=1)
    assert len(examples) == 3
    first = examples[0]
    index = int(first.id.rsplit("-", 1)[1])
    prompt = gsm8k.PROMPT.format(question=f"What is {index} plus {index}?")
    assert first.messages == [{"role": "user", "content": prompt}]
    assert first.reference == str(2 * index)
    assert gsm8k.load(data_file=path, num_samples=None)[500].reference == "1000"  # "#### 1,000" in the file
    assert len(gsm8k.load(data_file=path)) == gsm8k.DEFAULT_NUM_SAMPLES == 300


def test_gsm8k_row_without_gold_marker_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "just 5"}])
    with pytest.raises(ValueError, match="no '#### <number>' gold"):
        gsm8k.load(data_file=path)


# --- sampling and file handling (shared) -------------------------------------------------------


def test_seeded_sampling_is_reproducible_and_takes_everything_when_n_covers_the_data(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", gsm8k_rows(50))
    ids = lambda **kw: [e.id for e in gsm8k.load(data_file=path, **kw)]  # noqa: E731
    assert ids(num_samples=10, seed=3) == ids(num_samples=10, seed=3)
    assert ids(num_samples=10, seed=3) != ids(num_samples=10, seed=4)
    assert len(set(ids(num_samples=10, seed=3))) == 10
    assert ids(num_samples=4, seed=3) == ids(num_samples=10, seed=3)[:4]  # nested: a smaller sample is a prefix of a larger one
    everything = [f"gsm8k-file-{i}" for i in range(50)]
    assert ids(num_samples=50, seed=3) == ids(num_samples=500, seed=9) == ids(num_samples=None) == everything
    cnn = write_jsonl(tmp_path / "cnndm.jsonl", cnndm_rows(20))
    assert [e.id for e in cnndm.load(data_file=cnn, num_samples=5, seed=2)] == [e.id for e in cnndm.load(data_file=cnn, num_samples=5, seed=2)]


def test_bad_inputs_are_refused_with_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        gsm8k.load(data_file=tmp_path / "missing.jsonl")
    csv = tmp_path / "rows.csv"
    csv.write_text("question,answer\n")
    with pytest.raises(ValueError, match=r"unsupported suffix '\.csv'"):
        gsm8k.load(data_file=csv)
    wrong = write_jsonl(tmp_path / "wrong.jsonl", [{"prompt": "q", "answer": "#### 1"}])
    with pytest.raises(DataFileError, match=r"wrong\.jsonl:1: no 'question' field"):
        gsm8k.load(data_file=wrong)
    good = write_jsonl(tmp_path / "good.jsonl", gsm8k_rows(3))
    with pytest.raises(ValueError, match="num_samples must be a positive integer"):
        gsm8k.load(data_file=good, num_samples=0)


def test_parquet_and_json_files_load_like_jsonl(tmp_path):
    import datasets

    rows = mmlu_rows({"anatomy": 4})
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "mmlu.parquet"))
    (tmp_path / "mmlu.json").write_text(json.dumps(rows))
    from_jsonl = mmlu.load(data_file=write_jsonl(tmp_path / "mmlu.jsonl", rows))
    for name in ("mmlu.parquet", "mmlu.json"):
        loaded = mmlu.load(data_file=tmp_path / name)
        assert [(e.id, e.messages, e.reference) for e in loaded] == [(e.id, e.messages, e.reference) for e in from_jsonl]


# --- MMLU --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("The answer is (B)", "B"),
        ("The answer is (B).", "B"),
        ("the correct answer is C.", "C"),
        ("Answer: D", "D"),
        ("A force acts, so v grows. The correct answer is \\(\\boxed{C}\\).", "C"),
        ("A is wrong and B too.\n\nBased on the analysis, the correct answer is:\n\n\\boxed{D}", "D"),
        ("A is tempting, but the correct answer is:\nB. Wrong, Wrong", "B"),
        ("A first look misleads. **Answer: C**", "C"),
        ("A fair reading points to \\boxed{B}.", "B"),
        ("B", "B"),
        ("B.", "B"),
        (" (A) mitochondria", "A"),
        ("C) Paris", "C"),
        ("I think it's C because of the heat.", "C"),
        ("Because of osmosis, D is right.", "D"),
        ("No idea.", None),
        ("", None),
    ],
)
def test_mmlu_letter_extraction(text, letter):
    assert mmlu.extract_letter(text) == letter


def test_mmlu_scores_the_option_letter():
    assert mmlu.score("The answer is (B).", example("B")) == 1.0
    assert mmlu.score("A", example("B")) == 0.0
    assert mmlu.score("I am not sure.", example("B")) == 0.0


def test_mmlu_loads_a_local_file_with_zero_shot_prompt(tmp_path):
    path = write_jsonl(tmp_path / "mmlu.jsonl", mmlu_rows({"high_school_biology": 3}))
    examples = mmlu.load(data_file=path)
    assert [e.reference for e in examples] == ["A", "B", "C"]
    assert examples[1].meta == {"subject": "high_school_biology"}
    (message,) = examples[1].messages
    assert message["role"] == "user"
    assert message["content"] == (
        "The following are multiple choice questions about high school biology. "
        "Answer with the letter (A, B, C or D) of the correct option.\n\n"
        "high_school_biology question 1?\n"
        "A. high_school_biology-1-opt0\nB. high_school_biology-1-opt1\n"
        "C. high_school_biology-1-opt2\nD. high_school_biology-1-opt3\nAnswer:"
    )


def test_mmlu_allocation_is_proportional_with_one_per_subject():
    counts = {"a": 30, "b": 10, "c": 2}
    assert mmlu.allocate(counts, 21, seed=0) == {"a": 15, "b": 5, "c": 1}
    assert mmlu.allocate({"a": 100, "b": 10, "c": 1}, 10, seed=0) == {"a": 8, "b": 1, "c": 1}
    assert mmlu.allocate(counts, 42, seed=0) == counts
    for n in range(1, 43):
        alloc = mmlu.allocate(counts, n, seed=0)
        assert sum(alloc.values()) == n
        assert all(0 <= alloc[s] <= counts[s] for s in counts)
        if n >= len(counts):
            assert min(alloc.values()) >= 1
    assert sorted(mmlu.allocate(counts, 2, seed=0).values()) == [0, 1, 1]


def test_mmlu_sample_is_stratified_and_reproducible(tmp_path):
    path = write_jsonl(tmp_path / "mmlu.jsonl", mmlu_rows({"anatomy": 30, "astronomy": 10, "virology": 2}))
    examples = mmlu.load(data_file=path, num_samples=21, seed=5)
    assert Counter(e.meta["subject"] for e in examples) == {"anatomy": 15, "astronomy": 5, "virology": 1}
    assert [e.id for e in examples] == [e.id for e in mmlu.load(data_file=path, num_samples=21, seed=5)]
    assert [e.id for e in examples] != [e.id for e in mmlu.load(data_file=path, num_samples=21, seed=6)]
    assert len(mmlu.load(data_file=path)) == 42  # default 500 covers the file: every row


def test_mmlu_five_shot_uses_other_rows_of_the_same_subject(tmp_path):
    path = write_jsonl(tmp_path / "mmlu.jsonl", mmlu_rows({"anatomy": 6, "virology": 7}))
    examples = {e.id: e for e in mmlu.load(data_file=path, num_fewshot=5, num_samples=None)}
    assert len(examples) == 13
    target = examples["mmlu-virology-file-8"]  # virology question 2 (file row 8)
    messages = target.messages
    assert [m["role"] for m in messages] == ["user", "assistant"] * 5 + ["user"]
    shown = [re.match(r"(?:.*\n\n)?(virology question \d)\?", m["content"], re.S).group(1) for m in messages[::2]]
    assert shown == [f"virology question {i}" for i in (0, 1, 3, 4, 5)] + ["virology question 2"]
    assert [m["content"] for m in messages[1::2]] == ["A", "B", "D", "A", "B"]
    assert messages[0]["content"].startswith("The following are multiple choice questions about virology.")
    assert not any("The following" in m["content"] for m in messages[1:])
    assert not any("anatomy" in m["content"] for m in messages)
    assert target.reference == "C"


def test_mmlu_few_shot_with_too_few_rows_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "mmlu.jsonl", mmlu_rows({"anatomy": 3}))
    with pytest.raises(ValueError, match="'anatomy' has 2 other example"):
        mmlu.load(data_file=path, num_fewshot=5)


# --- CNN/DailyMail -----------------------------------------------------------------------------


def test_rouge_l_on_hand_checked_pairs():
    assert cnndm.rouge_l("the cat sat on the mat", "the cat sat on the mat") == pytest.approx(1.0)
    # LCS "the cat on the mat" = 5 of 6 tokens each side: P = R = F = 5/6.
    assert cnndm.rouge_l("the cat lay on the mat", "the cat sat on the mat") == pytest.approx(5 / 6)
    # LCS 2: P = 2/2, R = 2/6, F = 2PR/(P+R) = 0.5.
    assert cnndm.rouge_l("the cat", "the cat sat on the mat") == pytest.approx(0.5)
    # Stemming: "dogs"/"dog" and "running"/"runs" match; "were"/"was" do not. LCS 3 of 4: F = 0.75.
    assert cnndm.rouge_l("The dogs were running", "the dog was runs") == pytest.approx(0.75)
    assert cnndm.rouge_l("", "the cat") == 0.0
    assert cnndm.score("the cat", example("the cat sat on the mat")) == pytest.approx(0.5)


def test_cnndm_loads_a_local_file_and_truncates_articles(tmp_path):
    path = write_jsonl(tmp_path / "cnndm.jsonl", cnndm_rows(4))
    examples = cnndm.load(data_file=path, max_article_words=5)
    assert [e.id for e in examples] == ["cnndm-h000", "cnndm-h001", "cnndm-h002", "cnndm-h003"]
    assert examples[2].reference == "Summary 2."
    assert examples[2].messages == [{"role": "user", "content": "Summarize the following news article in three sentences.\n\nArticle 2 w0 w1 w2"}]
    whole = cnndm.load(data_file=path, max_article_words=None)[2].messages[0]["content"]
    assert whole.endswith("w48 w49")


# --- registry ----------------------------------------------------------------------------------


def test_registry_holds_the_three_tasks_with_their_defaults():
    assert set(TASKS) == {"gsm8k", "mmlu", "cnndm"}
    assert get_task("gsm8k") is gsm8k.TASK
    tasks = [get_task(name) for name in ("gsm8k", "mmlu", "cnndm")]
    assert [(t.metric_name, t.default_num_samples, t.max_new_tokens) for t in tasks] == [
        ("exact_match", 300, 256),
        ("accuracy", 500, 256),
        ("rougeL", 200, 128),
    ]
    assert get_task("mmlu").score("(B)", example("B")) == 1.0


def test_unknown_task_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown task 'gsm9k'; choose one of \['cnndm', 'gsm8k', 'mmlu'\]"):
        get_task("gsm9k")


# --- the real files, templates, shots, data-file errors ----------------------------------------

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"the shared data folder is not at {SHARED}")


@needs_shared
def test_the_three_tasks_load_from_the_real_files():
    from distill.common.splits import CNNDM_EVAL_ROWS

    gsm = gsm8k.load(data_file=SHARED / "gsm8k" / "test.jsonl", num_samples=30)
    assert len(gsm) == 30 and all(re.fullmatch(r"-?\d+", e.reference) for e in gsm)
    assert gsm[0].messages[0]["content"].startswith("Solve the following math problem.")
    test, dev = SHARED / "mmlu" / "test.jsonl", SHARED / "mmlu" / "dev.jsonl"
    zero = mmlu.load(data_file=test, num_samples=200)
    assert len(zero) == 200 and len({e.meta["subject"] for e in zero}) == 57  # stratified: every subject
    assert [e.id for e in zero] == [e.id for e in mmlu.load(data_file=test, num_samples=500)][:200]  # nested
    five = mmlu.load(data_file=test, num_samples=57, num_fewshot=5, fewshot_file=dev)
    dev_rows = [json.loads(line) for line in dev.read_text().splitlines()]
    for e in five:
        turns = e.messages
        assert [m["role"] for m in turns] == ["user", "assistant"] * 5 + ["user"]
        shots = [r for r in dev_rows if r["subject"] == e.meta["subject"]]
        assert [m["content"] for m in turns[1::2]] == ["ABCD"[r["answer"]] for r in shots]  # the dev file's five, in order
        assert turns[2]["content"].startswith(shots[1]["question"].strip())
    rows = [json.loads(line) for line in (SHARED / "cnndm" / "test.jsonl").read_text().splitlines()]
    news = cnndm.load(data_file=SHARED / "cnndm" / "test.jsonl", num_samples=40)
    eval_ids = {f"cnndm-{rows[i]['id']}" for i in CNNDM_EVAL_ROWS}
    assert len(news) == 40 and {e.id for e in news} <= eval_ids
    assert {e.id for e in cnndm.load(data_file=SHARED / "cnndm" / "test.jsonl", num_samples=None)} == eval_ids  # every eval row, no other
    assert max(len(e.messages[0]["content"].split()) for e in news) <= cnndm.DEFAULT_MAX_ARTICLE_WORDS + 10


def test_mmlu_samples_are_nested_and_stratified(tmp_path):
    path = write_jsonl(tmp_path / "mmlu.jsonl", mmlu_rows({"anatomy": 30, "astronomy": 10, "virology": 5, "law": 55}))
    full = [e.id for e in mmlu.load(data_file=path, num_samples=99, seed=4)]
    for n in (1, 3, 4, 10, 33, 60, 98):
        got = mmlu.load(data_file=path, num_samples=n, seed=4)
        assert [e.id for e in got] == full[:n]
        counts = Counter(e.meta["subject"] for e in got)
        if n >= 4:
            assert set(counts) == {"anatomy", "astronomy", "virology", "law"}
            assert all(abs(counts[s] - n * k / 100) < 1.5 for s, k in (("anatomy", 30), ("astronomy", 10), ("virology", 5), ("law", 55)))
    assert full != [e.id for e in mmlu.load(data_file=path, num_samples=99, seed=5)]


def test_templates_ask_each_task_another_way(tmp_path):
    from distill.common.prompts import TEMPLATES

    g = write_jsonl(tmp_path / "g.jsonl", gsm8k_rows(3))
    (boxed,) = gsm8k.load(data_file=g, num_samples=1, template="gsm8k-boxed")
    assert boxed.messages[0]["content"].endswith("put your final answer within \\boxed{}.") and boxed.messages[0]["content"].startswith("What is")
    assert gsm8k.load(data_file=g, num_samples=1, template="{question}?!")[0].messages[0]["content"].endswith("??!")
    assert gsm8k.load(data_file=g, num_samples=1)[0].messages == gsm8k.load(data_file=g, num_samples=1, template="gsm8k")[0].messages
    m = write_jsonl(tmp_path / "m.jsonl", mmlu_rows({"high_school_biology": 6}))
    exam = mmlu.load(data_file=m, num_samples=1, template="mmlu-exam", num_fewshot=2)[0].messages
    assert exam[0]["content"].startswith("You are taking an exam in high school biology.") and exam[0]["content"].endswith("Answer:")
    assert not any("exam" in turn["content"] for turn in exam[1:])  # the instruction opens the chat once, as the header does
    assert mmlu.load(data_file=m, num_samples=1)[0].messages[0]["content"].startswith(TEMPLATES["mmlu"].split("{subject}")[0])
    c = write_jsonl(tmp_path / "c.jsonl", cnndm_rows(2))
    assert cnndm.load(data_file=c, num_samples=None, template="cnndm-tldr", max_article_words=3)[0].messages[0]["content"] == "Article 0 w0\n\nTL;DR:"


@pytest.mark.parametrize(
    ("task", "rows", "line", "problem"),
    [
        ("gsm8k", [*gsm8k_rows(2), "not json"], 3, r"not JSON"),
        ("gsm8k", [*gsm8k_rows(1), {"question": "q"}], 2, r"no 'answer' field"),
        ("gsm8k", [{"question": "q", "answer": 5}], 1, r"'answer' is a int, not text"),
        ("mmlu", [*mmlu_rows({"a": 2}), {**mmlu_rows({"a": 1})[0], "answer": 4}], 3, r"'answer' 4 is out of range: use an index 0-3 or a letter A-D"),
        ("mmlu", [{**mmlu_rows({"a": 1})[0], "choices": ["x", "y"]}], 1, r"'choices' must be a list of 4 texts"),
        ("mmlu", [{**mmlu_rows({"a": 1})[0], "answer": True}], 1, r"'answer' True is out of range"),
        ("cnndm", [*cnndm_rows(3), {"article": "a", "highlights": "h"}], 4, r"no 'id' field"),
    ],
)
def test_a_bad_row_names_its_file_and_line(tmp_path, task, rows, line, problem):
    path = tmp_path / f"{task}.jsonl"
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    with pytest.raises(DataFileError, match=rf"^{re.escape(str(path))}:{line}: {problem}"):
        get_task(task).load(data_file=path)


def test_a_bad_shot_file_names_its_line_and_too_few_shots_name_the_file(tmp_path):
    data = write_jsonl(tmp_path / "test.jsonl", mmlu_rows({"anatomy": 2}))
    dev = tmp_path / "dev.jsonl"
    dev.write_text(json.dumps(mmlu_rows({"anatomy": 1})[0]) + "\n{oops\n")
    with pytest.raises(DataFileError, match=rf"^{re.escape(str(dev))}:2: not JSON"):
        mmlu.load(data_file=data, num_fewshot=1, fewshot_file=dev)
    write_jsonl(dev, mmlu_rows({"anatomy": 1}))
    assert len(mmlu.load(data_file=data, num_fewshot=1, fewshot_file=dev)[1].messages) == 3  # the shot comes from dev, not the data file
    with pytest.raises(ValueError, match=rf"has 1 other example\(s\) for num_fewshot=5.*to {re.escape(str(dev))}"):
        mmlu.load(data_file=data, num_fewshot=5, fewshot_file=dev)
