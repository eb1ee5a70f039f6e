"""The nearest-neighbour retrieval probe's model: one token per key (its vector and an
embedding of its label), a query token last, bidirectional blocks, and the label read
from the query's position with the label embedding (tied). One layer leaves no depth to
work around a head's rank."""

from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from .blocks import attention_names, blocks, expand_pattern, initialise


class NeighbourRetriever(nn.Module):
    """(keys [B, n, dims], labels [B, n], queries [B, dims]) -> logits [B, n] over the
    labels. NeighbourRetriever(dims, keys, dim, heads, layers=1, attention="exact",
    pattern=None, mlp_ratio=4, attention_options=None, mup=False, attention_scale=None).
    The tokens carry no positions: the keys are a set."""

    def __init__(self, dims: int, keys: int, dim: int = 32, heads: int = 2, layers: int = 1,
                 attention: str = "exact", pattern: Optional[Sequence[str]] = None,
                 mlp_ratio: float = 4.0, attention_options=None, mup: bool = False,
                 attention_scale: Optional[float] = None):
        super().__init__()
        if dims < 1 or keys < 2:
            raise ValueError(f"dims and keys: expected >= 1 and >= 2, got {dims}, {keys}")
        self.dims, self.keys = dims, keys
        self.pattern = expand_pattern(attention, pattern, layers)
        self.read_in = nn.Linear(dims, dim)
        self.label_embedding = nn.Embedding(keys, dim)
        self.query_marker = nn.Parameter(torch.zeros(dim))
        self.blocks = blocks(dim, heads, self.pattern, causal=False, mlp_ratio=mlp_ratio,
                             options=attention_options, mup=mup, scale=attention_scale)
        self.norm = nn.LayerNorm(dim)
        # Tied to the label embedding, as a language model's readout is to its input
        # embedding: a head that copies a key's label embedding already scores that label.
        self.read_out = nn.Linear(dim, keys, bias=False)
        initialise(self, mup, self.read_out)
        self.read_out.weight = self.label_embedding.weight

    def attention_counts(self):
        return attention_names(self)

    def forward(self, keys: Tensor, labels: Tensor, queries: Tensor) -> Tensor:
        B = keys.shape[0]
        if (keys.dim() != 3 or tuple(keys.shape[1:]) != (self.keys, self.dims)
                or tuple(labels.shape) != (B, self.keys)
                or tuple(queries.shape) != (B, self.dims)):
            raise ValueError(f"keys, labels, queries: expected [B, {self.keys}, {self.dims}], "
                             f"[B, {self.keys}] and [B, {self.dims}], got {list(keys.shape)}, "
                             f"{list(labels.shape)} and {list(queries.shape)}")
        key_tokens = self.read_in(keys) + self.label_embedding(labels)  # [B, n, dim]
        query_token = self.read_in(queries) + self.query_marker          # [B, dim]
        x = torch.cat([key_tokens, query_token.unsqueeze(1)], dim=1)     # [B, n + 1, dim]
        for block in self.blocks:
            x, _ = block(x)
        return self.read_out(self.norm(x[:, -1]))
