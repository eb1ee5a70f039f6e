"""The "subquad" attention function of transformers' AttentionInterface: HF's layout
[B, H, N, D] in, [B, N, H, Dv] out as sdpa_attention_forward gives it, computed by
subquad.ops.exact_attention on CPU tensors. O(N M D) per head; the oracle is sdpa.
"""

from typing import Optional

import torch
from torch import Tensor
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ..ops import exact_attention
from .mask import KeyPadding


def attention_forward(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                      attention_mask, dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None, **kwargs):
    """query [B, H, N, D], key [B, Hkv, M, D], value [B, Hkv, M, Dv] -> (out [B, N, H, Dv],
    None). attention_mask: a KeyPadding (subquad.hf.mask), None (no padding, causal as the
    module is: sdpa's rule) or anything else, which sdpa runs."""
    B, H, N = query.shape[:3]
    M = key.shape[2]
    if isinstance(attention_mask, KeyPadding):
        padding = attention_mask
        if padding.keep is not None and tuple(padding.keep.shape) != (B, M):
            raise ValueError(f"subquad attention: the padding mask is {list(padding.keep.shape)}"
                             f" for {B} sequences of {M} keys")
    elif attention_mask is None:
        padding = KeyPadding(None, is_causal if is_causal is not None
                             else getattr(module, "is_causal", True))
    else:
        padding = None
    runs_here = (padding is not None and dropout == 0.0
                 and all(t.device.type == "cpu" for t in (query, key, value))
                 and query.is_floating_point() and H % key.shape[1] == 0)
    if not runs_here:
        if isinstance(attention_mask, KeyPadding):
            attention_mask = attention_mask.dense(B, N, M)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    # [B, H, N, D] -> [B, N, H, D]: a view with a contiguous last dimension, read in place.
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    options = dict(scale=scaling, causal=padding.causal, threads=torch.get_num_threads())
    if padding.keep is None:
        return exact_attention(q, k, v, **options)[0], None
    return _padded(q, k, v, padding, options), None


def _padded(q: Tensor, k: Tensor, v: Tensor, padding: KeyPadding, options: dict) -> Tensor:
    """Exact attention of a padded batch, once per distinct padding pattern on the real keys
    only. With causal masks only the real queries are computed (padding queries give
    zeros; no real token sees them): dropping the padding keeps bottom-right alignment, as
    the real keys before a real query are the real keys before the query window plus the
    real queries up to it."""
    B, N, H = q.shape[:3]
    M = k.shape[1]
    out = q.new_zeros(B, N, H, v.shape[3])  # [B, N, H, Dv]
    patterns, group = torch.unique(padding.keep, dim=0, return_inverse=True)
    for index, keep in enumerate(patterns):
        rows = torch.nonzero(group == index).squeeze(1)
        keys = torch.nonzero(keep).squeeze(1)
        queries = (torch.nonzero(keep[M - N:]).squeeze(1) if padding.causal
                   else torch.arange(N))
        if keys.numel() == 0 or queries.numel() == 0:
            continue
        q_rows = q.index_select(0, rows).index_select(1, queries)
        k_rows = k.index_select(0, rows).index_select(1, keys)
        v_rows = v.index_select(0, rows).index_select(1, keys)
        out[rows[:, None], queries[None, :]] = exact_attention(q_rows, k_rows, v_rows,
                                                               **options)[0]
    return out
