"""WildCat attention layer (registry: "wildcat", inference only): multi-head attention over a
weighted coreset of the keys, O(N r D) per head with r coreset points.
"""

from typing import Optional

from torch import Tensor

from .. import ops
from .base import AttentionLayer, check_heads, linear, split_heads
from .registry import Capabilities

WILDCAT = Capabilities(
    causal=False, bidirectional=True, padding_mask=True, decoding_cache=False, backward=False,
    dtypes=("float32",), gqa=True,
    reasons={"causal": "a query attends the coreset of all keys; a causal mask would need "
                       "one coreset per query position",
             "decoding_cache": "WildCat compresses a whole key set per call; decoding with "
                               "compressed caches is subquad.cache.KVCache.compress with a "
                               "CompressKV press",
             "backward": "the coreset selection (randomly pivoted Cholesky) has no gradient; "
                         "train with 'exact' and load the weights into this layer"})


class WildcatAttention(AttentionLayer):
    """Multi-head attention computed by WildCat: x [B, N, dim] -> [B, N, dim].

    q = x W_q, k = context W_k, v = context W_v (kv_heads heads, grouped queries; context
    defaults to x), WildCat attention with `rank` coreset points per (batch, kv head), W_o.
    The C++ kernel (float32) on CPU; elsewhere subquad.reference's WildCat (float64, pivots
    from torch's generator: other coresets than the C++ ones, the same where a bin fits
    whole). Options: kv_heads, rank, bins, seed, method
    ("wildcat", "uniform_nystrom", "uniform_subsample"), scale, bias, threads.
    """

    name = "wildcat"
    capabilities = WILDCAT

    def __init__(self, dim: int, heads: int, *, kv_heads: Optional[int] = None,
                 causal: bool = False, rank: int = 128, bins: int = 1, seed: int = 0,
                 method: str = "wildcat", scale: Optional[float] = None, bias: bool = True,
                 threads: int = 0):
        super().__init__(dim)
        if causal:
            WILDCAT.require(self.name, "causal")
        check_heads(dim, heads)
        kv_heads = heads if kv_heads is None else kv_heads
        check_heads(heads, kv_heads, "kv_heads")
        self.heads, self.kv_heads, self.causal = heads, kv_heads, False
        self.options = dict(rank=rank, bins=bins, seed=seed, scale=scale, method=method,
                            threads=threads)
        head_dim = dim // heads
        self.w_q = linear(dim, dim, bias=bias, mup=False)
        self.w_k = linear(dim, kv_heads * head_dim, bias=bias, mup=False)
        self.w_v = linear(dim, kv_heads * head_dim, bias=bias, mup=False)
        self.w_o = linear(dim, dim, bias=bias, mup=False)

    def forward(self, x: Tensor, attention_mask: Optional[Tensor] = None, cache=None, *,
                context: Optional[Tensor] = None):
        """As every layer; `context` [B, M, dim] gives other keys and values (no mask)."""
        if context is None:
            return super().forward(x, attention_mask, cache)
        if attention_mask is not None or cache is not None:
            raise ValueError("context: cross attention takes no attention_mask and no cache")
        if context.dim() != 3 or context.shape[0] != x.shape[0] or context.shape[2] != self.dim:
            raise ValueError(f"context: expected [B, M, dim] = [{x.shape[0]}, M, {self.dim}], "
                             f"got {list(context.shape)}")
        self.check_input(x)
        return self.attend(x, context), None

    def attend(self, x: Tensor, context: Optional[Tensor] = None) -> Tensor:
        context = x if context is None else context
        q = split_heads(self.w_q(x), self.heads)
        k = split_heads(self.w_k(context), self.kv_heads)
        v = split_heads(self.w_v(context), self.kv_heads)
        return self.w_o(self.core(q, k, v).flatten(-2))

    def core(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The attention of projected q [B, N, H, D], k, v [B, M, Hkv, D] -> [B, N, H, D]."""
        return ops.wildcat_attention(q, k, v, **self.options)
