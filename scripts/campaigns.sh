#!/usr/bin/env bash
# Runs the ViT evidence campaigns in the background, one worker per core (pinned, normal
# priority), resumably: a finished run is skipped, an interrupted one resumes from its
# checkpoint, and the workers share runs through their claims
# (python/subquad/experiments/README.md). Every run below finished on 2026-12-06 and its
# records are committed, so on a clone this only rebuilds the WildCat swap page from
# them; it reruns a campaign whose records under runs/experiments/ are removed (commit
# them as results arrive).
#   scripts/campaigns.sh   # after scripts/test.sh (or an in-place build of the extension)
# Both cores take the ViT queue below in order (the workers share runs through their
# claims); core 0 then runs the WildCat swap study on its models. Logs:
# runs/logs/worker<core>.log. (The KV-press study is complete; a rerun of it is
# `python -m subquad.kvstudy run configs/kvstudy/study.toml --share K/2` on each core.)
set -euo pipefail
cd "$(dirname "$0")/.."

python=.venv/bin/python
[ -x "$python" ] || { echo "campaigns.sh: run scripts/install.sh first" >&2; exit 2; }
# The tree's package when its extension is built in place, else the one installed in .venv.
if compgen -G "python/subquad/_core*.so" >/dev/null; then export PYTHONPATH=$PWD/python; fi
"$python" -c "import subquad._core" 2>/dev/null ||
  { echo "campaigns.sh: subquad is not built (scripts/test.sh installs it into .venv)" >&2
    exit 2; }

queue=(vit_avgpool_protocol vit_cls_protocol ca_deit_protocol vit_p2_protocol)
files() { for name in "$@"; do printf 'configs/experiments/%s.toml ' "$name"; done; }

mkdir -p runs/logs
run_experiments="$python -m subquad.experiments.run"
nohup taskset -c 1 bash -c "$run_experiments $(files "${queue[@]}")" \
  >>runs/logs/worker1.log 2>&1 &
worker1=$!
# The WildCat swap study reads vit_p2_protocol's finished models (one process, core 0). It
# skips a source run still training on core 1, so it runs again once worker 1 is done: the
# seeds already measured are read back, the rest measured, and the page rebuilt whole.
swap="$python -m subquad.experiments.wildcat_swap configs/experiments/wildcat_vit_protocol.toml"
nohup taskset -c 0 bash -c "$run_experiments $(files "${queue[@]}") && { $swap || true; } &&
  while kill -0 $worker1 2>/dev/null; do sleep 60; done && $swap" \
  >>runs/logs/worker0.log 2>&1 &
echo "campaigns.sh: workers started on cores 0 and 1 (runs/logs/worker0.log, worker1.log)"
