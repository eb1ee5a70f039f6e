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
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..cache import KVCache

__all__ = ["PRESSES", "Press", "make_press", "kept_entries"]

SINKS = 4  # StreamingLLM's attention sinks; also CompressKV's exact prefix here
SNAPKV_WINDOW = 64  # SnapKV observation window (kvpress default)
SNAPKV_KERNEL = 5  # SnapKV pooling width (kvpress default)
COMPRESSKV_WINDOW = 64  # recent tokens CompressKV keeps exactly (at least)
BIN_RANK = 16  # coreset points per bin (CompressKV default)


def kept_entries(length: int, compression_ratio: float) -> int:
    """Entries a head keeps: int(S (1 - r)), kvpress's rule."""
    return int(length * (1 - compression_ratio))


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


def _weighted_layout(length: int, compression_ratio: float) -> Tuple[int, int, int]:
    """(sinks, window, bins) of a weighted press at budget int(S (1 - r)): sinks and
    window exact, bins x BIN_RANK coreset points in the middle, the budget met exactly
    (the window takes the remainder). bins 0: the budget is all sinks + window."""
    kept = kept_entries(length, compression_ratio)
    bins = max(0, (kept - SINKS - COMPRESSKV_WINDOW) // BIN_RANK)
    sinks = min(SINKS, kept)
    return sinks, kept - sinks - bins * BIN_RANK, bins


def _store_weighted(layer: KVCache, keep: Tensor, log_weights: Tensor, values: Tensor):
    layer.compress(keep, log_weights=log_weights, values=values)


def _fold(weight_rows: Tensor, log_row_scale: Tensor, values: Tensor):
    """Entries of a coreset from folded rows: the entry counts as exp(o) [Vt, w] with
    Vt = A values, w = A 1 (A = weight_rows [..., r, n], values [..., n, Dv]). Returns
    (values Vt / w [..., r, Dv], log weights o + log w [..., r]) where w > 0; w <= 0 rows get log weight -inf (see the README: such
    rows are dropped from attention)."""
    folded = weight_rows @ values  # [r, Dv]
    totals = weight_rows.sum(-1)  # [r]
    positive = totals > 0
    safe = torch.where(positive, totals, torch.ones_like(totals))
    log_weights = torch.where(positive, log_row_scale + torch.log(safe),
                              torch.full_like(totals, -math.inf))
    return folded / safe[..., None], log_weights, int((~positive).sum())


class CompressKVPress(Press):
    """subquad._core.CompressKV per block, converted to KVCache entries with log-weights."""

    name = "compresskv"

    def compress_layer(self, block, layer, queries):
        from .. import _core

        kept = kept_entries(layer.length, self.compression_ratio)
        sinks, window, bins = _weighted_layout(layer.length, self.compression_ratio)
        if bins == 0:
            return StreamingLLMPress(self.compression_ratio).compress_layer(block, layer, None)
        middle = layer.length - sinks - window
        # Middle ratio r' with floor(middle (1 - r')) = bins * BIN_RANK exactly (+0.5 guards
        # against the float product rounding down).
        ratio = 1.0 - (bins * BIN_RANK + 0.5) / middle
        compressor = _core.CompressKV(sink=sinks, window=window, compression_ratio=ratio,
                                      bin_rank=BIN_RANK, seed=self.seed * 1000003 + block)
        keys = layer.keys.float().transpose(1, 2).contiguous()  # [B, S, Hkv, D]
        values = layer.values.float().transpose(1, 2).contiguous()
        # The entries kept, by index into the S held: entry e counts as exp(log_scale)
        # [W V, w]; as a KVCache entry its value is W V / w and its log-weight
        # log_scale + log w. Non-positive Nystrom weights (w <= 0) cannot be a log-weight:
        # those entries get -inf, as do the padding slots of a short coreset.
        indices, weighted, weights, log_scales, counts = (
            torch.from_numpy(a) for a in compressor.select(keys, values, threads=1))
        count = int(counts.max())
        if count > kept:
            raise RuntimeError(f"compresskv: {count} entries for a budget of {kept}")
        held = torch.arange(indices.shape[2]) < counts[..., None]  # [B, Hkv, L]
        positive = held & (weights > 0)
        safe = torch.where(positive, weights, torch.ones_like(weights)).double()
        pad = kept - indices.shape[2]  # a short coreset (exhausted residuals) leaves slots
        keep = F.pad(torch.where(held, indices, 0), (0, pad))  # padding: entry 0, never seen
        log_weights = F.pad(torch.where(positive, log_scales.double() + torch.log(safe),
                                        torch.full_like(safe, -math.inf)), (0, pad),
                            value=-math.inf)
        new_values = F.pad(weighted.double() / safe[..., None], (0, 0, 0, pad))
        self._count("nonpositive_weights", int((held & ~positive).sum()))
        self._count("padded", int((kept - counts).sum()))
        self._count("entries", int(keep.shape[0] * keep.shape[1]) * kept)
        _store_weighted(layer, keep, log_weights.to(layer.dtype),
                        new_values.to(layer.dtype))

    def _count(self, key, value):
        self.stats[key] = self.stats.get(key, 0) + value


class NystromPress(CompressKVPress):
    """Uniform-Nyström: CompressKV's bins and exact sinks/window, pivots drawn uniformly
    without replacement, Nyström weights W = H_SS^+ H_S: of the exponential kernel at
    WildCat's temperature (float64)."""

    name = "nystrom"

    def compress_layer(self, block, layer, queries):
        from .. import _core

        kept = kept_entries(layer.length, self.compression_ratio)
        sinks, window, bins = _weighted_layout(layer.length, self.compression_ratio)
        if bins == 0:
            return StreamingLLMPress(self.compression_ratio).compress_layer(block, layer, None)
        length = layer.length
        keys = layer.keys.double()  # [B, Hkv, S, D]
        values = layer.values.double()
        beta = 1.0 / math.sqrt(layer.head_dim)
        generator = torch.Generator().manual_seed(self.seed * 1000003 + block)
        middle = torch.arange(sinks, length - window)
        edges = np.linspace(0, len(middle), bins + 1).round().astype(int)
        batch, kv_heads = keys.shape[:2]
        keep = torch.zeros(batch, kv_heads, kept, dtype=torch.int64)
        log_weights = torch.zeros(batch, kv_heads, kept, dtype=torch.float64)
        new_values = values.new_zeros(batch, kv_heads, kept, layer.value_dim)
        exact = torch.cat([torch.arange(sinks), torch.arange(length - window, length)])
        sizes = edges[1:] - edges[:-1]  # members per bin: two values at most
        slots = len(exact) + BIN_RANK * torch.arange(bins)  # first entry of each bin
        dropped = 0
        for b in range(batch):
            for h in range(kv_heads):
                k, v = keys[b, h], values[b, h]
                centred = k - k.mean(0)  # softmax-exact recentering (as CompressKV)
                keep[b, h, :len(exact)] = exact
                new_values[b, h, :len(exact)] = v[exact]
                # Pivots drawn bin after bin from one generator; then the bins of one size
                # are solved as a batch.
                draws = [torch.randperm(int(n), generator=generator)[:BIN_RANK] for n in sizes]
                for size in np.unique(sizes):
                    group = np.nonzero(sizes == size)[0]
                    members = middle[torch.as_tensor(edges[group])[:, None]
                                     + torch.arange(int(size))]  # [g, n]
                    rows = torch.stack([draws[c] for c in group])  # [g, r]
                    kc = centred[members]  # [g, n, D]
                    radius = kc.norm(dim=-1).amax(-1)  # [g]
                    tau = torch.tensor([
                        _core.wildcat_temperature(beta, float(r), float(r), int(size))
                        if r > 0 else 1.0 for r in radius], dtype=torch.float64)
                    scaled = kc * math.sqrt(beta) / tau[:, None, None]  # [g, n, D]
                    sq = (scaled * scaled).sum(-1)  # [g, n]
                    picked = scaled.gather(1, rows[..., None].expand(-1, -1, scaled.shape[2]))
                    sq_picked = sq.gather(1, rows)  # [g, r]
                    # Unit-diagonal Gaussian form G = exp(<kt_i, kt_j> - sq_i/2 - sq_j/2).
                    gram = torch.exp(picked @ scaled.transpose(1, 2) - sq_picked[..., None] / 2
                                     - sq[:, None, :] / 2)  # [g, r, n]
                    square = gram.gather(2, rows[:, None, :].expand(-1, rows.shape[1], -1))
                    inverse = torch.linalg.pinv(square, hermitian=True, rtol=1e-10)
                    # W = diag(e^{-sq_S/2}) G_SS^+ G_S: diag(e^{sq/2}); the column factor
                    # is shifted by its max (a row log scale) to stay in range.
                    shift = sq.amax(-1, keepdim=True) / 2  # [g, 1]
                    rows_w = (inverse @ gram) * torch.exp(sq / 2 - shift)[:, None, :]
                    folded, lw, bad = _fold(rows_w, shift - sq_picked / 2, v[members])
                    dropped += bad
                    at = (slots[group][:, None] + torch.arange(rows.shape[1])).reshape(-1)
                    keep[b, h, at] = members.gather(1, rows).reshape(-1)
                    new_values[b, h, at] = folded.reshape(-1, folded.shape[-1])
                    log_weights[b, h, at] = lw.reshape(-1)
                at = len(exact) + BIN_RANK * bins
                if at != kept:
                    raise RuntimeError(f"nystrom: {at} entries for a budget of {kept}")
        self._count("nonpositive_weights", dropped)
        self._count("entries", batch * kv_heads * kept)
        _store_weighted(layer, keep, log_weights.to(layer.dtype),
                        new_values.to(layer.dtype))


PRESSES = {press.name: press for press in (NoPress, RandomPress, StreamingLLMPress,
                                           KnormPress, SnapKVPress, NystromPress,
                                           CompressKVPress)}


def make_press(name: str, compression_ratio: float = 0.0, seed: int = 0) -> Press:
    if name not in PRESSES:
        raise ValueError(f"press: expected one of {sorted(PRESSES)}, got {name!r}")
    return PRESSES[name](compression_ratio, seed)
