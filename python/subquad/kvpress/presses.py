"""kvpress presses that keep a weighted coreset of each KV head: CompressKVPress (WildCat's
CompressKV) and UniformNystromPress, selected by subquad.kv_coresets (the functions
subquad.llm's presses call). Applied after each attention layer of the prefill, as
kvpress's presses: the layer's DynamicLayer becomes a CoresetLayer (subquad.hf) holding the
int(S (1 - r)) kept entries, their folded values and their log-weights, which the "subquad"
attention adds to the scores of every later step (the question, the answer).
"""

import numbers
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar, Dict, Generator

from kvpress import BasePress
from kvpress.presses.base_press import is_prefilling
from torch import nn
from transformers import PreTrainedModel
from transformers.cache_utils import DynamicLayer

from .. import kv_coresets
from ..hf import NAME, KeyPadding
from ..hf.coreset_cache import CoresetLayer

__all__ = ["CompressKVPress", "CoresetPress", "UniformNystromPress"]


def _count(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")


@dataclass
class CoresetPress(BasePress):
    """A press whose kept entries carry log-weights (see the module docstring).

    compression_ratio r in [0, 1): the fraction of each head's S entries removed (0: the
    cache is left as it is); seed: the pivots' draws (block b draws from seed * 1000003 +
    b); n_sink first tokens and at least window_size recent ones are kept exactly (weight
    1), bins of the middle keep bin_rank points each. When no bin fits the budget, the
    press keeps the n_sink first and the most recent entries, unweighted.
    """

    compression_ratio: float = 0.0
    seed: int = 0
    n_sink: int = kv_coresets.SINKS
    window_size: int = kv_coresets.WINDOW
    bin_rank: int = kv_coresets.BIN_RANK
    # Summed over the layers compressed: coreset points with a non-positive weight
    # (never attended), padding slots of short coresets, entries kept.
    stats: Dict[str, int] = field(default_factory=dict, init=False, repr=False,
                                  compare=False)

    select: ClassVar = None  # a subquad.kv_coresets function

    def __post_init__(self):
        ratio = self.compression_ratio
        if (isinstance(ratio, bool) or not isinstance(ratio, numbers.Real)
                or not 0.0 <= ratio < 1.0):
            raise ValueError(f"compression_ratio: expected a fraction in [0, 1), got {ratio!r}")
        _count("seed", self.seed, 0)
        _count("n_sink", self.n_sink, 0)
        _count("window_size", self.window_size, 0)
        _count("bin_rank", self.bin_rank, 1)

    @contextmanager
    def __call__(self, model: PreTrainedModel) -> Generator:
        """Compresses every prefill of `model` run inside the block; the hooks leave with it
        (the compressed caches keep their weights)."""
        implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
        if implementation != NAME:
            raise ValueError(
                f"model: {type(self).__name__} needs the {NAME!r} attention, which adds the "
                f"coreset's log-weights to the scores; the model runs {implementation!r} "
                f"(load it with attn_implementation=subquad.hf.register(), or call "
                f"model.set_attn_implementation({NAME!r}))")
        self.post_init_from_model(model)
        hooks = [layer.self_attn.register_forward_hook(self.forward_hook, with_kwargs=True)
                 for layer in _decoder_layers(model)]
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()

    def forward_hook(self, module: nn.Module, input, kwargs: dict, output):
        hidden_states = kwargs["hidden_states"]
        if (self.compression_ratio == 0
                or not is_prefilling(kwargs["cache_position"], hidden_states.shape[1])):
            return output
        cache = kwargs.get("past_key_values")
        if cache is None:
            raise ValueError(f"{type(self).__name__}: the prefill runs without a cache "
                             f"(use_cache=False?): nothing to compress")
        index = module.layer_idx
        layer = cache.layers[index]
        if type(layer) is not DynamicLayer:
            raise ValueError(f"{type(self).__name__}: compresses a DynamicCache's layers, "
                             f"got a {type(layer).__name__} at layer {index}")
        mask = kwargs.get("attention_mask")
        if not (mask is None or isinstance(mask, KeyPadding) and mask.keep is None):
            raise ValueError(f"{type(self).__name__}: the prefill is padded (or has a custom "
                             f"mask): only unpadded batches are compressed")
        keys, values = layer.keys, layer.values  # [B, Hkv, S, D], [B, Hkv, S, Dv]
        coreset = type(self).select(keys.cpu(), values.cpu(), float(self.compression_ratio),
                                    seed=kv_coresets.layer_seed(self.seed, index),
                                    sinks=self.n_sink, window=self.window_size,
                                    bin_rank=self.bin_rank)
        for key, value in coreset.stats.items():
            self.stats[key] = self.stats.get(key, 0) + value
        keep = coreset.keep.to(keys.device)[..., None]  # [B, Hkv, kept, 1]
        kept_keys = keys.gather(2, keep.expand(-1, -1, -1, keys.shape[3])).contiguous()
        if coreset.log_weights is None:  # sinks and window only: weight 1, values as held
            layer.keys = kept_keys
            layer.values = values.gather(2, keep.expand(-1, -1, -1, values.shape[3])).contiguous()
            return output
        cache.layers[index] = CoresetLayer(kept_keys, coreset.values.to(values),
                                           coreset.log_weights, config=module.config)
        return output

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        raise NotImplementedError(
            f"{type(self).__name__}.compress: a coreset press's entries carry log-weights, "
            f"which keys and values alone would drop; it compresses through its forward hook "
            f"(press(model), the kvpress pipeline)")


def _decoder_layers(model: nn.Module):
    """The decoder layers of a causal LM (kvpress's rule: model.model[.language_model])."""
    inner = getattr(model, "model", None)
    inner = getattr(inner, "language_model", inner)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"model: expected a causal LM with model.model.layers, got "
                         f"{type(model).__name__}")
    return layers


@dataclass
class CompressKVPress(CoresetPress):
    """WildCat's CompressKV (subquad._core.CompressKV): randomly pivoted Cholesky pivots per
    bin with Nystrom weights. See CoresetPress for the arguments."""

    select: ClassVar = staticmethod(kv_coresets.compresskv)


@dataclass
class UniformNystromPress(CoresetPress):
    """Uniform Nystrom: CompressKV's bins and weights, pivots drawn uniformly without
    replacement. See CoresetPress for the arguments."""

    select: ClassVar = staticmethod(kv_coresets.uniform_nystrom)
