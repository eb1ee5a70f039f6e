"""A ViT classifier (Dosovitskiy et al. 2021): patches embedded by a strided convolution,
a class token or average pooling, transformer blocks, a linear head. Layers named
"circulant2d" are CA-DeiT blocks (Han et al. 2026): depthwise-conv position encoding and
gated 2D Circulant Attention on the patch grid, which has no place for a class token."""

from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from ..layers import Circulant2dBlock
from ..layers.registry import accepted_options
from .blocks import attention_names, blocks, check_attention_options, expand_pattern, initialise

CIRCULANT2D = "circulant2d"
POOLS = ("cls", "mean")


class ViTClassifier(nn.Module):
    """images [B, channels, H, W] -> logits [B, classes].

    ViTClassifier(image_size, patch, channels, classes, dim, heads, layers,
    attention="exact", pattern=None, pool="cls" | "mean", mlp_ratio=4,
    attention_options=None, mup=False, attention_scale=None). image_size is an int or
    (H, W), divisible by patch; the grid is (H / patch, W / patch). A model whose layers are
    all circulant2d takes its positions from the blocks' convolutions; any other gets
    learned position embeddings."""

    def __init__(self, image_size, patch: int, channels: int, classes: int, dim: int = 96,
                 heads: int = 4, layers: int = 4, attention: str = "exact",
                 pattern: Optional[Sequence[str]] = None, pool: str = "cls",
                 mlp_ratio: float = 4.0, attention_options=None, mup: bool = False,
                 attention_scale: Optional[float] = None):
        super().__init__()
        height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
        if patch < 1 or height % patch or width % patch:
            raise ValueError(f"patch: expected a divisor of the image size {height} x {width}, "
                             f"got {patch}")
        if pool not in POOLS:
            raise ValueError(f"pool: expected one of {POOLS}, got {pool!r}")
        self.pattern = expand_pattern(attention, pattern, layers)
        if CIRCULANT2D in self.pattern and pool == "cls":
            raise ValueError("pool: circulant2d layers attend over the patch grid, which "
                             "has no place for a class token; use pool = 'mean'")
        self.image_size = (height, width)
        self.grid = (height // patch, width // patch)
        self.pool = pool
        self.embed = nn.Conv2d(channels, dim, kernel_size=patch, stride=patch)
        tokens = self.grid[0] * self.grid[1] + (pool == "cls")
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim)) if pool == "cls" else None
        learned_positions = any(name != CIRCULANT2D for name in self.pattern)
        self.positions = nn.Parameter(torch.zeros(1, tokens, dim)) if learned_positions \
            else None
        check_attention_options(self.pattern, attention_options, causal=False)
        options = dict(attention_options or {})
        circulant_options = dict(options.pop(CIRCULANT2D, {}))
        # The block's own options (mlp_ratio is the model's)
        accepted = [name for name in accepted_options(Circulant2dBlock) if name != "mlp_ratio"]
        unknown = [name for name in circulant_options if name not in accepted]
        if unknown:
            raise ValueError(f"{CIRCULANT2D}: unknown option{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(unknown)}; accepted: {', '.join(accepted)}")
        body = blocks(dim, heads, [n for n in self.pattern if n != CIRCULANT2D],
                      causal=False, mlp_ratio=mlp_ratio, options=options, mup=mup,
                      scale=attention_scale)
        others = iter(body)
        self.blocks = nn.ModuleList(
            Circulant2dBlock(dim, heads, mlp_ratio=mlp_ratio, **circulant_options)
            if name == CIRCULANT2D else next(others) for name in self.pattern)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        initialise(self, mup, self.head)
        if self.positions is not None:
            nn.init.normal_(self.positions, std=0.02)

    def attention_counts(self):
        counts = attention_names(self)
        if CIRCULANT2D in self.pattern:
            counts[CIRCULANT2D] = self.pattern.count(CIRCULANT2D)
        return counts

    def forward(self, images: Tensor) -> Tensor:
        channels = self.embed.in_channels
        if images.dim() != 4 or images.shape[1] != channels or tuple(
                images.shape[2:]) != self.image_size:
            # (a strided convolution would drop the pixels past the last whole patch)
            raise ValueError(f"images: expected [B, {channels}, {self.image_size[0]}, "
                             f"{self.image_size[1]}], got {list(images.shape)}")
        # The residual stream in the parameters' dtype: under bf16 autocast the patch
        # embedding comes out in bf16, and the blocks' LayerNorms take their own dtype.
        x = self.embed(images).flatten(2).transpose(1, 2).to(self.embed.weight.dtype)
        B, N, dim = x.shape  # N = Hg * Wg
        if self.class_token is not None:
            x = torch.cat([self.class_token.expand(B, -1, -1), x], dim=1)
        if self.positions is not None:
            x = x + self.positions
        for name, block in zip(self.pattern, self.blocks):
            if name == CIRCULANT2D:
                x = block(x.view(B, *self.grid, dim)).view(B, N, dim)
            else:
                x, _ = block(x)
        x = self.norm(x)
        pooled = x[:, 0] if self.class_token is not None else x.mean(dim=1)
        return self.head(pooled)
