#!/usr/bin/env bash
# Sets everything up and runs the whole test suite: a Release build with warnings as
# errors and its ctest suite (unit tests and CLI end to end), a project built against the
# installed package, the same unit tests under address and undefined-behaviour sanitizers,
# then the Python package (installed, and as a wheel) and its tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh

jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSUBQUAD_WERROR=ON >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build -j "$jobs" --output-on-failure --timeout 600

# The installed C++ package, used by a project outside the tree (examples/consumer).
rm -rf build/install build/consumer
cmake --install build --prefix build/install --component development >/dev/null
cmake -S examples/consumer -B build/consumer -G Ninja \
  -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/consumer
build/consumer/subquad_consumer

# Sanitizers: unit tests only (no benchmarks, no CLI); -O1 keeps them quick to build and run.
cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DSUBQUAD_SANITIZE=ON -DSUBQUAD_WERROR=ON \
  -DSUBQUAD_BUILD_BENCHMARKS=OFF -DSUBQUAD_BUILD_CLI=OFF >/dev/null
cmake --build build-sanitize -j "$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-sanitize -j "$jobs" --output-on-failure --timeout 900

# libFuzzer targets (the .npy loader, attend's option parsing), about a minute in all.
FUZZ_SECONDS=25 scripts/fuzz.sh build-fuzz

if [ -f pyproject.toml ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation .
  scripts/check_wheel.sh build/wheel  # the same CMake tree as the install: seconds
  .venv/bin/python -m pytest -q python/tests
fi
