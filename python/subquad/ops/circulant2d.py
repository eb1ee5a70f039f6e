"""2D Circulant Attention as a torch operator: the C++ kernels (src/circulant2d) on CPU
tensors, subquad.reference (2D FFTs by torch.fft) on other devices."""

from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.library import custom_op

from .. import _core, reference
from . import _cpu


def _logit_scale(q: Tensor, scale_mode: str, scale: Optional[float]) -> float:
    """The logit scale c of subquad.circulant2d_scale for q [B, Hg, Wg, H, D]."""
    return _core.circulant2d_scale(q.shape[1] * q.shape[2], q.shape[-1],
                                   scale_mode=scale_mode, scale=scale)


@custom_op("subquad::circulant2d", mutates_args=())
def circulant2d_op(q: Tensor, k: Tensor, v: Tensor, scale_mode: str, scale: Optional[float],
                   threads: int) -> Tensor:
    return reference.circulant2d(q, k, v, scale=_logit_scale(q, scale_mode, scale)).contiguous()


@circulant2d_op.register_kernel("cpu")
def _(q, k, v, scale_mode, scale, threads):
    out, _weights = _cpu.run(_core.circulant2d_forward, (q, k, v),
                             scale_mode=scale_mode,
                             scale=scale, threads=threads)
    return out.to(v.dtype)


@circulant2d_op.register_fake
def _(q, k, v, scale_mode, scale, threads):
    return torch.empty_like(v, memory_format=torch.contiguous_format)


@custom_op("subquad::circulant2d_backward", mutates_args=())
def circulant2d_backward_op(q: Tensor, k: Tensor, v: Tensor, dout: Tensor, scale_mode: str,
                            scale: Optional[float],
                            threads: int) -> Tuple[Tensor, Tensor, Tensor]:
    return _cpu.contiguous(reference.vjp(reference.circulant2d, (q, k, v), dout,
                                         scale=_logit_scale(q, scale_mode, scale)))


@circulant2d_backward_op.register_kernel("cpu")
def _(q, k, v, dout, scale_mode, scale, threads):
    grads = _cpu.run(_core.circulant2d_backward, (q, k, v, dout),
                     scale_mode=scale_mode, scale=scale,
                     threads=threads)
    return tuple(g.to(v.dtype) for g in grads)


@circulant2d_backward_op.register_fake
def _(q, k, v, dout, scale_mode, scale, threads):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _setup(ctx, inputs, output):
    q, k, v, *options = inputs
    ctx.save_for_backward(q, k, v)
    ctx.options = options


def _backward(ctx, dout):
    return (*circulant2d_backward_op(*ctx.saved_tensors, dout, *ctx.options), None, None, None)


circulant2d_op.register_autograd(_backward, setup_context=_setup)


def circulant2d(q: Tensor, k: Tensor, v: Tensor, *, scale_mode: str = "paper",
                scale: Optional[float] = None, threads: int = 0) -> Tensor:
    """2D Circulant Attention, differentiable: q, k [B, Hg, Wg, H, D], v [B, Hg, Wg, H, Dv]
    -> out [B, Hg, Wg, H, Dv]. Per (batch, head): a[m] = c sum_n <q[n], k[n + m]> on the
    torus, s = softmax(a), out[i] = sum_n s[n] v[i + n]. scale_mode "paper"
    (c = 1/(N sqrt(D))) or "code" (1/sqrt(N)); scale overrides it."""
    return circulant2d_op(q, k, v, scale_mode, scale, threads)
