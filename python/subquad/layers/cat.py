"""CAT layers (Yamada 2025; registry: "cat", "cat-avgkey", "cat-causal"): one score per
token and head, a circulant (or causal lag) mixing of the values. O(N log N) per head on
the FFT path; causal CAT decodes token by token through CatCausalCache.
"""

from typing import Optional

from torch import Tensor

from .. import ops
from .base import AttentionLayer, check_heads, check_positive, linear, logit_scale, split_heads
from .caches import CatCausalCache
from .registry import Capabilities

FLOAT_DTYPES = ("float32", "float64")
_NO_GQA = ("CAT scores each token with one number per head (z = x W_A or <q, mean k>); "
           "there are no per-token keys to share between query heads")

CAT = Capabilities(
    causal=False, bidirectional=True, padding_mask=True, decoding_cache=False, backward=True,
    dtypes=FLOAT_DTYPES, gqa=False,
    reasons={"causal": "the circulant A[i, j] = s[(j - i) mod N] mixes every position with "
                       "every other; use 'cat-causal' (the lag convention)",
             "decoding_cache": "bidirectional CAT has no token-by-token order; 'cat-causal' "
                               "decodes",
             "gqa": _NO_GQA})

CAT_AVGKEY = Capabilities(
    causal=False, bidirectional=True, padding_mask=True, decoding_cache=False, backward=True,
    dtypes=FLOAT_DTYPES, gqa=False,
    reasons={"causal": "the averaged key mean_j k[j] and the circulant both read every "
                       "position; use 'cat-causal'",
             "decoding_cache": "bidirectional: no token-by-token order",
             "gqa": _NO_GQA})

CAT_CAUSAL = Capabilities(
    causal=True, bidirectional=False, padding_mask=True, decoding_cache=True, backward=True,
    dtypes=FLOAT_DTYPES, gqa=False,
    reasons={"bidirectional": "the lag convention out[i] = sum_{k <= i} s_i[k] v[i - k] is "
                              "causal by construction; use 'cat'",
             "gqa": _NO_GQA})


class CATLayer(AttentionLayer):
    """CAT attention layer: x [B, T, dim] -> [B, T, dim].

    z = score_scale * x W_A ([B, T, heads]), v = x W_V split into heads of dim // heads,
    per-head CAT (circulant of softmax(z) over the sequence; causal: the lag convention),
    heads concatenated, W_O. Options: causal, convention ("roll" A[i, j] = s[(j - i) mod N]
    or "conv"; not causal only), score_scale, mup (muP init), bias, threads.
    """

    def __init__(self, dim: int, heads: int, *, causal: bool = False, convention: str = "roll",
                 score_scale: float = 1.0, mup: bool = False, bias: bool = False,
                 threads: int = 0):
        super().__init__(dim)
        check_heads(dim, heads)
        if convention not in ("roll", "conv"):
            raise ValueError(f"convention: expected 'roll' or 'conv', got {convention!r}")
        self.heads, self.head_dim = heads, dim // heads
        self.causal, self.convention, self.threads = causal, convention, threads
        self.score_scale = check_positive("score_scale", score_scale)
        self.name = "cat-causal" if causal else "cat"
        self.capabilities = CAT_CAUSAL if causal else CAT
        self.prefix_only = causal
        self.w_a = linear(dim, heads, bias=bias, mup=mup)
        self.w_v = linear(dim, dim, bias=bias, mup=mup)
        self.w_o = linear(dim, dim, bias=bias, mup=mup, output=True)

    def scores_and_values(self, x: Tensor):
        """x [B, T, dim] -> z [B, T, H], v [B, T, H, D]."""
        return self.w_a(x) * self.score_scale, split_heads(self.w_v(x), self.heads)

    def attend(self, x: Tensor) -> Tensor:
        z, v = self.scores_and_values(x)
        if self.causal:
            out = ops.cat_causal(z, v, threads=self.threads)
        else:
            out = ops.cat(z, v, convention=self.convention, threads=self.threads)
        return self.w_o(out.flatten(-2))

    def init_cache(self, batch: int, *, context: Optional[int] = None, dtype=None, device=None):
        """An empty CatCausalCache (context: unused, the cache grows)."""
        if not self.causal:
            raise ValueError("cat: a decoding cache needs the causal layer ('cat-causal')")
        weight = self.w_v.weight
        return CatCausalCache(batch, self.heads, self.head_dim,
                              dtype=weight.dtype if dtype is None else dtype,
                              device=weight.device if device is None else device)

    def decode(self, x: Tensor, cache) -> Tensor:
        if not isinstance(cache, CatCausalCache):
            raise TypeError(f"cache: expected a CatCausalCache (layer.init_cache), got "
                            f"{type(cache).__name__}")
        z, v = self.scores_and_values(x)
        return self.w_o(cache.update(z, v).flatten(-2))


class CATAvgKeyLayer(AttentionLayer):
    """Averaged-key CAT: x [B, T, dim] -> [B, T, dim].

    q, k, v = x W_q, x W_k, x W_v (heads of dim // heads), z[i] = scale <q[i], mean_j k[j]>
    (scale None: 1/sqrt(D), 8/D under mup), CAT with `convention`, W_o.
    """

    name = "cat-avgkey"
    capabilities = CAT_AVGKEY

    def __init__(self, dim: int, heads: int, *, causal: bool = False, convention: str = "roll",
                 scale: Optional[float] = None, mup: bool = False, bias: bool = False,
                 threads: int = 0):
        super().__init__(dim)
        check_heads(dim, heads)
        if causal:
            CAT_AVGKEY.require(self.name, "causal")
        if convention not in ("roll", "conv"):
            raise ValueError(f"convention: expected 'roll' or 'conv', got {convention!r}")
        self.heads, self.head_dim = heads, dim // heads
        self.causal, self.convention, self.threads = False, convention, threads
        self.scale = logit_scale(self.head_dim, scale, mup)
        self.w_qkv = linear(dim, 3 * dim, bias=bias, mup=mup)
        self.w_o = linear(dim, dim, bias=bias, mup=mup, output=True)

    def attend(self, x: Tensor) -> Tensor:
        q, k, v = (split_heads(t, self.heads) for t in self.w_qkv(x).chunk(3, dim=-1))
        out = ops.cat_avgkey(q, k, v, scale=self.scale, convention=self.convention,
                             threads=self.threads)
        return self.w_o(out.flatten(-2))
