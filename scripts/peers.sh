#!/usr/bin/env bash
# Peer benchmarks: subquad against PyTorch 2.x (SDPA, torch.fft) and scipy.fft, one thread,
# same process, interleaved (benchmarks/peers/README.md). Sets up .venv (scripts/install.sh:
# PyTorch 2.15, SciPy and ducc0 are in requirements/main.txt), installs subquad into it
# from the build folder build-peers/, then runs what is asked:
#   scripts/peers.sh [--no-build] [--quick] [exact] [cat] [circulant2d]
# With no name it runs all three. They write docs/results/peers/*.csv and the "Peer
# benchmark" section of docs/perf/<family>.md. --no-build skips reinstalling subquad;
# --quick runs a few small points (smoke test). PEERS_CPU picks the core the benchmarks
# are pinned to (default 0).
# Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

build=1
quick=()
targets=()
for argument in "$@"; do
  case "$argument" in
    --no-build) build=0 ;;
    --quick) quick=(--quick) ;;
    exact | cat | circulant2d) targets+=("$argument") ;;
    *)
      echo "peers.sh: unknown argument '$argument' (expected --no-build, --quick, exact, cat" \
        "or circulant2d)" >&2
      exit 2
      ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(exact cat circulant2d)

python=.venv/bin/python
if [ "$build" -eq 1 ]; then
  scripts/install.sh # the compilers, FFTW, oneDNN and the Python environment
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$python" -m pip install -q --disable-pip-version-check \
    --no-build-isolation --no-deps --config-settings=build-dir=build-peers .
  # What was built, for the benchmarks' tables: the commit, and whether the sources differed.
  {
    git rev-parse --short=12 HEAD
    git status --porcelain -- src include python cmake CMakeLists.txt | grep -q . &&
      echo "plus uncommitted changes to the sources"
  } | paste -sd' ' >.venv/subquad-build-commit || true
elif [ ! -x "$python" ]; then
  echo "peers.sh: .venv does not exist; run without --no-build first" >&2
  exit 1
fi

# One thread everywhere, on one core: the figures are single-thread ones.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
pin=(taskset -c "${PEERS_CPU:-0}")
for target in "${targets[@]}"; do
  case "$target" in
    exact) "${pin[@]}" "$python" benchmarks/peers/exact_vs_sdpa.py "${quick[@]}" ;;
    cat) "${pin[@]}" "$python" benchmarks/peers/cat_vs_fft.py "${quick[@]}" ;;
    circulant2d) "${pin[@]}" "$python" benchmarks/peers/circulant2d_vs_torch.py "${quick[@]}" ;;
  esac
done
