"""`distill accept` end to end on tiny saved models and local files of all three tasks: greedy
identity, equal quality, a self-draft accepted every time, real PNGs, resume, and clear refusals."""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

import matplotlib.image
import pytest
import torch

from distill.common.tiny import build_tokenizer, corpus_texts, make_examples, tiny_qwen2
from distill.common.trim import PROMPT_ROWS
from distill.common.vocab import cut_at_eos
from distill.eval.acceptance import DraftSource, Settings, _widened_share, main, parse_drafts
from distill.eval.journal import LEGACY, Journal, Run, busiest
from distill.eval.measurement import TARGET, Call, calls_to_run
from distill.eval.tasks import get_task

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_NEW_TOKENS = 8
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SCHEMA_FIELDS = {
    "acceptance_rate",
    "mean_accepted_length",
    "tokens_per_target_forward",
    "end_to_end_speedup",
    "decode_speedup",
    "intervals",
    "decomposition",
    "ttft_s",
    "tpot_s",
    "tokens_per_s",
    "quality",
    "target_quality",
    "quality_metric",
    "greedy_identity",
    "per_position_acceptance",
}


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models decode fastest on one thread; two threads on a busy 2-core machine are many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer, tiny_pair):
    """The shared tiny pair saved, each with the tokenizer (its target whose padded rows never win, as in
    Qwen2.5, so a self-draft over the real vocabulary can match every token), and task files."""
    root = tmp_path_factory.mktemp("accept")
    target, draft = tiny_pair.real_vocab_target, tiny_pair.draft
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    files = {
        "gsm8k": _jsonl(
            root / "gsm8k.jsonl",
            [
                {"question": "anna has 3 apples and gets 4 more . how many apples does anna have ?", "answer": "3 + 4 = 7 . #### 7"},
                {"question": "ben has 9 pens and gives away 2 . how many pens are left ?", "answer": "9 - 2 = 7 . #### 7"},
                {"question": "cara has 5 cups and gets 6 more . how many cups does cara have ?", "answer": "5 + 6 = 11 . #### 11"},
            ],
        ),
        "mmlu": _jsonl(
            root / "mmlu.jsonl",
            [
                {"question": "which animal says moo ?", "subject": "farm", "choices": ["cat", "cow", "owl", "bee"], "answer": 1},
                {"question": "what colour is the sky ?", "subject": "nature", "choices": ["red", "green", "blue", "old"], "answer": 2},
            ],
        ),
        "cnndm": _jsonl(
            root / "cnndm.jsonl",
            [
                {"article": "the quick fox finds the hen by the river . the hen helps the fox at home .", "highlights": "the fox finds the hen .", "id": "a1"},
                {
                    "article": "the lazy dog chases the cat in the park every day . the cat likes the owl .",
                    "highlights": "the dog chases the cat .",
                    "id": "a2",
                },
            ],
        ),
    }
    # cnndm's first reference is the target's own greedy summary, so its ROUGE-L is 1 and quality is not trivially 0.
    example = get_task("cnndm").load(data_file=files["cnndm"], num_samples=None)[0]
    prompt = tokenizer(
        tokenizer.apply_chat_template(example.messages, add_generation_prompt=True, tokenize=False), add_special_tokens=False, return_tensors="pt"
    )
    summary = target.generate(**prompt, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)[0, prompt["input_ids"].shape[1] :]
    rows = [json.loads(line) for line in Path(files["cnndm"]).read_text().splitlines()]
    rows[0]["highlights"] = tokenizer.decode(summary, skip_special_tokens=True)
    _jsonl(Path(files["cnndm"]), rows)
    return root, files


def _args(root: Path, files: dict[str, str], out: Path, *extra: str) -> list[str]:
    data = [a for task, path in files.items() for a in ("--data-file", f"{task}={path}")]
    return [
        "--target",
        str(root / "target"),
        "--draft",
        f"small={root / 'draft'}",
        "--draft",
        f"self={root / 'target'}",
        "--tasks",
        "gsm8k,mmlu,cnndm",
        *data,
        "--num-samples",
        "2",
        "--max-new-tokens",
        str(MAX_NEW_TOKENS),
        "--num-draft-tokens",
        "3",
        "--device",
        "cpu",
        "--cost-repeats",
        "2",
        "--output-dir",
        str(out),
        *extra,
    ]


