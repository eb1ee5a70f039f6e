"""The in-context regression transformer of Garg et al. (2022): x and y tokens
interleaved (x_1, y_1, ..., x_n, y_n), a causal transformer, and the prediction of y_i
read at x_i's position, which sees the pairs before it but not y_i."""

from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from .blocks import attention_names, blocks, expand_pattern, initialise


def interleave(xs: Tensor, ys: Tensor) -> Tensor:
    """xs [B, n, d], ys [B, n] -> tokens [B, 2n, d]: x_i, then (y_i, 0, ..., 0)."""
    B, n, d = xs.shape
    y_tokens = torch.zeros_like(xs)
    y_tokens[:, :, 0] = ys
    return torch.stack([xs, y_tokens], dim=2).reshape(B, 2 * n, d)


class InContextRegressor(nn.Module):
    """(xs [B, n, dims], ys [B, n]) -> predictions [B, n] of each y_i from x_i and the
    pairs before it. InContextRegressor(dims, max_points, dim, heads, layers,
    attention="exact", pattern=None, mlp_ratio=4, attention_options=None, mup=False,
    attention_scale=None)."""

    def __init__(self, dims: int, max_points: int, dim: int = 128, heads: int = 4,
                 layers: int = 4, attention: str = "exact",
                 pattern: Optional[Sequence[str]] = None, mlp_ratio: float = 4.0,
                 attention_options=None, mup: bool = False,
                 attention_scale: Optional[float] = None):
        super().__init__()
        if dims < 1 or max_points < 1:
            raise ValueError(f"dims and max_points: expected >= 1, got {dims}, {max_points}")
        self.dims, self.max_points = dims, max_points
        self.pattern = expand_pattern(attention, pattern, layers)
        self.read_in = nn.Linear(dims, dim)
        self.positions = nn.Embedding(2 * max_points, dim)
        self.blocks = blocks(dim, heads, self.pattern, causal=True, mlp_ratio=mlp_ratio,
                             options=attention_options, mup=mup, scale=attention_scale)
        self.norm = nn.LayerNorm(dim)
        self.read_out = nn.Linear(dim, 1)
        initialise(self, mup, self.read_out)

    def attention_counts(self):
        return attention_names(self)

    def forward(self, xs: Tensor, ys: Tensor) -> Tensor:
        if xs.dim() != 3 or xs.shape[-1] != self.dims or tuple(ys.shape) != tuple(xs.shape[:2]):
            raise ValueError(f"xs, ys: expected [B, n, {self.dims}] and [B, n], got "
                             f"{list(xs.shape)} and {list(ys.shape)}")
        if xs.shape[1] > self.max_points:
            raise ValueError(f"xs: {xs.shape[1]} points, max_points is {self.max_points}")
        tokens = interleave(xs, ys)  # [B, 2n, dims]
        x = self.read_in(tokens) + self.positions(torch.arange(tokens.shape[1],
                                                               device=xs.device))
        for block in self.blocks:
            x, _ = block(x)
        return self.read_out(self.norm(x))[:, 0::2, 0]  # at the x positions: [B, n]
