#!/usr/bin/env bash
# Builds gpumem with warnings as errors and runs every test: the C++ and
# Python suites (ctest) and the web page in headless Chromium.
# Usage: bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh -DGPUMEM_WERROR=ON
(cd build && ctest --output-on-failure -j"$(nproc)")
GPUMEM_CLI="$PWD/build/gpumem" bash tests/browser/run.sh