@pytest.fixture(scope="module")
def greedy_run(setup):
    root, files = setup
    out = root / "greedy"
    rc = main(_args(root, files, out, "--ks", "1", "--draft-alone"))
    return rc, out, json.loads((out / "report.json").read_text())


def test_greedy_run_reports_every_task_and_draft(greedy_run):
    rc, out, report = greedy_run
    assert rc == 0
    assert set(report["drafts"]) == {"small", "self"}
    for entry in report["drafts"].values():
        assert set(entry["tasks"]) == {"gsm8k", "mmlu", "cnndm"}
        for row in entry["tasks"].values():
            assert SCHEMA_FIELDS <= set(row)
            assert row["num_prompts"] == 2
            assert len(row["per_position_acceptance"]) == 3
    env = report["environment"]
    assert env["dtype"] == "float32" and env["torch"] and env["transformers"] and env["distill"] and "accept" in env["command"]
    assert env["tokenizers"] and env["datasets"] and env["numpy"]  # every version that can move a figure
    load = report["machine_load"]
    assert load["wall_s"] > 0 and load["cpus"] >= 1 and isinstance(load["busy"], bool)
    assert report["settings"]["seed"] == 0 and report["settings"]["mode"] == "greedy"


def test_greedy_speculative_output_is_the_target_output(greedy_run):
    _, _, report = greedy_run
    for name, entry in report["drafts"].items():
        for task, row in entry["tasks"].items():
            assert row["greedy_identity"] == 1.0, (name, task, row["differing_examples"])
            assert row["quality"] == row["target_quality"] == report["target_only"][task]["quality"]
            assert row["metrics"] == report["target_only"][task]["metrics"]
            assert row["quality_metric"] == {"gsm8k": "exact_match", "mmlu": "accuracy", "cnndm": "rougeL"}[task]
            assert row["mismatches"] == []
            # identical answers: quality's interval is target-only's, their paired difference exactly 0
            assert row["intervals"]["quality"] == report["target_only"][task]["intervals"]["quality"]
            assert row["quality_vs_target"]["value"] == row["quality_vs_target"]["low"] == row["quality_vs_target"]["high"] == 0.0
    assert report["target_only"]["cnndm"]["quality"] >= 0.5  # the target's own summary scores ROUGE-L 1
    for base in report["target_only"].values():
        iv = base["intervals"]["quality"]
        assert iv["low"] <= iv["value"] <= iv["high"] and iv["value"] == pytest.approx(base["quality"]) and iv["prompts"] == base["num_prompts"]


def test_each_draft_alone_is_scored_on_the_task(greedy_run):
    """--draft-alone: each draft also decodes by itself; the target as its own draft scores what the target scores."""
    _, out, report = greedy_run
    for task, row in report["drafts"]["self"]["tasks"].items():
        assert row["draft_alone_quality"] == report["target_only"][task]["quality"]
        assert row["draft_alone_metrics"] == report["target_only"][task]["metrics"]
    assert all("draft_alone_quality" in row and row["draft_alone_tokens_per_s"] > 0 for row in report["drafts"]["small"]["tasks"].values())
    assert "| draft alone |" in (out / "report.md").read_text()


