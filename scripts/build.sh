#!/usr/bin/env bash
# Installs what is missing, then configures and builds EKVA into build/ (incremental).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/install-deps.sh"
if [ ! -f "$root/build/build.ninja" ]; then
  cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${EKVA_CMAKE_ARGS:-}
fi
cmake --build "$root/build" --parallel "$(nproc)"
