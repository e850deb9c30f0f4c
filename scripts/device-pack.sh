#!/usr/bin/env bash
# Packs the CUDA build (build-cuda/) for the GPU machine, which runs Ubuntu 24.04 with the CUDA
# toolkit but not every library ekva was linked against here: two archives, so that a device call
# carries only one (the working tree and what it carries share 64 MiB):
#   build-cuda/device-test  the CUDA tests       (carry it; run build-cuda/device-test/run.sh ...)
#   build-cuda/device-cli   ekva, with ICU 72    (carry it; run build-cuda/device-cli/run.sh ...)
# run.sh unpacks on first use, puts the libraries on LD_LIBRARY_PATH and runs its arguments.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lib=/lib/x86_64-linux-gnu
pack() {  # NAME FILES...
  local dir=$root/build-cuda/$1
  shift
  rm -rf "$dir" && mkdir -p "$dir/devpack"
  cp -L "$@" "$dir/devpack/"
  find "$dir/devpack" -type f ! -name '*.so*' -exec strip {} +
  tar cf - -C "$dir" devpack | xz -9 -T2 > "$dir/devpack.tar.xz"
  rm -rf "$dir/devpack"
  cat > "$dir/run.sh" <<'RUN'
#!/bin/bash
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$here/devpack" ] || tar xJf "$here/devpack.tar.xz" -C "$here"
export LD_LIBRARY_PATH=$here/devpack:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
exec "$@"
RUN
  chmod +x "$dir/run.sh"
  ls -la "$dir/devpack.tar.xz"
}
common="$lib/libfmt.so.9 $lib/libgomp.so.1 $lib/libsentencepiece.so.0"
pack device-test "$root/build-cuda/tests/test_backend_cuda" $common
pack device-cli "$root/build-cuda/src/cli/ekva" $common $lib/libicuuc.so.72 $lib/libicudata.so.72 \
  $lib/libcpp-httplib.so.0.11