def test_a_mismatch_is_located_with_the_targets_margin(setup, tokenizer):
    """Where a speculative output leaves the target's, the report names the position and the target's
    top-2 logit margin there (near 0: a near-tie that rounding can flip)."""
    from distill.common.models import load_model
    from distill.eval.acceptance import first_difference

    root, _ = setup
    target = load_model(root / "target", dtype="float32")
    prompt = tokenizer("anna has 3 apples .")["input_ids"]
    expected = target.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, min_new_tokens=6)[0, len(prompt) :].tolist()
    got = expected[:3] + [(expected[3] + 1) % len(tokenizer)] + expected[4:]
    found = first_difference(target, prompt, expected, got, torch.device("cpu"))
    with torch.no_grad():
        logits = target(input_ids=torch.tensor([prompt + expected[:3]])).logits[0, -1].topk(2).values
    assert found == {"position": 3, "target_token": expected[3], "speculative_token": got[3], "target_top2_margin": pytest.approx(float(logits[0] - logits[1]))}
    assert first_difference(target, prompt, expected, expected[:4], torch.device("cpu"))["position"] == 4  # one stopped early


def test_self_draft_is_always_accepted_and_small_draft_is_not(greedy_run):
    _, _, report = greedy_run
    for _task, row in report["drafts"]["self"]["tasks"].items():
        assert row["acceptance_rate"] == 1.0 and row["alpha"] == 1.0
        assert row["per_position_acceptance"] == [1.0, 1.0, 1.0]
        assert row["mean_accepted_length"] == 2.5  # rounds of k = 3 and (cut short) k = 2, all accepted
        # 8 tokens in 3 target forwards: the prefill's 1, a full round's 3 accepted + 1, and 2 + 1 in a round cut to k = 2.
        assert row["tokens_per_target_forward"] == pytest.approx(8 / 3)
    small = report["drafts"]["small"]["tasks"]
    assert min(r["acceptance_rate"] for r in small.values()) < 1.0


def test_speedup_sweep_and_predictions(greedy_run):
    _, _, report = greedy_run
    for entry in report["drafts"].values():
        assert [p["k"] for p in entry["sweep"]] == [1, 3]
        for p in entry["sweep"]:
            assert p["end_to_end_speedup"] > 0 and p["decode_speedup"] > 0 and p["predicted_speedup"] > 0
            assert p["target_wall_s"] > 0 and p["wall_s"] > 0
            assert p["decomposition"]["predicted_decode_speedup"] > 0 and p["num_prompts"] == 6
        assert [p["k"] for p in entry["predicted_curve"]] == [1, 2, 3]
        assert 1 <= entry["best_k"] <= 3 and entry["costs"]["c"] > 0 and entry["costs"]["real_tokens"]
        for row in entry["tasks"].values():
            assert row["end_to_end_speedup"] == pytest.approx(row["target_wall_s"] / row["wall_s"])
            assert row["decode_speedup"] > 0 and row["timed_pairs"] == 2
            assert row["ttft_s"] > 0 and row["tpot_s"] > 0 and row["tokens_per_s"] > 0
            iv = row["intervals"]["end_to_end_speedup"]
            assert iv["value"] == pytest.approx(row["end_to_end_speedup"]) and iv["low"] <= iv["value"] <= iv["high"] and iv["prompts"] == 2
            parts = row["decomposition"]
            assert parts["rounds"] > 0 and parts["draft_s_per_round"] > 0 and parts["verify_s_per_round"] > 0 and parts["bookkeeping_s_per_round"] > 0
            assert 0.5 < parts["parts_over_decode_time"] <= 1.0  # the three clocks hold the decode time, less what no round holds
            # The predicted round counts the loop's two-token first draft step: c₂ + (k-1)·c + v(k) target steps.
            costs, k = entry["costs"], report["settings"]["num_draft_tokens"]
            expected_round = costs["target_step_s"] * (costs["c_first"] + (k - 1) * costs["c"] + costs["v"][str(k)])
            assert parts["predicted_round_s"] == pytest.approx(expected_round)
    assert all(p["alpha"] == 1.0 for p in report["drafts"]["self"]["sweep"])


