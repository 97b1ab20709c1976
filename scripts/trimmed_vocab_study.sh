#!/usr/bin/env bash
# The trimmed-vocabulary study behind docs/benchmarks.md's "Trimmed vocabulary" tables: the base and the
# distilled Coder-0.5B draft with their LM heads cut afterwards to K = 8k / 16k / 32k rows (counted on the
# target's own answers to the training prompts and GSM8K train's reference answers: training rows only), and a
# draft trained with the trimmed head, under Coder-1.5B on the held-out GSM8K prompts of the real-pair study
# (the first 30 of the seed-0 shuffle). The decoder widens each cut per call by the prompt's own tokens
# (prompt rows, distill.common.trim.PromptRows).
#
#   scripts/trimmed_vocab_study.sh sweep       # coverage, c and predicted speedup per K (distill bench; ~15 min)
#   scripts/trimmed_vocab_study.sh trim        # the six trimmed folders (a minute each)
#   scripts/trimmed_vocab_study.sh train       # a draft trained with draft.vocab.size=$TRAINED_K, counted as the cuts (~50 min: the generations are reused)
#   scripts/trimmed_vocab_study.sh bf16 fp32   # one `distill accept` run each (bf16: ~2.7 h on 2 idle cores, fp32: ~1.3 h in two runs; resumable)
#                                              # bf16 asks the k3 step's 30 prompts x 128 tokens: its three drafts' acceptance must repeat
#   scripts/trimmed_vocab_study.sh k3          # the goal's comparison alone, fitting one session: the distilled draft and its
#                                              # 8k and 16k cuts at k = 3, 30 prompts x 128 tokens (~55 min; 32k left out: its c
#                                              # sits with 16k's, so it could only win on acceptance)
#   BEST=8192 scripts/trimmed_vocab_study.sh k3-fp32    # float32 greedy identity of the chosen cut, 8 prompts (~20 min)
#
# Every step is resumable and leaves finished outputs alone. Run the timed steps (sweep, bf16, fp32, k3, k3-fp32) on an idle machine:
# a report whose machine-load record shows other processes above 0.1 cores is refused.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/idle.sh
R=${DISTILL_REAL_DIR:-$HOME/.cache/distill-real}
DISTILLED=${DISTILLED:-runs/qwen2.5-coder-0.5b-from-1.5b-cpu}
GENERATIONS=${GENERATIONS:-runs/qwen2.5-coder-1.5b-gsm8k-train-256/generations.jsonl}  # the target's answers to the 256 training prompts
COUNTED=("$GENERATIONS" ../shared/data/gsm8k/train.jsonl)  # what each cut is counted on: those and GSM8K train's answers
TRAINED_K=${TRAINED_K:-8192}  # the cut that met issue 28's goals in the k3 step
TRAINED=runs/qwen2.5-coder-0.5b-from-1.5b-vocab${TRAINED_K}-cpu
SIZES=(8192 16384 32768)
TEST=../shared/data/gsm8k/test.jsonl

drafts=(--draft "base=$R/coder-0.5b" --draft "distilled=$DISTILLED")
# float32 cannot hold the target and all nine drafts in 24 GiB (the OOM killer stopped it at 24.3 GB), so fp32 runs them in two groups
base_drafts=(--draft "base=$R/coder-0.5b")
distilled_drafts=(--draft "distilled=$DISTILLED")
swept=distilled  # the k sweep covers the distilled drafts only; the base ones are measured at k = 3
pairs=""         # each trimmed draft's paired difference over its untrimmed source (each is compared with base anyway)
trimmed() { echo "$1-$(($2 / 1024))k=runs/trim/$1-$2"; }  # the --draft value of draft $1 cut to $2 rows
for K in "${SIZES[@]}"; do
  drafts+=(--draft "$(trimmed base "$K")" --draft "$(trimmed distilled "$K")")
  base_drafts+=(--draft "$(trimmed base "$K")")
  distilled_drafts+=(--draft "$(trimmed distilled "$K")")
  swept+=,distilled-$((K / 1024))k
  pairs+=distilled-$((K / 1024))k:distilled,
done
drafts+=(--draft "trained-$((TRAINED_K / 1024))k=$TRAINED")
distilled_drafts+=(--draft "trained-$((TRAINED_K / 1024))k=$TRAINED")
swept+=,trained-$((TRAINED_K / 1024))k
pairs+=trained-$((TRAINED_K / 1024))k:distilled

k3_drafts=(--draft "distilled=$DISTILLED" --draft "$(trimmed distilled 8192)" --draft "$(trimmed distilled 16384)")
BEST=${BEST:-8192}
best_draft=(--draft "$(trimmed distilled "$BEST")")

accept() {  # name, the name of the array of --draft options, then distill accept options
  local name=$1; local -n chosen=$2; shift 2
  python eval/acceptance.py --target "$R/coder-1.5b" "${chosen[@]}" --tasks gsm8k --data-file "gsm8k=$TEST" --seed 0 \
    --num-draft-tokens 3 "$@" --output-dir "eval-output/trimmed-$name"
  idle_or_fail "eval-output/trimmed-$name/report.json"
  cp "eval-output/trimmed-$name/report.json" "docs/results/trimmed_vocab_$name.json"
}

for one in ${@:-sweep trim train bf16 fp32}; do
  case $one in
    sweep) distill bench --target "$R/coder-1.5b" --draft "$DISTILLED" --dtype bfloat16 --ks 1..6 --num-prompts 8 \
             --vocab-sizes 8192,16384,32768,65536 --vocab-from "${COUNTED[@]}" --coverage-from "$TEST" \
             --markdown docs/benchmarks.md --section trimmed_vocab_sweep ;;
    trim) for K in "${SIZES[@]}"; do
            for pair in "base=$R/coder-0.5b" "distilled=$DISTILLED"; do
              out=runs/trim/${pair%%=*}-$K
              [ -e "$out/config.json" ] || distill trim-vocab "${pair#*=}" "$out" --size "$K" --from "${COUNTED[@]}"
            done
          done ;;
    train) distill train recipes/qwen2.5-coder-0.5b-from-1.5b-cpu.yaml --set target.name_or_path="$R/coder-1.5b" \
             --set draft.name_or_path="$R/coder-0.5b" --set data.dataset=../shared/data/gsm8k/train.jsonl \
             --set draft.vocab.size="$TRAINED_K" --set "draft.vocab.count_from=[$(IFS=,; echo "${COUNTED[*]}")]" \
             --set output_dir="$TRAINED" $( [ -d "$TRAINED" ] && echo --resume ) ;;
    bf16) accept bf16 drafts --num-samples 30 --max-new-tokens 128 --ks 1,2,3,4,5,6 --sweep-samples 8 --sweep-drafts "$swept" --compare "$pairs" --dtype bfloat16 ;;
    fp32) for group in base distilled; do
            accept "fp32_$group" "${group}_drafts" --num-samples 8 --max-new-tokens 128 --dtype float32 --cost-repeats 5
          done ;;
    k3) accept k3_rows k3_drafts --num-samples 30 --max-new-tokens 128 --dtype bfloat16 ;;
    k3-fp32) accept k3_rows_fp32 best_draft --num-samples 8 --max-new-tokens 128 --dtype float32 --cost-repeats 5 ;;
    *) echo "unknown step $one: choose sweep, trim, train, bf16, fp32, k3 or k3-fp32" >&2; exit 2 ;;
  esac
done
distill docs
