"""Weighted KV-cache coresets: which entries of each KV head a coreset press keeps, their
log-weights and their folded values. One function per method, shared by subquad.llm's
presses (KVCache) and subquad.kvpress's (transformers' DynamicCache).

Budget: int(S (1 - r)) entries per head (kvpress's rule): `sinks` first tokens and a recent
window kept exactly (weight 1), the middle cut into bins of which each keeps `bin_rank`
coreset points. A point stands for its bin: it counts exp(log_weight) times in a softmax,
with a value folding in the bin's other values (WildCat's Nystrom weights). Methods:
    compresskv       subquad._core.CompressKV: randomly pivoted Cholesky pivots per bin
    uniform_nystrom  the same bins and weights with uniformly drawn pivots (float64 torch)
Cost per head: O(S bin_rank D) for CompressKV; O(S bin_rank (D + bin_rank)) for uniform
Nystrom. Reference: python/subquad/reference/wildcat.py (the same weights, per bin).
"""

import math
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["BIN_RANK", "SINKS", "WINDOW", "KVCoreset", "compresskv", "kept_entries",
           "layer_seed", "layout", "uniform_nystrom"]

SINKS = 4  # first tokens kept exactly (StreamingLLM's attention sinks)
WINDOW = 64  # recent tokens kept exactly (at least: the window takes the budget's remainder)
BIN_RANK = 16  # coreset points per bin (CompressKV's default)
_SEED_STRIDE = 1000003  # a press's seed and a block's index -> one seed per block


@dataclass
class KVCoreset:
    """The entries a press keeps, per (batch, KV head)."""

    keep: Tensor  # [B, Hkv, kept] int64: indices into the S entries, as `compress` takes them
    # [B, Hkv, kept] float64 added to the entries' scores; -inf: never attended (a
    # non-positive Nystrom weight, or a slot a short coreset left). None: every weight is 1.
    log_weights: Optional[Tensor]
    values: Optional[Tensor]  # [B, Hkv, kept, Dv] float64 folded; None: the entries' own
    stats: Dict[str, int] = field(default_factory=dict)


def kept_entries(length: int, compression_ratio: float) -> int:
    """Entries a head keeps: int(S (1 - r)), kvpress's rule."""
    return int(length * (1 - compression_ratio))


def layer_seed(seed: int, block: int) -> int:
    """The seed of one block's selection: blocks draw independently, runs reproducibly."""
    return seed * _SEED_STRIDE + block


