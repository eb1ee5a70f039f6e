"""subquad.train: the trainer behind the subquad-train console script.

load(path, overrides) -> a checked config (config.SCHEMA); Trainer(config, resume).run()
trains it (AdamW, warm-up + cosine, clipping, bf16 autocast, safetensors checkpoints with
bit-identical resume, evaluation, early stopping, metrics.jsonl / metrics.csv, loss.png).
"""

import sys

from .._optional import require

require("subquad.train", "train", ["torch", "safetensors", "matplotlib"]
        + (["tomli"] if sys.version_info < (3, 11) else []))

from .config import FAMILIES, SCHEMA, ConfigError, load, resolve
from .loop import Trainer, learning_rate

__all__ = ["FAMILIES", "SCHEMA", "ConfigError", "load", "resolve", "Trainer", "learning_rate"]
