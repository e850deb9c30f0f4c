#!/usr/bin/env bash
# The sanitizer tier: builds EKVA with AddressSanitizer and UndefinedBehaviorSanitizer into
# build-asan/ (incremental) and runs the tests under them. Any report fails the run.
# Extra arguments go to ctest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build-asan"
"$root/scripts/install-deps.sh"
if [ ! -f "$build/build.ninja" ]; then
  # -O1, as the sanitizers' documentation advises: quicker to build than -O3, stack traces intact.
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" -DEKVA_SANITIZE=ON -DEKVA_CUDA=OFF \
    -DEKVA_BUILD_BENCH=OFF
fi
cmake --build "$build" --parallel "$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one test per core, as scripts/test.sh
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"
