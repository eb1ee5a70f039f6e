"""Early stopping (train.patience): a run ends when its validation loss has not improved on
its best for `patience` consecutive evaluations, and the best evaluation's weights are the
ones it reports. The state is small and kept in the checkpoint, so a resumed run decides
exactly as an uninterrupted one."""

import math
from typing import Dict, Optional

import torch
from torch import nn


class EarlyStopping:
    """The best validation loss so far, its step and weights, and the evaluations since.
    state() / EarlyStopping(patience, state) carry it through a checkpoint (the weights
    travel as the checkpoint's best.* tensors)."""

    def __init__(self, patience: int, state: Optional[Dict] = None,
                 weights: Optional[Dict[str, torch.Tensor]] = None):
        state = state or {}
        self.patience = patience
        self.best_loss: Optional[float] = state.get("best_loss")
        self.best_step: Optional[int] = state.get("best_step")
        self.since: int = state.get("since", 0)  # evaluations since the best
        self.stopped_at: Optional[int] = state.get("stopped_at")  # None: not stopped early
        self.weights = weights

    @property
    def enabled(self) -> bool:
        return self.patience > 0

    def state(self) -> Dict:
        """JSON-able (a float's repr round-trips exactly, so a resumed run compares the
        same numbers)."""
        return {"patience": self.patience, "best_loss": self.best_loss,
                "best_step": self.best_step, "since": self.since,
                "stopped_at": self.stopped_at}

    def update(self, step: int, loss: float, model: nn.Module) -> bool:
        """Records the evaluation after `step`; True when patience is exhausted. A loss
        that is not finite never becomes the best."""
        if math.isfinite(loss) and (self.best_loss is None or loss < self.best_loss):
            self.best_loss, self.best_step, self.since = loss, step, 0
            self.weights = {name: tensor.detach().clone()
                            for name, tensor in model.state_dict().items()}
        else:
            self.since += 1
        return self.since >= self.patience

    def restore(self, model: nn.Module) -> Optional[int]:
        """Loads the best weights into `model`; their step (None: no finite evaluation
        yet, the model keeps its weights)."""
        if self.weights is None:
            return None
        model.load_state_dict(self.weights, strict=True)
        return self.best_step

    def summary(self, steps_trained: int) -> Dict:
        """What a run's result records: whether early stopping ended it, the step of the
        weights it reports and the step its training ended at."""
        return {"patience": self.patience, "stopped_early": self.stopped_at is not None,
                "best_step": self.best_step, "best_loss": self.best_loss,
                "stopped_at": steps_trained}