def test_markdown_and_plots_are_written(greedy_run):
    _, out, _ = greedy_run
    md = (out / "report.md").read_text()
    for text in ("## gsm8k", "## mmlu", "## cnndm", "| target only |", "| small |", "| self |", "100.0%", "acceptance_per_position.png", "speedup_vs_k.png"):
        assert text in md
    for name in ("acceptance_per_position.png", "speedup_vs_k.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 10_000
        image = matplotlib.image.imread(out / name)
        assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 500
        assert image[..., :3].std() > 0.05  # not a blank canvas
    assert not list(out.glob(".*"))  # no temporary files left behind


def test_second_run_resumes_from_the_journal(setup, greedy_run):
    root, files = setup
    _, out, first = greedy_run
    calls = [line for line in (out / "records.jsonl").read_text().splitlines() if '"key"' in line]
    assert main(_args(root, files, out, "--ks", "1")) == 0
    assert [line for line in (out / "records.jsonl").read_text().splitlines() if '"key"' in line] == calls  # no call made again
    again = json.loads((out / "report.json").read_text())
    for name in first["drafts"]:
        for task, row in first["drafts"][name]["tasks"].items():
            assert again["drafts"][name]["tasks"][task]["end_to_end_speedup"] == row["end_to_end_speedup"]
            assert again["drafts"][name]["tasks"][task]["runs"] == row["runs"]


def test_a_draft_added_to_a_finished_run_gets_a_baseline_timed_in_its_own_run(setup, greedy_run, monkeypatch):
    """One more draft in a second run: the journalled calls are reused, the target-only calls of its
    prompts are timed again in the new run and its speedup divides by those. The second run's clock
    is made 10x slower for the target (a fake clock): the new draft's speedup must see it, the first
    run's drafts keep theirs."""
    import shutil

    import distill.eval.acceptance as acceptance

    root, files = setup
    _, out, first = greedy_run
    added = root / "added"
    shutil.copytree(out, added)
    before = (added / "records.jsonl").read_text().splitlines()
    real = acceptance.target_generate

    def slow_clock(*args, **kwargs):
        result = real(*args, **kwargs)
        return {**result, "wall_s": result["wall_s"] * 10, "ttft_s": result["ttft_s"] * 10}

    monkeypatch.setattr(acceptance, "target_generate", slow_clock)
    args = _args(root, files, added, "--ks", "1", "--draft-alone")
    args[args.index("--draft") : args.index("--draft") + 2] = ["--draft", f"small={root / 'draft'}", "--draft", f"copy={root / 'draft'}"]
    assert main(args) == 0
    after = (added / "records.jsonl").read_text().splitlines()
    assert after[: len(before)] == before  # nothing journalled is lost
    new = [json.loads(line) for line in after[len(before) :] if '"key"' in line]
    assert {r["system"] for r in new} == {TARGET, "copy", "alone:copy"}
    report = json.loads((added / "report.json").read_text())
    assert set(report["drafts"]) == {"small", "copy", "self"} and len(report["runs"]) == 2
    second = {r["run_id"] for r in new}
    assert len(second) == 1
    for task, row in first["drafts"]["small"]["tasks"].items():
        small, copy = report["drafts"]["small"]["tasks"][task], report["drafts"]["copy"]["tasks"][task]
        assert small["end_to_end_speedup"] == row["end_to_end_speedup"] and small["runs"] == row["runs"]  # paired in the first run
        assert copy["runs"] == sorted(second) and copy["acceptance_rate"] == row["acceptance_rate"]  # the same weights, timed anew
        assert copy["end_to_end_speedup"] > 5 * small["end_to_end_speedup"]  # divided by the second run's (slow) target-only calls


def test_cost_repeats_are_spread_over_the_runs_calls(setup, tmp_path, monkeypatch):
    """c, c₂ and v(k) are timed a few repeats at a time between the generate calls, not all at the end,
    so they see the machine as the calls they predict did; the report counts them all."""
    import distill.eval.acceptance as acceptance

    root, files = setup
    out = tmp_path / "spread"
    journal = out / "records.jsonl"
    taken: list[tuple[int, int]] = []
    real = acceptance.CostSampler.sample

    def spy(self, repeats=1):
        taken.append((len(journal.read_text().splitlines()), repeats))
        return real(self, repeats)

    monkeypatch.setattr(acceptance.CostSampler, "sample", spy)
    args = _args(root, files, out, "--cost-repeats", "4")
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert sum(r for _, r in taken) == 4 and all(c["costs"]["repeats"] == 4 for c in report["drafts"].values())
    assert len({at for at, r in taken if r}) >= 3  # at three or more points of the run
    assert report["settings"]["cost_timing"].startswith("spread evenly over the run's")
    assert all(c["costs"]["c_first"] > 0 for c in report["drafts"].values())


def test_a_journal_of_other_settings_is_moved_aside_not_lost(tmp_path):
    old = Journal(tmp_path / "records.jsonl", "aaaa")
    old.begin(Run.begin("cpu"))
    old.add("gsm8k|0|target|None", {"new": [[1, 2]]})
    fresh = Journal(tmp_path / "records.jsonl", "bbbb")
    assert fresh.latest("gsm8k|0|target|None") is None
    kept = Journal(tmp_path / "records.aaaa.jsonl", "aaaa")
    assert kept.latest("gsm8k|0|target|None") == {"key": "gsm8k|0|target|None", "run_id": old.run.run_id, "new": [[1, 2]]}


def test_an_old_journal_is_read_whole_and_its_timings_marked_as_another_runs(tmp_path):
    """A journal written before runs were recorded: its calls are reused for outputs and acceptance, but
    no speculative call pairs with a timing of it, so the next run times each batch afresh."""
    path = tmp_path / "records.jsonl"
    calls = [Call("gsm8k|0|target|None", "gsm8k", 0, (0,), TARGET, None), Call("gsm8k|0|kd|3|s", "gsm8k", 0, (0,), "kd", 3)]
    lines = [{"fingerprint": "f"}] + [{"key": c.key, "system": c.system, "new": [[1]], "wall_s": 1.0, "ttft_s": 0.1} for c in calls]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    journal = Journal(path, "f")
    assert journal.latest(calls[1].key)["run_id"] == LEGACY and journal.in_run(calls[0].key, LEGACY) is None
    assert calls_to_run([calls], journal) == calls  # re-timed: target-only first, then the draft
    journal.begin(Run.begin("cpu"))
    for c in calls:
        journal.add(c.key, {"system": c.system, "new": [[1]], "wall_s": 2.0, "ttft_s": 0.2})
    assert calls_to_run([calls], Journal(path, "f")) == []
    assert path.read_text().splitlines()[: len(lines)] == [json.dumps(line) for line in lines]  # nothing lost


def test_retrained_draft_or_edited_data_is_measured_afresh(tmp_path):
    (tmp_path / "draft").mkdir()
    weights = tmp_path / "draft" / "model.safetensors"
    weights.write_bytes(b"weights")
    data = tmp_path / "mmlu.jsonl"
    data.write_text("{}\n")
    settings = Settings(target="Qwen/Qwen2.5-7B-Instruct", drafts=[DraftSource("kd", str(tmp_path / "draft"))], tasks=["mmlu"], data_files={"mmlu": str(data)})
    before = settings.fingerprint()
    assert Settings(**{**vars(settings), "output_dir": "elsewhere"}).fingerprint() == before
    assert Settings(**{**vars(settings), "seed": 1}).fingerprint() != before
    stamp = settings.draft_stamp("kd")
    weights.write_bytes(b"retrained")
    assert settings.draft_stamp("kd") != stamp and settings.fingerprint() == before  # only the retrained draft's calls are redone
    os.utime(data, ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns + 1))
    assert settings.fingerprint() == before  # a data file copied or remounted, not edited: its calls are kept
    data.write_text("{}\n{}\n")
    assert settings.fingerprint() != before


