#!/usr/bin/env bash
# Packs the CUDA build (build-cuda/, or the build directory given as $1) for the GPU machine, which
# runs Ubuntu 24.04 with the CUDA toolkit but not every library ekva was linked against here: two
# archives, so that a device call carries only one (the working tree and what it carries share
# 64 MiB):
#   BUILD/device-test  the CUDA tests                      (carry it; run BUILD/device-test/run.sh ...)
#   BUILD/device-cli   ekva, with ICU 72 and cpp-httplib   (carry it; run BUILD/device-cli/run.sh ...)
# run.sh unpacks on first use, puts the libraries on LD_LIBRARY_PATH and runs its arguments.
# bench/serve/run_h200.sh takes BUILD/device-cli as its binary directory.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${1:-$root/build-cuda}" && pwd)
lib=/lib/x86_64-linux-gnu
. "$root/scripts/pack-common.sh"
pack() {  # NAME FILES...
  local dir=$build/$1
  shift
  pack_stage "$dir"
  cp -L "$@" "$dir/devpack/"
  find "$dir/devpack" -type f ! -name '*.so*' -exec strip {} +
  pack_seal "$dir"
}
common="$lib/libfmt.so.9 $lib/libgomp.so.1 $lib/libsentencepiece.so.0"
# serve and loadgen link Debian's cpp-httplib 0.11 (Ubuntu 24.04 has 0.14) and its Brotli.
http="$lib/libcpp-httplib.so.0.11 $lib/libbrotlidec.so.1 $lib/libbrotlienc.so.1 $lib/libbrotlicommon.so.1"
pack device-test "$build/tests/test_backend_cuda" $common
pack device-cli "$build/src/cli/ekva" $common $lib/libicuuc.so.72 $lib/libicudata.so.72 $http
