"""scripts/bench_loss.py on a small shape: every variant runs in its own child, the fused losses equal the
unchunked one, and --docs writes the section rendered from the report kept beside it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from distill.commands.render_docs import main as render_docs

REPO = Path(__file__).resolve().parents[2]


def test_bench_loss_writes_its_report_and_the_losses_agree(tmp_path):
    docs = tmp_path / "docs" / "benchmarks.md"
    argv = ["--tokens", "64", "--vocab", "512", "--hidden", "32", "--chunk-sizes", "16", "48", "--repeats", "1", "--docs", str(docs)]
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_loss.py"), *argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads((tmp_path / "docs" / "results" / "bench_loss.json").read_text())
    rows = saved["blocks"][1]["rows"]
    assert [r[0] for r in rows] == ["unchunked (full logits)", "fused, chunk 16", "fused, chunk 48"]
    assert len({r[-1] for r in rows}) == 1  # the same loss to six decimals, chunked or not
    assert "<!-- results:bench_loss -->" in docs.read_text()
    assert render_docs(["--check", "--root", str(tmp_path)]) == 0
