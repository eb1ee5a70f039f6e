#!/usr/bin/env bash
# Runs the evidence campaigns still open, in the background, one worker per core (pinned,
# normal priority), resumably: a finished run is skipped, an interrupted one resumes from
# its checkpoint, and the workers share runs through their claims
# (python/subquad/experiments/README.md). Start it again in every session until the pages
# are done; commit runs/experiments/ and runs/kvstudy/ as results arrive.
#   scripts/campaigns.sh   # after scripts/test.sh (or an in-place build of the extension)
# Both cores first share the KV-press study (subquad.kvstudy --share K/2: each takes every
# other document and task), then take the ViT queue below in order; core 0 then runs the
# WildCat swap study on its models. Logs: runs/logs/worker<core>.log.
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
kvstudy="$python -m subquad.kvstudy run configs/kvstudy/study.toml"
# The WildCat swap study reads vit_p2_protocol's finished models (one process, core 0).
nohup taskset -c 0 bash -c "$kvstudy --share 0/2 && $run_experiments $(files "${queue[@]}") &&
  $python -m subquad.experiments.wildcat_swap configs/experiments/wildcat_vit_protocol.toml" \
  >>runs/logs/worker0.log 2>&1 &
nohup taskset -c 1 bash -c "$kvstudy --share 1/2 && $run_experiments $(files "${queue[@]}")" \
  >>runs/logs/worker1.log 2>&1 &
echo "campaigns.sh: workers started on cores 0 and 1 (runs/logs/worker0.log, worker1.log)"
