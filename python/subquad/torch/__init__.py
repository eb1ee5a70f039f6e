"""PyTorch autograd Functions on subquad's operators (CPU tensors).

Functions (differentiable in every tensor argument unless marked), from
``subquad.torch.functional``:
    exact_attention       (q, k, v) -> (out, lse)
    merge_attention       (out_a, lse_a, out_b, lse_b) -> (out, lse)
    cat                   (z, v) -> out                  CAT, roll or conv convention
    cat_avgkey            (q, k, v) -> out               averaged-key CAT
    cat_causal            (z, v) -> out                  causal CAT (lag convention)
    circulant2d           (q, k, v) -> out               2D Circulant Attention on a grid
    mlr_attention         (q, k, v) -> out               MLR attention
    bilinear_mlr_project  (x, weights) -> y              bilinear MLR score projection
    btt_project           (x, w1, w2) -> y               BTT score projection
    wildcat_attention     (q, k, v) -> out               no grad (inference only)

The attention layers built on these Functions are in subquad.layers.
"""

from .._optional import require

require("subquad.torch", "torch", ["torch"])

from . import functional
from .functional import *  # noqa: F401,F403  (the public functions, functional.__all__)
from .functional import __all__
