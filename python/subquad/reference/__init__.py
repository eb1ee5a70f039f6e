"""subquad.reference: every operator of subquad in plain torch, one reference per method.

The test oracle of the C++ kernels, and the implementation that subquad.ops registers for
tensors on devices without kernels of their own (CUDA, MPS, ...). Same arguments and
layouts as subquad.ops, without `threads`.
"""

from .operators import (  # noqa: F401
    bilinear_mlr_project,
    btt_project,
    cap_weight,
    cat,
    cat_avgkey,
    cat_causal,
    cat_causal_rows,
    circulant2d,
    exact_attention,
    merge_attention,
    mlr_attention,
    mlr_attention_rows,
    mlr_decode_rows,
    mlr_attention_with_lse,
    mlr_block_sizes,
    mlr_scores,
    rms_cap_limit,
    vjp,
)
from .wildcat import wildcat_attention  # noqa: F401
