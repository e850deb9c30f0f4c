#!/usr/bin/env bash
# Issue 23's serving measurement: for full KV and each KV budget, `ekva serve` with seeded random
# Mixtral-8x7B weights on the GPU and a fixed --kv-memory, and `ekva loadgen` sending enough
# prompts of random token ids to fill the sequences that memory holds; the server's peak
# concurrency and decode throughput beside the Roofline model's prediction for each budget.
#
#   bench/serve/run_h200.sh BIN OUT [PROMPT_TOKENS] [KV_MEMORY_BYTES]
#
# BIN: a directory holding `ekva` and the shared libraries it needs (a build's src/cli, or the
# device pack build/device-all made by scripts/device-pack.sh, unpacked here on first use). OUT:
# where everything goes. PROMPT_TOKENS (32704: with MAX_TOKENS, Mixtral's 32768-token context) and
# KV_MEMORY_BYTES (20 GiB) make a shorter smoke run possible. Environment (defaults in brackets):
#   MAX_TOKENS [64]  BUDGETS ["1 0.2 0.5 0.1"]  POLICY [streaming]  PREFILL_CHUNK [4096]
#   MODEL [tests/fixtures/configs/mixtral-8x7b/config.json]  SEED [1] (empty: MODEL's checkpoint)
#   DEVICE [cuda]  KV_DTYPE [bf16]  HW [h200]  PORT [8321]  MAX_SEQUENCES (cap; default: enough)
#   TIME_LIMIT [540] seconds for the whole run: a budget that cannot start with 60 s left is skipped
#
# The server runs with --prefill-first: every prompt the memory admits is prefilled before the
# batch decodes, so the decode batch reaches what the memory holds (the count the prediction
# makes). Each budget gets a fresh server (its peaks count from its start), stopped with SIGINT.
# POLICY defaults to streaming, whose decode steps do no host work per retained token (no scores
# to add, selection by position): other policies select and score on the host today, seconds per
# step at 32k (docs/BENCHMARKS.md, "Serving on the H200"), which would measure the host.
# Full KV and 20% run first, the comparison the issue's goal names, then 50% and 10% (the longest:
# most prompts to prefill). Writes per budget loadgen-BUDGET.json and serve-BUDGET.log, then
# prediction.json, summary.md (the table), summary.json and serve.svg, refreshed after each budget.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
[[ $# -ge 2 ]] || { sed -n '2,29p' "$0"; exit 2; }
BIN=$1
OUT=$2
PROMPT=${3:-32704}
KV_MEMORY=${4:-21474836480}
MAX_TOKENS=${MAX_TOKENS:-64}
BUDGETS=${BUDGETS:-"1 0.2 0.5 0.1"}
POLICY=${POLICY:-streaming}
PREFILL_CHUNK=${PREFILL_CHUNK:-4096}
MODEL=${MODEL:-tests/fixtures/configs/mixtral-8x7b/config.json}
SEED=${SEED-1}
DEVICE=${DEVICE:-cuda}
KV_DTYPE=${KV_DTYPE:-bf16}
HW=${HW:-h200}
PORT=${PORT:-8321}
TIME_LIMIT=${TIME_LIMIT:-540}
start=$SECONDS
mkdir -p "$OUT"

if [[ ! -x "$BIN/ekva" && -f "$BIN/devpack.tar.xz" ]]; then
  [[ -d "$BIN/devpack" ]] || tar xJf "$BIN/devpack.tar.xz" -C "$BIN"
  BIN=$BIN/devpack
fi
[[ -x "$BIN/ekva" ]] || { echo "no ekva in $BIN" >&2; exit 1; }
export LD_LIBRARY_PATH="$BIN:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
EKVA=$BIN/ekva
command -v nvidia-smi >/dev/null &&
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv >"$OUT/gpu.txt"

# The prediction for every budget: sequences and decode tokens/s (also sizes the runs).
budget_list=$(echo "$BUDGETS" | tr ' ' ',')
"$EKVA" roofline serve --model "$MODEL" --hw "$HW" --kv-dtype "$KV_DTYPE" \
  --kv-memory "$KV_MEMORY" --prompt-tokens "$PROMPT" --max-tokens "$MAX_TOKENS" \
  --budgets "$budget_list" ${MAX_SEQUENCES:+--max-sequences "$MAX_SEQUENCES"} --json \
  >"$OUT/prediction.json" || { echo "ekva roofline serve failed" >&2; exit 1; }
predicted() {  # BUDGET: the predicted sequences
  python3 -c 'import json,sys
p = [x for x in json.load(open(sys.argv[1]))["points"] if abs(x["budget"] - float(sys.argv[2])) < 1e-9]
print(p[0]["sequences"] if p else 0)' "$OUT/prediction.json" "$1"
}
# Requests per budget: the predicted sequences and a sixteenth more (at least 2), so that the
# memory, not the workload, bounds the batch (the extra ones wait for the first wave to finish).
requests_for() { local n; n=$(predicted "$1"); echo $((n + (n / 16 > 2 ? n / 16 : 2))); }
max_sequences=0
for b in $BUDGETS; do
  r=$(requests_for "$b")
  ((r > max_sequences)) && max_sequences=$r
done
MAX_SEQUENCES=${MAX_SEQUENCES:-$max_sequences}

summarize() {
  python3 bench/serve/summarize.py --prediction "$OUT/prediction.json" --out "$OUT" \
    "$OUT"/loadgen-*.json >"$OUT/summarize.log" 2>&1 && cat "$OUT/summary.md"
}

status=0
for b in $BUDGETS; do
  left=$((TIME_LIMIT - (SECONDS - start)))
  if ((left < 60)); then
    echo "== budget $b skipped: ${left} s left of TIME_LIMIT=$TIME_LIMIT" | tee -a "$OUT/skipped.txt"
    continue
  fi
  if [[ $b == 1 || $b == 1.0 ]]; then
    policy=(--policy full)
    per_request=(--kv-policy full)
  else
    policy=(--policy "$POLICY" --budget "$b")
    per_request=(--kv-policy "$POLICY" --kv-budget "$b")
  fi
  requests=$(requests_for "$b")
  ((requests > MAX_SEQUENCES)) && requests=$MAX_SEQUENCES
  log=$OUT/serve-$b.log
  echo "== budget $b: ${policy[*]}, $requests requests of $PROMPT tokens, $MAX_TOKENS generated each"
  "$EKVA" serve --model "$MODEL" ${SEED:+--random-weights "$SEED"} --device "$DEVICE" \
    --kv-dtype "$KV_DTYPE" --port "$PORT" --kv-memory "$KV_MEMORY" \
    --max-sequences "$MAX_SEQUENCES" --prefill-chunk "$PREFILL_CHUNK" --prefill-first \
    "${policy[@]}" 2>"$log" &
  pid=$!
  until grep -q 'on http' "$log" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "the server did not start:" >&2
      tail -5 "$log" >&2
      exit 1
    fi
    sleep 0.5
  done
  head -2 "$log"
  # The loadgen may use what is left but 30 s, for the server to stop and the summary.
  left=$((TIME_LIMIT - (SECONDS - start) - 30))
  timeout "$left" "$EKVA" loadgen --url "http://127.0.0.1:$PORT" --requests "$requests" \
    --concurrency "$requests" --prompt-tokens "$PROMPT" --max-tokens "$MAX_TOKENS" --seed 7 \
    "${per_request[@]}" --timeout "$left" --json >"$OUT/loadgen-$b.json.part"
  rc=$?
  if [[ $rc -eq 0 ]]; then
    mv "$OUT/loadgen-$b.json.part" "$OUT/loadgen-$b.json"
  else
    echo "loadgen for budget $b: exit $rc" | tee -a "$OUT/failed.txt"
    status=1
  fi
  kill -INT "$pid"
  for _ in $(seq 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$pid" 2>/dev/null && { echo "the server did not stop; killed" >&2; kill -KILL "$pid"; status=1; }
  wait "$pid" || { echo "ekva serve for budget $b: exit $?" | tee -a "$OUT/failed.txt"; status=1; }
  tail -1 "$log"
  summarize || status=1
  echo "   $((SECONDS - start)) s so far"
done
exit $status
