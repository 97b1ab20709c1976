"""Faults and bad input: `distill train`, `distill cache-teacher` and `scripts/publish.py` SIGKILLed at
chosen points and rerun end exactly where an uninterrupted run does; corrupt or mismatched files are
refused with one message naming the file and the fix; the security defaults hold.

Kills are deterministic: the real CLI runs as a subprocess behind a small hook (written to the test's
temp dir, never in the product) that wraps one function and SIGKILLs the process on its Nth call,
before it, after it, or after truncating the file it just wrote to half (a torn write)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from datasets import Dataset
from huggingface_hub import HfApi
from safetensors.torch import load_file

from distill.commands.publish import main as publish_main
from distill.commands.publish import publish
from distill.training.data import load_examples, tokenize_example
from distill.training.recipe import RecipeError, load_recipe
from distill.training.teacher import CacheMismatchError, TeacherCache
from distill.training.teacher import main as teacher_main
from distill.training.train import build_trainer, train
from distill.training.train import main as train_main

REPO = Path(__file__).resolve().parents[1]

KILL_HOOK = '''
"""Test-only: SIGKILL this process at the call given by $KILL_AT = "module:attr.path:N:when[:basename]"."""
import importlib, os, signal

module, attr, n, when, *name = os.environ["KILL_AT"].split(":")
owner = importlib.import_module(module)
*parents, leaf = attr.split(".")
for part in parents:
    owner = getattr(owner, part)
original, calls = getattr(owner, leaf), [0]


def _path(args, kwargs):
    return os.fspath(args[1] if len(args) > 1 else next(iter(kwargs.values())))


def wrapper(*args, **kwargs):
    if name and os.path.basename(_path(args, kwargs)) != name[0]:
        return original(*args, **kwargs)
    calls[0] += 1
    if calls[0] == int(n) and when == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    result = original(*args, **kwargs)
    if calls[0] == int(n):
        if when == "torn":
            path = _path(args, kwargs)
            os.truncate(path, os.path.getsize(path) // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    return result


setattr(owner, leaf, wrapper)
'''


def run_cli(args: list[str], tmp: Path, kill_at: str | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """The `distill` CLI's main on ARGS, or `python scripts/publish.py ARGS` when args[0] is a .py
    file, in a fresh one-thread Python, with the kill hook imported first when `kill_at` is given."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(tmp), str(REPO)]), "HF_HUB_OFFLINE": "1"}
    env.pop("KILL_AT", None)
    if kill_at:
        (tmp / "_kill_hook.py").write_text(KILL_HOOK)
        env["KILL_AT"] = kill_at
    script = "import runpy, sys\n"
    if kill_at:
        script += "import _kill_hook\n"
    if args[0].endswith(".py"):
        script += "sys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n"
    else:
        script += "from distill.cli import main\nraise SystemExit(main())\n"
    return subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp)


