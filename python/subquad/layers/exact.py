"""Exact softmax attention layers (registry: "exact", "sliding-window"): multi-head, GQA,
causal or not, an optional sliding window, optional rotary positions; subquad's exact kernel
on CPU, masked matmuls elsewhere; decoding through subquad.cache.KVCache. O(T^2 D) per head
(O(T w D) windowed).
"""

from typing import Optional

from torch import Tensor

from .. import ops
from . import rotary
from .base import AttentionLayer, check_heads, linear, logit_scale, split_heads
from .registry import Capabilities

FLOAT_DTYPES = ("float32", "float64")

EXACT = Capabilities(
    causal=True, bidirectional=True, padding_mask=True, decoding_cache=True, backward=True,
    dtypes=FLOAT_DTYPES, gqa=True)

SLIDING_WINDOW = Capabilities(
    causal=True, bidirectional=False, padding_mask=True, decoding_cache=True, backward=True,
    dtypes=FLOAT_DTYPES, gqa=True,
    reasons={"bidirectional": "the window is the w keys up to the query (the kernel's "
                              "window implies causal); use 'exact' for bidirectional"})


class ExactAttention(AttentionLayer):
    """Multi-head softmax attention: x [B, T, dim] -> [B, T, dim].

    q = x W_q ([B, T, heads, dim / heads]), k, v = x W_k, x W_v (kv_heads heads each,
    heads % kv_heads == 0), softmax(scale q k^T) v per head, W_o. Options:
    kv_heads (None: heads), causal, window (0: none; w > 0: the last w keys, implies
    causal), scale (None: 1/sqrt(D), or 8/D under mup), mup (muP init and logit scale),
    bias, threads (C++ kernels; 0: all cores),
    rope (rotary position embeddings on q and k after the projections, layers.rotary's
    "rotate half" form; D must be even), rope_base (its base, 10000). With rope, a
    sequence's tokens sit at positions 0..T-1 (each sequence of a padded batch from 0,
    as run alone); decoding continues from the tokens the cache has seen.
    """

    def __init__(self, dim: int, heads: int, *, kv_heads: Optional[int] = None,
                 causal: bool = False, window: int = 0, scale: Optional[float] = None,
                 mup: bool = False, bias: bool = False, threads: int = 0, rope: bool = False,
                 rope_base: float = rotary.DEFAULT_BASE):
        super().__init__(dim)
        check_heads(dim, heads)
        kv_heads = heads if kv_heads is None else kv_heads
        check_heads(heads, kv_heads, "kv_heads")
        if not isinstance(window, int) or window < 0:
            raise ValueError(f"window: expected an int >= 0 (0: no window), got {window!r}")
        if window > 0 and not causal:
            raise ValueError(f"window: a sliding window of {window} keys implies causal "
                             "attention; pass causal=True")
        if not isinstance(rope, bool):
            raise ValueError(f"rope: expected a bool, got {rope!r}")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        if rope:
            rotary.check_head_dim(self.head_dim)
        self.rope, self.rope_base = rope, rotary.check_base(rope_base)
        self.causal, self.window, self.threads = causal, window, threads
        self.scale = logit_scale(self.head_dim, scale, mup)
        self.name = "sliding-window" if window > 0 else "exact"
        self.capabilities = SLIDING_WINDOW if window > 0 else EXACT
        self.prefix_only = causal  # output i reads tokens 0..i only and never T
        self.w_q = linear(dim, dim, bias=bias, mup=mup)
        self.w_k = linear(dim, kv_heads * self.head_dim, bias=bias, mup=mup)
        self.w_v = linear(dim, kv_heads * self.head_dim, bias=bias, mup=mup)
        self.w_o = linear(dim, dim, bias=bias, mup=mup, output=True)

    def project(self, x: Tensor, start: int = 0):
        """x [B, T, dim] -> q [B, T, H, D], k, v [B, T, Hkv, D]; with rope, q and k rotated
        at positions start .. start + T - 1."""
        q, k = split_heads(self.w_q(x), self.heads), split_heads(self.w_k(x), self.kv_heads)
        if self.rope:
            q, k = rotary.rotate(q, k, start, self.rope_base)
        return q, k, split_heads(self.w_v(x), self.kv_heads)

    def attend(self, x: Tensor) -> Tensor:
        q, k, v = self.project(x)
        out, _ = ops.exact_attention(q, k, v, scale=self.scale, causal=self.causal,
                                     window=self.window, threads=self.threads)
        return self.w_o(out.flatten(-2))

    def init_cache(self, batch: int, *, context: Optional[int] = None, dtype=None, device=None):
        """An empty KVCache for `batch` sequences (window-bounded for a sliding window).

        context (the most tokens to be decoded) is part of every layer's init_cache; the
        KVCache grows as needed, so it needs none."""
        from ..cache import KVCache

        if not self.causal:
            raise ValueError(f"{self.name}: a decoding cache needs causal=True (bidirectional "
                             "attention has no token-by-token order)")
        weight = self.w_k.weight
        return KVCache(batch, self.kv_heads, self.head_dim, window=self.window or None,
                       dtype=weight.dtype if dtype is None else dtype,
                       device=weight.device if device is None else device)

    def decode(self, x: Tensor, cache) -> Tensor:
        from ..cache import KVCache

        if not self.causal:
            raise ValueError(f"{self.name}: a decoding cache needs causal=True")
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache: expected a subquad.cache.KVCache (layer.init_cache), got "
                            f"{type(cache).__name__}")
        q, k, v = self.project(x, start=cache.seen)  # positions go on past dropped keys
        out = cache.update(q, k, v, scale=self.scale)  # [B, T, H, D]
        return self.w_o(out.flatten(-2))


class SlidingWindowAttention(ExactAttention):
    """Causal attention over the last `window` keys (the query's own included): the
    "sliding-window" entry. Options as ExactAttention (rope included: positions are
    absolute, so a decoded token's position is the count of tokens seen, not of the
    window's); window is required (>= 1)."""

    def __init__(self, dim: int, heads: int, *, window: int, kv_heads: Optional[int] = None,
                 causal: bool = True, scale: Optional[float] = None, mup: bool = False,
                 bias: bool = False, threads: int = 0,
                 rope: bool = False, rope_base: float = rotary.DEFAULT_BASE):
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window: expected an int >= 1 for sliding-window attention, got "
                             f"{window!r}")
        super().__init__(dim, heads, kv_heads=kv_heads, causal=causal, window=window,
                         scale=scale, mup=mup, bias=bias, threads=threads,
                         rope=rope, rope_base=rope_base)
