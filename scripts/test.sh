#!/usr/bin/env bash
# Builds gpumem with warnings as errors and runs every test (ctest).
# Usage: bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh -DGPUMEM_WERROR=ON
cd build
ctest --output-on-failure -j"$(nproc)"
