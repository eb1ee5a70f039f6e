"""The "subquad" attention function of transformers' AttentionInterface: HF's layout
[B, H, N, D] in, [B, N, H, Dv] out as sdpa_attention_forward gives it, computed by
subquad.ops.exact_attention on CPU tensors. O(N M D) per head; the oracle is sdpa.

Keys from a CoresetLayer (coreset_cache.py) carry log-weights lw [B, Hkv, P] for their
first P entries (0 for the rest): the scores become scale q.k_j + lw_j. On CPU the kernel
adds them as one more dimension, q' = [q, 1 / scale] against k' = [k, lw]; sdpa, where it
runs instead, takes them in an additive float mask.
"""

import math
from typing import Optional

import torch
from torch import Tensor
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ..ops import exact_attention
from .coreset_cache import log_weights_of
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
    log_weights = log_weights_of(key)
    if log_weights is not None:
        if log_weights.shape[:2] != key.shape[:2] or log_weights.shape[2] > M:
            raise ValueError(f"subquad attention: log-weights {list(log_weights.shape)} for "
                             f"keys {list(key.shape)}")
        scaling = query.shape[3] ** -0.5 if scaling is None else scaling
        # [B, Hkv, M]: the coreset's log-weights, 0 for the entries appended since.
        log_weights = torch.nn.functional.pad(log_weights.to(key.device, key.dtype),
                                              (0, M - log_weights.shape[2]))
    runs_here = (padding is not None and dropout == 0.0
                 and all(t.device.type == "cpu" for t in (query, key, value))
                 and query.is_floating_point() and H % key.shape[1] == 0)
    if not runs_here:
        if isinstance(attention_mask, KeyPadding):
            attention_mask = attention_mask.dense(B, N, M)
        if log_weights is not None:
            attention_mask = _additive_mask(attention_mask, log_weights, query, is_causal,
                                            getattr(module, "is_causal", True))
            is_causal = False
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    if log_weights is not None:
        query = torch.cat([query, query.new_full((B, H, N, 1), 1.0 / scaling)], dim=-1)
        key = torch.cat([key, log_weights[..., None]], dim=-1)
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


def _additive_mask(mask, log_weights: Tensor, query: Tensor, is_causal: Optional[bool],
                   module_causal: bool) -> Tensor:
    """sdpa's float mask [B, H, N, M] adding log_weights [B, Hkv, M] to the scores where
    `mask` (None, or sdpa's bool or float mask) allows attention: -inf elsewhere."""
    B, H, N = query.shape[:3]
    Hkv, M = log_weights.shape[1:]
    if mask is None:  # sdpa's rule: causal (bottom-right) unless told otherwise
        causal = is_causal if is_causal is not None else module_causal
        mask = KeyPadding(None, causal and N > 1).dense(B, N, M).to(query.device)
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~mask, -math.inf)
    return mask + log_weights.repeat_interleave(H // Hkv, dim=1)[:, :, None, :]
