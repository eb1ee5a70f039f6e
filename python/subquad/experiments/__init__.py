"""The papers' central comparisons at small scale on real data: experiment files
(configs/experiments/*.toml) of variants x seeds, a resumable runner (run.py), the results
pages' tables and plots (report.py), and the inference-time WildCat swap
(wildcat_swap.py). See docs/results/README.md."""

from .spec import Experiment, Variant, load_experiment

__all__ = ["Experiment", "Variant", "load_experiment"]
