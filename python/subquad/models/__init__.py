"""Model families built on subquad.layers, each taking attention= (a registry entry, or
"torch" for torch's own attention) and an optional per-layer pattern (e.g.
["cat", "exact"] repeated: CAT-Alter), with muP-style init and a logit-scale option.

- CausalLM: decoder-only language model with per-layer decoding caches
- MaskedLM: encoder masked language model (BERT masking: bert_mask)
- ViTClassifier: patches, class token or mean pooling; circulant2d layers are CA-DeiT
- InContextRegressor: Garg et al.'s interleaved (x, y) layout, predictions at x
- PatchForecaster: channel-independent patches in, forecasts out (MSE)
- NeighbourRetriever: the nearest-neighbour retrieval probe (keys, labels, a query)
"""

from .._optional import require

require("subquad.models", "torch", ["torch"])

from .blocks import TORCH_ATTENTION, Block, TorchAttention, build_attention, expand_pattern
from .forecaster import PatchForecaster
from .language import IGNORE_INDEX, CausalLM, MaskedLM, bert_mask
from .regression import InContextRegressor, interleave
from .retrieval import NeighbourRetriever
from .vit import ViTClassifier

__all__ = ["TORCH_ATTENTION", "Block", "TorchAttention", "build_attention", "expand_pattern",
           "PatchForecaster", "CausalLM", "MaskedLM", "bert_mask", "InContextRegressor",
           "interleave", "NeighbourRetriever", "ViTClassifier"]
