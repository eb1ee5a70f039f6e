"""Structured-score attention layers (Kuang et al. 2025; registry: "mlr", "bilinear-mlr",
"btt"). MLR: a multi-level low-rank score matrix (blocks halve per level), O(T^2 sum_l
r_l / 2^(l-1)) score work; bilinear MLR and BTT: structured q/k projections scored by
the exact kernel. Decoding: MlrCache for MLR, subquad.cache.KVCache for the other two.
"""

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _core
from .. import ops, reference
from .base import AttentionLayer, check_heads, linear, split_heads
from .caches import MlrCache
from .registry import Capabilities

FLOAT_DTYPES = ("float32", "float64")
_PROJECTED_HEADS = ("q and k are structured projections of x with the score's own heads; "
                    "there are no separate key heads to share")

MLR = Capabilities(
    causal=True, bidirectional=True, padding_mask=True, decoding_cache=True, backward=True,
    dtypes=FLOAT_DTYPES, gqa=True)

BILINEAR_MLR = Capabilities(
    causal=True, bidirectional=True, padding_mask=True, decoding_cache=True, backward=True,
    dtypes=FLOAT_DTYPES, gqa=False, reasons={"gqa": _PROJECTED_HEADS})

BTT = Capabilities(
    causal=True, bidirectional=True, padding_mask=True, decoding_cache=True, backward=True,
    dtypes=FLOAT_DTYPES, gqa=False, reasons={"gqa": _PROJECTED_HEADS})


def _check_ranks(ranks: Sequence[int]) -> list:
    ranks = list(ranks)
    if not ranks or not all(isinstance(r, int) and r >= 1 for r in ranks):
        raise ValueError(f"ranks: expected a non-empty list of ints >= 1, got {ranks!r}")
    return ranks


def _normal(shape: Sequence[int], fan_in: int) -> nn.Parameter:
    """A weight drawn from N(0, 1 / fan_in) (muP hidden-weight initialisation)."""
    return nn.Parameter(torch.randn(*shape) / math.sqrt(fan_in))


def _kv_cache(layer, batch: int, head_dim: int, value_dim: int, dtype, device):
    from ..cache import KVCache

    if not layer.causal:
        raise ValueError(f"{layer.name}: a decoding cache needs causal=True")
    weight = layer.w_v.weight
    return KVCache(batch, layer.heads, head_dim, value_dim,
                   dtype=weight.dtype if dtype is None else dtype,
                   device=weight.device if device is None else device)


def _check_kv_cache(cache) -> None:
    from ..cache import KVCache

    if not isinstance(cache, KVCache):
        raise TypeError(f"cache: expected a subquad.cache.KVCache (layer.init_cache), got "
                        f"{type(cache).__name__}")


