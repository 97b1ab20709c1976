#!/usr/bin/env bash
# The real-pair study behind docs/benchmarks.md and README's headline: the base and the distilled
# Qwen2.5-Coder-0.5B-Instruct under Coder-1.5B-Instruct on held-out GSM8K test prompts, one
# `distill accept` run per setting (each run times target-only and speculative calls interleaved),
# prompts nested (the first 30, 16 and 8 of one seeded shuffle). Each report is copied to
# docs/results/ and the docs sections are rendered from it by `distill docs`.
#
#   scripts/real_pair_study.sh            # all three runs (about 2 h on 2 idle cores; resumable: run it again)
#   DISTILLED=runs/other scripts/real_pair_study.sh bf16
#
# Run it on an idle machine: a report whose machine-load record shows other processes above 0.1
# cores is refused here (rerun it when the machine is quiet: its outputs are reused, its timings not).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/idle.sh
R=${DISTILL_REAL_DIR:-$HOME/.cache/distill-real}
DISTILLED=${DISTILLED:-runs/qwen2.5-coder-0.5b-from-1.5b-cpu}
common=(--target "$R/coder-1.5b" --draft "base=$R/coder-0.5b" --draft "distilled=$DISTILLED"
        --tasks gsm8k --data-file gsm8k=../shared/data/gsm8k/test.jsonl --seed 0 --num-draft-tokens 3)

run() {  # name, then distill accept options
  local name=$1; shift
  local out="eval-output/real-${name//_/-}"
  python eval/acceptance.py "${common[@]}" "$@" --output-dir "$out"
  idle_or_fail "$out/report.json"
  mkdir -p docs/results
  cp "$out/report.json" "docs/results/real_pair_$name.json"
}

for what in "${@:-bf16 fp32 t07}"; do
  for one in $what; do
    case $one in
      bf16) run bf16 --num-samples 30 --max-new-tokens 256 --ks 1,2,3,4,5,6 --sweep-samples 8 --dtype bfloat16 --cost-repeats 40 ;;  # speed, k sweep on the first 8
      fp32) run fp32_8 --num-samples 8 --max-new-tokens 128 --dtype float32 --cost-repeats 5 ;;                       # greedy identity
      t07) run t07 --num-samples 16 --max-new-tokens 128 --temperature 0.7 --dtype bfloat16 ;;                       # sampled acceptance
      *) echo "unknown run $one: choose bf16, fp32 or t07" >&2; exit 2 ;;
    esac
  done
done
distill docs
