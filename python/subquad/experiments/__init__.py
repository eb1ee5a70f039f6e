"""The papers' central comparisons at small scale on real data: experiment files
(configs/experiments/*.toml) of variants x seeds, a resumable runner (run.py), the results
pages' tables and plots (report.py), and the inference-time WildCat swap
(wildcat_swap.py, with its Performer-style baseline in performer.py). See
docs/results/README.md."""

import sys

from .._optional import require

require("subquad.experiments", "experiments", ["torch", "safetensors", "matplotlib", "scipy"]
        + (["tomli"] if sys.version_info < (3, 11) else []))

from .spec import Experiment, Variant, load_experiment

__all__ = ["Experiment", "Variant", "load_experiment"]
