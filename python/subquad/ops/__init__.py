"""subquad.ops: every operator of subquad as a torch custom operator (torch.library).

Torch's dispatcher is the one switch: CPU tensors run the C++ kernels, which write into
torch-allocated outputs; tensors on any other device run subquad.reference, registered as
each operator's default implementation. Each differentiable operator has its backward as
an operator too, registered with register_autograd, and a fake implementation, so that
torch.compile(fullgraph=True) traces forward and backward. Operators (torch.ops.subquad.*):

    exact_attention       (q, k, v) -> (out, lse)
    merge_attention       (out_a, lse_a, out_b, lse_b) -> (out, lse)
    cat                   (z, v) -> out                  CAT, roll or conv convention
    cat_avgkey            (q, k, v) -> out               averaged-key CAT
    cat_causal            (z, v) -> out                  causal CAT (lag convention)
    cat_causal_decode     (z, v) -> out                  its newest rows (decoding; no grad)
    circulant2d           (q, k, v) -> out               2D Circulant Attention on a grid
    mlr_attention         (q, k, v) -> out               MLR attention
    mlr_decode            (q, level_keys, v) -> out      causal MLR decoding (no grad)
    bilinear_mlr_project  (x, weights) -> y              bilinear MLR score projection
    btt_project           (x, w1, w2) -> y               BTT score projection
    wildcat_attention     (q, k, v) -> out               no grad (inference only)

The functions below take keyword options with defaults; OPERATORS lists the registered
operators (forward and backward) for tests and tools.
"""

import contextlib
import sys

from .._optional import require

require("subquad.ops", "torch", ["torch"])

import torch  # noqa: E402

if not hasattr(torch.library, "custom_op"):
    raise ImportError(f"subquad.ops needs torch >= 2.4 (torch.library.custom_op), found "
                      f"torch {torch.__version__}: pip install 'subquad[torch]'")

from torch.library import CustomOpDef  # noqa: E402

from .cat import cat, cat_avgkey, cat_causal, cat_causal_decode  # noqa: E402
from .circulant2d import circulant2d  # noqa: E402
from .exact import exact_attention, merge_attention  # noqa: E402
from .structured import (bilinear_mlr_project, btt_project, mlr_attention,  # noqa: E402
                         mlr_decode)
from .wildcat import wildcat_attention  # noqa: E402

__all__ = [
    "bilinear_mlr_project",
    "btt_project",
    "cat",
    "cat_avgkey",
    "cat_causal",
    "cat_causal_decode",
    "circulant2d",
    "exact_attention",
    "merge_attention",
    "mlr_attention",
    "mlr_decode",
    "wildcat_attention",
]

# Every registered operator, by its name in torch.ops.subquad. (The family modules are read
# from sys.modules: the package's names cat and circulant2d are the functions.)
OPERATORS = {
    op._name: op
    for family in ("cat", "circulant2d", "exact", "structured", "wildcat")
    for op in vars(sys.modules[f"{__name__}.{family}"]).values()
    if isinstance(op, CustomOpDef)
}


@contextlib.contextmanager
def reference_on_cpu():
    """Inside the block, CPU tensors run subquad.reference too: every operator's CPU kernel
    is disabled, so the dispatcher falls back to the default implementation, the path of
    tensors on devices without kernels of their own. The oracle of the layer tests."""
    with contextlib.ExitStack() as stack:
        for op in OPERATORS.values():
            stack.enter_context(op.set_kernel_enabled("cpu", False))
        yield
