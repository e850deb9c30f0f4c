#!/usr/bin/env bash
# Installs every build and test dependency from Debian's packages. Idempotent: packages already
# present are not touched, so the README commands and CI can call it every time.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config clang-format
  clang-16 libclang-rt-16-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev libcpp-httplib-dev
  libopenblas-dev libomp-dev
  libsentencepiece-dev sentencepiece libpcre2-dev libicu-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