def assert_killed(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == -signal.SIGKILL, f"expected a SIGKILL, got rc={proc.returncode}\n{proc.stderr[-3000:]}"


def tree_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder`, by relative path (hidden temp files included)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------------------------
# a tiny run on disk


@pytest.fixture(scope="module")
def tiny(tiny_run):
    """A saved tiny target (embedding padded +32), 48 training and 8 eval examples, 8 cosine-scheduled steps."""
    return tiny_run(
        "faults",
        train_rows=48,
        eval_rows=8,
        training={
            "max_steps": 8,
            "per_device_train_batch_size": 8,
            "learning_rate": 1e-2,
            "lr_scheduler_type": "cosine",
            "warmup_ratio": 0.1,
            "logging_steps": 1,
            "save_steps": 2,
            "save_total_limit": 2,
            "report_to": ["none"],
        },
    )


def final_state(output_dir: Path) -> tuple[dict[str, torch.Tensor], list[float], float]:
    """(draft weights, per-step training losses of the last checkpoint's history, final eval loss)."""
    weights = load_file(output_dir / "draft" / "model.safetensors")
    info = json.loads((output_dir / "run_info.json").read_text())
    last = output_dir / f"checkpoint-{info['global_step']}"
    history = json.loads((last / "trainer_state.json").read_text())["log_history"]
    return weights, [h["loss"] for h in history if "loss" in h], info["metrics"]["eval_loss"]


@pytest.fixture(scope="module")
def straight(tiny):
    """The uninterrupted run every killed-and-resumed run must equal."""
    assert train_main([str(tiny.write_recipe("straight"))]) == 0
    return final_state(tiny / "straight")


def assert_same_run(got: tuple, expected: tuple) -> None:
    weights, losses, eval_loss = got
    assert weights.keys() == expected[0].keys()
    for name, value in expected[0].items():
        assert torch.equal(weights[name], value), name
    assert losses == expected[1] and len(losses) == 8
    assert eval_loss == expected[2]


# --------------------------------------------------------------------------------------------
# distill train, killed


TRAIN_KILLS = {
    # forward and backward of step 5 done, its optimizer step not: checkpoint-4 is the latest
    "mid-step": ("transformers.trainer:Trainer.training_step:5:after", "checkpoint-4"),
    # checkpoint-6's optimizer.pt torn in half before trainer_state.json was written
    "mid-checkpoint-save": ("torch:save:3:torn:optimizer.pt", "checkpoint-4"),
    # checkpoint-6 complete but its trainer_state.json torn (the last file a checkpoint gets)
    "torn-trainer-state": ("transformers.trainer_callback:TrainerState.save_to_json:3:torn", "checkpoint-4"),
}


@pytest.mark.parametrize("fault", [pytest.param(f, marks=[] if f == "mid-checkpoint-save" else [pytest.mark.slow]) for f in TRAIN_KILLS])
def test_killed_training_resumes_to_the_uninterrupted_result(tiny, straight, fault):
    kill_at, resumes_from = TRAIN_KILLS[fault]
    recipe = tiny.write_recipe(f"killed-{fault}")
    out = tiny / f"killed-{fault}"
    assert_killed(run_cli(["train", str(recipe)], tiny, kill_at=kill_at))
    assert not (out / "draft").exists()
    assert train_main([str(recipe), "--resume"]) == 0
    info = json.loads((out / "run_info.json").read_text())
    assert Path(info["resumed_from"]).name == resumes_from and info["global_step"] == 8
    assert_same_run(final_state(out), straight)


# --------------------------------------------------------------------------------------------
# distill cache-teacher, killed


CACHE = {"mode": "cache", "top_k": 8, "batch_size": 4}


@pytest.fixture(scope="module")
def cache_recipe(tiny):
    return tiny.write_recipe("cached", teacher={**CACHE, "cache_dir": str(tiny / "cache")})


@pytest.fixture(scope="module")
def straight_cache(tiny, cache_recipe):
    """An uninterrupted cache: 48 training examples in 6 shards of 8, and the held-out 8 in one."""
    assert teacher_main([str(cache_recipe), "--shard-size", "8", "--cache-dir", str(tiny / "cache")]) == 0
    return tiny / "cache"


def test_killed_cache_teacher_reruns_to_a_byte_identical_cache(tiny, cache_recipe, straight_cache):
    where = tiny / "cache-killed"
    args = ["cache-teacher", str(cache_recipe), "--shard-size", "8", "--cache-dir", str(where)]
    # the third shard is torn: its temp file half written when the process dies, never renamed into place
    assert_killed(run_cli(args, tiny, kill_at="safetensors.torch:save_file:3:torn"))
    left = sorted(p.name for p in (where / "train").iterdir())
    assert left[0].startswith(".shard-00002.safetensors.") and left[0].endswith(".tmp")
    assert left[1:] == ["manifest.json", "shard-00000.safetensors", "shard-00001.safetensors"]
    with pytest.raises(CacheMismatchError, match="incomplete.*rerun `distill cache-teacher"):
        TeacherCache(where / "train")
    assert teacher_main(args[1:]) == 0
    assert tree_digest(where) == tree_digest(straight_cache) and len(tree_digest(where)) == 6 + 1 + 2

    losses = []
    for cache_dir in (straight_cache, where):
        recipe = tiny.recipe(f"on-{cache_dir.name}", teacher={**CACHE, "cache_dir": str(cache_dir)}, training={"max_steps": 2})
        metrics = train(load_recipe(recipe))
        losses.append((metrics["train_loss"], metrics["eval_loss"]))
    assert losses[0] == losses[1]


# --------------------------------------------------------------------------------------------
# scripts/publish.py, killed


@pytest.mark.slow
def test_killed_publish_leaves_the_old_folder_or_the_whole_new_one(tiny, straight):
    """--force over an earlier publish: killed mid-write, the old folder is untouched; killed after
    the swap (before the old copy is deleted), the new folder is whole."""
    out, reference = tiny / "site" / "draft", tiny / "reference" / "draft"
    publish(out, run_dir=tiny / "straight")
    old = tree_digest(out)
    args = [str(REPO / "scripts" / "publish.py"), str(tiny / "straight"), "--out", str(out), "--force", "--pad-vocab-to-target"]
    publish(reference, run_dir=tiny / "straight", pad_vocab_to_target=True)
    new = tree_digest(reference)
    assert new != old

    assert_killed(run_cli(args, tiny, kill_at="transformers.modeling_utils:safe_save_file:1:torn"))
    assert tree_digest(out) == old
    assert_killed(run_cli(args, tiny, kill_at="shutil:rmtree:1:before"))
    got = tree_digest(out)
    for named in ("README.md", "publish_info.json"):  # both name the folder (the card's and the engines' commands)
        assert (out / named).read_text().replace(str(out), str(reference)) == (reference / named).read_text()
    assert {k: v for k, v in got.items() if k not in ("README.md", "publish_info.json")} == {
        k: v for k, v in new.items() if k not in ("README.md", "publish_info.json")
    }


# --------------------------------------------------------------------------------------------
# corrupt and mismatched files


@pytest.fixture
def cache_copy(tmp_path, straight_cache):
    where = tmp_path / "cache"
    shutil.copytree(straight_cache, where)
    return where


def flip_byte(path: Path, offset_from_end: int = 16) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x01
    path.write_bytes(bytes(data))


def test_truncated_or_bit_flipped_cache_shard_is_refused_naming_it(tiny, cache_recipe, straight_cache, cache_copy):
    shard = cache_copy / "train" / "shard-00001.safetensors"
    os.truncate(shard, shard.stat().st_size - 100)
    with pytest.raises(CacheMismatchError, match=r"shard-00001\.safetensors is corrupt \(\d+ bytes, the manifest recorded \d+\): delete it and rerun"):
        TeacherCache(cache_copy / "train")
    shard.write_bytes((straight_cache / "train" / shard.name).read_bytes())
    flip_byte(shard)  # inside the last tensor's data: safetensors itself would read it without a word
    with pytest.raises(CacheMismatchError, match=r"shard-00001\.safetensors is corrupt \(its sha256 differs"):
        TeacherCache(cache_copy / "train")
    shard.unlink()  # the fix the message gives: delete the shard and rerun, which recomputes just it
    assert teacher_main([str(cache_recipe), "--shard-size", "8", "--cache-dir", str(cache_copy)]) == 0
    assert tree_digest(cache_copy) == tree_digest(straight_cache)


def test_unreadable_shard_of_a_cache_without_checksums_is_named(cache_copy):
    manifest = cache_copy / "train" / "manifest.json"
    manifest.write_text(json.dumps({k: v for k, v in json.loads(manifest.read_text()).items() if k != "shards"}))
    shard = cache_copy / "train" / "shard-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:5])
    cache = TeacherCache(cache_copy / "train")
    with pytest.raises(CacheMismatchError, match=r"shard-00000\.safetensors is unreadable \(.*header.*\): delete it and rerun"):
        cache.example(0)


@pytest.mark.parametrize("field", ["dataset", "tokenizer_fingerprint", "target"])
def test_cache_of_another_dataset_tokenizer_or_target_is_refused(tiny, cache_copy, field):
    recipe = tiny.recipe("mismatch", teacher={**CACHE, "cache_dir": str(cache_copy)})
    if field == "dataset":
        recipe["data"]["dataset"] = str(tiny / "eval.jsonl")
        field = "dataset_fingerprint"
    else:
        manifest = cache_copy / "train" / "manifest.json"
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), field: "something-else"}))
    with pytest.raises(
        CacheMismatchError, match=rf"teacher cache {cache_copy / 'train'} does not match this run \({field}: .*Rebuild it with `distill cache-teacher"
    ):
        build_trainer(load_recipe(recipe))


