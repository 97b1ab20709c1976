#!/usr/bin/env bash
# Re-measure the tiny-model and CPU tables of docs/benchmarks.md, one benchmark after another (never two at
# once: each times itself), each writing its report to docs/results/ and its section rendered from it; the
# real-pair tables come from scripts/real_pair_study.sh. Run on an idle machine; about 1 h on 2 cores.
#
#   scripts/benchmarks.sh                 # all of them
#   scripts/benchmarks.sh demo batch      # some: demo batch train-tiny train-trl decode memory rehearsal loss train-gsm8k decode-real
set -euo pipefail
cd "$(dirname "$0")/.."
R=${DISTILL_REAL_DIR:-$HOME/.cache/distill-real}
DEMO=${DEMO_DIR:-demo-output/benchmarks}
DOCS=docs/benchmarks.md

for one in ${@:-demo batch train-tiny train-trl decode memory rehearsal loss train-gsm8k decode-real}; do
  echo "=== $one ($(date -u +%H:%M:%S))"
  case $one in
    demo) distill demo --out "$DEMO" --docs "$DOCS" ;;
    batch) python scripts/bench_batch.py --demo-dir "$DEMO" --backend eager ;;
    train-tiny) python scripts/bench_train.py tiny --target-steps 150 --steps 100 --prompts 16 ;;
    train-trl) python scripts/bench_train.py trl --target-steps 150 --steps 60 --prompts 16 ;;
    decode) python scripts/bench_decode.py --num-prompts 6 --repeats 2 --max-new-tokens 48 ;;
    memory) OMP_NUM_THREADS=1 distill memory --check recipes/model_configs/qwen2.5-{0.5b,1.5b,7b}-instruct.json --markdown "$DOCS" ;;
    rehearsal) distill rehearse --out rehearsal-output --markdown "$DOCS" ;;
    loss) python scripts/bench_loss.py --chunk-sizes 128 256 1024 --docs "$DOCS"
          python scripts/bench_loss.py --teacher topk --chunk-sizes 128 256 --docs "$DOCS" ;;
    train-gsm8k) OMP_NUM_THREADS=1 python scripts/bench_train.py gsm8k --rows 7473 --target-steps 1000 --steps 800 --prompts 16 --max-new-tokens 48 ;;
    decode-real) python scripts/bench_decode.py --target "$R/coder-1.5b" --draft "$R/coder-0.5b" --gsm8k ../shared/data/gsm8k/test.jsonl \
                   --dtype bfloat16 --num-draft-tokens 3 --num-prompts 6 --repeats 2 --max-new-tokens 64 --skip-compiled --section bench_decode-real ;;
    *) echo "unknown benchmark $one" >&2; exit 2 ;;
  esac
done
distill docs
