#!/usr/bin/env bash
# The prepared GPU check of the static, CUDA-graphed verification loop (issue 5).
#   bash scripts/gpu_check.sh              # one GPU (H200): Qwen2.5-7B / 0.5B / 1.5B shapes, bf16, < 8 min
#   bash scripts/gpu_check.sh --cpu-smoke  # the same stages on tiny shapes on a CPU, < 1 min
# Needs torch and transformers >= 5 (no network, nothing downloaded). Prints its table last; writes
# docs/benchmarks.md (section gpu_check) and, when $OUT is set, $OUT/gpu_check.json.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
PY="${PYTHON:-}"
if [ -z "$PY" ]; then  # the first interpreter on PATH that has torch
  for candidate in python python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then PY="$candidate"; break; fi
  done
fi
[ -n "$PY" ] || { echo "gpu_check: no python with torch on PATH (set PYTHON=/path/to/python)" >&2; exit 2; }
# The script stops starting new work at its own deadline (420 s); this is the backstop.
LIMIT=460
case " $* " in *" --cpu-smoke "*) LIMIT=150 ;; esac
exec timeout --kill-after=10 "$LIMIT" "$PY" scripts/gpu_check.py "$@"
