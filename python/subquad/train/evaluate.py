"""Scores a trained run without retraining: its configuration, tokeniser and weights come
from a checkpoint (a run directory's checkpoint.safetensors, or a model-only file committed
next to a results page); the metrics are those of the whole split, or of any text file for
the language families. A run with early stopping (train.patience > 0) is scored with its
best evaluation's weights, the ones it reports, and says so (weights=best)."""

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


def load_run(path: str, best: bool = True):
    """(task, step) of the checkpoint at `path`: the task built from the saved
    configuration (evaluating whole splits) with the saved weights loaded; with best (and
    a checkpoint of a run with early stopping) the best evaluation's weights, step then
    being theirs."""
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
    step = load_weights(path, task.model, best)
    task.model.eval()
    return task, step


def load_weights(path: str, model, best: bool = True) -> int:
    """Loads the weights of the checkpoint at `path` into `model` and returns their step:
    with best (and a run with early stopping) its best evaluation's, the ones it reports;
    else the last saved."""
    step, _ = checkpoint.load(path, model, None)
    stopping = checkpoint.early_stopping(checkpoint.read_metadata(path))
    if best and stopping is not None and stopping["best_step"] is not None:
        weights = checkpoint.best_weights(path)
        if weights is not None:  # a run's checkpoint (an exported file holds only the best)
            model.load_state_dict(weights, strict=True)
            step = stopping["best_step"]
    return step


def weights_note(path: str, step: int) -> Dict[str, object]:
    """For a run with early stopping: {"weights": "best" (its best evaluation's) or "last"
    (no evaluation yet), and "early_stop_at": the step patience ended it at, if it did};
    {} for other runs."""
    stopping = checkpoint.early_stopping(checkpoint.read_metadata(checkpoint_path(path)))
    if stopping is None:
        return {}
    note = {"weights": "best" if step == stopping["best_step"] else "last"}
    if stopping["stopped_at"] is not None:
        note["early_stop_at"] = stopping["stopped_at"]
    return note


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
    return {"step": step, **weights_note(path, step), **result}
