"""KV-cache presses with NVIDIA kvpress semantics, applied once after prefill.

`compression_ratio` r is the fraction removed: every KV head of every block keeps
int(S (1 - r)) of its S entries (kvpress's ScorerPress: top-scoring entries per head).
A press is called on a LlamaCache after prefill (`press(cache)`); tokens appended later
(the question, the continuation) keep their original positions. Bytes really drop:
KVCache.compress gathers the kept entries into new storage.

Scorer presses (higher score kept; kvpress's definitions):
    random       uniform scores (seeded)
    streaming    StreamingLLM: 4 sink tokens + the most recent ones
    knorm        smallest key L2 norms
    snapkv       attention of the last 64 prefill queries over the keys (causal, softmax,
                 mean over the window), average-pooled (kernel 5), mean over the query
                 heads of each KV group; the window itself always kept (a prompt of 64
                 tokens or fewer: every key scored by the votes of all its queries)
Weighted presses (same budget, entries carry log-weights and folded values):
    compresskv   subquad's WildCat CompressKV (randomly pivoted Cholesky coresets with
                 Nyström weights per bin; 4 sinks and a recent window kept exactly)
    nystrom      uniform-Nyström: the same bins and weights with uniformly drawn pivots
"""

import math
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import kv_coresets
from ..cache import KVCache
from ..kv_coresets import SINKS, kept_entries

__all__ = ["PRESSES", "Press", "make_press", "kept_entries"]

SNAPKV_WINDOW = 64  # SnapKV observation window (kvpress default)
SNAPKV_KERNEL = 5  # SnapKV pooling width (kvpress default)


class Press:
    """Base press: `press(cache)` compresses every block of a LlamaCache in place."""

    name = "none"

    def __init__(self, compression_ratio: float = 0.0, seed: int = 0):
        if not 0.0 <= compression_ratio < 1.0:
            raise ValueError(f"compression_ratio: expected a fraction in [0, 1), got "
                             f"{compression_ratio}")
        self.compression_ratio, self.seed = float(compression_ratio), int(seed)
        self.stats: Dict[str, float] = {}

    def __call__(self, cache) -> None:
        if self.compression_ratio == 0.0:
            return  # kvpress: ratio 0 leaves the cache untouched
        for block, layer in enumerate(cache.layers):
            self.compress_layer(block, layer, cache.queries[block])

    def compress_layer(self, block: int, layer: KVCache, queries: Optional[Tensor]) -> None:
        raise NotImplementedError


class ScorerPress(Press):
    """Keeps the int(S (1 - r)) top-scoring entries of each KV head (kept in order)."""

    def score(self, block: int, layer: KVCache, queries: Optional[Tensor]) -> Tensor:
        raise NotImplementedError  # -> [B, Hkv, S]

    def compress_layer(self, block, layer, queries):
        kept = kept_entries(layer.length, self.compression_ratio)
        scores = self.score(block, layer, queries)
        keep = scores.topk(kept, dim=-1).indices.sort(dim=-1).values
        layer.compress(keep)


class NoPress(Press):
    name = "none"

    def __call__(self, cache) -> None:
        return


class RandomPress(ScorerPress):
    name = "random"

    def score(self, block, layer, queries):
        generator = torch.Generator().manual_seed(self.seed * 1000003 + block)
        return torch.rand(layer.keys.shape[:3], generator=generator)


class StreamingLLMPress(ScorerPress):
    name = "streaming"

    def score(self, block, layer, queries):
        kept = kept_entries(layer.length, self.compression_ratio)
        scores = torch.zeros(layer.keys.shape[:3])
        scores[:, :, :SINKS] = 1.0
        recent = kept - SINKS
        if recent > 0:
            scores[:, :, layer.length - recent:] = 1.0
        return scores


class KnormPress(ScorerPress):
    name = "knorm"

    def score(self, block, layer, queries):
        return -layer.keys.float().norm(dim=-1)


class SnapKVPress(ScorerPress):
    name = "snapkv"

    def score(self, block, layer, queries):
        if queries is None:
            raise ValueError("snapkv: the cache holds no prefill queries (prefill first)")
        keys = layer.keys  # [B, Hkv, S, D]
        batch, kv_heads, length, dim = keys.shape
        window = min(SNAPKV_WINDOW, queries.shape[1], length)
        heads = queries.shape[2]
        group = heads // kv_heads
        q = queries[:, -window:].transpose(1, 2).to(keys.dtype)  # [B, H, W, D]
        k = keys.repeat_interleave(group, dim=1)  # [B, H, S, D]
        scores = q @ k.transpose(2, 3) / math.sqrt(dim)  # [B, H, W, S]
        # Query t of the window sits at position S - W + t and sees keys <= it.
        causal = torch.ones(window, window, dtype=torch.bool).triu(1)
        scores[..., length - window:] = scores[..., length - window:].masked_fill(
            causal, -math.inf)
        weights = torch.softmax(scores.float(), dim=-1)  # [B, H, W, S]
        # The keys the window votes on: those before it, or, when the prompt is no longer
        # than the window (kvpress refuses such prompts), every key, the window's own
        # queries being all there is to observe.
        voted = length - window if length > window else length
        votes = weights[..., :voted].mean(dim=-2)  # [B, H, voted]
        votes = F.avg_pool1d(votes, kernel_size=SNAPKV_KERNEL, padding=SNAPKV_KERNEL // 2,
                             stride=1)
        votes = votes.view(batch, kv_heads, group, voted).mean(2)
        # The window scores above every vote (max + 1, as kvpress): it is always kept, also
        # when fewer entries than the window are kept (a tie at the max could drop one).
        return F.pad(votes, (0, length - voted), value=float(votes.max()) + 1.0)


class CompressKVPress(Press):
    """subquad._core.CompressKV per block (subquad.kv_coresets.compresskv), stored as
    KVCache entries with log-weights and folded values."""

    name = "compresskv"
    select = staticmethod(kv_coresets.compresskv)

    def compress_layer(self, block, layer, queries):
        coreset = self.select(layer.keys, layer.values, self.compression_ratio,
                              seed=kv_coresets.layer_seed(self.seed, block))
        for key, value in coreset.stats.items():
            self.stats[key] = self.stats.get(key, 0) + value
        if coreset.log_weights is None:  # no room for a bin: sinks and window only
            layer.compress(coreset.keep)
            return
        layer.compress(coreset.keep, log_weights=coreset.log_weights.to(layer.dtype),
                       values=coreset.values.to(layer.dtype))


class NystromPress(CompressKVPress):
    """Uniform-Nystrom (subquad.kv_coresets.uniform_nystrom): CompressKV's bins and exact
    sinks/window, pivots drawn uniformly without replacement."""

    name = "nystrom"
    select = staticmethod(kv_coresets.uniform_nystrom)


PRESSES = {press.name: press for press in (NoPress, RandomPress, StreamingLLMPress,
                                           KnormPress, SnapKVPress, NystromPress,
                                           CompressKVPress)}


def make_press(name: str, compression_ratio: float = 0.0, seed: int = 0) -> Press:
    if name not in PRESSES:
        raise ValueError(f"press: expected one of {sorted(PRESSES)}, got {name!r}")
    return PRESSES[name](compression_ratio, seed)