def _check_count(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
    return value


def layout(length: int, compression_ratio: float, sinks: int = SINKS, window: int = WINDOW,
           bin_rank: int = BIN_RANK) -> Tuple[int, int, int]:
    """(sinks, window, bins) at budget int(S (1 - r)): sinks and window exact, bins x
    bin_rank coreset points in the middle, the budget met exactly (the window takes the
    remainder). bins 0: the budget is all sinks + window."""
    kept = kept_entries(length, compression_ratio)
    bins = max(0, (kept - sinks - window) // bin_rank)
    sinks = min(sinks, kept)
    return sinks, kept - sinks - bins * bin_rank, bins


def fold(weight_rows: Tensor, log_row_scale: Tensor, values: Tensor):
    """Entries of a coreset from folded rows: the entry counts as exp(o) [Vt, w] with
    Vt = A values, w = A 1 (A = weight_rows [..., r, n], values [..., n, Dv]). Returns
    (values Vt / w [..., r, Dv], log weights o + log w [..., r], how many w <= 0): rows
    with w <= 0 get log weight -inf (dropped from attention)."""
    folded = weight_rows @ values  # [r, Dv]
    totals = weight_rows.sum(-1)  # [r]
    positive = totals > 0
    safe = torch.where(positive, totals, torch.ones_like(totals))
    log_weights = torch.where(positive, log_row_scale + torch.log(safe),
                              torch.full_like(totals, -math.inf))
    return folded / safe[..., None], log_weights, int((~positive).sum())


def _sinks_and_window(shape, length: int, kept: int, sinks: int) -> KVCoreset:
    """No room for a bin: the first `sinks` and the last kept - sinks entries, weight 1
    (StreamingLLM's selection)."""
    keep = torch.cat([torch.arange(sinks), torch.arange(length - (kept - sinks), length)])
    return KVCoreset(keep.expand(*shape, kept).contiguous(), None, None)


def _check(keys: Tensor, values: Tensor, compression_ratio: float, sinks: int, window: int,
           bin_rank: int):
    if keys.dim() != 4 or values.dim() != 4 or keys.shape[:3] != values.shape[:3]:
        raise ValueError(f"keys, values: expected [B, Hkv, S, D] and [B, Hkv, S, Dv], got "
                         f"{list(keys.shape)} and {list(values.shape)}")
    if not 0.0 <= compression_ratio < 1.0:
        raise ValueError(f"compression_ratio: expected a fraction in [0, 1), got "
                         f"{compression_ratio}")
    _check_count("sinks", sinks, 0)
    _check_count("window", window, 0)
    _check_count("bin_rank", bin_rank, 1)


def _budget(keys: Tensor, values: Tensor, compression_ratio: float, sinks: int, window: int,
            bin_rank: int):
    """The checked arguments' (S, entries kept, sinks, window, bins) of a coreset press."""
    _check(keys, values, compression_ratio, sinks, window, bin_rank)
    length = keys.shape[2]
    return (length, kept_entries(length, compression_ratio),
            *layout(length, compression_ratio, sinks, window, bin_rank))


def compresskv(keys: Tensor, values: Tensor, compression_ratio: float, *, seed: int,
               sinks: int = SINKS, window: int = WINDOW, bin_rank: int = BIN_RANK) -> KVCoreset:
    """subquad._core.CompressKV's coreset of keys [B, Hkv, S, D], values [B, Hkv, S, Dv]
    (CPU), at the budget of `layout`, as KVCoreset entries."""
    from . import _core

    length, kept, sinks, window, bins = _budget(keys, values, compression_ratio, sinks,
                                                window, bin_rank)
    if bins == 0:
        return _sinks_and_window(keys.shape[:2], length, kept, sinks)
    middle = length - sinks - window
    # Middle ratio r' with floor(middle (1 - r')) = bins * bin_rank exactly (+0.5 guards
    # against the float product rounding down).
    ratio = 1.0 - (bins * bin_rank + 0.5) / middle
    compressor = _core.CompressKV(sink=sinks, window=window, compression_ratio=ratio,
                                  bin_rank=bin_rank, seed=seed)
    # The entries kept, by index into the S held: entry e counts as exp(log_scale) [W V, w];
    # as a cache entry its value is W V / w and its log-weight log_scale + log w.
    # Non-positive Nystrom weights (w <= 0) cannot be a log-weight: those entries get -inf,
    # as do the padding slots of a short coreset.
    indices, weighted, weights, log_scales, counts = (
        torch.from_numpy(a) for a in compressor.select(
            keys.float().transpose(1, 2).contiguous(),  # [B, S, Hkv, D]
            values.float().transpose(1, 2).contiguous(), threads=1))
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
    folded = F.pad(weighted.double() / safe[..., None], (0, 0, 0, pad))
    stats = {"nonpositive_weights": int((held & ~positive).sum()),
             "padded": int((kept - counts).sum()),
             "entries": int(keep.shape[0] * keep.shape[1]) * kept}
    return KVCoreset(keep, log_weights, folded, stats)


def uniform_nystrom(keys: Tensor, values: Tensor, compression_ratio: float, *, seed: int,
                    sinks: int = SINKS, window: int = WINDOW,
                    bin_rank: int = BIN_RANK) -> KVCoreset:
    """Uniform Nystrom: CompressKV's bins and exact sinks/window, pivots drawn uniformly
    without replacement, Nystrom weights W = H_SS^+ H_S: of the exponential kernel at
    WildCat's temperature (float64). keys [B, Hkv, S, D], values [B, Hkv, S, Dv]."""
    from . import _core

    length, kept, sinks, window, bins = _budget(keys, values, compression_ratio, sinks,
                                                window, bin_rank)
    if bins == 0:
        return _sinks_and_window(keys.shape[:2], length, kept, sinks)
    keys, values = keys.double(), values.double()
    beta = 1.0 / math.sqrt(keys.shape[3])
    generator = torch.Generator().manual_seed(seed)
    middle = torch.arange(sinks, length - window)
    edges = np.linspace(0, len(middle), bins + 1).round().astype(int)
    batch, kv_heads = keys.shape[:2]
    keep = torch.zeros(batch, kv_heads, kept, dtype=torch.int64)
    log_weights = torch.zeros(batch, kv_heads, kept, dtype=torch.float64)
    new_values = values.new_zeros(batch, kv_heads, kept, values.shape[3])
    exact = torch.cat([torch.arange(sinks), torch.arange(length - window, length)])
    sizes = edges[1:] - edges[:-1]  # members per bin: two values at most
    slots = len(exact) + bin_rank * torch.arange(bins)  # first entry of each bin
    dropped = 0
    for b in range(batch):
        for h in range(kv_heads):
            k, v = keys[b, h], values[b, h]
            centred = k - k.mean(0)  # softmax-exact recentering (as CompressKV)
            keep[b, h, :len(exact)] = exact
            new_values[b, h, :len(exact)] = v[exact]
            # Pivots drawn bin after bin from one generator; then the bins of one size are
            # solved as a batch.
            draws = [torch.randperm(int(n), generator=generator)[:bin_rank] for n in sizes]
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
                # W = diag(e^{-sq_S/2}) G_SS^+ G_S: diag(e^{sq/2}); the column factor is
                # shifted by its max (a row log scale) to stay in range.
                shift = sq.amax(-1, keepdim=True) / 2  # [g, 1]
                rows_w = (inverse @ gram) * torch.exp(sq / 2 - shift)[:, None, :]
                folded, lw, bad = fold(rows_w, shift - sq_picked / 2, v[members])
                dropped += bad
                at = (slots[group][:, None] + torch.arange(rows.shape[1])).reshape(-1)
                keep[b, h, at] = members.gather(1, rows).reshape(-1)
                new_values[b, h, at] = folded.reshape(-1, folded.shape[-1])
                log_weights[b, h, at] = lw.reshape(-1)
            at = len(exact) + bin_rank * bins
            if at != kept:
                raise RuntimeError(f"uniform_nystrom: {at} entries for a budget of {kept}")
    stats = {"nonpositive_weights": dropped, "entries": batch * kv_heads * kept}
    return KVCoreset(keep, log_weights, new_values, stats)
