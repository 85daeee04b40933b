#!/usr/bin/env bash
# Installs the Debian packages gpumem needs (only the missing ones) and builds
# it into build/. Usage: bash scripts/setup.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(g++ cmake make nlohmann-json3-dev libcli11-dev libfmt-dev libonnx-dev libprotobuf-dev protobuf-compiler libgtest-dev libbenchmark-dev libcpp-httplib-dev pybind11-dev python3-dev python3-pytest python3-setuptools python3-wheel python3-venv python3-pip
      clang libclang-rt-14-dev)  # clang + libFuzzer/sanitizer runtimes: scripts/fuzz.sh
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
echo "setup: built build/gpumem" >&2
