#!/usr/bin/env bash
# Sets everything up and runs the whole test suite: a Release build with warnings as
# errors and its ctest suite (unit tests and CLI end to end), a project built against the
# installed package, the same unit tests under address and undefined-behaviour sanitizers,
# then the Python package (installed, and as a wheel) and its tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# Where the time goes: `phase NAME` ends the running phase, printing its wall seconds and the
# CPU seconds (user + system) of the processes it ran, and starts NAME; `phase` alone ends.
ticks=$(getconf CLK_TCK)
phase() {
  local stat cpu
  read -r -a stat </proc/$$/stat  # fields 16, 17: CPU ticks of the finished children
  cpu=$((stat[15] + stat[16]))
  if [ -n "${phase_name:-}" ]; then
    printf 'test.sh: %-16s %5d s wall %6d s cpu\n' "$phase_name" $((SECONDS - phase_began)) \
      $(((cpu - phase_cpu) / ticks))
  fi
  phase_name=${1:-} phase_began=$SECONDS phase_cpu=$cpu
}

phase install
scripts/install.sh

jobs=$(nproc)
phase build
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSUBQUAD_WERROR=ON >/dev/null
cmake --build build -j "$jobs"
phase ctest
ctest --test-dir build -j "$jobs" --output-on-failure --timeout 600

# The installed C++ package, used by a project outside the tree (examples/consumer).
phase consumer
rm -rf build/install build/consumer
cmake --install build --prefix build/install --component development >/dev/null
cmake -S examples/consumer -B build/consumer -G Ninja \
  -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/consumer
build/consumer/subquad_consumer

# Sanitizers: unit tests only (no benchmarks, no CLI); -O1 keeps them quick to build and run,
# -g1 (line tables: a report's stack names file and line) compiles faster than -g.
phase sanitize-build
cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DSUBQUAD_SANITIZE=ON -DSUBQUAD_WERROR=ON \
  -DSUBQUAD_BUILD_BENCHMARKS=OFF -DSUBQUAD_BUILD_CLI=OFF >/dev/null
cmake --build build-sanitize -j "$jobs"
phase sanitize-ctest
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-sanitize -j "$jobs" --output-on-failure --timeout 900

# libFuzzer targets (the .npy loader, attend's option parsing), 25 s each, side by side.
phase fuzz
FUZZ_SECONDS=25 scripts/fuzz.sh build-fuzz

if [ -f pyproject.toml ]; then
  # The package built in the Release tree above, configured as it was (pyproject.toml's
  # defines for a standalone build overridden): only the bindings compile, against the
  # libraries the C++ tests ran. A user's `pip install .` keeps its own tree, build-python/.
  python_tree=(--config-settings=build-dir=build
               --config-settings=cmake.define.SUBQUAD_BUILD_TESTS=ON
               --config-settings=cmake.define.SUBQUAD_BUILD_BENCHMARKS=ON
               --config-settings=cmake.define.SUBQUAD_BUILD_CLI=ON)
  phase pip-install
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation \
    "${python_tree[@]}" .
  phase wheel
  WHEEL_ARGS="${python_tree[*]}" scripts/check_wheel.sh build/wheel  # the same tree: seconds
  phase pytest
  .venv/bin/python -m pytest -q python/tests
fi
phase
