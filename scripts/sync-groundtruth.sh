#!/usr/bin/env bash
# Copies the shared ground truth (public measurements and exact parameter
# counts, none produced by gpumem) into tests/fixtures/groundtruth and the HF
# configs into data/presets/configs, so tests and the build need nothing
# outside the repository. Run from the repository root with ../shared beside it.
set -euo pipefail
src=${1:-../shared/groundtruth}
cp "$src"/*.json "$src"/README.md tests/fixtures/groundtruth/
cp "$src"/configs/*.json data/presets/configs/
