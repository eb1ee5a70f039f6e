"""The study's presses: name -> constructor of a kvpress press at a compression ratio, with
the settings each press may sweep on held-out documents.

kvpress 0.5.5's own presses (SnapKV, StreamingLLM, Knorm, TOVA, ExpectedAttention,
PyramidKV, AdaKV over SnapKV, KeyDiff, random), the authors' sink + window + uniform
baseline (`SinkWindowUniformPress`, below), and subquad.kvpress's coreset presses
(CompressKV, uniform Nystrom) at the authors' settings (32 sinks, a 32-token window, bins of
12). Every press keeps int(S (1 - r)) entries per KV head (AdaKV: on average over the
heads of a layer; PyramidKV: on average over the layers).
"""

import itertools
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Sequence

import kvpress
import torch
from kvpress import ScorerPress

from .. import kvpress as coreset_presses
from ..hf import register

__all__ = ["AUTHORS", "PRESSES", "PressSpec", "SinkWindowUniformPress", "make",
           "register_attention", "settings_grid"]

# The WildCat authors' CompressKV settings: 32 sink tokens, a 32-token window, bins of 12.
AUTHORS = {"n_sink": 32, "window_size": 32}
AUTHORS_BIN_RANK = 12
_KEEP_ALWAYS = 3.0  # scores above any uniform draw in [0, 1): sinks, then the window


@dataclass
class SinkWindowUniformPress(ScorerPress):
    """The authors' uniform baseline: the n_sink first and window_size most recent entries
    kept, the rest of the budget a uniform draw (without replacement, unweighted) from the
    middle. With a budget below n_sink + window_size: the sinks, then the most recent."""

    compression_ratio: float = 0.0
    n_sink: int = AUTHORS["n_sink"]
    window_size: int = AUTHORS["window_size"]
    seed: int = 0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        batch, heads, length = keys.shape[:3]
        generator = torch.Generator().manual_seed(self.seed * 1000003 + module.layer_idx)
        scores = torch.rand(batch, heads, length, generator=generator, dtype=torch.float64)
        recent = torch.arange(length, dtype=torch.float64) / length  # the latest highest
        window = slice(max(length - self.window_size, 0), length)
        scores[..., window] = _KEEP_ALWAYS - 1 + recent[window]
        scores[..., :self.n_sink] = _KEEP_ALWAYS
        return scores.to(keys.device)


@dataclass(frozen=True)
class PressSpec:
    """How to build one press: fixed settings, and a grid of 2-3 values per swept setting
    (tried on the tuning documents, never on the evaluation ones)."""

    build: Callable[..., object]  # build(compression_ratio, seed, **settings) -> a press
    grid: Mapping[str, Sequence]
    family: str  # "kvpress", "authors' baseline", "coreset"


def _kvpress(cls, **fixed):
    def build(ratio, seed, **settings):
        return cls(compression_ratio=ratio, **fixed, **settings)
    return build


def _random(ratio, seed, **settings):
    return kvpress.RandomPress(compression_ratio=ratio, seed=seed, **settings)


def _adakv_snapkv(ratio, seed, alpha_safeguard=0.2, **settings):
    return kvpress.AdaKVPress(kvpress.SnapKVPress(compression_ratio=ratio, **settings),
                              alpha_safeguard=alpha_safeguard)


def _uniform_baseline(ratio, seed, **settings):
    return SinkWindowUniformPress(compression_ratio=ratio, seed=seed, **settings)


def _coreset(cls):
    def build(ratio, seed, **settings):
        options = {**AUTHORS, "bin_rank": AUTHORS_BIN_RANK, **settings}
        return cls(compression_ratio=ratio, seed=seed, **options)
    return build


PRESSES: Dict[str, PressSpec] = {
    "snapkv": PressSpec(_kvpress(kvpress.SnapKVPress), {"window_size": [32, 64, 128]},
                        "kvpress"),
    "streaming_llm": PressSpec(_kvpress(kvpress.StreamingLLMPress), {"n_sink": [4, 32]},
                               "kvpress"),
    "knorm": PressSpec(_kvpress(kvpress.KnormPress), {}, "kvpress"),
    "tova": PressSpec(_kvpress(kvpress.TOVAPress), {}, "kvpress"),
    "expected_attention": PressSpec(_kvpress(kvpress.ExpectedAttentionPress),
                                    {"n_future_positions": [128, 512]}, "kvpress"),
    "pyramidkv": PressSpec(_kvpress(kvpress.PyramidKVPress), {"beta": [4, 20]},
                           "kvpress"),
    "adakv_snapkv": PressSpec(_adakv_snapkv, {"alpha_safeguard": [0.1, 0.2]}, "kvpress"),
    "keydiff": PressSpec(_kvpress(kvpress.KeyDiffPress), {}, "kvpress"),
    "random": PressSpec(_random, {}, "kvpress"),
    "uniform_baseline": PressSpec(_uniform_baseline, {}, "authors' baseline"),
    "compresskv": PressSpec(_coreset(coreset_presses.CompressKVPress), {}, "coreset"),
    "uniform_nystrom": PressSpec(_coreset(coreset_presses.UniformNystromPress), {}, "coreset"),
}


def settings_grid(name: str, grid: Mapping[str, Sequence] = None) -> List[Dict]:
    """Every combination of the press's swept settings (`grid` overrides the default);
    [{}] for a press with none."""
    if name not in PRESSES:
        raise ValueError(f"press: expected one of {sorted(PRESSES)}, got {name!r}")
    grid = PRESSES[name].grid if grid is None else grid
    keys = sorted(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def make(name: str, ratio: float, seed: int = 0, settings: Mapping = None):
    """The press `name` at compression ratio `ratio` with `settings` (a grid point)."""
    if name not in PRESSES:
        raise ValueError(f"press: expected one of {sorted(PRESSES)}, got {name!r}")
    return PRESSES[name].build(float(ratio), int(seed), **dict(settings or {}))


def register_attention() -> str:
    """Registers the "subquad" attention (subquad.hf); kvpress, imported above, makes
    register() wrap it with the attention patch that AdaKV needs."""
    return register()
