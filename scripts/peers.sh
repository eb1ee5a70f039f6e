#!/usr/bin/env bash
# Peer benchmarks: subquad against PyTorch 2.x (SDPA, torch.fft) and scipy.fft, one thread,
# same process, interleaved (benchmarks/peers/README.md). Creates the separate environment
# .venv-peers (Debian's python3 with PyTorch from PyPI, whose nvidia-* wheels make it about
# 5 GB: that is why it is not the test environment), installs subquad into it from its own
# build folder build-peers/, then runs what is asked:
#   scripts/peers.sh [--no-build] [--quick] [exact] [cat] [circulant2d] [tests]
# With no name it runs all four. exact, cat and circulant2d write docs/results/peers/*.csv
# and the "Peer benchmark" section of docs/perf/<family>.md; tests runs the Python test
# suite on PyTorch 2.x. --no-build skips reinstalling subquad; --quick runs a few small
# points (smoke test). PEERS_CPU picks the core the benchmarks are pinned to (default 0).
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
    exact | cat | circulant2d | tests) targets+=("$argument") ;;
    *)
      echo "peers.sh: unknown argument '$argument' (expected --no-build, --quick, exact, cat," \
        "circulant2d or tests)" >&2
      exit 2
      ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(exact cat circulant2d tests)

python=.venv-peers/bin/python
if [ "$build" -eq 1 ]; then
  scripts/install.sh # Debian's compilers, FFTW, oneDNN: what building subquad needs
  # Debian's python 3.11 without its site packages (Debian's torch 1.13 and NumPy stay out).
  [ -x "$python" ] || /usr/bin/python3 -m venv .venv-peers
  "$python" -m pip install -q --disable-pip-version-check \
    "torch==2.15.0" "numpy==2.4.6" "scipy==1.17.1" "ducc0==0.42.0" "pytest==9.2.0" \
    "nanobind==3.1.0" "scikit-build-core==1.1.2" \
    "tokenizers==0.20.3" "safetensors==0.4.5" "gguf==0.19.0" "matplotlib==3.10.3" # tests
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$python" -m pip install -q --disable-pip-version-check \
    --no-build-isolation --no-deps --config-settings=build-dir=build-peers .
  # What was built, for the benchmarks' tables: the commit, and whether the sources differed.
  {
    git rev-parse --short=12 HEAD
    git status --porcelain -- src include python cmake CMakeLists.txt | grep -q . &&
      echo "plus uncommitted changes to the sources"
  } | paste -sd' ' >.venv-peers/subquad-build-commit || true
elif [ ! -x "$python" ]; then
  echo "peers.sh: .venv-peers does not exist; run without --no-build first" >&2
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
    tests) "$python" -m pytest -q python/tests ;;
  esac
done
