#!/usr/bin/env bash
# Sets everything up, builds the subquad CLI (Release, -march=native), captures the SmolLM2
# workload when it is missing (so that the approximation rows are measured on real
# attention), runs `subquad bench` with no options (or with the options given to this
# script), then writes its report: a summary after the table, and plots
# (scripts/bench_report.py, from bench.csv).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target subquad_cli

# The options that decide whether the bench reads the default workload folder, and where
# it writes (`--name value` or `--name=value`, as the CLI parses them).
out_dir=bench-out
uses_workload=1
previous=
for arg in "$@"; do
  case "$previous" in
    --out-dir) out_dir=$arg ;;
    --inputs) [ "$arg" = gaussian ] && uses_workload=0 ;;
  esac
  case "$arg" in
    --out-dir=*) out_dir=${arg#--out-dir=} ;;
    --help | -h) exec build/subquad bench "$@" ;;
    --inputs=gaussian | --workload | --workload=* | --shapes | --shapes=* | --batch | --batch=*)
      uses_workload=0 ;;
  esac
  previous=$arg
done

# The folder `subquad bench` reads by default, resolved in its order (cli/bench_inputs.cpp,
# subquad.llm.attention_workload.default_workload_dir).
workload=${SUBQUAD_WORKLOAD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/subquad/smollm2}

capture_workload() {
  # subquad.llm runs the model on subquad's own kernels: it needs the Python package, built
  # in the tree above (only the bindings compile, against the libraries the CLI links).
  if ! .venv/bin/python -c "import subquad.llm" 2>/dev/null; then
    echo "bench.sh: building the Python package for the capture (once)"
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation \
      --config-settings=build-dir=build \
      --config-settings=cmake.define.SUBQUAD_BUILD_TESTS=ON \
      --config-settings=cmake.define.SUBQUAD_BUILD_BENCHMARKS=ON \
      --config-settings=cmake.define.SUBQUAD_BUILD_CLI=ON . || return 1
  fi
  echo "bench.sh: capturing the attention inputs of SmolLM2-135M on real text into $workload"
  echo "bench.sh: (once, about a minute on one core; the approximation rows are measured on it)"
  .venv/bin/python -m subquad.llm.cli capture --out "$workload" >/dev/null
}

# The manifest is written last: without it the capture is missing, was interrupted or
# predates manifests, and the bench would refuse it.
if [ "$uses_workload" = 1 ] && [ ! -f "$workload/manifest.txt" ]; then
  capture_workload ||
    echo "bench.sh: the capture failed; the approximation rows run on Gaussian inputs"
fi
build/subquad bench "$@"
.venv/bin/python scripts/bench_report.py "$out_dir/bench.csv"
