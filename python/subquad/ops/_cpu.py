"""How subquad.ops hands CPU tensors to the C++ kernels (subquad._core).

Inputs are read in place (DLPack) once their last dimension is contiguous; outputs are
torch.empty tensors the kernels write whole (`_core.outputs_from`), so no NumPy array and no
zero fill sits between torch and the kernels. The kernels take float32 and float64 (exact
attention also bfloat16); other floating dtypes (float16, bfloat16 under autocast) are
computed in float32, and the caller casts the results back.
"""

from typing import Callable, Sequence

import torch
from torch import Tensor

from .. import _core

KERNEL_DTYPES = (torch.float32, torch.float64)
_TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def _allocate(shape: tuple, dtype: str) -> Tensor:
    return torch.empty(shape, dtype=_TORCH_DTYPES[dtype])


def readable(tensor: Tensor) -> Tensor:
    """`tensor` with a contiguous last dimension: what the kernels read in place."""
    if tensor.dim() > 0 and tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        return tensor.contiguous()
    return tensor


def sequence_readable(tensor: Tensor) -> Tensor:
    """As readable, but also read in place when the sequence dimension (1) is contiguous:
    CAT's kernels take sequence-last memory and answer in the same layout."""
    if tensor.dim() > 1 and tensor.shape[1] > 1 and tensor.stride(1) == 1:
        return tensor
    return readable(tensor)


def contiguous(tensors: Sequence[Tensor]) -> tuple:
    """The tensors C-contiguous: the layout the kernels answer in, and so the one the fake
    implementations give torch.compile, which the reference must give too."""
    return tuple(t.contiguous() for t in tensors)


def work_dtype(dtype: torch.dtype, accepted: Sequence[torch.dtype] = KERNEL_DTYPES):
    """The dtype a kernel computes `dtype` in: itself when accepted, else float32."""
    return dtype if dtype in accepted else torch.float32


def run(kernel: Callable, tensors: Sequence[Tensor], *,
        accepted: Sequence[torch.dtype] = KERNEL_DTYPES, prepare: Callable = readable,
        **options):
    """kernel(*tensors, **options) on the tensors cast to the dtype the kernel computes the
    first one's in (work_dtype: autocast hands layers a mix, e.g. bfloat16 values beside
    float32 scores) and made readable, with outputs allocated by torch."""
    for t in tensors:
        if not t.is_floating_point():
            raise ValueError(f"subquad.ops: expected floating-point tensors, got {t.dtype} "
                             f"of shape {list(t.shape)}")
    dtype = work_dtype(tensors[0].dtype, accepted)
    with _core.outputs_from(_allocate):
        return kernel(*(prepare(t.to(dtype)) for t in tensors), **options)
