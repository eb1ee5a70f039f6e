"""One prefill, every press: the full cache of a context, and what each attention layer's
kvpress forward hook saw during the prefill (module, keyword arguments, output), so that a
press compresses a copy of the full cache by replaying its own hook on those arguments.

During a prefill, a layer's cache is compressed after that layer's attention has run, and
the next layer's input does not depend on the cache: the replayed hooks see exactly what
they would see in `with press(model): model(ids)`, at the cost of one prefill per context
instead of one per (press, ratio). tests/test_kvstudy_runner.py checks the equality.
Memory: the layers' hidden states, C x dim floats per layer, are held with the cache.
"""

import copy
from typing import Dict, List, Tuple

import torch
from torch import Tensor
from transformers import DynamicCache

from ..hf.coreset_cache import CoresetLayer
from ..llm.timing import PeakMemory

__all__ = ["Prefill", "cache_entries", "decoder_layers"]


def decoder_layers(model) -> List:
    inner = getattr(model, "model", None)
    inner = getattr(inner, "language_model", inner)
    return list(inner.layers)


def cache_entries(model, cache) -> Dict[str, float]:
    """entries held (summed over layers and KV heads), entries attended (held minus AdaKV's
    masked keys and coreset points of log-weight -inf), bytes held, and the mean entries
    attended per KV head and layer."""
    held = attended = nbytes = 0
    heads = 0
    for module, layer in zip((layer.self_attn for layer in decoder_layers(model)), cache.layers):
        keys, values = layer.keys, layer.values  # [B, Hkv, S, D], [B, Hkv, S, Dv]
        count = keys.shape[0] * keys.shape[1] * keys.shape[2]
        held += count
        heads += keys.shape[0] * keys.shape[1]
        nbytes += keys.nbytes + values.nbytes
        masked = getattr(module, "masked_key_indices", None)
        dropped = 0 if masked is None else int(masked[0].numel())
        if isinstance(layer, CoresetLayer):
            nbytes += layer.log_weights.nbytes
            dropped += int((layer.log_weights <= -1e4).sum())
        attended += count - dropped
    return {"entries_held": held, "entries_attended": attended, "cache_bytes": nbytes,
            "kept_per_head": attended / heads}


class Prefill:
    """Prefill(model, ids [1, C]): the full cache, the last position's logits [V] and the
    hook arguments of every attention layer; `compress(press)` -> a compressed copy."""

    @torch.no_grad()
    def __init__(self, model, ids: Tensor):
        self.model = model
        self.context = ids.shape[1]
        self.calls: Dict[int, Tuple] = {}
        modules = [layer.self_attn for layer in decoder_layers(model)]

        def record(module, args, kwargs, output):
            # kvpress's hooks read output[1] only; the attention output is not kept.
            self.calls[module.layer_idx] = (module, dict(kwargs), (None,) + tuple(output[1:]))

        hooks = [m.register_forward_hook(record, with_kwargs=True) for m in modules]
        self.cache = DynamicCache()
        try:
            with PeakMemory() as cost:
                out = model(input_ids=ids, past_key_values=self.cache, logits_to_keep=1)
        finally:
            for hook in hooks:
                hook.remove()
        self.last_logits = out.logits[0, -1]  # [V]: predicts the token after the context
        self.prefill_s, self.prefill_cpu_s, self.prefill_peak_mib = (
            cost.seconds, cost.cpu_seconds, cost.mib)
        self.modules = modules

    def full_cache(self):
        """A copy of the uncompressed cache."""
        self._clear_masks()
        return copy.deepcopy(self.cache)

    def _clear_masks(self) -> None:
        # AdaKV leaves its masked keys on the modules; a prefill would clear them.
        for module in self.modules:
            module.masked_key_indices = None

    @torch.no_grad()
    def compress(self, press):
        """A copy of the full cache compressed by `press`, and the cost: wall and CPU
        seconds and peak resident MiB of the compression alone."""
        cache = self.full_cache()
        with press(self.model):
            with PeakMemory() as cost:
                for index in sorted(self.calls):
                    module, kwargs, output = self.calls[index]
                    press.forward_hook(module, [], {**kwargs, "past_key_values": cache}, output)
        return cache, {"compress_s": cost.seconds, "compress_cpu_s": cost.cpu_seconds,
                       "compress_peak_mib": cost.mib}
