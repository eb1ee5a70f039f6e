"""KV-cache presses with NVIDIA kvpress semantics, applied once after prefill.

`compression_ratio` r is the fraction removed: every KV head of every block keeps
int(S (1 - r)) of its S entries. A press is called on a LlamaCache after prefill
(`press(cache)`); tokens appended later (the question, the continuation) keep their original
positions. Bytes really drop: KVCache.compress gathers the kept entries into new storage.

Weighted presses (entries carry log-weights and folded values):
    compresskv   subquad's WildCat CompressKV (randomly pivoted Cholesky coresets with
                 Nyström weights per bin; 4 sinks and a recent window kept exactly)
    nystrom      uniform-Nyström: the same bins and weights with uniformly drawn pivots
kvpress's scorer presses (random, StreamingLLM, Knorm, SnapKV) are kvpress's own, run by
subquad.kvstudy: this package's copies kept kvpress 0.5.5's entries on identical
caches (docs/llm_parity.md) and were retired (RETIRED).
"""

from typing import Dict

from .. import kv_coresets
from ..cache import KVCache
from ..kv_coresets import kept_entries

__all__ = ["PRESSES", "RETIRED", "Press", "make_press", "kept_entries", "retired_press"]


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
            self.compress_layer(block, layer)

    def compress_layer(self, block: int, layer: KVCache) -> None:
        raise NotImplementedError


class NoPress(Press):
    name = "none"

    def __call__(self, cache) -> None:
        return


class CompressKVPress(Press):
    """subquad._core.CompressKV per block (subquad.kv_coresets.compresskv), stored as
    KVCache entries with log-weights and folded values."""

    name = "compresskv"
    select = staticmethod(kv_coresets.compresskv)

    def compress_layer(self, block, layer):
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


PRESSES = {press.name: press for press in (NoPress, NystromPress, CompressKVPress)}

# The names of the retired scorer presses (records of docs/results/kv-compression.md carry
# them) -> the kvpress press that does the same.
RETIRED = {"random": "RandomPress", "streaming": "StreamingLLMPress", "knorm": "KnormPress",
           "snapkv": "SnapKVPress"}


def retired_press(name: str) -> str:
    """Why a retired press name is refused, and what replaces it."""
    return (f"{name}: retired; use kvpress's {RETIRED[name]} (subquad.kvstudy runs kvpress's "
            f"presses)")


def make_press(name: str, compression_ratio: float = 0.0, seed: int = 0) -> Press:
    if name in RETIRED:
        raise ValueError(f"press: {retired_press(name)}")
    if name not in PRESSES:
        raise ValueError(f"press: expected one of {sorted(PRESSES)}, got {name!r}")
    return PRESSES[name](compression_ratio, seed)
