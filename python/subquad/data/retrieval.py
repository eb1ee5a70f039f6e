"""Synthetic nearest-neighbour retrieval on the sphere, the probe of the low-rank
bottleneck (Bhojanapalli et al. 2020; Kuang et al. 2025): each sequence draws `keys` unit
vectors in R^dims, each with its own label (a random permutation of 0..keys-1), and a
query, a noisy copy of one of them put back on the sphere. The target is that key's label.

One attention head scores a query against a key by a bilinear form of rank <= d_head, so
with d_head < dims it sees the vectors only through a d_head-dimensional projection;
nearest_neighbour_accuracy(rank=r) is what the nearest neighbour in r coordinates scores
(the keys are isotropic, so any r-dimensional projection is as good as these)."""

from typing import NamedTuple

import torch
from torch import Tensor


class RetrievalBatch(NamedTuple):
    keys: Tensor     # float32 [B, keys, dims], unit rows
    labels: Tensor   # int64 [B, keys], a permutation of 0..keys-1 per sequence
    queries: Tensor  # float32 [B, dims], unit rows
    targets: Tensor  # int64 [B], the label of the key the query copies


def _unit(x: Tensor) -> Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def sample_sphere_retrieval(batch: int, keys: int, dims: int, noise: float,
                            generator: torch.Generator) -> RetrievalBatch:
    """`batch` sequences; query = unit(key_j + noise * g / sqrt(dims)), g ~ N(0, I), so
    the noise vector's norm is about `noise` (the key's is 1)."""
    if batch < 1 or keys < 2 or dims < 1:
        raise ValueError(f"batch, keys, dims: expected >= 1, >= 2, >= 1, got {batch}, "
                         f"{keys}, {dims}")
    if not noise >= 0 or noise == float("inf"):
        raise ValueError(f"noise: expected a finite number >= 0, got {noise}")
    key_vectors = _unit(torch.randn(batch, keys, dims, generator=generator))
    labels = torch.rand(batch, keys, generator=generator).argsort(dim=1)
    chosen = torch.randint(keys, (batch,), generator=generator)
    rows = torch.arange(batch)
    perturbation = torch.randn(batch, dims, generator=generator) * (noise / dims ** 0.5)
    queries = _unit(key_vectors[rows, chosen] + perturbation)
    return RetrievalBatch(key_vectors, labels, queries, labels[rows, chosen])


def nearest_neighbour_accuracy(batch: RetrievalBatch, rank: int) -> float:
    """The fraction of queries whose nearest key by the inner product of the first `rank`
    coordinates carries the target label."""
    if not 1 <= rank <= batch.keys.shape[-1]:
        raise ValueError(f"rank: expected 1..{batch.keys.shape[-1]}, got {rank}")
    scores = torch.einsum("bd,bnd->bn", batch.queries[:, :rank].double(),
                          batch.keys[:, :, :rank].double())
    picked = batch.labels.gather(1, scores.argmax(dim=1, keepdim=True)).squeeze(1)
    return float((picked == batch.targets).double().mean())
