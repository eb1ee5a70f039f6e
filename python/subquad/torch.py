"""PyTorch autograd Functions on subquad's operators (CPU tensors).

Tensors reach the C++ operators without copies (the extension reads them in place through
DLPack) and results come back as tensors sharing the memory of the NumPy outputs
(``torch.from_numpy``), so nothing is built against torch and any PyTorch with DLPack
works. Inputs whose last dimension is not contiguous are made contiguous first; incoming
gradients likewise. Dtypes: float32 or float64 (WildCat: float32 only); all tensors of one
call share the dtype. Bad arguments raise ValueError with the C++ message. Backward
passes are the library's own (first order only: double backward raises).

Functions (differentiable in every tensor argument unless marked):
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

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import _core

__all__ = [
    "bilinear_mlr_project",
    "btt_project",
    "cat",
    "cat_avgkey",
    "cat_causal",
    "circulant2d",
    "exact_attention",
    "merge_attention",
    "mlr_attention",
    "wildcat_attention",
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
    @once_differentiable
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
    @once_differentiable
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


# --------------------------------------------------------------------------------------
# CAT


class CatFunction(torch.autograd.Function):
    """(z, v, convention, path, threads) -> out."""

    @staticmethod
    def forward(ctx, z, v, convention, path, threads):
        ctx.options = dict(convention=convention, path=path, threads=threads)
        ctx.save_for_backward(z, v)
        return _tensor(_core.cat_forward(_array(z), _array(v), **ctx.options))

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        z, v = ctx.saved_tensors
        dz, dv = _core.cat_backward(_array(z), _array(v), _grad(dout, v), **ctx.options)
        return _tensor(dz), _tensor(dv), None, None, None


def cat(z: Tensor, v: Tensor, *, convention: str = "roll", path: str = "automatic",
        threads: int = 0) -> Tensor:
    """CAT, differentiable in z and v: z [B, N, H], v [B, N, H, Dv] -> out [B, N, H, Dv].

    convention "roll" (A[i, j] = s[(j - i) mod N]) or "conv"; path "automatic", "direct"
    or "fft". See subquad.cat_forward.
    """
    return CatFunction.apply(z, v, convention, path, threads)


class CatAvgKeyFunction(torch.autograd.Function):
    """(q, k, v, scale, convention, path, threads) -> out."""

    @staticmethod
    def forward(ctx, q, k, v, scale, convention, path, threads):
        ctx.options = dict(scale=scale, convention=convention, path=path, threads=threads)
        ctx.save_for_backward(q, k, v)
        return _tensor(_core.cat_avgkey_forward(_array(q), _array(k), _array(v),
                                                **ctx.options))

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        grads = _core.cat_avgkey_backward(_array(q), _array(k), _array(v), _grad(dout, v),
                                          **ctx.options)
        return (*map(_tensor, grads), None, None, None, None)


def cat_avgkey(q: Tensor, k: Tensor, v: Tensor, *, scale: Optional[float] = None,
               convention: str = "roll", path: str = "automatic",
               threads: int = 0) -> Tensor:
    """Averaged-key CAT, differentiable: q, k [B, N, H, D], v [B, N, H, Dv] -> out.

    z = scale <q[i], mean_j k[j]> (scale None: 1/sqrt(D)), then CAT.
    """
    return CatAvgKeyFunction.apply(q, k, v, scale, convention, path, threads)


class CatCausalFunction(torch.autograd.Function):
    """(z, v, path, threads) -> out."""

    @staticmethod
    def forward(ctx, z, v, path, threads):
        ctx.options = dict(path=path, threads=threads)
        out = _tensor(_core.cat_causal_forward(_array(z), _array(v), **ctx.options))
        ctx.save_for_backward(z, v, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        z, v, out = ctx.saved_tensors
        dz, dv = _core.cat_causal_backward(_array(z), _array(v), out, _grad(dout, out),
                                           **ctx.options)
        return _tensor(dz), _tensor(dv), None, None


def cat_causal(z: Tensor, v: Tensor, *, path: str = "automatic", threads: int = 0) -> Tensor:
    """Causal CAT, differentiable: z [B, N, H], v [B, N, H, Dv] -> out [B, N, H, Dv],
    out[i] = sum_{k <= i} exp(z[k]) v[i - k] / sum_{k <= i} exp(z[k])."""
    return CatCausalFunction.apply(z, v, path, threads)


# --------------------------------------------------------------------------------------
# 2D Circulant Attention


class Circulant2dFunction(torch.autograd.Function):
    """(q, k, v, scale_mode, scale, threads) -> out."""

    @staticmethod
    def forward(ctx, q, k, v, scale_mode, scale, threads):
        ctx.options = dict(scale_mode=scale_mode, scale=scale, threads=threads)
        ctx.save_for_backward(q, k, v)
        out, _ = _core.circulant2d_forward(_array(q), _array(k), _array(v), **ctx.options)
        return _tensor(out)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        grads = _core.circulant2d_backward(_array(q), _array(k), _array(v), _grad(dout, v),
                                           **ctx.options)
        return (*map(_tensor, grads), None, None, None)


def circulant2d(q: Tensor, k: Tensor, v: Tensor, *, scale_mode: str = "paper",
                scale: Optional[float] = None, threads: int = 0) -> Tensor:
    """2D Circulant Attention, differentiable: q, k [B, Hg, Wg, H, D], v [B, Hg, Wg, H, Dv]
    -> out [B, Hg, Wg, H, Dv]. scale_mode "paper" (1/(N sqrt(D))) or "code" (1/sqrt(N));
    scale overrides it. See subquad.circulant2d_forward."""
    return Circulant2dFunction.apply(q, k, v, scale_mode, scale, threads)


# --------------------------------------------------------------------------------------
# Structured attention


class MlrAttentionFunction(torch.autograd.Function):
    """(q, k, v, ranks, causal, block_divide, threads) -> out."""

    @staticmethod
    def forward(ctx, q, k, v, ranks, causal, block_divide, threads):
        ctx.options = dict(ranks=list(ranks), causal=causal, block_divide=block_divide,
                           threads=threads)
        out, lse = _core.mlr_attention_forward(_array(q), _array(k), _array(v), **ctx.options)
        out, lse = _tensor(out), _tensor(lse)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        grads = _core.mlr_attention_backward(_array(q), _array(k), _array(v), out, lse,
                                             _grad(dout, out), **ctx.options)
        return (*map(_tensor, grads), None, None, None, None)


def mlr_attention(q: Tensor, k: Tensor, v: Tensor, *, ranks: Sequence[int],
                  causal: bool = False, block_divide: bool = False,
                  threads: int = 0) -> Tensor:
    """MLR attention, differentiable: q [B, T, H, D], k [B, T, Hkv, D], v [B, T, Hkv, Dv]
    -> out [B, T, H, Dv]; ranks split D (sum = D). See subquad.mlr_attention_forward."""
    return MlrAttentionFunction.apply(q, k, v, tuple(ranks), causal, block_divide, threads)


class BilinearMlrProjectFunction(torch.autograd.Function):
    """(x, options, *weights) -> y."""

    @staticmethod
    def forward(ctx, x, options, *weights):
        ctx.options = options
        ctx.save_for_backward(x, *weights)
        return _tensor(_core.bilinear_mlr_project_forward(
            _array(x), [w.detach().contiguous() for w in weights], **options))

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, *weights = ctx.saved_tensors
        dx, dweights = _core.bilinear_mlr_project_backward(
            _array(x), [w.detach().contiguous() for w in weights], _grad(dy, x), **ctx.options)
        return (_tensor(dx), None, *map(_tensor, dweights))


def bilinear_mlr_project(x: Tensor, weights: Sequence[Tensor], *, ranks: Sequence[int],
                         heads: int = 1, level_scale: Sequence[float] = (),
                         layer_norm: bool = True, rms_cap: bool = True,
                         threads: int = 0) -> Tensor:
    """Bilinear MLR projection, differentiable in x and the weights.

    x [B, N, Dm], weights[l] [2^l, Dm / 2^l, heads * ranks[l]] -> y [B, N, heads, E],
    E = sum_l ranks[l] 2^l. See subquad.bilinear_mlr_project_forward.
    """
    options = dict(ranks=list(ranks), heads=heads, level_scale=list(level_scale),
                   layer_norm=layer_norm, rms_cap=rms_cap, threads=threads)
    return BilinearMlrProjectFunction.apply(x, options, *weights)


class BttProjectFunction(torch.autograd.Function):
    """(x, w1, w2, options) -> y."""

    @staticmethod
    def forward(ctx, x, w1, w2, options):
        ctx.options = options
        ctx.save_for_backward(x, w1, w2)
        return _tensor(_core.btt_project_forward(_array(x), w1.detach().contiguous(),
                                                 w2.detach().contiguous(), **options))

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w1, w2 = ctx.saved_tensors
        grads = _core.btt_project_backward(_array(x), w1.detach().contiguous(),
                                           w2.detach().contiguous(), _grad(dy, x),
                                           **ctx.options)
        return (*map(_tensor, grads), None)


def btt_project(x: Tensor, w1: Tensor, w2: Tensor, *, heads: int = 1, rank: int = 1,
                layer_norm: bool = True, rms_cap: bool = True, threads: int = 0) -> Tensor:
    """BTT projection, differentiable: x [B, N, D], w1 [a, b, heads b rank],
    w2 [heads b, a, a rank] -> y [B, N, heads, D], (a, b) = subquad.btt_factors(D)."""
    options = dict(heads=heads, rank=rank, layer_norm=layer_norm, rms_cap=rms_cap,
                   threads=threads)
    return BttProjectFunction.apply(x, w1, w2, options)


# --------------------------------------------------------------------------------------
# WildCat (inference only)


def wildcat_attention(q: Tensor, k: Tensor, v: Tensor, *, rank: int = 128, bins: int = 1,
                      seed: int = 0, scale: Optional[float] = None, method: str = "wildcat",
                      threads: int = 0) -> Tensor:
    """WildCat coreset attention (float32, not differentiable: the result carries no grad).

    q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> out [B, N, H, Dv].
    See subquad.wildcat_attention.
    """
    return _tensor(_core.wildcat_attention(_array(q), _array(k), _array(v), rank=rank,
                                           bins=bins, seed=seed, scale=scale, method=method,
                                           threads=threads))