def test_checkpoint_without_its_optimizer_state_is_refused(tiny, straight, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(tiny / "straight", out)
    (out / "checkpoint-8" / "optimizer.pt").unlink()
    recipe = tmp_path / "run.yaml"
    recipe.write_text(yaml.safe_dump({**tiny.recipe("straight"), "output_dir": str(out)}))
    with pytest.raises(FileNotFoundError, match=r"checkpoint-8 lacks optimizer\.pt.*restore the files, or delete checkpoint-8 to resume from checkpoint-6"):
        train(load_recipe(recipe), resume=True)


@pytest.mark.parametrize("verb", ["train", "cache-teacher"])
def test_bad_input_ends_the_command_with_its_message_and_no_traceback(tiny, tmp_path, verb, capsys):
    """The CLI prints the clear message alone (exit 2), not a traceback that buries it."""
    recipe = tmp_path / "missing.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                **tiny.recipe("missing", target={"name_or_path": str(tiny / "no-such-target")}),
                "teacher": {"mode": "cache", "cache_dir": str(tmp_path / "cache")},
            }
        )
    )
    main = train_main if verb == "train" else teacher_main
    assert main([str(recipe)]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.startswith(f"distill {verb}: error: invalid recipe:"), err
    assert err.splitlines()[1:] == [
        f"  target.name_or_path: {tiny / 'no-such-target'} does not exist (relative paths are read from {Path.cwd()}); fix the path or create it first"
    ]


@pytest.mark.parametrize("key", ["target.name_or_path", "draft.name_or_path", "data.dataset", "data.eval_split"])
def test_recipe_pointing_at_a_missing_file_names_the_key(tiny, key):
    recipe = tiny.recipe("missing")
    section, name = key.split(".")
    if key == "draft.name_or_path":
        recipe["draft"] = {"name_or_path": str(tiny / "no-such-draft")}
    else:
        recipe[section][name] = str(tiny / ("no-such.jsonl" if section == "data" else "no-such-target"))
    with pytest.raises(RecipeError, match=rf"{key}: .*no-such.* does not exist .*fix the path"):
        build_trainer(load_recipe(recipe))


def test_dataset_rows_without_the_adapters_fields_are_refused(tiny):
    wrong = tiny / "gsm8k-like.jsonl"
    wrong.write_text(json.dumps({"question": "1 + 1 ?", "answer": "2"}) + "\n")
    with pytest.raises(ValueError, match=r"adapter 'prompt_response' needs columns \['prompt'\].*set data.adapter"):
        load_examples(str(wrong), "prompt_response")
    holes = tiny / "holes.jsonl"
    holes.write_text("".join(json.dumps(r) + "\n" for r in [{"prompt": "a", "response": "b"}, {"response": "c"}, {"prompt": None, "response": "d"}]))
    with pytest.raises(ValueError, match=r"2 rows of .*holes.jsonl have no 'prompt' .*the first is row 2: fill those rows in or drop them"):
        load_examples(str(holes), "prompt_response")


def test_empty_dataset_is_refused(tiny):
    empty = tiny / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"empty.jsonl is empty: there is nothing to train"):
        load_examples(str(empty), "prompt_response")
    no_rows = tiny / "no-rows.parquet"
    Dataset.from_dict({"prompt": [], "response": []}).to_parquet(no_rows)
    with pytest.raises(ValueError, match=r"no-rows.parquet has no rows: there is nothing to train"):
        load_examples(str(no_rows), "prompt_response")


