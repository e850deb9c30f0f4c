#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/build.sh"
# ctest runs one test per core; an OpenMP team in each on top would oversubscribe the cores, and a
# team's barriers then wait for threads the scheduler has put aside (docs/BENCHMARKS.md, "CPU engine").
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ctest --test-dir "$root/build" --output-on-failure -j "$(nproc)" "$@"
