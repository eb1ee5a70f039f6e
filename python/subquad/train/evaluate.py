"""Scores a trained run without retraining: its configuration, tokeniser and weights come
from a checkpoint (a run directory's checkpoint.safetensors, or a model-only file committed
next to a results page); the metrics are those of the whole split, or of any text file for
the language families."""

import copy
import json
import os
from typing import Dict, Optional

import torch

from ..data.errors import DataError
from . import checkpoint
from .config import DRAWN_FAMILIES, ConfigError, resolve
from .loop import CHECKPOINT, autocast_context
from .tasks import LanguageTask, make_task


def checkpoint_path(path: str) -> str:
    """`path` itself, or the checkpoint inside the run directory `path`."""
    if os.path.isdir(path):
        path = os.path.join(path, CHECKPOINT)
    if not os.path.isfile(path):
        raise ConfigError(f"--evaluate: {path} not found (expected a run directory holding "
                          f"{CHECKPOINT}, or a .safetensors checkpoint)")
    return path


def load_run(path: str):
    """(task, step) of the checkpoint at `path`: the task built from the saved
    configuration (evaluating whole splits) with the saved weights loaded."""
    path = checkpoint_path(path)
    metadata = checkpoint.read_metadata(path)  # CheckpointError naming the file
    config = copy.deepcopy(json.loads(metadata["config"]))
    state = json.loads(metadata["task_state"])
    try:
        if config["run"]["family"] not in DRAWN_FAMILIES:
            config["train"]["eval_batches"] = 0  # the whole split
    except (KeyError, TypeError) as error:
        raise DataError(f"{path}: not a subquad-train checkpoint (its configuration has no "
                        f"{error})") from None
    config = resolve(config)
    torch.set_num_threads(config["run"]["threads"])
    task = make_task(config, state)
    step, _ = checkpoint.load(path, task.model, None)
    task.model.eval()
    return task, step


def evaluate(path: str, split: str = "validation", text: Optional[str] = None
             ) -> Dict[str, float]:
    """Metrics of the run at `path` on `split`, or on the UTF-8 text file `text`."""
    task, step = load_run(path)
    with autocast_context(task.config["train"]["precision"]), torch.no_grad():
        if text is None:
            result = task.evaluate(split)
        elif not isinstance(task, LanguageTask):
            raise ConfigError(f"--text: only the language families (lm, mlm) score a text "
                              f"file; this run is {task.config['run']['family']!r}")
        else:
            try:
                with open(text, encoding="utf-8") as file:
                    content = file.read()
            except FileNotFoundError:
                raise ConfigError(f"--text: {text} not found") from None
            except OSError as error:
                raise ConfigError(f"--text: cannot read {text} ({error.strerror})") from None
            except UnicodeDecodeError as error:
                raise DataError(f"--text: {text} is not UTF-8 text ({error})") from None
            result = task.score(task.tokenizer.encode(content))
    return {"step": step, **result}
