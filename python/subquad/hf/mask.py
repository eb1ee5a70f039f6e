"""The mask function of the "subquad" attention: instead of a [B, 1, N, M] boolean mask it
hands the attention a compact description (KeyPadding: which keys are real, and whether
attention is causal), so that the kernel runs on the real tokens only. Masks it cannot
describe that way are built by transformers' sdpa_mask, and the attention defers to sdpa.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor
from transformers.masking_utils import (bidirectional_mask_function, causal_mask_function,
                                        prepare_padding_mask, sdpa_mask)


@dataclass(frozen=True, eq=False)
class KeyPadding:
    """The mask of a batch as padding plus causality: query i of N attends to key j of M
    iff keep[b, j] and (not causal or j <= i + M - N), bottom-right aligned as in
    subquad.ops.exact_attention. The queries are the last N of the M positions."""

    keep: Optional[Tensor]  # [B, M] bool, True for a real token; None: no padding
    causal: bool

    def dense(self, batch: int, queries: int, keys: int) -> Tensor:
        """The same mask as sdpa takes it: [B, 1, N, M] bool, True where attention is
        allowed."""
        device = self.keep.device if self.keep is not None else None
        allowed = torch.ones(batch, 1, queries, keys, dtype=torch.bool, device=device)
        if self.keep is not None:
            allowed = allowed & self.keep[:, None, None, :]
        if self.causal:
            i = torch.arange(queries, device=device)[:, None]
            j = torch.arange(keys, device=device)[None, :]
            allowed = allowed & (j <= i + keys - queries)
        return allowed


def make_mask(batch_size: int, cache_position: Tensor, kv_length: int, kv_offset: int = 0,
                   mask_function: Callable = causal_mask_function,
                   attention_mask: Optional[Tensor] = None, **kwargs):
    """AttentionMaskInterface's signature (transformers.masking_utils.sdpa_mask): a
    KeyPadding for causal or bidirectional masks with optional 2D padding whose queries
    are the last positions of the keys (dynamic caches, no cache); else sdpa_mask's mask."""
    causal = mask_function is causal_mask_function
    queries = cache_position.shape[0]
    describable = (
        (causal or mask_function is bidirectional_mask_function)
        and cache_position.device.type == "cpu"
        and not torch.compiler.is_compiling()
        # Static caches hold kv_length slots past the tokens seen so far: not bottom-right.
        and (not causal or int(cache_position[-1]) + 1 == kv_offset + kv_length
             == int(cache_position[0]) + queries))
    if not describable:
        return sdpa_mask(batch_size=batch_size, cache_position=cache_position,
                         kv_length=kv_length, kv_offset=kv_offset, mask_function=mask_function,
                         attention_mask=attention_mask, **kwargs)
    keep = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    if keep is not None:
        keep = keep[:, kv_offset:kv_offset + kv_length].to(torch.bool)
        if bool(keep.all()):
            keep = None
    return KeyPadding(keep, causal)
