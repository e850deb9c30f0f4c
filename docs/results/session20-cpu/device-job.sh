#!/bin/bash
# The device calls that test and time the candidate kernels of sessions 18-20 (README.md
# beside this file), run from the repository root on the GPU machine with build-next/ carried:
#   docs/results/session20-cpu/device-job.sh check     # miscompile check, SASS counts, CUDA suite
#   docs/results/session20-cpu/device-job.sh sanitize  # racecheck and memcheck on the new kernels
#   docs/results/session20-cpu/device-job.sh time MODEL  # prompts, then batch-1 steps, alternating
#                                          (MODEL: qwen3-30b-a3b, olmoe-1b-7b or mixtral-8x7b)
# build-next/ is made here by docs/results/session20-cpu/build-next.sh. Results go to $OUT.
set -u
B=build-next
R=$B/device-all/run.sh
P=$B/device-all/devpack
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
$R true
variants=${VARIANTS:-"base attn scan append wgmma scores pv pvswap all"}
bin() {  # VARIANT NAME: the variant's binary, unpacked on first use
  if [ "$1" = base ]; then echo "$P/$2"; return; fi
  [ -x "$B/$1/$2" ] || { xz -dc "$B/$1/$2.xz" > "$B/$1/$2" && chmod +x "$B/$1/$2"; }
  echo "$B/$1/$2"
}
configs=tests/fixtures/configs

case "${1:-}" in
check)
  # The operand layouts alone first: which N-major stride assignment is the hardware's.
  build-next/wgmma_layouts | tee "$OUT/wgmma-layouts.txt"
  for v in $variants; do
    echo "== $v: $(python3 tools/check_ldgsts_registers.py "$(bin $v ekva)" "$(bin $v test_backend_cuda)" 2>&1 | tr '\n' ' ')"
  done | tee "$OUT/ldgsts.txt"
  # The prefill attention's SASS, base and candidates: instructions of each opcode.
  for v in base attn scores pv; do
    cuobjdump -sass "$(bin $v ekva)" > /tmp/sass-$v.txt 2>&1
    python3 - /tmp/sass-$v.txt <<'PY' > "$OUT/sass-prefill-$v-opcodes.txt"
import collections, re, sys
kernels, name = {}, None
for line in open(sys.argv[1]):
    if "Function :" in line:
        name = line.split("Function :")[1].strip()
        name = name if "prefill_attention_kernel" in name else None
        if name:
            kernels[name] = collections.Counter()
    m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
    if name and m:
        kernels[name][m.group(2).split(".")[0]] += 1
for name, ops in kernels.items():
    print(name, sum(ops.values()), "instructions")
    print("  " + " ".join(f"{op}:{n}" for op, n in ops.most_common()))
PY
    echo "sass $v: $(grep -c instructions "$OUT/sass-prefill-$v-opcodes.txt") kernels"
  done
  # Each diff touches its own kernels: the whole suite on all of them together.
  $R "$(bin all test_backend_cuda)" > "$OUT/suite-all.txt" 2>&1
  tail -3 "$OUT/suite-all.txt"
  # Each candidate's kernel tests on its own binary (the engine's parity tests are in the suite).
  declare -A own=([attn]='PrefillAttentionTest.*' [scan]='PrefillAttentionTest.*'
    [append]='KvOpsTest.*' [wgmma]='GroupedGemmTest.*'
    [scores]='PrefillAttentionTest.*:GroupedGemmTest.*' [pv]='PrefillAttentionTest.*'
    [pvswap]='PrefillAttentionTest.*')
  for v in attn scan append wgmma scores pv pvswap; do
    $R "$(bin $v test_backend_cuda)" --gtest_filter="${own[$v]}" > "$OUT/suite-$v.txt" 2>&1
    echo "$v: $(tail -1 "$OUT/suite-$v.txt")"
  done
  ;;
sanitize)
  for tool in racecheck memcheck; do
    $R compute-sanitizer --tool $tool --error-exitcode 1 "$(bin all test_backend_cuda)" \
      --gtest_filter='PrefillAttentionTest.*:GroupedGemmTest.WideGroupsOfPromptSizedSteps:KvOpsTest.AppendAppliesRopeLikeCpu' \
      > "$OUT/$tool-all.txt" 2>&1
    echo "$tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool-all.txt" | tr '\n' ' ')"
  done
  ;;
time)
  # A 4096-token prompt (OLMoE 4000), the variants alternating twice (VARIANTS: those that passed
  # the check), then batch-1 steps.
  m=${2:?time needs a model: qwen3-30b-a3b, olmoe-1b-7b or mixtral-8x7b}
  n=4096; [ "$m" = olmoe-1b-7b ] && n=4000
  for round in 1 2; do
    for v in $variants; do
      $R "$(bin $v ekva)" bench --model $configs/$m/config.json --random-weights 1 --batch 1 \
        --context 16 --budgets 1 --steps 3 --warmup 1 --prompt $n --json \
        > "$OUT/prompt-$m-$v-$round.json" 2> "$OUT/prompt-$m-$v-$round.err"
      echo "prompt $m $v $round: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["prefill"]["ms"])' "$OUT/prompt-$m-$v-$round.json" 2>&1)"
    done
  done | tee "$OUT/prompts-$m.txt"
  for v in base append all; do
    $R "$(bin $v ekva)" bench --model $configs/$m/config.json --random-weights 1 --batch 1 \
      --context $n --budgets 1 --steps 10 --warmup 2 --json > "$OUT/decode-$m-$v.json" \
      2> "$OUT/decode-$m-$v.err"
  done
  ;;
*)
  echo "usage: $0 check|sanitize|time MODEL" >&2
  exit 2
  ;;
esac
