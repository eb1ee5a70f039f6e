"""Performer-style attention (Choromanski et al., "Rethinking Attention with Performers",
FAVOR+): softmax attention estimated with m positive orthogonal random features,
O(B H (N + M) m (D + Dv)) instead of O(B H N M (D + Dv)). A baseline of the WildCat swap
(wildcat_swap.py), inference only and no registry entry. Its plain reference, quadratic in
the tokens, is performer_attention_reference.

Kernel: exp(s q.k) = E_w[phi(q) phi(k)], phi(x)_i = exp(w_i.x' - |x'|^2 / 2), x' = sqrt(s) x,
w_i ~ N(0, I_D); the m rows of w are drawn in blocks of D mutually orthogonal directions
with independent Gaussian-vector norms, so each row is N(0, I_D) and the estimate stays
unbiased with less variance than independent rows.
"""

import math
from typing import Optional

import torch
from torch import Tensor

from ..layers.base import AttentionLayer, check_heads, linear, split_heads
from ..layers.registry import Capabilities
from ..reference.operators import _repeat_kv as repeat_kv  # [B, M, Hkv, C] -> [B, M, H, C]

PERFORMER = Capabilities(
    causal=False, bidirectional=True, padding_mask=True, decoding_cache=False, backward=True,
    dtypes=("float32", "float64"), gqa=True,
    reasons={"causal": "the key state sums every key; a causal Performer needs prefix sums, "
                       "which this baseline of the bidirectional swap does not compute",
             "decoding_cache": "the swap replaces whole-sequence layers; no cache is kept"})


def equal_memory_features(rank: int, key_dim: int, value_dim: int) -> int:
    """The most random features whose state fits the memory of a coreset of `rank` keys.

    Per head a weighted coreset stores rank keys, values and weights, rank (Dk + Dv + 1)
    numbers; m random features store phi(K)^T V and phi(K)^T 1, m (Dv + 1) numbers (the
    projection w is drawn again from the seed, as a coreset's pivots are not kept). So
    m = floor(rank (Dk + Dv + 1) / (Dv + 1)): about 2 rank when Dk = Dv."""
    if rank < 1 or key_dim < 1 or value_dim < 1:
        raise ValueError(f"equal_memory_features: expected positive sizes, got rank {rank}, "
                         f"key_dim {key_dim}, value_dim {value_dim}")
    return rank * (key_dim + value_dim + 1) // (value_dim + 1)


def orthogonal_gaussian(features: int, dim: int, generator: torch.Generator) -> Tensor:
    """w [features, dim] in float64: blocks of `dim` orthonormal rows (Haar-distributed: QR
    of a Gaussian matrix with R's diagonal made positive), each row scaled by the norm of
    an independent N(0, I_dim) vector, so that every row is N(0, I_dim)."""
    if features < 1 or dim < 1:
        raise ValueError(f"orthogonal_gaussian: expected features, dim >= 1, got {features}, "
                         f"{dim}")
    blocks = []
    for _ in range(math.ceil(features / dim)):
        gaussian = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        q, r = torch.linalg.qr(gaussian)
        blocks.append((q * torch.sign(torch.diagonal(r))).T)
    directions = torch.cat(blocks)[:features]
    norms = torch.randn(features, dim, generator=generator, dtype=torch.float64).norm(dim=1)
    return directions * norms[:, None]


def positive_features(x: Tensor, projection: Tensor, scale: float) -> Tensor:
    """phi(x) [B, N, H, m] of x [B, N, H, D] with projection w [m, D], unstabilised:
    exp(w.x' - |x'|^2 / 2), x' = sqrt(scale) x."""
    x = x * math.sqrt(scale)
    return torch.exp(torch.einsum("bnhd,md->bnhm", x, projection.to(x.dtype))
                     - x.square().sum(-1, keepdim=True) / 2)


