# shellcheck shell=bash
# Sourced by scripts/device-pack.sh and scripts/fuzz-pack.sh. The machines they pack for run
# Ubuntu 24.04, which lacks libraries of this Debian 12 build (fmt 9, SentencePiece, ICU 72, ...), so
# a pack carries them beside the binaries, compressed so that it travels with the working tree (64
# MiB in all):
#   pack_stage DIR   empties DIR and makes DIR/devpack, the folder to fill
#   pack_seal DIR    compresses DIR/devpack into DIR/devpack.tar.xz and writes DIR/run.sh, which
#                    unpacks it on first use, puts DIR/devpack on LD_LIBRARY_PATH and runs its
#                    arguments
#   pack_slim_icu DIR  cuts DIR/libicudata.so.72 down to the normalization data
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

# ICU's data library is 31 MB (7.5 compressed), nearly all of it locales, collation and converters.
# The tokenizers use its normalizers alone (character properties and NFC/NFD are built into
# libicuuc), so the pack's libicudata.so.72 holds only the normalization data, as ICU's own tools
# (icupkg, genccode; icu-devtools) package it.
pack_slim_icu() {  # DIR: replaces DIR/libicudata.so.72, if there, by the normalization data alone
  local stage=$1 icu
  [ -f "$stage/libicudata.so.72" ] || return 0
  icu=$(mktemp -d)
  mkdir "$icu/full" "$icu/items" "$icu/small"  # icupkg wants a package named as its file
  python3 - "$stage/libicudata.so.72" "$icu/full/icudt72l.dat" <<'PY'
# Copies the data package that the library exports as icudt72_dat out of the ELF file.
import struct, sys
elf = open(sys.argv[1], "rb").read()
shoff = struct.unpack_from("<Q", elf, 0x28)[0]
shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
for _, kind, _, _, offset, size, link, _, _, _ in sections:
    if kind != 11:  # SHT_DYNSYM
        continue
    strings = sections[link][4]
    for j in range(size // 24):
        name, _, _, shndx, value, length = struct.unpack_from("<IBBHQQ", elf, offset + j * 24)
        if elf[strings + name:elf.index(b"\0", strings + name)] == b"icudt72_dat":
            section = sections[shndx]
            start = section[4] + value - section[3]
            open(sys.argv[2], "wb").write(elf[start:start + length])
            sys.exit(0)
sys.exit("no icudt72_dat in " + sys.argv[1])
PY
  icupkg -l "$icu/full/icudt72l.dat" | grep '\.nrm$' >"$icu/keep.txt"
  icupkg -x "$icu/keep.txt" -d "$icu/items" "$icu/full/icudt72l.dat"
  icupkg -a "$icu/keep.txt" -s "$icu/items" new "$icu/small/icudt72l.dat"
  genccode -q -d "$icu/small" "$icu/small/icudt72l.dat"
  sed -i 's/ icudt72l_dat=/ icudt72_dat=/' "$icu/small/icudt72l_dat.c"
  cc -shared -fPIC -o "$stage/libicudata.so.72" -Wl,-soname,libicudata.so.72 \
    "$icu/small/icudt72l_dat.c"
  rm -rf "$icu"
}