def test_sampling_reports_quality_and_acceptance_not_identity(setup):
    root, files = setup
    out = root / "sampled"
    args = _args(root, {"gsm8k": files["gsm8k"]}, out, "--temperature", "0.8", "--top-p", "0.95")
    args[args.index("--tasks") + 1] = "gsm8k"
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["mode"] == "sampling"
    for entry in report["drafts"].values():
        row = entry["tasks"]["gsm8k"]
        assert row["greedy_identity"] is None and 0.0 <= row["quality"] <= 1.0
    # A draft identical to the target is accepted with probability min(1, p/q) = 1.
    assert report["drafts"]["self"]["tasks"]["gsm8k"]["acceptance_rate"] == 1.0
    assert "| – |" in (out / "report.md").read_text()


def test_draft_with_another_tokenizer_is_refused(setup, tmp_path, capsys):
    root, files = setup
    other = build_tokenizer(corpus_texts(make_examples(50, seed=7)), vocab_size=300)
    stranger = tiny_qwen2(len(other), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, tokenizer=other)
    stranger.save_pretrained(tmp_path / "stranger")
    other.save_pretrained(tmp_path / "stranger")
    args = _args(root, files, tmp_path / "out")
    args[args.index(f"small={root / 'draft'}")] = f"stranger={tmp_path / 'stranger'}"
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "stranger" in err and "tokenizers disagree" in err
    assert not (tmp_path / "out" / "report.json").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        (("--tasks", "gsm8k,squad"), "unknown task 'squad'"),
        (("--data-file", "mmlu=/nonexistent/mmlu.jsonl"), "does not exist"),
        (("--ks", "0,2"), "--ks"),
        (("--sweep-drafts", "small,nobody"), "--sweep-drafts names 'nobody', which is no --draft"),
        (("--compare", "small:nobody"), "--compare names 'nobody', which is no --draft"),
        (("--compare", "small:small"), "--compare 'small:small': write DRAFT:REFERENCE with two different draft names"),
        (("--compare", "small"), "--compare 'small': write DRAFT:REFERENCE"),
    ],
)
def test_bad_input_is_refused_with_a_clear_error(setup, tmp_path, capsys, change, message):
    root, files = setup
    args = _args(root, files, tmp_path / "out")
    flag, value = change
    if flag == "--data-file":
        args[args.index(f"mmlu={files['mmlu']}")] = value
    elif flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_eos_cut_and_draft_names():
    assert cut_at_eos([5, 6, 2, 0, 0], {2}) == [5, 6, 2]  # the one EOS cut the report's outputs go through
    assert cut_at_eos([5, 6, 7], {2, 3}) == [5, 6, 7]
    drafts = parse_drafts(["Qwen/Qwen2.5-0.5B-Instruct,kd=runs/kd", "self=Qwen/Qwen2.5-7B-Instruct"])
    assert [(d.name, d.path) for d in drafts] == [
        ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
        ("kd", "runs/kd"),
        ("self", "Qwen/Qwen2.5-7B-Instruct"),
    ]
    with pytest.raises(ValueError, match="given twice"):
        parse_drafts(["a=x", "a=y"])