class MLRAttention(AttentionLayer):
    """MLR attention layer: x [B, T, dim] -> [B, T, dim].

    q, k = LayerNorm over the head dim (no affine) of x W_q, x W_k with head dim
    sum(ranks); v = x W_v with value head dim dim // heads; MLR attention; W_o.
    Options: ranks (None: [D - D // 2, D // 2], D = dim // heads), kv_heads, causal,
    block_divide, context (None: level blocks are T / 2^(l-1) of each call, T a multiple
    of 2^(L-1); an int: blocks on absolute positions 0..context-1, causal only, any
    T <= context), mup (muP init), threads.
    """

    name = "mlr"
    capabilities = MLR

    def __init__(self, dim: int, heads: int, ranks: Optional[Sequence[int]] = None, *,
                 kv_heads: Optional[int] = None, causal: bool = True,
                 block_divide: bool = False, context: Optional[int] = None,
                 mup: bool = False, threads: int = 0):
        super().__init__(dim)
        check_heads(dim, heads)
        kv_heads = heads if kv_heads is None else kv_heads
        check_heads(heads, kv_heads, "kv_heads")
        value_dim = dim // heads
        if ranks is None:
            ranks = [r for r in (value_dim - value_dim // 2, value_dim // 2) if r]
        self.ranks = _check_ranks(ranks)
        if context is not None:
            if not causal:
                raise ValueError("context: fixed blocks on absolute positions need "
                                 "causal=True (padding to the context would be attended)")
            reference.mlr_block_sizes(self.ranks, context)
        self.heads, self.kv_heads = heads, kv_heads
        self.causal, self.block_divide, self.context = causal, block_divide, context
        self.threads = threads
        self.head_dim, self.value_dim = sum(self.ranks), value_dim
        self.prefix_only = causal and context is not None
        self.length_multiple = 1 if context is not None else 1 << (len(self.ranks) - 1)
        self.w_q = linear(dim, heads * self.head_dim, bias=False, mup=mup)
        self.w_k = linear(dim, kv_heads * self.head_dim, bias=False, mup=mup)
        self.w_v = linear(dim, kv_heads * value_dim, bias=False, mup=mup)
        self.w_o = linear(heads * value_dim, dim, bias=False, mup=mup, output=True)

    def project(self, x: Tensor):
        """x [B, T, dim] -> q [B, T, H, D], k [B, T, Hkv, D], v [B, T, Hkv, Dv]."""
        q = F.layer_norm(split_heads(self.w_q(x), self.heads), (self.head_dim,))
        k = F.layer_norm(split_heads(self.w_k(x), self.kv_heads), (self.head_dim,))
        return q, k, split_heads(self.w_v(x), self.kv_heads)

    def attend(self, x: Tensor) -> Tensor:
        tokens = x.shape[1]
        length = tokens if self.context is None else self.context
        if tokens > length:
            raise ValueError(f"x: T = {tokens} exceeds the layer's context of {length}")
        multiple = 1 << (len(self.ranks) - 1)
        if length % multiple:  # only without context: the constructor checked context
            raise ValueError(f"x: T = {tokens} is not a multiple of 2^(L-1) = {multiple} (the "
                             f"{len(self.ranks)} MLR levels halve the sequence); pass "
                             "context= (causal) to put the blocks on absolute positions")
        q, k, v = self.project(x)
        if length > tokens:  # causal: zero tokens after the last one change no output row
            pad = (0, 0, 0, 0, 0, length - tokens)
            q, k, v = F.pad(q, pad), F.pad(k, pad), F.pad(v, pad)
        out = ops.mlr_attention(q, k, v, ranks=self.ranks, causal=self.causal,
                                block_divide=self.block_divide, threads=self.threads)
        return self.w_o(out[:, :tokens].flatten(-2))

    def init_cache(self, batch: int, *, context: Optional[int] = None, dtype=None, device=None):
        """An empty MlrCache; context (default: the layer's) fixes the level blocks."""
        if not self.causal:
            raise ValueError("mlr: a decoding cache needs causal=True")
        context = self.context if context is None else context
        if context is None:
            raise ValueError("context: MLR blocks sit on absolute positions 0..context-1; "
                             "pass init_cache(batch, context=...) or the layer option context")
        weight = self.w_v.weight
        return MlrCache(batch, self.heads, self.kv_heads, self.head_dim, self.value_dim,
                        context, ranks=self.ranks, block_divide=self.block_divide,
                        dtype=weight.dtype if dtype is None else dtype,
                        device=weight.device if device is None else device)

    def decode(self, x: Tensor, cache) -> Tensor:
        if not isinstance(cache, MlrCache):
            raise TypeError(f"cache: expected an MlrCache (layer.init_cache), got "
                            f"{type(cache).__name__}")
        return self.w_o(cache.update(*self.project(x)).flatten(-2))


class BilinearMLRAttention(AttentionLayer):
    """Attention with a bilinear MLR score: x [B, T, dim] -> [B, T, dim].

    q and k are bilinear MLR projections of x (weights [2^l, dim / 2^l, heads r_l] per
    level, RMS-capped, per-level LayerNorm; the level scales c_l on the query side), so
    S_h = sum_l c_l q_l k_l^T has rank up to sum_l r_l 2^l; exact attention with scale 1;
    v = x W_v (value head dim dim // heads); W_o. Options: ranks (None: [max(4, D // 2),
    max(2, D // 4)], D = dim // heads), causal, mup (muP level scales 8 / (r_l 2^l)),
    rms_cap, threads. dim must be divisible by 2^(len(ranks) - 1).
    Level l LayerNorms r_l 2^l features per head: with 2 of them it returns +-(1, -1), a
    sign whose gradient is 0 except near ties (with 1, zeros), so keep r_l 2^l >= 4, as the
    default ranks do at every head dim.
    """

    name = "bilinear-mlr"
    capabilities = BILINEAR_MLR

    def __init__(self, dim: int, heads: int, ranks: Optional[Sequence[int]] = None, *,
                 causal: bool = True, mup: bool = False, rms_cap: bool = True,
                 threads: int = 0):
        super().__init__(dim)
        check_heads(dim, heads)
        value_dim = dim // heads
        if ranks is None:
            ranks = [max(4, value_dim // 2), max(2, value_dim // 4)]
        self.ranks = _check_ranks(ranks)
        if dim % (1 << (len(self.ranks) - 1)):
            raise ValueError(f"dim: expected a multiple of 2^(len(ranks) - 1) = "
                             f"{1 << (len(self.ranks) - 1)}, got {dim}")
        self.heads, self.causal, self.rms_cap, self.threads = heads, causal, rms_cap, threads
        self.prefix_only = causal
        self.value_dim = value_dim
        self.score_dim = _core.bilinear_mlr_output_dim(self.ranks)
        self.level_scale = _core.bilinear_mlr_level_scales(self.ranks, mup)
        shapes = [(2**l, dim // 2**l, heads * r) for l, r in enumerate(self.ranks)]
        self.weights_q = nn.ParameterList([_normal(s, s[1]) for s in shapes])
        self.weights_k = nn.ParameterList([_normal(s, s[1]) for s in shapes])
        self.w_v = linear(dim, dim, bias=False, mup=mup)
        self.w_o = linear(dim, dim, bias=False, mup=mup, output=True)

    def sign_levels(self) -> list:
        """The levels l whose LayerNorm sees r_l 2^l < 4 features per head: their output is
        a sign (or zeros) with no useful gradient, so such a layer cannot learn its scores.
        Loading one (an old checkpoint) is allowed; the trainer refuses to start one."""
        return [l for l, r in enumerate(self.ranks) if r << l < 4]

    def project(self, x: Tensor):
        """x [B, T, dim] -> q, k [B, T, H, E], v [B, T, H, dim // H]."""
        options = dict(ranks=self.ranks, heads=self.heads, rms_cap=self.rms_cap,
                       threads=self.threads)
        q = ops.bilinear_mlr_project(x, list(self.weights_q), level_scale=self.level_scale,
                                     **options)
        k = ops.bilinear_mlr_project(x, list(self.weights_k), level_scale=[], **options)
        return q, k, split_heads(self.w_v(x), self.heads)

    def attend(self, x: Tensor) -> Tensor:
        q, k, v = self.project(x)
        out, _ = ops.exact_attention(q, k, v, scale=1.0, causal=self.causal, window=0,
                                     threads=self.threads)
        return self.w_o(out.flatten(-2))

    def init_cache(self, batch: int, *, context: Optional[int] = None, dtype=None, device=None):
        """An empty KVCache of the projected keys [.., E] and values (context: unused)."""
        return _kv_cache(self, batch, self.score_dim, self.value_dim, dtype, device)

    def decode(self, x: Tensor, cache) -> Tensor:
        _check_kv_cache(cache)
        q, k, v = self.project(x)
        return self.w_o(cache.update(q, k, v, scale=1.0).flatten(-2))


class BTTAttention(AttentionLayer):
    """Attention with a bilinear BTT score: x [B, T, dim] -> [B, T, dim].

    S_h[t, t'] = <x_t, LN(y_h(x_t'))> * scale with y_h the BTT projection (w1 [a, b,
    heads b rank], w2 [heads b, a, a rank], (a, b) = subquad.btt_factors(dim)): full-rank
    scores at O(dim^1.5) parameters; scale 1/sqrt(dim), or 1/dim under mup. v = x W_v
    (value head dim dim // heads); W_o. Options: rank, causal, mup, rms_cap, threads.
    """

    name = "btt"
    capabilities = BTT

    def __init__(self, dim: int, heads: int, rank: int = 1, *, causal: bool = True,
                 mup: bool = False, rms_cap: bool = True, threads: int = 0):
        super().__init__(dim)
        check_heads(dim, heads)
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"rank: expected an int >= 1, got {rank!r}")
        self.heads, self.rank, self.causal = heads, rank, causal
        self.rms_cap, self.threads = rms_cap, threads
        self.prefix_only = causal
        self.value_dim = dim // heads
        self.scale = 1.0 / dim if mup else 1.0 / math.sqrt(dim)
        a, b = _core.btt_factors(dim)
        self.w1 = _normal((a, b, heads * b * rank), b)
        self.w2 = _normal((heads * b, a, a * rank), a * rank)
        self.w_v = linear(dim, dim, bias=False, mup=mup)
        self.w_o = linear(dim, dim, bias=False, mup=mup, output=True)

    def project(self, x: Tensor):
        """x [B, T, dim] -> q (x itself, read in place), k [B, T, H, dim], v [B, T, H, dim/H]."""
        k = ops.btt_project(x, self.w1, self.w2, heads=self.heads, rank=self.rank,
                            rms_cap=self.rms_cap, threads=self.threads)
        q = x.unsqueeze(2).expand(-1, -1, self.heads, -1)
        return q, k, split_heads(self.w_v(x), self.heads)

    def attend(self, x: Tensor) -> Tensor:
        q, k, v = self.project(x)
        out, _ = ops.exact_attention(q, k, v, scale=self.scale, causal=self.causal, window=0,
                                     threads=self.threads)
        return self.w_o(out.flatten(-2))

    def init_cache(self, batch: int, *, context: Optional[int] = None, dtype=None, device=None):
        """An empty KVCache of the BTT keys [.., dim] and values (context: unused)."""
        return _kv_cache(self, batch, self.dim, self.value_dim, dtype, device)

    def decode(self, x: Tensor, cache) -> Tensor:
        _check_kv_cache(cache)
        q, k, v = self.project(x)
        return self.w_o(cache.update(q, k, v, scale=self.scale).flatten(-2))
