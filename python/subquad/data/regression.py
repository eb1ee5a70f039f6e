"""Synthetic in-context linear regression (Garg et al. 2022): each sequence draws its own
w ~ N(0, I_d) and points x_i ~ N(0, I_d), with y_i = w . x_i; a model sees
(x_1, y_1, ..., x_n, y_n) and predicts each y_i from the pairs before it.

The curriculum grows the active dimension and the number of points during training: the
first `active` coordinates of x are drawn, the rest are zero, so one model (built for the
largest dimension) is trained on ever harder problems."""

from dataclasses import dataclass
from typing import Tuple

import torch
from torch import Tensor


@dataclass(frozen=True)
class Curriculum:
    """Active dimension and point count at a training step: both start at `start`,
    grow by `increment` every `interval` steps, and stop at `end` (Garg et al.: dims
    5 -> 20 by 1 every 2000 steps; points 11 -> 41 by 2)."""

    dims_start: int
    dims_end: int
    points_start: int
    points_end: int
    dims_increment: int = 1
    points_increment: int = 2
    interval: int = 2000

    def __post_init__(self):
        if not 1 <= self.dims_start <= self.dims_end:
            raise ValueError(f"curriculum dims: expected 1 <= start <= end, got "
                             f"{self.dims_start}, {self.dims_end}")
        if not 1 <= self.points_start <= self.points_end:
            raise ValueError(f"curriculum points: expected 1 <= start <= end, got "
                             f"{self.points_start}, {self.points_end}")
        if self.interval < 1 or self.dims_increment < 0 or self.points_increment < 0:
            raise ValueError("curriculum: interval must be >= 1 and increments >= 0")

    def at(self, step: int) -> Tuple[int, int]:
        """(active dimension, points) at `step`."""
        stage = step // self.interval
        dims = min(self.dims_start + stage * self.dims_increment, self.dims_end)
        points = min(self.points_start + stage * self.points_increment, self.points_end)
        return dims, points


def sample_linear_regression(batch: int, points: int, dims: int, active: int,
                             generator: torch.Generator) -> Tuple[Tensor, Tensor]:
    """xs float32 [batch, points, dims] (coordinates >= active are zero) and
    ys [batch, points] with ys = xs w, w ~ N(0, I_active) per sequence."""
    if not 1 <= active <= dims:
        raise ValueError(f"active: expected 1..dims = {dims}, got {active}")
    if batch < 1 or points < 1:
        raise ValueError(f"batch and points: expected >= 1, got {batch}, {points}")
    xs = torch.randn(batch, points, dims, generator=generator)
    xs[:, :, active:] = 0
    w = torch.randn(batch, dims, 1, generator=generator)
    w[:, active:] = 0
    ys = (xs @ w).squeeze(-1)
    return xs, ys


def prefix_least_squares(xs: Tensor, ys: Tensor) -> Tensor:
    """xs [B, n, d], ys [B, n] -> [B, n]: each y_i predicted from the pairs before it by
    the minimum-norm least-squares fit (0 for i = 0). Without noise and with w ~ N(0, I)
    that is the posterior mean of w, so this is the best any model can score."""
    if xs.dim() != 3 or tuple(ys.shape) != tuple(xs.shape[:2]):
        raise ValueError(f"xs, ys: expected [B, n, d] and [B, n], got {list(xs.shape)} "
                         f"and {list(ys.shape)}")
    xs64, ys64 = xs.double(), ys.double()
    predictions = torch.zeros_like(ys64)
    for i in range(1, xs.shape[1]):
        w = torch.linalg.pinv(xs64[:, :i]) @ ys64[:, :i, None]  # [B, d, 1]
        predictions[:, i] = (xs64[:, i:i + 1] @ w)[:, 0, 0]
    return predictions.to(ys.dtype)
