"""The KV-press study of issue 31 (part 4): CompressKV and uniform Nystrom among kvpress's
presses on a real model, scored on key tokens (LongPPL's selection), plain ΔNLL and KL, and
retrieval in natural haystacks (needle, RULER-style multi-key, multi-value, variable
tracking); pre-registered in a TOML file, run resumably, reported with a primary comparison
and Holm-corrected secondaries. N processes with --share 0/N ... N-1/N (one per core) run
one study together, each on its own documents and tasks.

    python -m subquad.kvstudy run configs/kvstudy/pilot.toml [--share K/N]
    python -m subquad.kvstudy report configs/kvstudy/pilot.toml \
        --page docs/results/kv-press-study.md

Modules: presses (the registry and settings grids), replay (one prefill, every press),
lm (the metrics), tasks (retrieval tasks), texts, config, store (the records), runner,
stats (stratified paired intervals, Holm), report, model (SmolLM2 from the GGUF).
"""

from .._optional import require

require("subquad.kvstudy", "kvpress", ["torch", "transformers", "kvpress", "scipy"])
