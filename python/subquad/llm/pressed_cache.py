"""A KVCache whose attention after compression runs on subquad's exact kernel.

After a press, a block's cache holds the kept prefix (positions < p, any order, with
log-weights) and then the tokens appended since. The T queries of a call sit at the last
T positions, so every entry before them is fully visible and only the last T entries need
the causal mask. Two exact-kernel calls and a merge replace the masked torch attention of
KVCache (which forms the [B, Hkv, G, T, S] scores and mask, ~40% of a 256-token forward):

    prefix: softmax(scale q.k_j + lw_j) over entries before the T queries (no mask); the
            log-weight enters through one more dimension, q' = [q, 1 / scale] against
            k' = [k, lw], the keys as the cache stores them (a view: nothing is copied)
    recent: causal exact attention over the T appended entries
    out   = merge_attention(prefix, recent) (by their log-sum-exps)
Anything else (uncompressed caches, windows, other devices or dtypes, non-finite values)
takes KVCache's own path. Same result up to round-off: tested against it.
"""

import torch
from torch import Tensor

from ..cache import KVCache

__all__ = ["PressedKVCache"]


class PressedKVCache(KVCache):
    def __init__(self, *args, **options):
        super().__init__(*args, **options)
        # Whether every value held is finite, kept up by append and compress so that a
        # decode step need not scan the whole cache (9% of a press run's time).
        self._values_finite = True

    def append(self, k: Tensor, v: Tensor) -> None:
        super().append(k, v)
        self._values_finite = self._values_finite and bool(torch.isfinite(v).all())

    def compress(self, keep: Tensor, log_weights=None, values=None) -> None:
        super().compress(keep, log_weights, values)
        self._values_finite = bool(torch.isfinite(self.values).all())

    def clone(self) -> "PressedKVCache":
        copy = super().clone()
        copy.__class__ = PressedKVCache
        return copy

    def _attend_torch(self, q: Tensor, scale: float) -> Tensor:
        from ..ops import exact_attention, merge_attention

        tokens = q.shape[1]
        prefix = self.length - tokens
        if (self.window is not None or q.device.type != "cpu" or prefix < 1
                or q.dtype not in (torch.float32, torch.float64) or q.dtype != self.dtype
                or not self._values_finite):
            return super()._attend_torch(q, scale)
        positions = self.positions
        recent = torch.arange(self.seen - tokens, self.seen, device=positions.device)
        if not (bool((positions[:, :, prefix:] == recent).all())
                and int(positions[:, :, :prefix].max()) < self.seen - tokens):
            return super()._attend_torch(q, scale)
        keys = self.keys.transpose(1, 2)  # [B, S, Hkv, D]
        values = self.values.transpose(1, 2)  # [B, S, Hkv, Dv]
        prefix_keys, prefix_q = keys[:, :prefix], q
        if self.weighted:  # log-weights at least LOG_WEIGHT_FLOOR: no -inf arithmetic
            prefix_keys = self.keys_and_log_weights[:, :, :prefix].transpose(1, 2)
            prefix_q = torch.cat([q, q.new_full((*q.shape[:3], 1), 1.0 / scale)], dim=-1)
        out_a, lse_a = exact_attention(prefix_q, prefix_keys, values[:, :prefix], scale=scale)
        out_b, lse_b = exact_attention(q, keys[:, prefix:], values[:, prefix:], scale=scale,
                                       causal=True)
        out, _ = merge_attention(out_a, lse_a, out_b, lse_b)
        return out
