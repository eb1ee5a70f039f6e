"""A patch time-series forecaster in the style of PatchTST (Nie et al. 2023): each channel
is forecast on its own (channel independence); its context window, normalised by its own
mean and deviation, is cut into patches, embedded, run through a bidirectional
transformer, and a linear head maps the patch features to the horizon; trained on MSE."""

from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from .blocks import attention_names, blocks, expand_pattern, initialise

NORM_EPSILON = 1e-5  # guards the per-window deviation of a constant window


class PatchForecaster(nn.Module):
    """inputs [B, context, channels] -> forecasts [B, horizon, channels].

    PatchForecaster(context, horizon, patch, dim, heads, layers, attention="exact",
    pattern=None, mlp_ratio=4, attention_options=None, mup=False, attention_scale=None).
    context must be divisible by patch (non-overlapping patches)."""

    def __init__(self, context: int, horizon: int, patch: int = 16, dim: int = 64,
                 heads: int = 4, layers: int = 2, attention: str = "exact",
                 pattern: Optional[Sequence[str]] = None, mlp_ratio: float = 4.0,
                 attention_options=None, mup: bool = False,
                 attention_scale: Optional[float] = None):
        super().__init__()
        if patch < 1 or context % patch:
            raise ValueError(f"patch: expected a divisor of context = {context}, got {patch}")
        if horizon < 1:
            raise ValueError(f"horizon: expected >= 1, got {horizon}")
        self.context, self.horizon, self.patch = context, horizon, patch
        self.patches = context // patch
        self.pattern = expand_pattern(attention, pattern, layers)
        self.embed = nn.Linear(patch, dim)
        self.positions = nn.Parameter(torch.zeros(1, self.patches, dim))
        self.blocks = blocks(dim, heads, self.pattern, causal=False, mlp_ratio=mlp_ratio,
                             options=attention_options, mup=mup, scale=attention_scale)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(self.patches * dim, horizon)
        initialise(self, mup, self.head)
        nn.init.normal_(self.positions, std=0.02)

    def attention_counts(self):
        return attention_names(self)

    def forward(self, inputs: Tensor) -> Tensor:
        if inputs.dim() != 3 or inputs.shape[1] != self.context:
            raise ValueError(f"inputs: expected [B, context = {self.context}, channels], got "
                             f"{list(inputs.shape)}")
        B, _, C = inputs.shape
        mean = inputs.mean(dim=1, keepdim=True)  # [B, 1, C]
        std = (inputs.var(dim=1, keepdim=True, unbiased=False) + NORM_EPSILON).sqrt()
        series = ((inputs - mean) / std).transpose(1, 2).reshape(B * C, self.patches,
                                                                 self.patch)
        x = self.embed(series) + self.positions  # [B C, P, dim]
        for block in self.blocks:
            x, _ = block(x)
        forecast = self.head(self.norm(x).flatten(1))  # [B C, horizon]
        return forecast.view(B, C, self.horizon).transpose(1, 2) * std + mean
