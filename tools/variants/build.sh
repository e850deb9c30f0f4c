#!/bin/bash
# Builds, on this machine, the binaries that tools/variants/job.sh tests and times on the GPU
# machine: build-next/device-all (scripts/device-pack.sh's pack of the checked-out commit, the
# "base" variant) and, for each NAME=DIFF[+DIFF...] argument, the checked-out source with those
# diffs applied in order: its ekva, test_backend_cuda and cuda_decode_attention_bench (stripped,
# xz) in build-next/NAME/.
#   tools/variants/build.sh append=docs/results/session18-h200/append-kv-warp-per-token.diff
# Needs clean src/ and tests/ (the diffs are applied to them and taken back off); builds in build-var/.
# build-next/ is ignored by git; a device call carries it (carry: ["build-next"]) beside the tree.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
git diff --quiet -- src tests || { echo "src/ or tests/ has changes: commit or stash them first" >&2; exit 1; }
for spec in "$@"; do
  [[ $spec == *=* ]] || { echo "not NAME=DIFF[+DIFF...]: $spec" >&2; exit 2; }
  IFS=+ read -ra files <<< "${spec#*=}"
  for d in "${files[@]}"; do [ -f "$d" ] || { echo "no such diff: $d" >&2; exit 2; }; done
done
export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B build-var -G Ninja -DCMAKE_BUILD_TYPE=Release -DEKVA_CUDA=ON > /dev/null
rm -rf build-next && mkdir -p build-next
ninja -C build-var ekva test_backend_cuda cuda_decode_attention_bench cuda_product_chain_bench \
  ekva_kernel_trace
scripts/device-pack.sh build-var
mv build-var/device-all build-next/
trap 'git checkout -- src tests' EXIT
for spec in "$@"; do
  name=${spec%%=*}
  IFS=+ read -ra files <<< "${spec#*=}"
  for d in "${files[@]}"; do git apply "$d"; done
  ninja -C build-var ekva test_backend_cuda cuda_decode_attention_bench
  mkdir -p build-next/$name
  for b in src/cli/ekva tests/test_backend_cuda bench/cuda/cuda_decode_attention_bench; do
    strip -o build-next/$name/$(basename $b) build-var/$b
    xz -9 -T2 build-next/$name/$(basename $b)
  done
  git checkout -- src tests
done
du -sh build-next
