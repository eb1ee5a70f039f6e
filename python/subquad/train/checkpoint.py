"""Checkpoints in safetensors: the model's tensors, AdamW's state and, as metadata, the
step, the configuration, the optimizer's hyper-parameters and the task's text state (a
trained tokeniser); with early stopping also the best evaluation's weights and the
stopping state. Tied weights are stored once and re-tied on load."""

import json
import os
from typing import Dict, Optional, Tuple

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from ..data.errors import DataError
from .rundir import RunFileError

MODEL, OPTIMIZER, BEST = "model.", "optimizer.", "best."
PARTIAL = ".partial"  # the file a checkpoint is written to before it replaces the last
METADATA = ("step", "config", "param_groups", "aliases", "task_state")


class CheckpointError(DataError):
    """A checkpoint that cannot be read or does not fit; the message names the file."""


def save(path: str, model: nn.Module, optimizer: Optional[torch.optim.Optimizer], step: int,
         config: Dict, task_state: Dict[str, str], clock: Optional[Dict] = None,
         best: Optional[Dict[str, torch.Tensor]] = None,
         stopping: Optional[Dict] = None) -> None:
    """Writes the checkpoint atomically; optimizer None writes the model alone (the files
    committed next to results pages); clock: the run's cumulative CPU and wall seconds;
    best: the best evaluation's weights (a state dict, kept beside the model's); stopping:
    the early-stopping state (loop.EarlyStopping.state())."""
    tensors, aliases, owners = {}, {}, {}
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if key in owners:  # a tied weight: stored under its first name only
            aliases[name] = owners[key]
            continue
        owners[key] = name
        tensors[MODEL + name] = tensor.detach().contiguous()
    for name, tensor in (best or {}).items():
        if name not in aliases:
            tensors[BEST + name] = tensor.detach().contiguous()
    state = optimizer.state_dict() if optimizer is not None else {"state": {},
                                                                   "param_groups": []}
    for index, values in state["state"].items():
        for field, value in values.items():
            value = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"{OPTIMIZER}{index}.{field}"] = value.detach().contiguous()
    metadata = {
        "step": str(step),
        "config": json.dumps(config),
        "param_groups": json.dumps(state["param_groups"]),
        "aliases": json.dumps(aliases),
        "task_state": json.dumps(task_state),
        "clock": json.dumps(clock or {}),
    }
    if stopping is not None:
        metadata["early_stopping"] = json.dumps(stopping)
    temporary = path + PARTIAL
    try:
        save_file(tensors, temporary, metadata=metadata)
        os.replace(temporary, path)  # never a half-written checkpoint under the real name
    except (OSError, SafetensorError) as error:
        if os.path.lexists(temporary):
            os.remove(temporary)
        reason = error if isinstance(error, OSError) else OSError(None, _reason(error))
        raise RunFileError(path, "write it", reason) from None


def _reason(error: Exception) -> str:
    """A safetensors error's cause in words (its I/O errors carry the OS's message)."""
    text = str(error)
    if "No space left on device" in text:
        return "No space left on device"
    return text


def read_metadata(path: str) -> Dict[str, str]:
    """The checkpoint's metadata; CheckpointError (naming `path`) for a file that is not a
    whole subquad-train checkpoint (truncated, another format, a directory)."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as file:
            metadata = file.metadata() or {}
        missing = [key for key in METADATA if key not in metadata]
        if missing:
            raise ValueError(f"no {', '.join(missing)} in its metadata")
        for key in METADATA[1:]:
            json.loads(metadata[key])
        int(metadata["step"])
    except (OSError, ValueError, SafetensorError) as error:
        raise CheckpointError(f"{path}: not a subquad-train checkpoint, or not a whole one "
                              f"({error})") from None
    return metadata


def same_contents(first: str, second: str) -> bool:
    """Whether two checkpoint files hold the same tensors and metadata. Their bytes can
    differ all the same: safetensors writes the metadata's keys in a random order."""
    from safetensors import safe_open

    with safe_open(first, framework="pt") as one, safe_open(second, framework="pt") as other:
        if one.metadata() != other.metadata() or set(one.keys()) != set(other.keys()):
            return False
        return all(_identical(one.get_tensor(name), other.get_tensor(name))
                   for name in one.keys())


def _identical(first: torch.Tensor, second: torch.Tensor) -> bool:
    return (first.dtype == second.dtype and first.shape == second.shape
            and torch.equal(first, second))


def early_stopping(metadata: Dict[str, str]) -> Optional[Dict]:
    """The early-stopping state in a checkpoint's metadata (None: the run had none)."""
    return json.loads(metadata["early_stopping"]) if "early_stopping" in metadata else None


def best_weights(path: str) -> Optional[Dict[str, torch.Tensor]]:
    """The best evaluation's weights kept in the checkpoint at `path` (a state dict, tied
    names filled in); None when it keeps none."""
    try:
        metadata = read_metadata(path)
        tensors = load_file(path)
    except (OSError, SafetensorError) as error:
        raise CheckpointError(f"{path}: its tensors cannot be read ({error})") from None
    best = {name[len(BEST):]: t for name, t in tensors.items() if name.startswith(BEST)}
    if not best:
        return None
    for alias, owner in json.loads(metadata["aliases"]).items():
        best[alias] = best[owner]
    return best


def load(path: str, model: nn.Module,
         optimizer: Optional[torch.optim.Optimizer]) -> Tuple[int, Dict]:
    """Restores model (and optimizer, unless None) from `path`; returns (step, task_state).
    CheckpointError naming `path` when it cannot be read or its tensors do not fit."""
    try:
        return _load(path, model, optimizer)
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as error:
        if isinstance(error, CheckpointError):
            raise
        raise CheckpointError(f"{path}: its tensors cannot be read or do not fit the model "
                              f"of its configuration ({error})") from None


def _load(path: str, model: nn.Module,
          optimizer: Optional[torch.optim.Optimizer]) -> Tuple[int, Dict]:
    metadata = read_metadata(path)
    tensors = load_file(path)
    model_state = {name[len(MODEL):]: t for name, t in tensors.items() if name.startswith(MODEL)}
    for alias, owner in json.loads(metadata["aliases"]).items():
        model_state[alias] = model_state[owner]
    model.load_state_dict(model_state, strict=True)
    if optimizer is None:
        return int(metadata["step"]), json.loads(metadata["task_state"])
    optimizer_state: Dict[int, Dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        if name.startswith(OPTIMIZER):
            index, field = name[len(OPTIMIZER):].split(".", 1)
            optimizer_state.setdefault(int(index), {})[field] = tensor
    optimizer.load_state_dict({"state": optimizer_state,
                               "param_groups": json.loads(metadata["param_groups"])})
    return int(metadata["step"]), json.loads(metadata["task_state"])
