"""A transformers DynamicCache layer whose first P entries are a weighted coreset: entry j
counts exp(log_weights[b, h, j]) times in every softmax over the keys, the entries appended
after it once. The "subquad" attention (attention.py) adds the log-weights to the scores;
it finds them on the key tensor this layer's update returns (log_weights_of).
"""

from typing import Optional

import torch
from torch import Tensor
from transformers.cache_utils import DynamicLayer

from ..cache import LOG_WEIGHT_FLOOR

__all__ = ["CoresetLayer", "log_weights_of"]

# The attribute of the key tensor (the cache's own, as DynamicLayer.update returns it) that
# carries the layer's log-weights [B, Hkv, P] to the attention function, which transformers
# calls with the keys and values but not the cache.
_LOG_WEIGHTS = "subquad_log_weights"


def log_weights_of(key: Tensor) -> Optional[Tensor]:
    """The log-weights [B, Hkv, P] of the first P of the keys, or None: all weights 1."""
    return getattr(key, _LOG_WEIGHTS, None)


class CoresetLayer(DynamicLayer):
    """CoresetLayer(keys [B, Hkv, P, D], values [B, Hkv, P, Dv], log_weights [B, Hkv, P],
    config=None): a DynamicLayer holding the entries a coreset press kept, their (folded)
    values and log-weights (-inf, an entry never attended, is stored as LOG_WEIGHT_FLOOR so
    that no -inf arithmetic happens). `config`: the model's; when given, an update under an
    attention implementation other than "subquad" raises instead of silently attending
    to the entries unweighted."""

    def __init__(self, keys: Tensor, values: Tensor, log_weights: Tensor, config=None):
        super().__init__()
        if keys.dim() != 4 or values.dim() != 4 or keys.shape[:3] != values.shape[:3]:
            raise ValueError(f"keys, values: expected [B, Hkv, P, D] and [B, Hkv, P, Dv], got "
                             f"{list(keys.shape)} and {list(values.shape)}")
        if tuple(log_weights.shape) != tuple(keys.shape[:3]):
            raise ValueError(f"log_weights: expected shape {list(keys.shape[:3])}, got "
                             f"{list(log_weights.shape)}")
        if bool(torch.isnan(log_weights).any()):
            raise ValueError("log_weights: expected no NaN")
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values
        self.log_weights = log_weights.to(keys.device, keys.dtype).clamp(
            min=LOG_WEIGHT_FLOOR).contiguous()
        self.config = config

    def __repr__(self):
        return f"CoresetLayer(weighted={self.log_weights.shape[2]}, held={self.get_seq_length()})"

    def update(self, key_states: Tensor, value_states: Tensor, cache_kwargs=None):
        from . import NAME

        implementation = getattr(self.config, "_attn_implementation", NAME)
        if implementation != NAME:
            raise RuntimeError(
                f"this cache holds a weighted coreset ({self.log_weights.shape[2]} entries with "
                f"log-weights) that only the {NAME!r} attention adds to the scores; the model "
                f"runs {implementation!r}: model.set_attn_implementation({NAME!r}), or use a "
                f"cache compressed without weights")
        if self.get_seq_length() < self.log_weights.shape[2]:
            raise RuntimeError(
                f"this cache layer holds {self.get_seq_length()} entries for "
                f"{self.log_weights.shape[2]} log-weights: its keys were cut outside the layer "
                f"(another press after a coreset press?); crop() keeps them in step")
        keys, values = super().update(key_states, value_states, cache_kwargs)
        setattr(keys, _LOG_WEIGHTS, self.log_weights)
        return keys, values

    # Whatever reshapes the entries reshapes their log-weights.
    def crop(self, max_length: int) -> None:
        super().crop(max_length)
        self.log_weights = self.log_weights[..., :self.get_seq_length()]

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self.log_weights = self.log_weights.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: Tensor) -> None:
        super().batch_select_indices(indices)
        self.log_weights = self.log_weights[indices, ...]

    def reorder_cache(self, beam_idx: Tensor) -> None:
        super().reorder_cache(beam_idx)
        self.log_weights = self.log_weights.index_select(0, beam_idx.to(self.log_weights.device))

    def reset(self) -> None:
        super().reset()
        self.log_weights.zero_()