def test_runs_as_a_script(monkeypatch, capsys):
    """`python eval/acceptance.py` as Python runs it: the file as __main__, its folder first on sys.path
    (in-process, to spare the suite a second torch import)."""
    script = REPO_ROOT / "eval" / "acceptance.py"
    monkeypatch.syspath_prepend(str(script.parent))
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--draft" in out and "--ks" in out and "--data-file" in out


def test_drafts_are_compared_by_their_paired_difference(greedy_run):
    """self − small on the same prompts: the self-draft accepts every token and the small one none, so the
    paired difference is +1 with an interval that excludes 0; the report.md table marks it."""
    _, out, report = greedy_run
    rows = {c["task"]: c for c in report["comparisons"]}
    assert set(rows) == {"gsm8k", "mmlu", "cnndm"}
    for task, c in rows.items():
        small, own = (report["drafts"][n]["tasks"][task]["acceptance_rate"] for n in ("small", "self"))
        assert c["reference"] == "small" and c["draft"] == "self"
        assert c["acceptance_rate"]["value"] == pytest.approx(own - small) and c["acceptance_rate"]["outside_noise"]
        assert c["decode_speedup"]["prompts"] == 2
    assert "| gsm8k | self − small |" in (out / "report.md").read_text()


def test_templates_are_reported_per_label_and_reuse_the_calls_of_their_prompts(setup):
    """A finished run asked again under --template: the default template's calls are the journalled ones
    (the same prompts), only the new template's prompts are decoded, and each is a row of the report."""
    root, files = setup
    out = root / "templated"
    args = _args(root, {"gsm8k": files["gsm8k"]}, out)
    args[args.index("--tasks") + 1] = "gsm8k"
    assert main(args) == 0
    before = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if '"key"' in line]
    assert main([*args, "--template", "gsm8k=default,plain"]) == 0
    after = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if '"key"' in line]
    assert after[: len(before)] == before and {r["task"] for r in after[len(before) :]} == {"gsm8k@plain"}
    report = json.loads((out / "report.json").read_text())
    assert list(report["target_only"]) == ["gsm8k@default", "gsm8k@plain"]
    assert report["settings"]["templates_per_task"] == {"gsm8k@default": "gsm8k", "gsm8k@plain": "gsm8k-plain"}
    for label in ("gsm8k@default", "gsm8k@plain"):
        assert report["drafts"]["self"]["tasks"][label]["acceptance_rate"] == 1.0 and report["drafts"]["self"]["tasks"][label]["num_prompts"] == 2
    assert "## gsm8k@plain" in (out / "report.md").read_text()


