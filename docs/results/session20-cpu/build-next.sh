#!/bin/bash
# Builds, on this machine, what device-job.sh runs: build-next/device-all (the pack of the checked-out
# commit, scripts/device-pack.sh) and, for each candidate, its ekva and test_backend_cuda (stripped,
# xz) in build-next/VARIANT/: attn (prefill-attention-one-barrier.diff), append (session 18's
# append-kv-warp-per-token.diff), wgmma (session 19's wgmma-grouped-gemm.diff), scores (wgmma, attn
# and prefill-attention-wgmma-scores.diff, which builds on both), pv (scores and
# prefill-attention-wgmma-pv.diff), pvswap (pv with the N-major descriptor's two strides swapped),
# scan (attn and prefill-attention-scan-without-divisions.diff) and all (pv, the scan and append);
# and build-next/wgmma_layouts (wgmma_layouts.cu against pv's helpers).
# Needs a clean src/ (the diffs are applied to it and taken back off); builds in build-var/.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
git diff --quiet -- src || { echo "src/ has changes: commit or stash them first" >&2; exit 1; }
export PATH=/usr/local/cuda/bin:$PATH
results=docs/results
declare -A diffs=([attn]=$results/session20-cpu/prefill-attention-one-barrier.diff
  [append]=$results/session18-h200/append-kv-warp-per-token.diff
  [wgmma]=$results/session19-cpu/wgmma-grouped-gemm.diff)
diffs[scores]="${diffs[wgmma]} ${diffs[attn]} $results/session20-cpu/prefill-attention-wgmma-scores.diff"
diffs[pv]="${diffs[scores]} $results/session20-cpu/prefill-attention-wgmma-pv.diff"
diffs[pvswap]="${diffs[pv]} $results/session20-cpu/prefill-attention-wgmma-pv-strides-swapped.diff"
diffs[scan]="${diffs[attn]} $results/session20-cpu/prefill-attention-scan-without-divisions.diff"
diffs[all]="${diffs[pv]} $results/session20-cpu/prefill-attention-scan-without-divisions.diff ${diffs[append]}"
targets="ekva test_backend_cuda cuda_decode_attention_bench ekva_kernel_trace"
cmake -S . -B build-var -G Ninja -DCMAKE_BUILD_TYPE=Release -DEKVA_CUDA=ON > /dev/null
rm -rf build-next && mkdir -p build-next
ninja -C build-var $targets
scripts/device-pack.sh build-var
mv build-var/device-all build-next/
trap 'git checkout -- src' EXIT
# sm_90 variants first, then those that move the CUDA target to sm_90a: two full rebuilds.
for v in attn scan append wgmma scores pv pvswap all; do
  for d in ${diffs[$v]}; do git apply "$d"; done
  ninja -C build-var ekva test_backend_cuda
  if [ $v = pv ]; then  # the operand layouts alone, against the PV tree's helpers
    nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -Isrc \
      $results/session20-cpu/wgmma_layouts.cu -o build-next/wgmma_layouts
    strip build-next/wgmma_layouts
  fi
  mkdir -p build-next/$v
  for b in src/cli/ekva tests/test_backend_cuda; do
    strip -o build-next/$v/$(basename $b) build-var/$b
    xz -9 -T2 build-next/$v/$(basename $b)
  done
  git checkout -- src
done
du -sh build-next
