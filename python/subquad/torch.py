"""PyTorch autograd Functions and nn.Modules on subquad's operators (CPU tensors).

Tensors reach the C++ operators without copies (the extension reads them in place through
DLPack) and results come back as tensors sharing the memory of the NumPy outputs
(``torch.from_numpy``), so nothing is built against torch. Inputs whose last dimension is
not contiguous are made contiguous first. Dtypes: float32 or float64 (WildCat: float32).

Functions (differentiable unless marked):
    exact_attention, merge_attention

Modules:
"""

import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from . import _core

__all__ = [
    "exact_attention",
    "merge_attention",
]


def _array(tensor: Tensor) -> Tensor:
    """`tensor` detached, with a contiguous last dimension: readable in place by _core."""
    tensor = tensor.detach()
    if tensor.dim() > 0 and tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        tensor = tensor.contiguous()
    return tensor


def _tensor(array) -> Tensor:
    """A tensor sharing the memory of a NumPy output of _core."""
    return torch.from_numpy(array)


def _grad(grad: Optional[Tensor], like: Tensor) -> Tensor:
    """An incoming gradient as an array _core can read (zeros when autograd passes None)."""
    if grad is None:
        return torch.zeros_like(like)
    # Gradients of reductions arrive expanded (stride 0 everywhere): not a valid view.
    return grad.contiguous()


# --------------------------------------------------------------------------------------
# Exact attention


class ExactAttentionFunction(torch.autograd.Function):
    """(q, k, v, scale, causal, window, threads) -> (out, lse); both differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, window, threads):
        options = dict(scale=scale, causal=causal, window=window, threads=threads)
        out, lse = _core.exact_attention_forward(_array(q), _array(k), _array(v), **options)
        out, lse = _tensor(out), _tensor(lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = options
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dout = _grad(dout, out)
        if dlse is not None:
            # d lse_i / d s_ij = p_ij, which the kernel adds when v gains a column of ones
            # (dp_ij += dlse_i) whose output column is taken as 0 (so D_i is unchanged).
            v = torch.cat([v.detach(), torch.ones_like(v[..., :1])], dim=-1)
            out = torch.cat([out, torch.zeros_like(out[..., :1])], dim=-1)
            dout = torch.cat([dout, dlse.permute(0, 2, 1).unsqueeze(-1)], dim=-1)
        dq, dk, dv = _core.exact_attention_backward(
            _array(q), _array(k), _array(v), out, lse, dout, **ctx.options)
        dv = _tensor(dv)
        if dlse is not None:
            dv = dv[..., :-1]
        return _tensor(dq), _tensor(dk), dv, None, None, None, None


def exact_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: Optional[float] = None,
                    causal: bool = False, window: int = 0,
                    threads: int = 0) -> Tuple[Tensor, Tensor]:
    """Exact softmax attention, differentiable in q, k, v (through out and lse).

    q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> (out [B, N, H, Dv],
    lse [B, H, N]). scale None: 1/sqrt(D); causal bottom-right aligned; window 0: none.
    See subquad.exact_attention_forward.
    """
    return ExactAttentionFunction.apply(q, k, v, scale, causal, window, threads)


class MergeAttentionFunction(torch.autograd.Function):
    """(out_a, lse_a, out_b, lse_b, threads) -> (out, lse); both differentiable."""

    @staticmethod
    def forward(ctx, out_a, lse_a, out_b, lse_b, threads):
        out, lse = _core.merge_attention(_array(out_a), _array(lse_a), _array(out_b),
                                         _array(lse_b), threads=threads)
        out, lse = _tensor(out), _tensor(lse)
        ctx.save_for_backward(out_a, lse_a, out_b, lse_b, out, lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        out_a, lse_a, out_b, lse_b, out, lse = ctx.saved_tensors
        # out = w_a out_a + w_b out_b, w_p = exp(lse_p - lse):
        # d/d lse_p = w_p (<dout, out_p - out> + dlse), d/d out_p = w_p dout.
        finite = torch.isfinite(lse)
        safe_lse = torch.where(finite, lse, torch.zeros_like(lse))
        grads = []
        for out_p, lse_p in ((out_a, lse_a), (out_b, lse_b)):
            w = torch.where(finite, torch.exp(lse_p - safe_lse), torch.zeros_like(lse))
            w_rows = w.permute(0, 2, 1).unsqueeze(-1)  # [B, N, H, 1]
            d_lse_p = torch.zeros_like(lse) if dlse is None else dlse * w
            d_out_p = None
            if dout is not None:
                d_out_p = w_rows * dout
                d_lse_p = d_lse_p + w * ((dout * (out_p - out)).sum(-1)).permute(0, 2, 1)
            grads += [d_out_p, d_lse_p]
        return (*grads, None)


def merge_attention(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, *,
                    threads: int = 0) -> Tuple[Tensor, Tensor]:
    """Merges attention over two disjoint key sets, differentiably.

    out_a, out_b [B, N, H, Dv], lse_a, lse_b [B, H, N] -> (out [B, N, H, Dv], lse [B, H, N]).
    """
    return MergeAttentionFunction.apply(out_a, lse_a, out_b, lse_b, threads)
