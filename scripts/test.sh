#!/usr/bin/env bash
# Builds gpumem with warnings as errors and runs every test: the C++ and
# Python suites (ctest) and the web page in headless Chromium.
# Usage: bash scripts/test.sh   (GPUMEM_SLOW_TESTS=1 adds the pip-install test)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh -DGPUMEM_WERROR=ON
# The "slow" label (pip install from source, ~3 min on 2 cores) runs with
# GPUMEM_SLOW_TESTS=1: bash scripts/test.sh
if [ "${GPUMEM_SLOW_TESTS:-0}" = 1 ]; then
  (cd build && ctest --output-on-failure -j"$(nproc)")
else
  (cd build && ctest --output-on-failure -j"$(nproc)" -LE slow)
fi
GPUMEM_CLI="$PWD/build/gpumem" bash tests/browser/run.sh
# Hostile input (issue 15): the saved CLI regressions, a bounded mutation run
# of the CLI (fixed seed, <= 90 s), then the libFuzzer targets under ASan+UBSan
# (scripts/fuzz.sh: its own build-fuzz/, <= 10 s per target). Any finding fails.
# All three run; the script fails if any found something.
fuzz_rc=0
python3 fuzz/cli_mutate.py --replay fuzz/regressions/cli || fuzz_rc=1
python3 fuzz/cli_mutate.py --seed 1 --count 600 --max-time 90 || fuzz_rc=1
bash scripts/fuzz.sh || fuzz_rc=1
exit $fuzz_rc
