#!/bin/bash
# One device call's worth of tools/variants/job.sh, its results in one archive ($OUT/res.tgz: a call
# brings back only a few files). Run on the GPU machine with build-next/ carried:
#   tools/variants/call.sh
# What runs, each step under its own time limit so that the archive is always written:
#   CHECK    variants whose CUDA suite runs, filtered by FILTER (job.sh check)
#   DUR      variants whose prompt kernels Nsight Compute times (job.sh durations) on each of
#            DUR_MODELS (default qwen3-30b-a3b)
#   TIME     variants alternating in whole prompts (job.sh time, DECODE=0; PROMPT_ROUNDS rounds,
#            default 2) of each of MODELS (default qwen3-30b-a3b)
#   STEPS    variants alternating in batch-1 steps at context 4k (job.sh time, PROMPTS=0) of each
#            of MODELS (default: none)
#   SAN      VARIANT:FILTER pairs for racecheck and memcheck (job.sh sanitize; default: none)
#   ATT      B:L pairs at which decode attention alone is timed (job.sh attention) for the
#            variants ATT_VARIANTS (default base and the variants built; default: none)
#   NCU      VARIANT:MODEL:REGEX triples whose prompt kernels Nsight Compute profiles (job.sh
#            ncu, NCU_COUNT launches each, default 1; default: none)
#   NCU_STEP MODEL:REGEX pairs whose decode-step kernels Nsight Compute profiles (job.sh ncu-step;
#            default: none)
#   NCU_ATT  B:L pairs whose decode attention Nsight Compute profiles (job.sh ncu-attention;
#            default: none)
#   RECORD   models whose figures of record (job.sh record) each of RECORD_VARIANTS (default base
#            and the variants built) measures (default: none)
#   PEERS    models whose peers (job.sh peers) run after the figures of record (default: none)
#   TRACE    VARIANT:MODEL pairs whose batch-1 steps' kernel timelines are traced (job.sh trace,
#            PROMPT=0; default: none)
# An empty list skips its step; CHECK, DUR and TIME default to the variants built.
set -u
res=${OUT:?OUT names the folder whose files come back}
[ -d build-next/device-all ] || { echo "call.sh: no build-next/device-all (tools/variants/build.sh makes it; carry build-next)" >&2; exit 2; }
export OUT=/tmp/call-results
# A warm machine still holds the last call's results: they would come back again with this one's.
rm -rf "$OUT"
mkdir -p "$OUT"
J="bash tools/variants/job.sh"
built=$(cd build-next && ls -d */ | tr -d / | grep -v '^device-all$' | tr '\n' ' ')
finish() {
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
  tar czf "$res/res.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
}
trap finish EXIT
nvidia-smi --query-gpu=name --format=csv,noheader
if [ -n "${CHECK-$built}" ]; then
  timeout "${CHECK_S:-170}" env FILTER="${FILTER:-*}" VARIANTS="${CHECK-$built}" $J check
fi
if [ -n "${DUR-base $built}" ]; then
  for m in ${DUR_MODELS:-qwen3-30b-a3b}; do
    timeout "${DUR_S:-120}" env VARIANTS="${DUR-base $built}" $J durations "$m"
  done
  python3 tools/variants/durations.py "$OUT" 2>&1 | tee "$OUT/durations.md"
fi
for m in ${MODELS:-qwen3-30b-a3b}; do
  [ -n "${TIME-base $built}" ] || break
  timeout "${TIME_S:-150}" env DECODE=0 VARIANTS="${TIME-base $built}" $J time "$m"
done
for m in ${MODELS:-qwen3-30b-a3b}; do
  [ -n "${STEPS-}" ] || break
  timeout "${STEPS_S:-150}" env PROMPTS=0 VARIANTS="$STEPS" $J time "$m"
done
for m in ${RECORD-}; do
  timeout "${RECORD_S:-240}" env VARIANTS="${RECORD_VARIANTS:-base $built}" $J record "$m"
done
for m in ${PEERS-}; do
  timeout "${PEERS_S:-240}" $J peers "$m"
done
for a in ${ATT-}; do
  timeout "${ATT_S:-60}" env VARIANTS="${ATT_VARIANTS:-base $built}" $J attention "${a%%:*}" "${a#*:}"
done
for a in ${NCU-}; do
  r=${a#*:}
  timeout "${NCU_S:-90}" env VARIANT="${a%%:*}" $J ncu "${r%%:*}" "${r#*:}"
done
for a in ${NCU_STEP-}; do
  timeout "${NCU_S:-90}" $J ncu-step "${a%%:*}" "${a#*:}"
done
for a in ${NCU_ATT-}; do
  timeout "${NCU_S:-90}" $J ncu-attention "${a%%:*}" "${a#*:}"
done
for t in ${TRACE-}; do
  timeout "${TRACE_S:-60}" env VARIANT="${t%%:*}" PROMPT=0 $J trace "${t#*:}"
done
for s in ${SAN-}; do
  timeout "${SAN_S:-60}" env VARIANT="${s%%:*}" FILTER="${s#*:}" $J sanitize
done
