#!/bin/bash
# The run script of scripts/fuzz-pack.sh's pack (copied there as fuzz-all.sh): runs every packed
# target at once, each with RUNS executions split over libFuzzer jobs, within SECONDS:
#   build-fuzz/fuzzpack/fuzz-all.sh OUT [SECONDS=540] [WORKERS=nproc] [RUNS=10000000]
# The WORKERS cores are shared out in proportion to the cores each target needs to reach RUNS in
# SECONDS at its rate (FUZZ_RATES below, executions per CPU-second), at least one each;
# EKVA_FUZZ_TARGETS="a b" runs only those. OUT gets four files at most, since a device call brings
# back eight: summary.txt (the split, then per target its executions summed over its jobs and its
# status), logs.tar.xz (every job's libFuzzer log), findings.tar.gz (crashing, leaking, timing-out
# or out-of-memory inputs, when there are any) and corpus.tar.xz (the grown corpora, to pack for a
# next run). Exits 1 if any target failed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${EKVA_FUZZPACK_ENV:-}" ]; then
  # run.sh unpacks devpack.tar.xz and puts its libraries on LD_LIBRARY_PATH.
  EKVA_FUZZPACK_ENV=1 exec "$here/run.sh" "$here/fuzz-all.sh" "$@"
fi
if [ $# -lt 1 ]; then
  echo "usage: fuzz-all.sh OUT [SECONDS=540] [WORKERS=nproc] [RUNS=10000000]" >&2
  exit 2
fi
out=$(mkdir -p "$1" && cd "$1" && pwd)
seconds=${2:-540}
workers=${3:-$(nproc)}
runs=${4:-10000000}
pack=$here/devpack
# Executions per CPU-second of one process, the median of three 60 s runs from the seeds on the
# two-core development machine (docs/HARDENING.md, "Speed"); only their ratios matter for the split.
# EKVA_FUZZ_RATES="target=rate ..." replaces any of them.
FUZZ_RATES="tokenizer_json=1425 safetensors_header=2385 measured_times=3442 hardware=4785
  budget_plan=5093 calibration_stats=5421 sentencepiece_model=6069 completion_request=7071
  model_config=6002 tokenize=7419 ${EKVA_FUZZ_RATES:-}"
targets=${EKVA_FUZZ_TARGETS:-$(cd "$pack" && for f in fuzz_*; do echo "${f#fuzz_}"; done)}

# Cores per target: RUNS / (rate x SECONDS) is what it needs; the WORKERS cores are shared in that
# proportion (largest remainders), every target getting at least one.
plan=$(for t in $targets; do echo "$t"; done | awk -v rates="${FUZZ_RATES//$'\n'/ }" -v w="$workers" \
  -v runs="$runs" -v secs="$seconds" '
  BEGIN { n = split(rates, kv, / +/); for (i = 1; i <= n; i++) if (split(kv[i], p, "=") == 2) rate[p[1]] = p[2] }
  { t[NR] = $1; r = ($1 in rate) ? rate[$1] : 1000; need[NR] = runs / (r * secs); sum += need[NR] }
  END {
    used = 0
    for (i = 1; i <= NR; i++) {
      share = w * need[i] / sum; cores[i] = int(share); if (cores[i] < 1) cores[i] = 1
      rest[i] = share - cores[i]; used += cores[i]
    }
    while (used < w) {
      best = 1; for (i = 2; i <= NR; i++) if (rest[i] > rest[best]) best = i
      cores[best]++; rest[best] -= 1; used++
    }
    for (i = 1; i <= NR; i++) printf "%s %d %.2f\n", t[i], cores[i], need[i]
  }')
if [ "$(echo "$plan" | awk '{ s += $2 } END { print s }')" -gt "$workers" ]; then
  echo "fuzz-all: fewer WORKERS ($workers) than targets; each target still gets one" >&2
fi
summary=$out/summary.txt
{
  echo "# target workers cores-needed (RUNS=$runs in SECONDS=$seconds at FUZZ_RATES)"
  echo "$plan"
} | tee "$summary"

work=$(mktemp -d)  # the logs and finds, packed into OUT at the end
# Each input is written to a file that the loader reads back; tmpfs keeps that off the disk.
tmp=$(mktemp -d "$([ -w /dev/shm ] && echo /dev/shm || echo /tmp)/ekva-fuzz.XXXXXX")
export TMPDIR=$tmp EKVA_FUZZ_ROOT=$pack/root UBSAN_OPTIONS=print_stacktrace=1 OPENBLAS_NUM_THREADS=1
# Clang 16's ASan fails at random at start-up under the 32 bits of mmap randomness that newer
# kernels (Ubuntu 24.04's among them) use (google/sanitizers#1614); without ASLR it cannot, and the
# jobs libFuzzer starts inherit that.
norandom=()
if setarch "$(uname -m)" -R true 2>/dev/null; then norandom=(setarch "$(uname -m)" -R); fi
# Each target once on one seed before the long run, so that a pack that cannot run here (a missing
# library, a file the target opens) costs seconds, not the whole run.
while read -r t _; do
  seed=$(find "$pack/corpus/$t" -type f | head -n 1)
  if ! "${norandom[@]}" "$pack/fuzz_$t" "$seed" >"$work/preflight-$t.log" 2>&1; then
    cp "$work/preflight-$t.log" "$out/"
    tail -n 20 "$work/preflight-$t.log" >&2
    echo "fuzz-all: $t does not run here (OUT/preflight-$t.log)" >&2
    exit 1
  fi
done <<<"$plan"

start=$(date +%s)
while read -r t n _; do
  per_job=$(((runs + n - 1) / n))
  mkdir -p "$work/$t" "$pack/corpus/$t"
  # -jobs writes job J's output to fuzz-J.log in the working directory; the jobs share the corpus
  # folder and read each other's finds from it.
  (cd "$work/$t" && "${norandom[@]}" "$pack/fuzz_$t" -jobs="$n" -workers="$n" -runs="$per_job" \
    -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -artifact_prefix="$work/$t/" \
    -print_final_stats=1 "$pack/corpus/$t" >libfuzzer.log 2>&1
    echo $? >rc) &
done <<<"$plan"
wait
elapsed=$(($(date +%s) - start))
rm -rf "$tmp"

echo "# target workers executions seconds exec/s/worker status ($(date -u +%FT%TZ))" >>"$summary"
found_any=()
while read -r t n _; do
  total=$(cat "$work/$t"/fuzz-*.log 2>/dev/null |
    awk '/^stat::number_of_executed_units:/ { s += $2 } END { print s + 0 }')
  found=$(cd "$work/$t" && for f in crash-* leak-* timeout-* oom-*; do [ -e "$f" ] && echo -n "$f "; done)
  [ -n "$found" ] && found_any+=("$t")
  status=ok
  if [ "$(cat "$work/$t/rc" 2>/dev/null)" != 0 ] || [ -n "$found" ] ||
    grep -qE '^==[0-9]+==ERROR|^SUMMARY: [A-Za-z]+Sanitizer' "$work/$t"/fuzz-*.log 2>/dev/null; then
    status="FAILED rc=$(cat "$work/$t/rc" 2>/dev/null) $found"
  elif [ "$total" -lt "$runs" ]; then
    status="short of $runs"
  fi
  echo "$t $n $total $elapsed $((total / (elapsed > 0 ? elapsed : 1) / n)) $status" >>"$summary"
done <<<"$plan"

# libfuzzer.log repeats each job's log after it ends, so only its own lines are kept.
for f in "$work"/*/libfuzzer.log; do grep -E '^(=+ Job|/)' "$f" >"$f.jobs"; rm "$f"; done
(cd "$work" && tar cf - --exclude='crash-*' --exclude='leak-*' --exclude='timeout-*' \
  --exclude='oom-*' ./*) | xz -T0 >"$out/logs.tar.xz"
if [ "$(stat -c %s "$out/logs.tar.xz")" -gt $((15 << 20)) ]; then
  # Over what a file may be to come back: the last 300 lines of each log hold its findings and stats.
  for f in "$work"/*/fuzz-*.log; do tail -n 300 "$f" >"$f.tail" && rm "$f"; done
  (cd "$work" && tar cf - --exclude='crash-*' --exclude='leak-*' --exclude='timeout-*' \
    --exclude='oom-*' ./*) | xz -T0 >"$out/logs.tar.xz"
  echo "# logs.tar.xz holds the last 300 lines of each job's log" >>"$summary"
fi
finds=()
for t in "${found_any[@]}"; do
  for f in "$work/$t"/crash-* "$work/$t"/leak-* "$work/$t"/timeout-* "$work/$t"/oom-*; do
    if [ -e "$f" ]; then finds+=("${f#"$work"/}"); fi
  done
done
if [ ${#finds[@]} -gt 0 ]; then (cd "$work" && tar czf "$out/findings.tar.gz" "${finds[@]}"); fi
(cd "$pack" && tar cf - corpus) | xz -T0 >"$out/corpus.tar.xz"
if [ "$(stat -c %s "$out/corpus.tar.xz")" -gt $((15 << 20)) ]; then
  rm "$out/corpus.tar.xz"
  echo "# the grown corpora were over 15 MiB compressed and are not in OUT" >>"$summary"
fi
rm -rf "$work"
cat "$summary"
! grep -q ' FAILED ' "$summary"
