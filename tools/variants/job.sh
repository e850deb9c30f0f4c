#!/bin/bash
# Tests and times, on the GPU machine, what tools/variants/build.sh built (build-next/ carried):
#   tools/variants/job.sh check          # ldgsts miscompile check; the CUDA suite on every variant
#   tools/variants/job.sh sanitize       # racecheck and memcheck on $FILTER (default: the suite)
#   tools/variants/job.sh time MODEL     # 4k-token prompts, then batch-1 steps at context 4k,
#                                        # the variants alternating twice (DECODE=0: prompts only;
#                                        # PROMPTS=0: steps only)
#   tools/variants/job.sh record MODEL   # each variant's figures of record: batch 1, 16 and 64 at
#                                        # context 4k, budgets 1 and 0.2, a 4k-token prompt
#   tools/variants/job.sh peers MODEL    # the peers of the record's decode rows: transformers
#                                        # eager (bench/peers/hf_decode.py) at batch 1 and 16;
#                                        # for mixtral-8x7b also the CUDA-graphed PyTorch step
#                                        # (tools/roofline_measure.py decode_step) at 1, 16, 64
#   tools/variants/job.sh trace MODEL    # a variant's kernel timelines of a prompt and of decode
#                                        # steps (VARIANT, default base; PROMPT=0: steps only)
#   tools/variants/job.sh kernels MODEL  # each variant's prompt per kernel (Nsight Compute's
#                                        # durations, tools/ncu_summary.py)
#   tools/variants/job.sh durations MODEL  # each variant's prompt kernels matching REGEX (default:
#                                        # the grouped products, the sort's two kernels, pairs' sum,
#                                        # prefill attention and KV append: PER_LAYER 7 launches a
#                                        # layer of Qwen3's prompt; prefill attention always
#                                        # added, as the layers' count) in LAYERS
#                                        # layers (default 20) after the first 10 (fewer of a
#                                        # model of fewer layers): Nsight Compute's
#                                        # durations, about 10 s a variant (tools/variants/
#                                        # durations.py OUT makes the table)
#   tools/variants/job.sh ncu MODEL REGEX  # Nsight Compute's full set on a variant's (VARIANT,
#                                        # default base) prompt kernels matching REGEX (the 41st
#                                        # launch: a layer mid-model)
#                                        # (ncu, ncu-step and ncu-attention also write the
#                                        # report's raw page, source counters and
#                                        # tools/variants/ncu_hotspots.py's NAME-hotspots.txt)
#   tools/variants/job.sh ncu-step MODEL REGEX  # Nsight Compute's full set on base's decode-step
#                                        # kernels whose demangled names match REGEX (e.g.
#                                        # 'GemvOutput\)1,': the gate/up GEMV; template
#                                        # arguments print as '<\(bool\)1>', not '<true>') at
#                                        # batch 1, context 4k:
#                                        # the 41st match, a layer of a step after the warm-up
#   tools/variants/job.sh attention B L  # decode attention alone at batch B, context L
#                                        # (cuda_decode_attention_bench --only B L), the variants
#                                        # alternating twice
#   tools/variants/job.sh ncu-attention B L  # Nsight Compute's full set with source counters on
#                                        # base's decode attention at batch B, context L (the 11th
#                                        # launch of cuda_decode_attention_bench --only B L)
# MODEL: a directory of tests/fixtures/configs (qwen3-30b-a3b, olmoe-1b-7b, mixtral-8x7b), or one
# followed by @N: that model's first N layers (mixtral-8x7b@16 fits an H100). ROUNDS (default 2):
# the decode rounds of time; PROMPT_ROUNDS (default 2) its prompt rounds. VARIANTS
# (default: base and every variant built) picks and orders them. Results go to $OUT;
# tools/variants/summarize.py turns them into tables.
set -u
B=build-next
R=$B/device-all/run.sh
P=$B/device-all/devpack
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
$R true
built="base $(cd $B && ls -d */ | tr -d / | grep -v '^device-all$' | tr '\n' ' ')"
variants=${VARIANTS:-$built}
bin() {  # VARIANT NAME: the variant's binary, unpacked on first use
  if [ "$1" = base ]; then echo "$P/$2"; return; fi
  [ -x "$B/$1/$2" ] || { xz -dc "$B/$1/$2.xz" > "$B/$1/$2" && chmod +x "$B/$1/$2"; }
  echo "$B/$1/$2"
}
config() {  # MODEL: its config.json; MODEL@N, the same model cut to its first N layers (written
            # under /tmp: Mixtral-8x7B's 32 layers do not fit an H100, 16 do)
  local m=${1%@*} n=${1#*@}
  [ -f "tests/fixtures/configs/$m/config.json" ] || { echo "job.sh: no config tests/fixtures/configs/$m" >&2; return 2; }
  if [ "$m" = "$1" ]; then echo "tests/fixtures/configs/$m/config.json"; return; fi
  mkdir -p "/tmp/configs/$1"
  python3 - "tests/fixtures/configs/$m/config.json" "$n" "/tmp/configs/$1/config.json" <<'PY' || return 2
import json, sys
c = json.load(open(sys.argv[1]))
layers = c["num_hidden_layers"]
if not sys.argv[2].isdigit() or not 1 <= int(sys.argv[2]) <= layers:
    sys.exit(f"job.sh: {sys.argv[1]} has {layers} layers; @{sys.argv[2]} is not 1..{layers}")
c["num_hidden_layers"] = int(sys.argv[2])
json.dump(c, open(sys.argv[3], "w"))
PY
  echo "/tmp/configs/$1/config.json"
}
model_args() {  # MODEL: the bench arguments of a full-size model with random weights
  echo "--model $(config "$1") --random-weights 1 --batch ${BATCH:-1} --budgets 1 --json"
}
prompt_tokens() { if [ "${1%@*}" = olmoe-1b-7b ]; then echo 4000; else echo 4096; fi; }
export_ncu() {  # NAME: $OUT/NAME.ncu-rep's details, raw page, source counters and their hot spots
  $R ncu --import "$OUT/$1.ncu-rep" --page details > "$OUT/$1.txt" 2>&1
  $R ncu --import "$OUT/$1.ncu-rep" --page raw > "$OUT/$1-raw.txt" 2>&1
  $R ncu --import "$OUT/$1.ncu-rep" --page source --print-source sass --csv 2>&1 |
    gzip > "$OUT/$1-source.csv.gz"
  python3 tools/variants/ncu_hotspots.py "$OUT/$1-source.csv.gz" "$OUT/$1-raw.txt" \
    > "$OUT/$1-hotspots.txt" 2>&1
}

# A MODEL argument is checked once here: inside $(...) below a bad one could not stop the job.
case "${1:-}" in
time | record | peers | trace | kernels | durations | ncu | ncu-step)
  config "${2:?$1 needs a model directory of tests/fixtures/configs}" > /dev/null || exit 2
  ;;
