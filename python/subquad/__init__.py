"""subquad: fast softmax attention beyond O(N^2) on NumPy arrays.

Every operator of the C++ library, with the C++ names and argument names:

- exact attention: exact_attention_forward, exact_attention_backward, merge_attention
Options are keyword-only; ``threads=0`` uses all cores.

Arrays
    Inputs are CPU arrays of dtype float32 or float64 (NumPy arrays, or any object
    exporting DLPack or the buffer protocol, such as CPU torch tensors without grad);
    all arrays of one call share one dtype. Strided views (slices, transposed leading
    axes) are read in place without copies as long as the last dimension is contiguous
    (stride 1) and no stride is negative; otherwise ValueError is raised: pass
    ``numpy.ascontiguousarray(x)``. Nothing is converted implicitly. Outputs are new
    C-contiguous NumPy arrays. The GIL is released while a kernel runs.

Errors
    ValueError: a bad argument (dtype, rank, shape, option), with the C++ message naming
    the argument, the expected and the actual value. RuntimeError: any other failure in
    the library. TypeError: an argument that is not an array at all.

``subquad.torch`` (imported on demand, needs PyTorch) has autograd Functions and
nn.Modules built on these operators.
"""

from ._core import (
    exact_attention_backward,
    exact_attention_forward,
    merge_attention,
)

__version__ = "0.1.0"

__all__ = [
    "exact_attention_backward",
    "exact_attention_forward",
    "merge_attention",
]
