#!/usr/bin/env bash
# Packs the libFuzzer targets for a machine with more cores that runs Ubuntu 24.04 without this
# repository's dependencies, into one folder to carry there, build-fuzz/fuzzpack/ (about 8 MB: a
# device call carries it and the working tree within 64 MiB, and the tree is 55 MiB):
#   devpack.tar.xz  ekva_fuzz (every target in one binary, fuzz/pack.cpp; stripped, since that
#                   machine has no symbolizer: build-fuzz/fuzz/ekva_fuzz, same build ID, turns the
#                   offsets of a report into names here) with a link fuzz_NAME per target; the
#                   Debian 12 libraries it loads that such a machine lacks; the corpora (the seeds
#                   and what build-fuzz/corpus/ has grown, merged); the repository files the targets
#                   open, under root/ (found through EKVA_FUZZ_ROOT: the path compiled in is this
#                   machine's)
#   run.sh          unpacks on first use and runs its arguments with the libraries (pack-common.sh)
#   fuzz-all.sh     runs every packed target at once (scripts/fuzz-pack-run.sh says how)
#
#   scripts/fuzz-pack.sh [TARGET...]
#   build-fuzz/fuzzpack/fuzz-all.sh OUT [SECONDS=540] [WORKERS=nproc] [RUNS=10000000]
# Without TARGETs it packs every target but tokenize and model_config, which docs/HARDENING.md
# records at 10 million executions.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/scripts/pack-common.sh"
build=$root/build-fuzz
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(safetensors_header tokenizer_json sentencepiece_model budget_plan calibration_stats
    hardware measured_times completion_request)
fi
"$root/scripts/fuzz.sh" "$(IFS=,; echo "${targets[*]}")" build

dir=$build/fuzzpack
pack_stage "$dir"
stage=$dir/devpack
cp "$build/fuzz/ekva_fuzz" "$stage/"
strip "$stage/ekva_fuzz"
# The corpora: the seeds and what earlier runs grew in build-fuzz/corpus/ (fuzz.sh's, or a pack's
# corpus.tar.xz unpacked there), cut by libFuzzer's merge to the inputs that add coverage, since
# a grown corpus is mostly redundant and the pack must stay small.
merge_tmp=$(mktemp -d "$([ -w /dev/shm ] && echo /dev/shm || echo /tmp)/ekva-fuzz-merge.XXXXXX")
for t in "${targets[@]}"; do
  ln -s ekva_fuzz "$stage/fuzz_$t"
  mkdir -p "$stage/corpus/$t"
  grown=()
  if [ -d "$build/corpus/$t" ]; then grown=("$build/corpus/$t"); fi
  if ! TMPDIR=$merge_tmp EKVA_FUZZ_TARGET=$t "$build/fuzz/ekva_fuzz" -merge=1 -timeout=30 \
    -rss_limit_mb=4096 "$stage/corpus/$t" "$root/fuzz/corpus/$t" "${grown[@]}" \
    >"$build/fuzzpack-merge-$t.log" 2>&1; then
    tail -n 20 "$build/fuzzpack-merge-$t.log" >&2
    echo "fuzz-pack: merging the $t corpus failed (build-fuzz/fuzzpack-merge-$t.log)" >&2
    exit 1
  fi
  echo "corpus $t: $(find "$stage/corpus/$t" -type f | wc -l) inputs"
done
rm -rf "$merge_tmp"

# What the targets open besides their input (fuzz/targets.h's source_file): the embedded model's
# config and tokenizer, without its weights, and the fixture tokenizers.
files=()
case " ${targets[*]} " in *" completion_request "*)
  for f in "$root"/models/ekva-moe-8m/*; do
    case $f in *.safetensors) ;; *) files+=("${f#"$root"/}") ;; esac
  done ;;
esac
case " ${targets[*]} " in *" tokenize "*)
  files+=(tests/fixtures/tokenizers/allenai_dolma2.json
    tests/fixtures/tokenizers/allenai_gpt-neox-olmo-dolma-v1_5.json
    tests/fixtures/tokenizers/mistral-v3.tokenizer.json
    tests/fixtures/tokenizers/mistral-v3.tokenizer.model) ;;
esac
mkdir -p "$stage/root"
if [ ${#files[@]} -gt 0 ]; then (cd "$root" && cp --parents "${files[@]}" "$stage/root/"); fi

# Every library ekva_fuzz loads but glibc's and GCC's own, which Ubuntu 24.04 has in newer,
# compatible versions; the rest (fmt 9, SentencePiece, PCRE2, ICU 72, OpenBLAS and its Fortran
# runtime) are Debian 12's and may be missing or of another soname there.
ldd "$build/fuzz/ekva_fuzz" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  grep -vE '/(libc|libm|libresolv|libpthread|libdl|librt|libgcc_s|libstdc\+\+)\.so|/ld-linux' |
  xargs cp -L -t "$stage/"

pack_slim_icu "$stage"

cp "$root/scripts/fuzz-pack-run.sh" "$dir/fuzz-all.sh"
du -sh "$stage"
pack_seal "$dir"
du -sh "$dir"
