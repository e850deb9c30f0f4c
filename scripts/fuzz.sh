#!/usr/bin/env bash
# Builds the libFuzzer targets (clang 16, ASan + UBSan) into build-fuzz/ and runs each named target
# for SECONDS, one job at a time. TARGET is one of fuzz/CMakeLists.txt's targets, several joined by
# commas, or "all"; SECONDS "build" only builds them (one binary, build-fuzz/fuzz/ekva_fuzz).
#   scripts/fuzz.sh all 3                     # the CI smoke
#   scripts/fuzz.sh tokenize 3600 -runs=10000000
#   scripts/fuzz-pack.sh                      # all of them at once on a machine with more cores
# Extra arguments go to libFuzzer. New corpus entries are kept in build-fuzz/corpus/TARGET and
# crashes in build-fuzz/artifacts/TARGET; a crash ends the script with status 1.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ $# -lt 2 ]; then
  echo "usage: scripts/fuzz.sh TARGET|all SECONDS [libFuzzer options...]" >&2
  exit 1
fi
target=$1
seconds=$2
shift 2
build="$root/build-fuzz"
all=$(sed -n 's/^set(EKVA_FUZZ_TARGETS \(.*\)/\1/p; s/^ *\([a-z_ ]*\))$/\1/p' "$root/fuzz/CMakeLists.txt")
if [ "$target" = all ]; then targets=$all; else targets=${target//,/ }; fi

# Debug without NDEBUG, so that the JSON library's assertions stay on, at -O2: the targets ran a
# fifth faster than at -O1 and built as quickly. Not -march=native, so that scripts/fuzz-pack.sh's
# pack runs on another machine's CPU. Configured every time so that an older build-fuzz/ picks up
# changed flags.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O2 \
  -DCMAKE_C_COMPILER=clang-16 -DCMAKE_CXX_COMPILER=clang++-16 -DEKVA_FUZZ=ON -DEKVA_CUDA=OFF \
  -DEKVA_NATIVE=OFF -DEKVA_BUILD_TESTS=OFF -DEKVA_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" --parallel "$(nproc)" --target ekva_fuzz  # fuzz_NAME links to it
[ "$seconds" = build ] && exit 0

# The targets write each input to a file under TMPDIR for the loaders that take a path; on tmpfs
# that costs no disk (on this machine's overlay filesystem the file made the targets four times
# slower).
if [ -d /dev/shm ] && [ -w /dev/shm ]; then tmp_root=/dev/shm; else tmp_root=$build/tmp; fi

for t in $targets; do
  corpus="$build/corpus/$t"
  artifacts="$build/artifacts/$t/"
  mkdir -p "$corpus" "$artifacts"
  cp "$root/fuzz/corpus/$t"/* "$corpus/"
  log="$build/$t.log"
  tmp=$(mktemp -d "$tmp_root/ekva-fuzz-$t.XXXXXX")
  echo "fuzz $t for ${seconds}s"
  if ! TMPDIR="$tmp" UBSAN_OPTIONS=print_stacktrace=1 "$build/fuzz/fuzz_$t" \
      -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -artifact_prefix="$artifacts" \
      -print_final_stats=1 "$@" "$corpus" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    rm -rf "$tmp"
    echo "fuzz $t: FAILED (input kept in $artifacts)" >&2
    exit 1
  fi
  rm -rf "$tmp"
  grep -E '^Done [0-9]+ runs' "$log" | sed "s/^/fuzz $t: /"
done
