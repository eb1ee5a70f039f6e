"""Structured attention as torch operators: MLR attention, and the bilinear MLR and BTT
score projections. CPU tensors run the C++ kernels (src/structured); other devices run
subquad.reference."""

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.library import custom_op

from .. import _core, reference
from . import _cpu

# --------------------------------------------------------------------------------------
# MLR attention


@custom_op("subquad::mlr_attention", mutates_args=())
def mlr_attention_op(q: Tensor, k: Tensor, v: Tensor, ranks: List[int], causal: bool,
                     block_divide: bool, threads: int) -> Tuple[Tensor, Tensor]:
    return _cpu.contiguous(reference.mlr_attention_with_lse(q, k, v, ranks=ranks, causal=causal,
                                                            block_divide=block_divide))


@mlr_attention_op.register_kernel("cpu")
def _(q, k, v, ranks, causal, block_divide, threads):
    out, lse = _cpu.run(_core.mlr_attention_forward, (q, k, v), ranks=ranks, causal=causal, block_divide=block_divide, threads=threads)
    return out.to(q.dtype), lse.to(q.dtype)


@mlr_attention_op.register_fake
def _(q, k, v, ranks, causal, block_divide, threads):
    B, T, H = q.shape[:3]
    return q.new_empty(B, T, H, v.shape[3]), q.new_empty(B, H, T)


@custom_op("subquad::mlr_attention_backward", mutates_args=())
def mlr_attention_backward_op(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                              dout: Tensor, ranks: List[int], causal: bool, block_divide: bool,
                              threads: int) -> Tuple[Tensor, Tensor, Tensor]:
    return _cpu.contiguous(reference.vjp(reference.mlr_attention, (q, k, v), dout, ranks=ranks,
                                         causal=causal, block_divide=block_divide))


@mlr_attention_backward_op.register_kernel("cpu")
def _(q, k, v, out, lse, dout, ranks, causal, block_divide, threads):
    grads = _cpu.run(_core.mlr_attention_backward, (q, k, v, out, lse, dout),
                     ranks=ranks, causal=causal,
                     block_divide=block_divide, threads=threads)
    return tuple(g.to(q.dtype) for g in grads)


@mlr_attention_backward_op.register_fake
def _(q, k, v, out, lse, dout, ranks, causal, block_divide, threads):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _mlr_setup(ctx, inputs, output):
    q, k, v, *options = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.mark_non_differentiable(output[1])  # lse: saved for the backward, not a result
    ctx.options = options


def _mlr_backward(ctx, dout, dlse):
    return (*mlr_attention_backward_op(*ctx.saved_tensors, dout, *ctx.options),
            None, None, None, None)


mlr_attention_op.register_autograd(_mlr_backward, setup_context=_mlr_setup)


def mlr_attention(q: Tensor, k: Tensor, v: Tensor, *, ranks: Sequence[int],
                  causal: bool = False, block_divide: bool = False,
                  threads: int = 0) -> Tensor:
    """MLR attention, differentiable: q [B, T, H, D], k [B, T, Hkv, D], v [B, T, Hkv, Dv]
    -> out [B, T, H, Dv]; ranks split D (sum = D), level l has blocks of T / 2^(l-1)
    tokens. See subquad.mlr_attention_forward."""
    return mlr_attention_op(q, k, v, list(ranks), causal, block_divide, threads)[0]


@custom_op("subquad::mlr_decode", mutates_args=())
def mlr_decode_op(q: Tensor, level_keys: List[Tensor], v: Tensor, ranks: List[int],
                  block_divide: bool, context: int, threads: int) -> Tensor:
    return reference.mlr_decode_rows(q, level_keys, v, ranks=ranks, block_divide=block_divide,
                                     context=context)


@mlr_decode_op.register_kernel("cpu")
def _(q, level_keys, v, ranks, block_divide, context, threads):
    def kernel(q, v, *levels, **options):
        return _core.mlr_decode(q, list(levels), v, **options)

    out = _cpu.run(kernel, (q, v, *level_keys), ranks=ranks, block_divide=block_divide,
                   context=context, threads=threads)
    return out.to(q.dtype)


