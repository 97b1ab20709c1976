"""scripts/bench_decode.py on its built-in tiny pair: the three methods give the same greedy output, and
the section is written from the report kept beside the page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from distill.commands.render_docs import main as render_docs

REPO = Path(__file__).resolve().parents[2]


def test_bench_decode_compares_the_methods_and_writes_its_report(tmp_path):
    docs = tmp_path / "docs" / "benchmarks.md"
    argv = ["--num-prompts", "1", "--repeats", "1", "--max-new-tokens", "8", "--skip-compiled", "--output", str(docs)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_decode.py"), *argv], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]  # float32: the outputs of all methods are identical
    saved = json.loads((tmp_path / "docs" / "results" / "bench_decode.json").read_text())
    methods = [row[0] for row in saved["blocks"][1]["rows"]]
    assert methods == ["target-only generate", "transformers assistant_model", "distill SpeculativeDecoder (eager)"]
    assert "outputs identical across all methods: yes" in saved["blocks"][2]
    assert render_docs(["--check", "--root", str(tmp_path)]) == 0
