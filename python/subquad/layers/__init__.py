"""subquad.layers: one nn.Module per attention mechanism, one forward contract, a registry.

    layer = subquad.layers.build("cat", dim=64, heads=4)
    y, cache = layer(x [B, T, dim], attention_mask=None, cache=None)

attention_mask [B, T] is 1 for a token and 0 for padding. The layers call subquad.ops, so
torch's dispatcher picks the path: CPU tensors run subquad's C++ kernels, tensors on other
devices subquad.reference (subquad.ops.reference_on_cpu() selects it on CPU too, the test
oracle of the C++ path). capabilities(name) says
what an entry supports; build() raises for unknown options and impossible combinations.
See python/subquad/layers/README.md for the contract, the masks and the table.
"""

from .._optional import require

require("subquad.layers", "torch", ["torch"])

from . import cat as _cat
from . import circulant2d as _circulant2d
from . import exact as _exact
from . import structured as _structured
from . import wildcat as _wildcat
from .base import AttentionLayer
from .caches import CatCausalCache, MlrCache
from .cat import CATAvgKeyLayer, CATLayer
from .circulant2d import Circulant2dAttention, Circulant2dBlock
from .exact import ExactAttention, SlidingWindowAttention
from .registry import ATTENTIONS, Capabilities, build, capabilities, names, register
from .structured import BilinearMLRAttention, BTTAttention, MLRAttention
from .wildcat import WildcatAttention

register("exact", ExactAttention, _exact.EXACT)
register("sliding-window", SlidingWindowAttention, _exact.SLIDING_WINDOW)
register("cat", CATLayer, _cat.CAT)
register("cat-avgkey", CATAvgKeyLayer, _cat.CAT_AVGKEY)
register("cat-causal", CATLayer, _cat.CAT_CAUSAL, defaults=dict(causal=True))
register("circulant2d", Circulant2dAttention, _circulant2d.CIRCULANT2D)
register("mlr", MLRAttention, _structured.MLR)
register("bilinear-mlr", BilinearMLRAttention, _structured.BILINEAR_MLR)
register("btt", BTTAttention, _structured.BTT)
register("wildcat", WildcatAttention, _wildcat.WILDCAT)

__all__ = [
    "ATTENTIONS",
    "AttentionLayer",
    "BTTAttention",
    "BilinearMLRAttention",
    "CATAvgKeyLayer",
    "CATLayer",
    "CatCausalCache",
    "Capabilities",
    "Circulant2dAttention",
    "Circulant2dBlock",
    "ExactAttention",
    "MLRAttention",
    "MlrCache",
    "SlidingWindowAttention",
    "WildcatAttention",
    "build",
    "capabilities",
    "names",
    "register",
]