def test_a_trimmed_draft_keeps_greedy_identity_and_reports_its_coverage(setup, tmp_path, examples):
    """A draft cut by `distill trim-vocab` decodes the target's greedy output, and its report gives the
    kept rows and, per task, the share of the target-only output tokens inside its set, counted here by hand."""
    from distill.commands.trim_vocab import main as trim_vocab
    from distill.common.trim import read_map

    root, files = setup
    texts = tmp_path / "corpus.txt"  # the text the tiny pair learnt from
    texts.write_text("\n".join(corpus_texts(examples)))
    assert trim_vocab([str(root / "draft"), str(tmp_path / "trimmed"), "--size", "192", "--from", str(texts)]) == 0
    kept = set(read_map(tmp_path / "trimmed")[0])
    out = tmp_path / "run"
    args = _args(root, {"gsm8k": files["gsm8k"]}, out)
    args[args.index("--tasks") + 1] = "gsm8k"
    args[args.index(f"self={root / 'target'}")] = f"trimmed={tmp_path / 'trimmed'}"
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    row = report["drafts"]["trimmed"]["tasks"]["gsm8k"]
    assert row["greedy_identity"] == 1.0 and "vocab" not in report["drafts"]["small"]
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    tokens = [t for r in records if r.get("system") == TARGET and r.get("task") == "gsm8k" for new in r["new"] for t in new]
    share = sum(t in kept for t in tokens) / len(tokens)
    assert 0 < share < 1  # the target writes tokens the trimmed draft can never propose, and decoding stays lossless
    vocab = report["drafts"]["trimmed"]["vocab"]
    widened = vocab["coverage_with_prompt_rows"]["gsm8k"]
    assert vocab == {"kept": 192, "coverage": {"gsm8k": pytest.approx(share)}, "prompt_rows": PROMPT_ROWS, "coverage_with_prompt_rows": {"gsm8k": widened}}
    assert share < widened <= 1  # the answers repeat tokens of their questions that the set left out
    assert f"| trimmed | 192 | gsm8k | {share:.2%} | {PROMPT_ROWS} | {widened:.2%} |" in (out / "report.md").read_text()


def test_the_widened_coverage_counts_each_calls_prompt_extras():
    """Hand-checked: set {0, 1}; call 1's prompt adds 5 and 7 (capacity 2: the two most frequent of 5, 7, 9),
    call 2's adds 9; answer tokens inside: call 1: 0, 5, 7 of [0, 5, 7, 9]; call 2: 1, 9 of [1, 9, 5]."""
    in_set = torch.zeros(12, dtype=torch.bool)
    in_set[[0, 1]] = True
    calls = [(torch.tensor([5, 5, 7, 7, 9, 1]), [0, 5, 7, 9]), (torch.tensor([9, 1]), [1, 9, 5])]
    assert _widened_share(calls, in_set, 2) == pytest.approx(5 / 7)