esac

case "${1:-}" in
check)
  for v in $variants; do
    echo "$v: $(python3 tools/check_ldgsts_registers.py "$(bin $v ekva)" "$(bin $v test_backend_cuda)" 2>&1 | tr '\n' ' ')"
    $R "$(bin $v test_backend_cuda)" --gtest_filter="${FILTER:-*}" > "$OUT/suite-$v.txt" 2>&1
    echo "$v: $(tail -1 "$OUT/suite-$v.txt")"
  done | tee "$OUT/check.txt"
  ;;
sanitize)
  v=${VARIANT:-base}
  for tool in racecheck memcheck; do
    $R compute-sanitizer --tool $tool --error-exitcode 1 "$(bin $v test_backend_cuda)" \
      --gtest_filter="${FILTER:-*}" > "$OUT/$tool-$v.txt" 2>&1
    echo "$tool $v: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool-$v.txt" | tr '\n' ' ')"
  done
  ;;
time)
  m=${2:?time needs a model directory of tests/fixtures/configs}
  n=$(prompt_tokens "$m")
  for round in $([ "${PROMPTS:-1}" = 0 ] || seq "${PROMPT_ROUNDS:-2}"); do
    for v in $variants; do
      $R "$(bin $v ekva)" bench $(model_args "$m") --context 16 --steps 3 --warmup 1 --prompt $n \
        > "$OUT/prompt-$m-$v-$round.json" 2> "$OUT/prompt-$m-$v-$round.err"
      echo "prompt $m $v $round: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["prefill"]["ms"])' "$OUT/prompt-$m-$v-$round.json" 2>&1)"
    done
  done
  [ "${DECODE:-1}" = 0 ] && exit 0
  for round in $(seq "${ROUNDS:-2}"); do
    for v in $variants; do
      $R "$(bin $v ekva)" bench $(model_args "$m") --context $n --steps 10 --warmup 2 \
        > "$OUT/decode-$m-$v-$round.json" 2> "$OUT/decode-$m-$v-$round.err"
      echo "decode $m $v $round: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["decode"][0]["step_ms"])' "$OUT/decode-$m-$v-$round.json" 2>&1)"
    done
  done
  ;;
