#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with AddressSanitizer and
# UndefinedBehaviorSanitizer into build-fuzz/ and runs each one for a bounded,
# deterministic amount over its committed seeds (fuzz/corpus/<corpus>/) and
# its regression inputs (fuzz/regressions/<corpus>/). Any finding (a crash, a
# sanitizer report, an exception other than an input error, more than
# FUZZ_RSS_MB of memory or FUZZ_TIMEOUT seconds on one input) fails the script;
# the input that caused it is left in build-fuzz/findings/<corpus>/.
#
# Usage: bash scripts/fuzz.sh [corpus...]        (default: every corpus)
# Environment: FUZZ_RUNS (inputs per target, default 2000),
#              FUZZ_MAX_TIME (seconds per target, default 10),
#              FUZZ_TIMEOUT (seconds per input, default 5),
#              FUZZ_RSS_MB (default 2048), FUZZ_JOBS (build jobs, default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${FUZZ_RUNS:-2000}
MAX_TIME=${FUZZ_MAX_TIME:-10}
TIMEOUT=${FUZZ_TIMEOUT:-5}
RSS_MB=${FUZZ_RSS_MB:-2048}
JOBS=${FUZZ_JOBS:-$(nproc)}
BUILD=build-fuzz

# corpus name -> fuzz target (one target may serve several corpora).
declare -A TARGET=(
  [hf_config]=hf_config [layer_list]=layer_list [graph_json]=graph_json [onnx]=onnx
  [safetensors]=safetensors [gguf]=gguf [snapshot_pickle]=snapshot [snapshot_json]=snapshot
  [megatron]=megatron [doctor]=doctor [fields]=fields [api]=api
)
ORDER=(hf_config layer_list graph_json onnx safetensors gguf snapshot_pickle snapshot_json megatron doctor fields api)
if [ $# -gt 0 ]; then ORDER=("$@"); fi

CXX_COMPILER=${FUZZ_CXX:-$(command -v clang++ || true)}
if [ -z "$CXX_COMPILER" ]; then
  echo "fuzz: clang++ not found (Debian: apt-get install clang libclang-rt-14-dev)" >&2
  exit 1
fi
LAUNCHER=()
if command -v ccache >/dev/null; then LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

# -O1 with line tables: fast enough to fuzz, cheap to compile, readable
# stack traces. Only the libraries and the fuzz targets are built.
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DCMAKE_CXX_COMPILER="$CXX_COMPILER" "${LAUNCHER[@]}" -DGPUMEM_FUZZ=ON \
  -DGPUMEM_BUILD_TESTS=OFF -DGPUMEM_BUILD_BENCH=OFF -DGPUMEM_BUILD_SERVER=OFF -DGPUMEM_BUILD_PYTHON=OFF >/dev/null
cmake --build "$BUILD" -j"$JOBS" --target gpumem_fuzz_all >/dev/null
echo "fuzz: built $BUILD/fuzz/" >&2

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1:detect_stack_use_after_return=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for corpus in "${ORDER[@]}"; do
  target=${TARGET[$corpus]:-}
  if [ -z "$target" ]; then echo "fuzz: unknown corpus $corpus" >&2; exit 1; fi
  seeds=fuzz/corpus/$corpus
  regressions=fuzz/regressions/$corpus
  findings=$BUILD/findings/$corpus
  work=$BUILD/work/$corpus  # new inputs go here, never into the committed seeds
  rm -rf "$work" "$findings"
  mkdir -p "$work" "$findings"
  dirs=("$work" "$seeds")
  [ -d "$regressions" ] && dirs+=("$regressions")
  log=$BUILD/findings/$corpus.log
  start=$SECONDS
  if "$BUILD/fuzz/fuzz_$target" -seed=1 -runs="$RUNS" -max_total_time="$MAX_TIME" -timeout="$TIMEOUT" \
      -rss_limit_mb="$RSS_MB" -malloc_limit_mb="$RSS_MB" -max_len=65536 -print_final_stats=1 \
      -artifact_prefix="$findings/" "${dirs[@]}" >"$log" 2>&1; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    echo "fuzz: $corpus ok (${execs:-?} inputs, $((SECONDS - start)) s)" >&2
  else
    echo "fuzz: $corpus FAILED ($((SECONDS - start)) s); log $log, input(s):" >&2
    ls "$findings" >&2 || true
    grep -E "ERROR: |runtime error:|SUMMARY:|terminate called|what\(\)" "$log" | head -5 >&2 || true
    failed+=("$corpus")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]} (fuzz/README.md: reproduce, then add the input to fuzz/regressions/<corpus>/)" >&2
  exit 1
fi
echo "fuzz: no findings" >&2