def performer_attention_reference(q: Tensor, k: Tensor, v: Tensor, projection: Tensor, *,
                                  scale: Optional[float] = None) -> Tensor:
    """The plain form, in q's dtype (the test oracle in float64): the estimated kernel
    A[n, j] = phi(q_n).phi(k_j) made explicit, unstabilised, out = A V / A 1.
    q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> [B, N, H, Dv]."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k, v = k.to(q.dtype), v.to(q.dtype)
    heads = q.shape[2]
    phi_q = positive_features(q, projection, scale)  # [B, N, H, m]
    phi_k = repeat_kv(positive_features(k, projection, scale), heads)  # [B, M, H, m]
    kernel = torch.einsum("bnhm,bjhm->bhnj", phi_q, phi_k)  # [B, H, N, M]
    out = torch.einsum("bhnj,bjhe->bnhe", kernel, repeat_kv(v, heads))  # [B, N, H, Dv]
    return out / torch.einsum("bhnj->bnh", kernel).unsqueeze(-1)


def performer_attention(q: Tensor, k: Tensor, v: Tensor, projection: Tensor, *,
                        scale: Optional[float] = None) -> Tensor:
    """FAVOR+ in linear time, in q's dtype: out = phi(q) (phi(K)^T V) / phi(q) (phi(K)^T 1).
    q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv], projection [m, D] ->
    [B, N, H, Dv]. Stabilised as Performer's code: the query features' exponents lose
    their row maximum (|q'|^2 / 2 with it), the keys' their maximum over every key and
    feature of a (batch, kv head); both are factors common to numerator and denominator.
    A denominator that underflows to 0 gives 0 (as WildCat's guard)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    heads, root = q.shape[2], math.sqrt(scale)
    w = projection.to(q.dtype)
    query_logits = torch.einsum("bnhd,md->bnhm", q * root, w)  # [B, N, H, m]
    phi_q = torch.exp(query_logits - query_logits.amax(-1, keepdim=True))
    key_logits = (torch.einsum("bjhd,md->bjhm", k * root, w)
                  - (k * root).square().sum(-1, keepdim=True) / 2)  # [B, M, Hkv, m]
    phi_k = torch.exp(key_logits - key_logits.amax(dim=(1, 3), keepdim=True))
    state = repeat_kv(torch.einsum("bjhm,bjhe->bmhe", phi_k, v.to(q.dtype)), heads)
    normaliser = repeat_kv(phi_k.sum(1, keepdim=True), heads)  # [B, 1, H, m]
    numerator = torch.einsum("bnhm,bmhe->bnhe", phi_q, state)  # [B, N, H, Dv]
    denominator = torch.einsum("bnhm,bhm->bnh", phi_q, normaliser[:, 0]).unsqueeze(-1)
    represented = denominator > torch.finfo(q.dtype).tiny
    return torch.where(represented, numerator / torch.where(represented, denominator, 1.0),
                       0.0)


class PerformerAttention(AttentionLayer):
    """Multi-head attention computed by FAVOR+: x [B, N, dim] -> [B, N, dim].

    The projections w_q, w_k, w_v, w_o are named as ExactAttention's, so a trained exact
    layer's state_dict loads into it; the random projection [features, dim / heads] is
    drawn once from `seed`, shared by the heads, and not part of the state_dict. Options:
    kv_heads, features (m), seed, scale (None: 1/sqrt(D)), bias."""

    name = "performer"
    capabilities = PERFORMER

    def __init__(self, dim: int, heads: int, *, kv_heads: Optional[int] = None,
                 features: int, seed: int = 0, scale: Optional[float] = None,
                 bias: bool = True):
        super().__init__(dim)
        check_heads(dim, heads)
        kv_heads = heads if kv_heads is None else kv_heads
        check_heads(heads, kv_heads, "kv_heads")
        self.heads, self.kv_heads, self.causal = heads, kv_heads, False
        head_dim = dim // heads
        self.scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
        self.features, self.seed = features, seed
        generator = torch.Generator().manual_seed(seed)
        self.register_buffer("projection",
                             orthogonal_gaussian(features, head_dim, generator).float(),
                             persistent=False)
        self.w_q = linear(dim, dim, bias=bias, mup=False)
        self.w_k = linear(dim, kv_heads * head_dim, bias=bias, mup=False)
        self.w_v = linear(dim, kv_heads * head_dim, bias=bias, mup=False)
        self.w_o = linear(dim, dim, bias=bias, mup=False)

    def core(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The attention of projected q [B, N, H, D], k, v [B, M, Hkv, D] -> [B, N, H, D]."""
        return performer_attention(q, k, v, self.projection, scale=self.scale)

    def attend(self, x: Tensor) -> Tensor:
        q = split_heads(self.w_q(x), self.heads)
        k = split_heads(self.w_k(x), self.kv_heads)
        v = split_heads(self.w_v(x), self.kv_heads)
        return self.w_o(self.core(q, k, v).flatten(-2))
