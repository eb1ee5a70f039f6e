#!/usr/bin/env bash
# `pip wheel .` builds an installable wheel. Run after `pip install .`: both use the CMake tree
# of pyproject.toml's build-dir, so the wheel only relinks and packs (seconds). The wheel is
# unpacked into a temporary folder and imported from there (not from the source tree), and
# one operator runs from it.
# Usage: scripts/check_wheel.sh [OUT_DIR] (default build/wheel); extra pip arguments in
# $WHEEL_ARGS (e.g. --config-settings=build-dir=DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/wheel}
rm -rf "$out"
# shellcheck disable=SC2086
.venv/bin/python -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps \
  -w "$out" ${WHEEL_ARGS:-} .
wheel=$(ls "$out"/subquad-*.whl)
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
.venv/bin/python -m zipfile -e "$wheel" "$unpacked"
(cd "$unpacked" && PYTHONPATH="$unpacked" "$OLDPWD/.venv/bin/python" - "$unpacked" <<'PY'
import pathlib
import sys

import numpy as np

import subquad
import subquad._core as core

root = pathlib.Path(sys.argv[1])
assert pathlib.Path(core.__file__).resolve().is_relative_to(root), core.__file__
assert (root / "subquad" / "py.typed").exists() and (root / "subquad" / "_core.pyi").exists()
q = np.random.default_rng(0).standard_normal((1, 5, 2, 8)).astype(np.float32)
out, lse = core.exact_attention_forward(q, q, q)
assert out.shape == (1, 5, 2, 8) and np.isfinite(out).all() and np.isfinite(lse).all()
print(f"wheel: subquad imported from the unpacked wheel ({pathlib.Path(subquad.__file__).parent})")
PY
)
echo "wheel: $(basename "$wheel") ok"
