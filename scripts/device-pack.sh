#!/usr/bin/env bash
# Packs the CUDA build (build-cuda/, or the build directory given as $1) for the GPU machine, which
# runs Ubuntu 24.04 with the CUDA toolkit but not every library ekva was linked against here: one
# archive, BUILD/device-all, that a device call carries beside the working tree (the two share
# 64 MiB): ekva, the CUDA tests, the two GPU benchmarks and the kernel trace library with
# fmt 9, SentencePiece, ICU 72 (its normalization data alone), cpp-httplib 0.11 and Brotli. Carry it and run
# BUILD/device-all/run.sh COMMAND...: run.sh unpacks on first use, puts the libraries on
# LD_LIBRARY_PATH and runs its arguments (the binaries are BUILD/device-all/devpack/ekva,
# .../test_backend_cuda, .../cuda_decode_attention_bench and .../cuda_product_chain_bench).
# bench/serve/run_h200.sh takes BUILD/device-all as its binary directory;
# bench/cuda/run_attention_bench.sh takes EKVA_CUDA_BIN=BUILD/device-all/devpack once run.sh has
# unpacked it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${1:-$root/build-cuda}" && pwd)
lib=/lib/x86_64-linux-gnu
. "$root/scripts/pack-common.sh"
dir=$build/device-all
pack_stage "$dir"
cp -L "$build/src/cli/ekva" "$build/tests/test_backend_cuda" \
  "$build/bench/cuda/cuda_decode_attention_bench" "$build/bench/cuda/cuda_product_chain_bench" \
  "$dir/devpack/"
# The kernel timeline library (tools/kernel_trace), where the toolkit had CUPTI to build it.
trace=$build/tools/kernel_trace/libekva_kernel_trace.so
[ -f "$trace" ] && cp -L "$trace" "$dir/devpack/"
find "$dir/devpack" -type f -exec strip {} +
# serve and loadgen link Debian's cpp-httplib 0.11 (Ubuntu 24.04 has 0.14) and its Brotli.
cp -L -t "$dir/devpack/" $lib/libfmt.so.9 $lib/libgomp.so.1 $lib/libsentencepiece.so.0 \
  $lib/libicuuc.so.72 $lib/libicudata.so.72 $lib/libcpp-httplib.so.0.11 $lib/libbrotlidec.so.1 \
  $lib/libbrotlienc.so.1 $lib/libbrotlicommon.so.1
pack_slim_icu "$dir/devpack"
pack_seal "$dir"