def test_max_length_past_the_models_context_is_refused_and_long_prompts_keep_their_end(tiny, tokenizer):
    recipe = tiny.recipe("long", data={"max_length": 200, "max_prompt_length": 150})
    with pytest.raises(ValueError, match=r"data.max_length 200 exceeds the draft's context of 128 positions: set data.max_length .* at most 128"):
        build_trainer(load_recipe(recipe))
    messages = [{"role": "user", "content": " ".join(["the red fox"] * 40)}]
    row = tokenize_example(tokenizer, messages, "the fox .", max_prompt_length=16, max_length=24)
    full = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert len(full) > 16 and row["input_ids"][:16] == list(full[-16:])  # the prompt's end, which the response follows
    assert row["labels"][16:] == row["input_ids"][16:] and len(row["input_ids"]) <= 24


# --------------------------------------------------------------------------------------------
# security defaults


def _folder_with_code(tiny, folder: Path, code: str, model_type: str, auto: dict) -> Path:
    """A copy of the tiny target whose config names `model_type` and maps Auto classes to code.py."""
    shutil.copytree(tiny / "target", folder)
    (folder / "code.py").write_text(code)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": model_type, "auto_map": auto}))
    return folder


def test_remote_code_in_a_model_folder_is_never_run(tiny, tmp_path):
    """A target folder that ships custom code (auto_map) loads the library's own Qwen2 class, and
    one whose model type only its code knows is refused; the code never runs either way."""
    marker = tmp_path / "ran"
    auto = {"AutoConfig": "code.Config", "AutoModelForCausalLM": "code.Model", "AutoTokenizer": ["code.Tokenizer", None]}
    for name, model_type in (("known-type", "qwen2"), ("unknown-type", "evil_qwen")):
        folder = _folder_with_code(tiny, tmp_path / name, f"open({str(marker)!r}, 'w').write('ran')\n", model_type, auto)
        recipe = load_recipe(tiny.recipe(f"remote-{name}", target={"name_or_path": str(folder)}, data={"eval_split": None}))
        if model_type == "qwen2":
            assert type(build_trainer(recipe).teacher).__module__.startswith("transformers.")
        else:
            with pytest.raises(ValueError, match="trust_remote_code"):
                build_trainer(recipe)
    assert not marker.exists()


