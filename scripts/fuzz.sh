#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/*.cpp: the .npy loader, attend's option parsing)
# with clang under address and undefined-behaviour sanitizers and runs each for a bounded
# time on its corpus in tests/fuzz/ (new inputs go to a temporary folder, never into the
# repo). A finding stops with the crashing input saved under the build folder: add it to the
# corpus and turn it into a regression test.
# Every source is compiled once (npy.cpp is in both targets), the sources and then the two
# targets in parallel: each target still fuzzes for its full FUZZ_SECONDS, on its own core
# where there are two.
# Usage: scripts/fuzz.sh [BUILD_DIR] (FUZZ_SECONDS per target, default 25)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-fuzz}
seconds=${FUZZ_SECONDS:-25}
mkdir -p "$build"
flags=(-std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined
       -Iinclude -Isrc -Icli -Werror -Wall -Wextra)

# Waits for every background job in "$@" (process ids); fails if any of them failed.
wait_all() {
  local status=0
  for pid in "$@"; do wait "$pid" || status=1; done
  return "$status"
}

# Coverage instrumentation in every object (fuzzer-no-link); libFuzzer's main at the link.
pids=()
for source in tests/fuzz/fuzz_npy.cpp tests/fuzz/fuzz_attend_options.cpp src/common/npy.cpp \
              cli/options.cpp; do
  object="$build/$(basename "${source%.cpp}").o"
  clang++ "${flags[@]}" -fsanitize=fuzzer-no-link -c "$source" -o "$object" &
  pids+=($!)
done
wait_all "${pids[@]}"
clang++ "${flags[@]}" -fsanitize=fuzzer "$build/fuzz_npy.o" "$build/npy.o" -o "$build/fuzz_npy"
clang++ "${flags[@]}" -fsanitize=fuzzer "$build/fuzz_attend_options.o" "$build/options.o" \
  "$build/npy.o" -o "$build/fuzz_attend_options"

# One target: fuzzes for $seconds on its corpus; on a finding prints its log's end, fails.
fuzz() {
  local target=$1 work
  work=$(mktemp -d)
  "$build/fuzz_$target" "$work" "tests/fuzz/${target}_corpus" -max_total_time="$seconds" \
    -max_len=4096 -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$build/crash_${target}_" \
    -print_final_stats=0 2>"$build/fuzz_$target.log" ||
    { echo "fuzz_$target: failed"; tail -40 "$build/fuzz_$target.log"; rm -rf "$work"; return 1; }
  echo "fuzz_$target: ${seconds}s on tests/fuzz/${target}_corpus:" \
    "$(grep -E "^#[0-9]+ +DONE" "$build/fuzz_$target.log" || tail -1 "$build/fuzz_$target.log")"
  rm -rf "$work"
}

pids=()
for target in npy attend_options; do
  fuzz "$target" &
  pids+=($!)
done
wait_all "${pids[@]}"
echo "fuzz: 2 passed, 0 failed"
