"""vLLM's own engine on the real pair (`python -m pytest -q -m real tests/engines/test_vllm_real.py`, ~6 min):
skipped, saying why, where `distill vllm-env` has not made vLLM's environment or the converted folders are absent."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from distill.engines.vllm import main
from distill.engines.vllm_env import default_venv, ready

REAL_DIR = Path(os.environ.get("DISTILL_REAL_DIR", Path.home() / ".cache" / "distill-real"))
GSM8K = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "test.jsonl"

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(ready(default_venv()) is None, reason=f"no vLLM environment at {default_venv()}: make it with `distill vllm-env`"),
    pytest.mark.skipif(
        not (REAL_DIR / "coder-1.5b").is_dir() or not (REAL_DIR / "coder-0.5b").is_dir(),
        reason=f"no converted real pair in {REAL_DIR}: distill convert-gguf (README, Real models on a CPU)",
    ),
    pytest.mark.skipif(not GSM8K.is_file(), reason=f"no GSM8K data at {GSM8K}"),
]


def test_vllm_serves_the_real_draft_losslessly_and_its_counters_add_up(tmp_path):
    out = tmp_path / "report.json"
    args = ["--target", str(REAL_DIR / "coder-1.5b"), "--draft", f"base={REAL_DIR / 'coder-0.5b'}", "--data-file", str(GSM8K)]
    assert main([*args, "--num-prompts", "1", "--max-new-tokens", "24", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    base = report["drafts"]["base"]
    assert base["identical_outputs"] == 1  # float32: vLLM's speculative output is its target-only output
    assert base["request_counts_agree"] == 1 and 0 < base["accepted"] <= base["drafted"] == 3 * base["drafts"]
    assert sum(base["per_position_accepted"]) == base["accepted"] and report["vllm"]["vllm"] == "0.32.0"