record)
  m=${2:?record needs a model directory of tests/fixtures/configs}
  n=$(prompt_tokens "$m")
  for v in $variants; do
    $R "$(bin $v ekva)" bench --model "$(config "$m")" --random-weights 1 --batch 1,16,64 \
      --context $n --budgets 1,0.2 --steps 10 --warmup 2 --prompt $n --json \
      > "$OUT/record-$m-$v.json" 2> "$OUT/record-$m-$v.err"
    echo "record $m $v: exit $? $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(" ".join("%sx%s:%.3f" % (d["batch"], d["budget"], d["step_ms"]) for d in r["decode"]), "prompt", r["prefill"]["ms"])' "$OUT/record-$m-$v.json" 2>&1)"
  done
  ;;
peers)
  m=$2
  n=$(prompt_tokens "$m")
  python3 bench/peers/hf_decode.py --config "$(config "$m")" --batch 1,16 --context $n --steps 5 \
    --warmup 1 --out "$OUT/hf-$m.json" > "$OUT/hf-$m.log" 2>&1
  echo "peers $m transformers: exit $? $(tail -c 300 "$OUT/hf-$m.json" 2>&1)"
  if [ "${m%@*}" = mixtral-8x7b ]; then  # MODEL@N: the graphed step of the first N layers too
    python3 -c "import sys, json; sys.path.insert(0, 'tools'); import roofline_measure as r; \
layers = json.load(open(sys.argv[2]))['num_hidden_layers']; \
json.dump(r.decode_step((1, 16, 64), $n, layers), open(sys.argv[1], 'w'))" "$OUT/graphed-$m.json" \
      "$(config "$m")" > "$OUT/graphed-$m.log" 2>&1
    echo "peers $m graphed step: exit $? $(cat "$OUT/graphed-$m.json" 2>&1 | head -c 400)"
  fi
  ;;
trace)
  m=${2:?trace needs a model directory of tests/fixtures/configs}
  n=$(prompt_tokens "$m")
  layers=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["num_hidden_layers"])' \
    "$(config "$m")")
  cuda_lib=$(dirname "$(readlink -f "$(command -v nvcc)")")/../lib64
  v=${VARIANT:-base}
  trace() {  # NAME BENCH-ARGS...: a traced bench run and its per-layer summary
    local name=$1-$v
    shift
    CUDA_INJECTION64_PATH=$P/libekva_kernel_trace.so EKVA_KERNEL_TRACE=/tmp/trace-$name.csv \
      LD_LIBRARY_PATH=$cuda_lib:${LD_LIBRARY_PATH:-} $R "$(bin $v ekva)" bench $(model_args "$m") "$@" \
      > "$OUT/trace-$name.json" 2> "$OUT/trace-$name.err"
    python3 tools/kernel_trace_summary.py /tmp/trace-$name.csv --layers "$layers" \
      > "$OUT/trace-$name.txt" 2>&1
    gzip -c /tmp/trace-$name.csv > "$OUT/trace-$name.csv.gz"
  }
  [ "${PROMPT:-1}" = 0 ] || trace "$m-prompt" --context 16 --steps 3 --warmup 1 --prompt $n
  trace "$m-decode" --context $n --steps 10 --warmup 2
  ;;
kernels)
  m=${2:?kernels needs a model directory of tests/fixtures/configs}
  layers=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["num_hidden_layers"])' \
    "$(config "$m")")
  for v in $variants; do
    $R ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
      "$(bin $v ekva)" bench $(model_args "$m") --context 16 --steps 1 --warmup 0 \
      --prompt "$(prompt_tokens "$m")" > /tmp/kernels-$m-$v.csv 2> "$OUT/kernels-$m-$v.err"
    python3 tools/ncu_summary.py /tmp/kernels-$m-$v.csv --layers "$layers" --skip fill_random \
      > "$OUT/kernels-$m-$v.txt" 2>&1
    head -12 "$OUT/kernels-$m-$v.txt"
  done
  ;;