REMOTE_CODE = """
from transformers import Qwen2Config, Qwen2ForCausalLM

open({marker!r}, "w").write("ran")


class Config(Qwen2Config):
    model_type = "custom_qwen"


class Model(Qwen2ForCausalLM):
    config_class = Config
"""


def test_remote_code_runs_only_when_the_recipe_sets_trust_remote_code(tiny, tmp_path):
    """`target.trust_remote_code: true` loads the folder's own classes (its `auto_map`); the same
    folder without the key is refused and its code never runs."""
    marker = tmp_path / "ran"
    folder = _folder_with_code(
        tiny, tmp_path / "custom", REMOTE_CODE.format(marker=str(marker)), "custom_qwen", {"AutoConfig": "code.Config", "AutoModelForCausalLM": "code.Model"}
    )
    with pytest.raises(ValueError, match="trust_remote_code"):
        build_trainer(load_recipe(tiny.recipe("custom-off", target={"name_or_path": str(folder)}, data={"eval_split": None})))
    assert not marker.exists()
    recipe = load_recipe(tiny.recipe("custom-on", target={"name_or_path": str(folder), "trust_remote_code": True}, data={"eval_split": None}))
    teacher = build_trainer(recipe).teacher
    assert marker.exists() and type(teacher).__name__ == "Model" and not type(teacher).__module__.startswith("transformers.")


def test_weights_are_safetensors_and_pickles_load_weights_only(tiny, straight):
    for folder in (tiny / "straight" / "draft", tiny / "straight" / "checkpoint-8"):
        names = {p.name for p in folder.iterdir()}
        assert "model.safetensors" in names and not names & {"pytorch_model.bin", "model.bin"}
    sources = [p for p in (REPO / "distill").rglob("*.py")] + list((REPO / "scripts").glob("*.py")) + list((REPO / "eval").rglob("*.py"))
    loads = [(p.name, line) for p in sources for line in p.read_text().splitlines() if "torch.load(" in line]
    assert all("weights_only=True" in line for _, line in loads), loads