@mlr_decode_op.register_fake
def _(q, level_keys, v, ranks, block_divide, context, threads):
    return q.new_empty(*q.shape[:3], v.shape[3])


def mlr_decode(q: Tensor, level_keys: Sequence[Tensor], v: Tensor, *, ranks: Sequence[int],
               block_divide: bool = False, context: int, threads: int = 0) -> Tensor:
    """Causal MLR rows of the newest T positions over caller-owned state (no grad):
    q [B, T, H, D] the queries of positions S - T .. S - 1, in one block of the finest level;
    level_keys[l] [B, Hkv, s_l, r_l] (s_l = context / 2^(l-1)) the level-l columns of
    position p's key in slot p mod s_l, the new keys stored; v [B, S, Hkv, Dv] every value
    -> out [B, T, H, Dv]. The state of layers.MlrCache."""
    return mlr_decode_op(q, list(level_keys), v, list(ranks), block_divide, context, threads)


# --------------------------------------------------------------------------------------
# Bilinear MLR projection


@custom_op("subquad::bilinear_mlr_project", mutates_args=())
def bilinear_mlr_project_op(x: Tensor, weights: List[Tensor], ranks: List[int], heads: int,
                            level_scale: List[float], layer_norm: bool, rms_cap: bool,
                            threads: int) -> Tensor:
    return reference.bilinear_mlr_project(x, weights, ranks=ranks, heads=heads,
                                          level_scale=level_scale, layer_norm=layer_norm,
                                          rms_cap=rms_cap).contiguous()


@bilinear_mlr_project_op.register_kernel("cpu")
def _(x, weights, ranks, heads, level_scale, layer_norm, rms_cap, threads):
    y = _cpu.run(lambda x, *w: _core.bilinear_mlr_project_forward(
        x, [t.contiguous() for t in w], ranks=ranks, heads=heads, level_scale=level_scale,
        layer_norm=layer_norm, rms_cap=rms_cap, threads=threads), (x, *weights))
    return y.to(x.dtype)


@bilinear_mlr_project_op.register_fake
def _(x, weights, ranks, heads, level_scale, layer_norm, rms_cap, threads):
    width = sum(r << level for level, r in enumerate(ranks))
    return x.new_empty(*x.shape[:2], heads, width)


@custom_op("subquad::bilinear_mlr_project_backward", mutates_args=())
def bilinear_mlr_project_backward_op(x: Tensor, weights: List[Tensor], dy: Tensor,
                                     ranks: List[int], heads: int, level_scale: List[float],
                                     layer_norm: bool, rms_cap: bool,
                                     threads: int) -> List[Tensor]:
    return list(_cpu.contiguous(reference.vjp(
        lambda x, *w, **options: reference.bilinear_mlr_project(x, w, **options),
        (x, *weights), dy, ranks=ranks, heads=heads, level_scale=level_scale,
        layer_norm=layer_norm, rms_cap=rms_cap)))


@bilinear_mlr_project_backward_op.register_kernel("cpu")
def _(x, weights, dy, ranks, heads, level_scale, layer_norm, rms_cap, threads):
    def kernel(x, dy, *w):
        dx, dweights = _core.bilinear_mlr_project_backward(
            x, [t.contiguous() for t in w], dy, ranks=ranks, heads=heads,
            level_scale=level_scale, layer_norm=layer_norm, rms_cap=rms_cap, threads=threads)
        return [dx, *dweights]

    grads = _cpu.run(kernel, (x, dy, *weights))
    return [g.to(x.dtype) for g in grads]


@bilinear_mlr_project_backward_op.register_fake
def _(x, weights, dy, ranks, heads, level_scale, layer_norm, rms_cap, threads):
    return [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (x, *weights)]


def _bilinear_setup(ctx, inputs, output):
    x, weights, *options = inputs
    ctx.save_for_backward(x, *weights)
    ctx.options = options


def _bilinear_backward(ctx, dy):
    x, *weights = ctx.saved_tensors
    dx, *dweights = bilinear_mlr_project_backward_op(x, weights, dy, *ctx.options)
    return dx, dweights, None, None, None, None, None, None


bilinear_mlr_project_op.register_autograd(_bilinear_backward, setup_context=_bilinear_setup)


