# shellcheck shell=bash
# Sourced by scripts/device-pack.sh and scripts/fuzz-pack.sh. The machines they pack for run
# Ubuntu 24.04, which lacks libraries of this Debian 12 build (fmt 9, SentencePiece, ICU 72, ...), so
# a pack carries them beside the binaries, compressed so that it travels with the working tree (64
# MiB in all):
#   pack_stage DIR   empties DIR and makes DIR/devpack, the folder to fill
#   pack_seal DIR    compresses DIR/devpack into DIR/devpack.tar.xz and writes DIR/run.sh, which
#                    unpacks it on first use, puts DIR/devpack on LD_LIBRARY_PATH and runs its
#                    arguments
pack_stage() {
  rm -rf "$1" && mkdir -p "$1/devpack"
}

pack_seal() {
  local dir=$1
  tar cf - -C "$dir" devpack | nice xz -9 -T2 > "$dir/devpack.tar.xz"
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
