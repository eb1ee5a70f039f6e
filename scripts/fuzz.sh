#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/*.cpp: the .npy loader, attend's option parsing)
# with clang under address and undefined-behaviour sanitizers and runs each for a bounded
# time on its corpus in tests/fuzz/ (new inputs go to a temporary folder, never into the
# repo). A finding stops with the crashing input saved under the build folder: add it to the
# corpus and turn it into a regression test.
# Usage: scripts/fuzz.sh [BUILD_DIR] (FUZZ_SECONDS per target, default 25)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-fuzz}
seconds=${FUZZ_SECONDS:-25}
mkdir -p "$build"
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -Iinclude -Icli -Werror -Wall -Wextra)
clang++ "${flags[@]}" tests/fuzz/fuzz_npy.cpp src/common/npy.cpp -o "$build/fuzz_npy"
clang++ "${flags[@]}" tests/fuzz/fuzz_attend_options.cpp cli/options.cpp src/common/npy.cpp \
  -o "$build/fuzz_attend_options"
for target in npy attend_options; do
  work=$(mktemp -d)
  echo "fuzz_$target: ${seconds}s on tests/fuzz/${target}_corpus"
  "$build/fuzz_$target" "$work" "tests/fuzz/${target}_corpus" -max_total_time="$seconds" \
    -max_len=4096 -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$build/crash_${target}_" \
    -print_final_stats=0 2>"$build/fuzz_$target.log" ||
    { tail -40 "$build/fuzz_$target.log"; rm -rf "$work"; exit 1; }
  grep -E "^#[0-9]+ +DONE" "$build/fuzz_$target.log" || tail -2 "$build/fuzz_$target.log"
  rm -rf "$work"
done
echo "fuzz: 2 passed, 0 failed"