def test_the_k_sweep_covers_the_drafts_named_and_one_added_later_reuses_every_call(setup, tmp_path):
    """--sweep-drafts measures the other drafts at the main k only; the same run without it then makes only
    the left-out draft's sweep calls (and their target-only pairs), reusing every journalled call; a
    --compare pair added after it decodes nothing and reports that paired difference too."""
    root, files = setup
    out = tmp_path / "run"
    args = _args(root, {"gsm8k": files["gsm8k"]}, out, "--ks", "1")
    args[args.index("--tasks") + 1] = "gsm8k"

    def records() -> list[dict]:
        return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if '"key"' in line]

    assert main([*args, "--sweep-drafts", "small"]) == 0
    first = records()
    assert {(r["system"], r["k"]) for r in first} == {(TARGET, None), ("small", 3), ("small", 1), ("self", 3)}
    report = json.loads((out / "report.json").read_text())
    assert [p["k"] for p in report["drafts"]["small"]["sweep"]] == [1, 3] and report["drafts"]["self"]["sweep"] == []
    md = (out / "report.md").read_text()
    assert "**small**: α" in md and "**self**: α" not in md
    assert main(args) == 0
    after = records()
    assert after[: len(first)] == first
    assert {(r["system"], r["k"]) for r in after[len(first) :]} == {(TARGET, None), ("self", 1)}
    report = json.loads((out / "report.json").read_text())
    assert [p["k"] for p in report["drafts"]["self"]["sweep"]] == [1, 3]
    assert len(report["runs"]) == 2 and all(run["machine_load"]["wall_s"] > 0 for run in report["runs"].values())
    assert all(r["machine_load"]["wall_s"] > 0 for r in after)  # each call carries its run's load so far
    default = {(c["draft"], c["reference"]): c for c in report["comparisons"]}
    assert main([*args, "--compare", "small:self"]) == 0  # a pair added to a finished run: reported, nothing decoded
    assert records() == after
    pairs = {(c["draft"], c["reference"]): c for c in json.loads((out / "report.json").read_text())["comparisons"]}
    assert list(pairs) == [("self", "small"), ("small", "self")]
    assert pairs["self", "small"] == default["self", "small"]
    assert pairs["small", "self"]["acceptance_rate"]["value"] == pytest.approx(-default["self", "small"]["acceptance_rate"]["value"])
    assert "| gsm8k | small − self |" in (out / "report.md").read_text()


def test_a_stopped_runs_load_is_read_from_its_last_call_and_a_report_claims_its_busiest_run(tmp_path):
    def load(wall_s: float, cores: float) -> dict:
        return {"wall_s": wall_s, "others_cores": cores}

    journal = Journal(tmp_path / "records.jsonl", "f")
    journal.begin(Run.begin("cpu"))
    stopped = journal.run.run_id
    journal.add("a", {"new": [[1]], "machine_load": load(10.0, 0.02)})
    journal.add("b", {"new": [[2]], "machine_load": load(20.0, 0.30)})  # killed here: no run_end line
    journal = Journal(tmp_path / "records.jsonl", "f")
    journal.begin(Run.begin("cpu"))
    journal.add("c", {"new": [[3]], "machine_load": load(5.0, 0.01)})
    journal.end(load(6.0, 0.01))
    finished = journal.run.run_id
    journal = Journal(tmp_path / "records.jsonl", "f")
    assert journal.run_with_load(stopped)["machine_load"] == load(20.0, 0.30)
    assert journal.run_with_load(finished)["machine_load"] == load(6.0, 0.01)
    assert busiest([journal.run_with_load(stopped), journal.run_with_load(finished)]) == load(20.0, 0.30)