def test_recipes_are_read_with_a_safe_yaml_loader(tmp_path):
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.yaml"
    evil.write_text(f"seed: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(evil)
    assert not marker.exists()
    sources = "\n".join(p.read_text() for p in [*(REPO / "distill").rglob("*.py"), *(REPO / "scripts").glob("*.py")])
    assert "yaml.unsafe_load" not in sources and "yaml.Loader" not in sources and "yaml.FullLoader" not in sources
    assert all(
        call.startswith(("yaml.load(text, Loader=_Loader)", "yaml.load(f, Loader=_Loader)"))
        for call in ("yaml.load(" + c for c in sources.split("yaml.load(")[1:])
    )


SECRET = "hf_fault_test_secret_0123456789"


@pytest.fixture
def hub_calls(monkeypatch):
    """Record every HfApi call that would send something to the Hub, instead of making it."""
    calls = []
    for method in ("create_repo", "upload_folder", "upload_file", "create_commit"):
        monkeypatch.setattr(HfApi, method, lambda self, *a, _m=method, **kw: calls.append((_m, kw.get("repo_id"))) or "https://huggingface.co/me/x")
    monkeypatch.setenv("HF_TOKEN", SECRET)
    return calls


def test_nothing_is_uploaded_without_push_to_hub_and_the_token_is_never_written(tiny, straight, tmp_path, hub_calls, capfd, caplog):
    caplog.set_level(logging.DEBUG)
    recipe = tmp_path / "token.yaml"
    recipe.write_text(
        yaml.safe_dump(
            tiny.recipe(
                "run",
                root=tmp_path,
                target={"name_or_path": str(tiny / "target")},
                data={"dataset": str(tiny / "train.jsonl"), "eval_split": None},
                training={"max_steps": 1},
            )
        )
    )
    assert train_main([str(recipe)]) == 0
    assert publish_main([str(tmp_path / "run"), "--out", str(tmp_path / "local")]) == 0
    assert hub_calls == []
    assert publish_main([str(tmp_path / "run"), "--out", str(tmp_path / "pushed"), "--push-to-hub", "me/tiny-draft"]) == 0
    assert [c[0] for c in hub_calls] == ["create_repo", "upload_folder"]
    written = [p for folder in ("run", "local", "pushed") for p in (tmp_path / folder).rglob("*") if p.is_file()]
    assert (tmp_path / "pushed" / "README.md") in written
    leaked = [str(p) for p in written if SECRET.encode() in p.read_bytes()]
    out, err = capfd.readouterr()
    assert leaked == [] and SECRET not in out + err + caplog.text


# --------------------------------------------------------------------------------------------
# what a new user hits (issue 20): one line and exit 2, never a traceback


def _damaged(src: Path, dest: Path, damage: str) -> Path:
    shutil.copytree(src, dest)
    if damage == "torn weights":
        weights = dest / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        (dest / "config.json").write_text('{"model_type": "qwen2", "hidden_size":')
    return dest


def _gsm8k_file(tmp_path: Path) -> Path:
    path = tmp_path / "gsm8k.jsonl"
    path.write_text(json.dumps({"question": "anna has 3 apples and gets 4 more . how many ?", "answer": "#### 7"}) + "\n")
    return path


def _one_line_error(capsys, prog: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    last = err[-1] if err else ""
    assert "Traceback" not in "\n".join(err) and last.startswith(f"{prog}: error: "), err[-5:]
    return last


@pytest.mark.parametrize("damage", ["torn weights", "config not json"])
@pytest.mark.parametrize("command", ["accept", "publish", "bench"])
def test_unreadable_draft_weights_or_config_are_one_line_naming_the_file(tiny, straight, tmp_path, capsys, command, damage):
    from distill.commands.bench import main as bench_main
    from distill.eval.acceptance import main as accept_main

    draft = _damaged(tiny / "straight" / "draft", tmp_path / "draft", damage)
    target = str(tiny / "target")
    if command == "accept":
        rc = accept_main(
            [
                "--target",
                target,
                "--draft",
                f"kd={draft}",
                "--tasks",
                "gsm8k",
                "--data-file",
                f"gsm8k={_gsm8k_file(tmp_path)}",
                "--max-new-tokens",
                "4",
                "--device",
                "cpu",
                "--output-dir",
                str(tmp_path / "eval"),
            ]
        )
        prog = "distill accept"
    elif command == "publish":
        rc, prog = publish_main(["--draft", str(draft), "--target", target, "--out", str(tmp_path / "published")]), "distill publish"
        assert not (tmp_path / "published").exists()
    else:
        rc, prog = bench_main(["--target", target, "--draft", str(draft), "--device", "cpu"]), "distill bench"
    assert rc == 2
    line = _one_line_error(capsys, prog)
    assert str(draft) in line and ("model.safetensors" in line or "config" in line or "JSON" in line or "json" in line), line


def test_bench_refuses_a_draft_whose_tokenizer_differs_as_accept_does(tiny, straight, tmp_path, capsys):
    from distill.commands.bench import main as bench_main
    from distill.common.tiny import build_tokenizer

    other = tmp_path / "other"
    shutil.copytree(tiny / "straight" / "draft", other)
    build_tokenizer(["an entirely different corpus of words"] * 20, vocab_size=300).save_pretrained(other)
    assert bench_main(["--target", str(tiny / "target"), "--draft", str(other), "--device", "cpu"]) == 2
    assert "tokenizers disagree" in _one_line_error(capsys, "distill bench")


def test_a_missing_local_path_is_named_not_sent_to_the_hub(tiny, tmp_path, capsys, monkeypatch):
    from distill.eval.acceptance import main as accept_main

    monkeypatch.chdir(tmp_path)
    assert (
        accept_main(
            [
                "--target",
                str(tiny / "target"),
                "--draft",
                "runs/tiny/nope",
                "--tasks",
                "gsm8k",
                "--data-file",
                f"gsm8k={_gsm8k_file(tmp_path)}",
                "--device",
                "cpu",
            ]
        )
        == 2
    )
    line = _one_line_error(capsys, "distill accept")
    assert "runs/tiny/nope: no such file or folder" in line and "Repo id" not in line


def test_running_a_finished_recipe_again_is_its_message_and_exit_2(tiny, straight, capsys):
    assert train_main([str(tiny / "straight.yaml")]) == 2
    line = _one_line_error(capsys, "distill train")
    assert "already has checkpoint-8: pass --resume to continue it, or set output_dir to a new directory" in line


def test_a_published_folder_is_readable_by_others(tiny, straight, tmp_path):
    out = publish(tmp_path / "published", run_dir=tiny / "straight")
    modes = {p.relative_to(out.parent).as_posix(): p.stat().st_mode & 0o777 for p in [out, *out.rglob("*")]}
    assert modes.pop("published") == 0o755 and set(modes.values()) == {0o644}, modes


def test_help_answers_without_loading_torch_and_names_the_command():
    code = (
        "import sys\nfrom distill.cli import main\n"
        "for verb in ('train', 'prepare-tiny', 'accept', 'bench', 'convert-gguf'):\n"
        "    try:\n        main([verb, '--help'])\n    except SystemExit:\n        pass\n"
        "print('torch loaded' if 'torch' in sys.modules else 'torch not loaded')"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert run.stdout.rstrip().endswith("torch not loaded")
    assert "usage: distill prepare-tiny" in run.stdout and "usage: distill train" in run.stdout


def test_commands_that_do_not_use_deepspeed_print_nothing_about_it(tmp_path):
    """Saving any model makes accelerate import DeepSpeed, whose CPU fallback logs a warning; on a
    machine without CUDA the CLI tells DeepSpeed it is on the CPU first, so nothing is printed."""
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    run = subprocess.run(
        [sys.executable, "-m", "distill.cli", "prepare-tiny", "--out", str(tmp_path / "tiny"), "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Setting accelerator to CPU" not in run.stderr + run.stdout
