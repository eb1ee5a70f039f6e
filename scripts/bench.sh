#!/usr/bin/env bash
# Sets everything up, builds the subquad CLI (Release, -march=native) and runs its default
# comparison: `subquad bench` with no options, or with the options given to this script.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target subquad_cli
exec build/subquad bench "$@"
