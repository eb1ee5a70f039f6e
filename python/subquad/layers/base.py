"""The one forward contract of every attention layer, and what the layers share.

    y, cache = layer(x [B, T, dim], attention_mask=None, cache=None)

attention_mask [B, T]: 1 (or True) for a token, 0 for padding; a layer treats every
sequence as its tokens alone, in order (padding may sit anywhere), and writes zeros at
padded positions. cache: a subquad.cache.Cache from layer.init_cache(batch); the layer
appends x's tokens to it (prefill when T > 1, decoding when T = 1) and returns it.
"""

import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from .registry import Capabilities


def split_heads(x: Tensor, heads: int) -> Tensor:
    """[..., heads * d] -> [..., heads, d] (a view)."""
    return x.unflatten(-1, (heads, x.shape[-1] // heads))


def check_heads(dim: int, heads: int, name: str = "heads") -> None:
    if not isinstance(heads, int) or heads < 1 or dim % heads:
        raise ValueError(f"{name}: expected a positive divisor of {dim}, got {heads}")


# The structured-attention code's muP logit scale for standard attention: 8 / d_head.
MUP_LOGIT_MULTIPLIER = 8.0


def linear(fan_in: int, fan_out: int, *, bias: bool, mup: bool,
           output: bool = False) -> nn.Linear:
    """An nn.Linear. Under muP (as the structured-attention code): hidden weights
    N(0, 1 / fan_in), output projections (output=True) zero, biases zero; else torch's
    default initialisation."""
    layer = nn.Linear(fan_in, fan_out, bias=bias)
    if mup:
        if output:
            nn.init.zeros_(layer.weight)
        else:
            nn.init.normal_(layer.weight, std=1.0 / math.sqrt(fan_in))
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)
    return layer


def check_positive(name: str, value) -> float:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and
                                       math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: expected a positive finite number, got {value!r}")
    return float(value)


def logit_scale(head_dim: int, scale: Optional[float], mup: bool) -> float:
    """The attention-logit scale: explicit, or 8/D under muP (the structured-attention
    code), else 1/sqrt(D)."""
    if scale is not None:
        return check_positive("scale", scale)
    return MUP_LOGIT_MULTIPLIER / head_dim if mup else 1.0 / math.sqrt(head_dim)


def check_mask(attention_mask: Optional[Tensor], x: Tensor) -> Optional[Tensor]:
    """attention_mask [B, T] of 0/1 as a bool tensor, or None when there is no padding."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, Tensor):
        raise TypeError(f"attention_mask: expected a tensor [B, T], got "
                        f"{type(attention_mask).__name__}")
    if tuple(attention_mask.shape) != tuple(x.shape[:2]):
        raise ValueError(f"attention_mask: expected shape [B, T] = {list(x.shape[:2])}, got "
                         f"{list(attention_mask.shape)}")
    if attention_mask.dtype != torch.bool:
        if not ((attention_mask == 0) | (attention_mask == 1)).all():
            raise ValueError("attention_mask: expected 1 for a token and 0 for padding, got "
                             "other values")
        attention_mask = attention_mask != 0
    if attention_mask.device != x.device:
        attention_mask = attention_mask.to(x.device)
    return None if bool(attention_mask.all()) else attention_mask


def is_right_padding(mask: Tensor) -> bool:
    """Whether every row of mask [B, T] is tokens first, then padding."""
    return bool((mask[:, 1:] <= mask[:, :-1]).all())


class AttentionLayer(nn.Module):
    """Base of the layers: checks the arguments, handles padding, dispatches.

    Subclasses set dim, capabilities and name, and implement attend(x [B, T, dim]) ->
    [B, T, dim] for unpadded sequences; those with a decoding cache implement
    init_cache(batch) and decode(x, cache). `prefix_only` is True when output i depends
    on tokens 0..i alone (never on T), so right padding needs no repacking.
    """

    name: str
    capabilities: Capabilities
    prefix_only: bool = False
    length_multiple: int = 1  # every sequence length must be a multiple of this

    def __init__(self, dim: int):
        super().__init__()
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim: expected a positive int, got {dim!r}")
        self.dim = dim

    def extra_repr(self) -> str:
        heads = getattr(self, "heads", None)
        causal = getattr(self, "causal", None)
        return f"attention={self.name!r}, dim={self.dim}, heads={heads}, causal={causal}"

    def check_input(self, x: Tensor) -> None:
        """x must be [B, T >= 1, dim]; an inference-only layer must not be trained."""
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            shape = list(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x: expected [B, T, dim] with dim = {self.dim}, got {shape}")
        if x.shape[1] == 0:
            raise ValueError("x: expected at least one token (T >= 1), got T = 0")
        if torch.is_grad_enabled() and (self.training or x.requires_grad) and \
                not self.capabilities.backward:
            self.capabilities.require(self.name, "backward",
                                      "call .eval() and run under torch.no_grad()")

    def forward(self, x: Tensor, attention_mask: Optional[Tensor] = None,
                cache=None) -> Tuple[Tensor, object]:
        self.check_input(x)
        mask = check_mask(attention_mask, x)
        if cache is not None:
            self.capabilities.require(self.name, "decoding_cache")
            if mask is not None:
                raise ValueError(f"{self.name}: attention_mask with padding cannot be combined "
                                 "with a cache: cache entries of one step must be tokens of "
                                 "every sequence; decode padded batches without padding "
                                 "(left-align prompts by length) or one sequence at a time")
            return self.decode(x, cache), cache
        if mask is None:
            return self.attend(x), None
        self.capabilities.require(self.name, "padding_mask")
        return self.attend_padded(x, mask), None

    def attend(self, x: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement attend(x)")

    def decode(self, x: Tensor, cache) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no decoding cache")

    def attend_padded(self, x: Tensor, mask: Tensor) -> Tensor:
        """x [B, T, dim] with mask [B, T] -> [B, T, dim], zeros at padding: every sequence
        runs as its tokens alone; the rows with the same token count run as one batch."""
        keep = mask.unsqueeze(-1).to(x.dtype)
        if self.prefix_only and is_right_padding(mask):
            return self.attend(x) * keep
        counts = mask.sum(dim=1)  # [B]
        # Token positions of each row first, in order (a stable sort puts 1s before 0s).
        order = torch.sort((~mask).to(torch.uint8), dim=1, stable=True).indices  # [B, T]
        out = torch.zeros_like(x)
        for count in torch.unique(counts).tolist():
            if count == 0:
                continue
            rows = (counts == count).nonzero().squeeze(1)  # [b]
            index = order[rows, :count].unsqueeze(-1).expand(-1, -1, self.dim)  # [b, c, dim]
            y = self.attend(x[rows].gather(1, index))  # [b, c, dim]
            out = out.index_put((rows.unsqueeze(1), order[rows, :count]), y)
        return out
