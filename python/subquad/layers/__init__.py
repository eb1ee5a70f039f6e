"""subquad.layers: one nn.Module per attention mechanism, one forward contract, a registry.

    layer = subquad.layers.build("cat", dim=64, heads=4)
    y, cache = layer(x [B, T, dim], attention_mask=None, cache=None)

attention_mask [B, T] is 1 for a token and 0 for padding. CPU tensors run subquad's C++
kernels; tensors on other devices run the torch-native math of layers.native (the test
oracle of the C++ path; backend="torch" selects it on CPU too). capabilities(name) says
what an entry supports; build() raises for unknown options and impossible combinations.
See python/subquad/layers/README.md for the contract, the masks and the table.
"""

from .base import AttentionLayer
from .exact import ExactAttention, SlidingWindowAttention
from . import exact as _exact
from .registry import ATTENTIONS, Capabilities, build, capabilities, names, register

register("exact", ExactAttention, _exact.EXACT)
register("sliding-window", SlidingWindowAttention, _exact.SLIDING_WINDOW)

__all__ = [
    "ATTENTIONS",
    "AttentionLayer",
    "Capabilities",
    "ExactAttention",
    "SlidingWindowAttention",
    "build",
    "capabilities",
    "names",
    "register",
]