def bilinear_mlr_project(x: Tensor, weights: Sequence[Tensor], *, ranks: Sequence[int],
                         heads: int = 1, level_scale: Sequence[float] = (),
                         layer_norm: bool = True, rms_cap: bool = True,
                         threads: int = 0) -> Tensor:
    """Bilinear MLR projection, differentiable in x and the weights.

    x [B, N, Dm], weights[l] [2^l, Dm / 2^l, heads * ranks[l]] -> y [B, N, heads, E],
    E = sum_l ranks[l] 2^l. See subquad.bilinear_mlr_project_forward.
    """
    # No level_scale means 1 per level; said explicitly, because autograd reads an empty
    # list argument as an empty list of tensors.
    scales = [float(s) for s in level_scale] or [1.0] * len(ranks)
    return bilinear_mlr_project_op(x, list(weights), list(ranks), heads, scales, layer_norm,
                                   rms_cap, threads)


# --------------------------------------------------------------------------------------
# BTT projection


@custom_op("subquad::btt_project", mutates_args=())
def btt_project_op(x: Tensor, w1: Tensor, w2: Tensor, heads: int, rank: int,
                   layer_norm: bool, rms_cap: bool, threads: int) -> Tensor:
    return reference.btt_project(x, w1, w2, heads=heads, rank=rank, layer_norm=layer_norm,
                                 rms_cap=rms_cap).contiguous()


@btt_project_op.register_kernel("cpu")
def _(x, w1, w2, heads, rank, layer_norm, rms_cap, threads):
    y = _cpu.run(lambda x, w1, w2: _core.btt_project_forward(
        x, w1.contiguous(), w2.contiguous(), heads=heads, rank=rank, layer_norm=layer_norm,
        rms_cap=rms_cap, threads=threads), (x, w1, w2))
    return y.to(x.dtype)


@btt_project_op.register_fake
def _(x, w1, w2, heads, rank, layer_norm, rms_cap, threads):
    return x.new_empty(*x.shape[:2], heads, x.shape[2])


@custom_op("subquad::btt_project_backward", mutates_args=())
def btt_project_backward_op(x: Tensor, w1: Tensor, w2: Tensor, dy: Tensor, heads: int,
                            rank: int, layer_norm: bool, rms_cap: bool,
                            threads: int) -> Tuple[Tensor, Tensor, Tensor]:
    return _cpu.contiguous(reference.vjp(reference.btt_project, (x, w1, w2), dy, heads=heads,
                                         rank=rank, layer_norm=layer_norm, rms_cap=rms_cap))


@btt_project_backward_op.register_kernel("cpu")
def _(x, w1, w2, dy, heads, rank, layer_norm, rms_cap, threads):
    grads = _cpu.run(lambda x, w1, w2, dy: _core.btt_project_backward(
        x, w1.contiguous(), w2.contiguous(), dy, heads=heads, rank=rank,
        layer_norm=layer_norm, rms_cap=rms_cap, threads=threads), (x, w1, w2, dy))
    return tuple(g.to(x.dtype) for g in grads)


@btt_project_backward_op.register_fake
def _(x, w1, w2, dy, heads, rank, layer_norm, rms_cap, threads):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (x, w1, w2))


def _btt_setup(ctx, inputs, output):
    x, w1, w2, *options = inputs
    ctx.save_for_backward(x, w1, w2)
    ctx.options = options


def _btt_backward(ctx, dy):
    return (*btt_project_backward_op(*ctx.saved_tensors, dy, *ctx.options),
            None, None, None, None, None)


btt_project_op.register_autograd(_btt_backward, setup_context=_btt_setup)


def btt_project(x: Tensor, w1: Tensor, w2: Tensor, *, heads: int = 1, rank: int = 1,
                layer_norm: bool = True, rms_cap: bool = True, threads: int = 0) -> Tensor:
    """BTT projection, differentiable: x [B, N, D], w1 [a, b, heads b rank],
    w2 [heads b, a, a rank] -> y [B, N, heads, D], (a, b) = subquad.btt_factors(D)."""
    return btt_project_op(x, w1, w2, heads, rank, layer_norm, rms_cap, threads)