durations)
  m=${2:?durations needs a model directory of tests/fixtures/configs}
  k=${REGEX:-grouped_gemm|sort_|combine_kernel|prefill_attention|append_kv}
  per_layer=${PER_LAYER:-7}  # the default REGEX's launches in a layer
  # durations.py counts layers by prefill attention's launches (one a layer): a REGEX without it
  # gets it added, and its PER_LAYER one more.
  case $k in *prefill_attention*) ;; *) k="$k|prefill_attention"; per_layer=$((per_layer + 1)) ;; esac
  # LAYERS layers after the first 10, or as many as the model has after its first quarter (of
  # OLMoE's 16 layers, 6 were left after 10).
  total=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["num_hidden_layers"])' \
    "$(config "$m")")
  skip=$((total / 4 < 10 ? total / 4 : 10))
  layers=$((total - skip < ${LAYERS:-20} ? total - skip : ${LAYERS:-20}))
  for v in $variants; do
    $R ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
      --kernel-name "regex:$k" --launch-skip $((skip * per_layer)) \
      --launch-count $((layers * per_layer)) "$(bin $v ekva)" bench $(model_args "$m") \
      --context 16 --steps 1 --warmup 0 --prompt "$(prompt_tokens "$m")" \
      > "$OUT/durations-$m-$v.csv" 2> "$OUT/durations-$m-$v.err"
    echo "durations $m $v ($layers layers after $skip): exit $?"
  done
  ;;
ncu)
  m=${2:?ncu needs a model directory of tests/fixtures/configs}
  k=${3:?ncu needs a kernel name regex}
  v=${VARIANT:-base}
  # NCU_COUNT launches from the 41st that matches (2: a layer's two grouped products).
  $R ncu --set full --clock-control none --kernel-name "regex:$k" --launch-skip 40 \
    --launch-count "${NCU_COUNT:-1}" -o "$OUT/ncu-$v-$m-$k" "$(bin "$v" ekva)" bench $(model_args "$m") --context 16 --steps 1 \
    --warmup 0 --prompt "$(prompt_tokens "$m")" > "$OUT/ncu-$v-$m-$k.log" 2>&1
  export_ncu "ncu-$v-$m-$k"
  ;;
ncu-step)
  m=${2:?ncu-step needs a model directory of tests/fixtures/configs}
  k=${3:?ncu-step needs a kernel name regex}
  name=ncu-step-$m-$(echo "$k" | tr -c 'A-Za-z0-9_\n' '_')
  $R ncu --set full --clock-control none --kernel-name-base demangled --kernel-name "regex:$k" \
    --launch-skip 40 --launch-count 1 -o "$OUT/$name" "$P/ekva" bench $(model_args "$m") \
    --context "$(prompt_tokens "$m")" --steps 3 --warmup 1 > "$OUT/$name.log" 2>&1
  export_ncu "$name"
  echo "$name: $(grep -m1 -E 'Duration' "$OUT/$name.txt")"
  ;;
attention)
  b=${2:?attention needs a batch}
  l=${3:?attention needs a context}
  for round in 1 2; do
    for v in $variants; do
      $R "$(bin $v cuda_decode_attention_bench)" --only "$b" "$l" \
        > "$OUT/attention-b$b-l$l-$v-$round.txt" 2>&1
      echo "attention $v $round: $(grep -m1 -E '^B=' "$OUT/attention-b$b-l$l-$v-$round.txt")"
    done
  done
  ;;
ncu-attention)
  b=${2:?ncu-attention needs a batch}
  l=${3:?ncu-attention needs a context}
  name=ncu-attention-b$b-l$l
  $R ncu --set full --import-source yes --clock-control none --kernel-name regex:decode_attention \
    --launch-skip 10 --launch-count 1 -o "$OUT/$name" "$P/cuda_decode_attention_bench" --only "$b" "$l" \
    > "$OUT/$name.log" 2>&1
  export_ncu "$name"
  echo "$name: $(grep -m1 -E 'Duration' "$OUT/$name.txt")"
  ;;
*)
  echo "usage: $0 check|sanitize|time MODEL|record MODEL|trace MODEL|kernels MODEL|durations MODEL|ncu MODEL REGEX|ncu-step MODEL REGEX|attention B L|ncu-attention B L" >&2
  exit 2
  ;;
esac
