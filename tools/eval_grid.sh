#!/usr/bin/env bash
# Issue 21's published grid on the GPU engine: one `ekva eval` per (mode, task, budget), JOBS at a
# time, each with every policy of the comparison so that its paired tests (each policy against the
# best expert-blind one) are complete on its own.
#
#   tools/eval_grid.sh BIN OUT MODEL [MODES] [TASKS] [BUDGETS]
#
# BIN: a directory holding `ekva` and its libraries (a build's src/cli, or a device pack made by
# scripts/device-pack.sh, unpacked on first use). OUT: results go to OUT/MODE/TASK-BUDGET/.
# MODEL: models/ekva-moe-8m or models/ekva-qwen3moe-12m. Defaults: both modes; passkey,
# multikey-needle, kv-retrieval, ppl; budgets 0.06 0.12 0.25. Environment (defaults in brackets):
#   SEED [9001001, the test seed]  SAMPLES [100]  CONTEXT [2048]  DEVICE [cuda]  JOBS [12]
#   EVAL_JOBS [1]: each run's `ekva eval --jobs` (samples at once in one process, whose GPU
#   streams overlap, where separate processes take turns on the GPU)
#   POLICIES [ekva,adakv,snapkv,pyramidkv,rarity-tokens,ekva-random-groups; keydiff ranks keys on
#   the host, so the GPU engine refuses it]
#   PPL_SAMPLES [26: the windows of CONTEXT - 1 tokens data/eval/heldout.txt holds at 2048]
#   FILLER [data/eval/heldout.txt: needle facts hidden in prose]
#   RESERVE [none: the defaults]: the reserve's options for `ekva eval`; docs/RESULTS.md's first
#   published tables were made before the defaults moved, with "--reserve-threshold 3
#   --reserve-span 0"
#   TIME_LIMIT [none]: seconds for the whole grid; runs are cut at its end and none starts in its
#   last 30 s. A cut run leaves no results.json in its directory (its log says how far it got).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
[[ $# -ge 3 ]] || { sed -n '2,23p' "$0"; exit 2; }
BIN=$1
OUT=$2
MODEL=$3
MODES=${4:-"aware agnostic"}
TASKS=${5:-"passkey multikey-needle kv-retrieval ppl"}
BUDGETS=${6:-"0.06 0.12 0.25"}
SEED=${SEED:-9001001}
SAMPLES=${SAMPLES:-100}
CONTEXT=${CONTEXT:-2048}
DEVICE=${DEVICE:-cuda}
JOBS=${JOBS:-12}
EVAL_JOBS=${EVAL_JOBS:-1}
POLICIES=${POLICIES:-ekva,adakv,snapkv,pyramidkv,rarity-tokens,ekva-random-groups}
PPL_SAMPLES=${PPL_SAMPLES:-26}
FILLER=${FILLER:-data/eval/heldout.txt}
TIME_LIMIT=${TIME_LIMIT:-0}
read -ra reserve <<<"${RESERVE:-}"

if [[ ! -x "$BIN/ekva" && -f "$BIN/devpack.tar.xz" ]]; then
  [[ -d "$BIN/devpack" ]] || tar xJf "$BIN/devpack.tar.xz" -C "$BIN"
  BIN=$BIN/devpack
fi
[[ -x "$BIN/ekva" ]] || { echo "no ekva in $BIN" >&2; exit 1; }
export LD_LIBRARY_PATH="$BIN:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

run_one() {
  local mode=$1 task=$2 budget=$3
  local dir=$OUT/$mode/$task-$budget
  mkdir -p "$dir"
  local samples=$SAMPLES limit=()
  [[ $task == ppl ]] && samples=$PPL_SAMPLES
  [[ $TIME_LIMIT -gt 0 ]] && limit=(timeout $((TIME_LIMIT - SECONDS)))
  "${limit[@]}" "$BIN/ekva" eval --model "$MODEL" --policies "$POLICIES" --budgets "$budget" \
    --tasks "$task" --filler "$FILLER" --context "$CONTEXT" --samples "$samples" --seed "$SEED" \
    --mode "$mode" --device "$DEVICE" --jobs "$EVAL_JOBS" "${reserve[@]}" --out "$dir" \
    >"$dir/eval.log" 2>&1
  echo "$mode $task $budget: exit $? ($SECONDS s)"
}

for mode in $MODES; do
  for task in $TASKS; do
    for budget in $BUDGETS; do
      while [[ $(jobs -rp | wc -l) -ge $JOBS ]]; do wait -n; done
      if [[ $TIME_LIMIT -gt 0 && $((TIME_LIMIT - SECONDS)) -lt 30 ]]; then
        echo "$mode $task $budget: skipped (time limit)"
        continue
      fi
      run_one "$mode" "$task" "$budget" &
    done
  done
done
wait
