"""WildCat coreset attention as a torch operator (inference only: no backward).

CPU tensors run the C++ kernel (src/wildcat), in float32; other devices run
subquad.reference's WildCat, which draws its pivots from torch's generator, so the two
agree exactly only where a bin fits whole (rank >= bin size: exact attention).
"""

from typing import Optional

import torch
from torch import Tensor
from torch.library import custom_op

from .. import _core, reference
from . import _cpu


@custom_op("subquad::wildcat_attention", mutates_args=())
def wildcat_attention_op(q: Tensor, k: Tensor, v: Tensor, rank: int, bins: int, seed: int,
                         scale: Optional[float], method: str, query_radius: str,
                         threads: int) -> Tensor:
    return reference.wildcat_attention(q, k, v, rank=rank, bins=bins, seed=seed, scale=scale,
                                       method=method, query_radius=query_radius
                                       ).to(v.dtype).contiguous()


@wildcat_attention_op.register_kernel("cpu")
def _(q, k, v, rank, bins, seed, scale, method, query_radius, threads):
    out = _cpu.run(_core.wildcat_attention, (q, k, v), accepted=(torch.float32,), rank=rank,
                   bins=bins, seed=seed, scale=scale, method=method, query_radius=query_radius,
                   threads=threads)
    return out.to(v.dtype)


@wildcat_attention_op.register_fake
def _(q, k, v, rank, bins, seed, scale, method, query_radius, threads):
    return q.new_empty(*q.shape[:3], v.shape[3], dtype=v.dtype)


def wildcat_attention(q: Tensor, k: Tensor, v: Tensor, *, rank: int = 128, bins: int = 1,
                      seed: int = 0, scale: Optional[float] = None, method: str = "wildcat",
                      query_radius: str = "keys", threads: int = 0) -> Tensor:
    """WildCat coreset attention; the result carries no gradient.

    q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> out [B, N, H, Dv] approximating
    softmax(scale q k^T) v. rank: coreset points per (batch, kv head) over all bins; bins:
    contiguous key bins compressed independently; method "wildcat", "uniform_nystrom" or
    "uniform_subsample"; query_radius: the R_Q of the temperature, "keys" (R_Q = R_K) or
    "queries" (max ||q||). See subquad.wildcat_attention.
    """
    return wildcat_attention_op(q.detach(), k.detach(), v.detach(), rank, bins, seed, scale,
                                method, query_radius, threads)
