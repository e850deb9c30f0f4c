#!/usr/bin/env bash
# Builds, checks and times the CUDA decode attention in one run, writing everything under $OUT:
# the GPU unit tests (against the CPU backend), compute-sanitizer memcheck and racecheck on the
# same tests at small sizes, the C++ benchmark, and the PyTorch SDPA / Triton peers side by side.
#
#   OUT=out/cuda bench/cuda/run_attention_bench.sh               # builds build-cuda first
#   EKVA_CUDA_BIN=dir OUT=... bench/cuda/run_attention_bench.sh  # uses prebuilt binaries in dir
#                                                                 # (and the shared libraries there)
#   EKVA_NCU=1 ...                                                # adds an Nsight Compute profile
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/cuda-bench}
mkdir -p "$OUT"
if [[ -n "${EKVA_CUDA_BIN:-}" ]]; then
  tests="$EKVA_CUDA_BIN/test_backend_cuda"
  bench="$EKVA_CUDA_BIN/cuda_decode_attention_bench"
  export LD_LIBRARY_PATH="$EKVA_CUDA_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  cmake -S . -B build-cuda -G Ninja -DEKVA_CUDA=ON >"$OUT/build.log" 2>&1 &&
    ninja -C build-cuda test_backend_cuda cuda_decode_attention_bench >>"$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
  tests=build-cuda/tests/test_backend_cuda
  bench=build-cuda/bench/cuda/cuda_decode_attention_bench
fi
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$OUT/tests.log"

echo "== tests"
timeout 240 "$tests" >>"$OUT/tests.log" 2>&1 || status=1
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|Failure|error' "$OUT/tests.log" | head -40
echo "== compute-sanitizer (small sizes)"
for tool in memcheck racecheck; do
  EKVA_CUDA_TEST_SMALL=1 timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 3 \
    "$tests" --gtest_filter='DecodeAttentionTest.*:KvOpsTest.*:DeviceKvLayerTest.*' >"$OUT/$tool.log" 2>&1
  rc=$?
  echo "$tool: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUT/$tool.log" |
    tr '\n' ' ')" | tee -a "$OUT/sanitizer.log"
  [[ $rc -eq 0 ]] || { status=1; grep -m 20 -E 'Invalid|Race|hazard|rror' "$OUT/$tool.log"; }
  cat "$OUT/$tool.log" >>"$OUT/sanitizer.log" && rm "$OUT/$tool.log"
done
if [[ -n "${EKVA_NCU:-}" ]]; then  # one profile of the attention kernel (B=32, L=16k)
  echo "== ncu"
  timeout 240 ncu --clock-control none --kernel-name regex:decode_attention_kernel --launch-skip 8 \
    --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section SchedulerStats \
    "$bench" --only 32 16384 >"$OUT/ncu.txt" 2>&1
  grep -E "DRAM Throughput|Memory Throughput|Achieved Occupancy|Stall|Issued Warp|Eligible|Active Warps" \
    "$OUT/ncu.txt" | head -30
fi
echo "== benchmark"
timeout 300 "$bench" --out "$OUT/ekva.json" 2>&1 | tee "$OUT/bench.log" || status=1
echo "== peers"
PYTHONUNBUFFERED=1 timeout 400 python3 tools/decode_attention_peers.py --out "$OUT/peers.json" \
  --ekva "$OUT/ekva.json" --table "$OUT/table.md" 2>&1 | tee "$OUT/peers.log" | grep -v '^{' ||
  status=1
exit $status
