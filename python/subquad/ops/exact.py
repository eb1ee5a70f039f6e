"""Exact attention and the merge of two attention results, as torch operators.

CPU tensors run the C++ kernels (src/exact); tensors on other devices run subquad.reference,
registered as the operators' default implementation. Backward passes are operators too, so
torch.compile traces the whole step. lse is float32 for bfloat16 and float16 inputs, else
in the inputs' dtype.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.library import custom_op

from .. import _core, reference
from . import _cpu


# The exact kernels also take bfloat16 (with a float32 lse).
_EXACT_DTYPES = (*_cpu.KERNEL_DTYPES, torch.bfloat16)


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


# --------------------------------------------------------------------------------------
# Exact attention


@custom_op("subquad::exact_attention", mutates_args=())
def exact_attention_op(q: Tensor, k: Tensor, v: Tensor, scale: Optional[float], causal: bool,
                       window: int, threads: int) -> Tuple[Tensor, Tensor]:
    out, lse = reference.exact_attention(q, k, v, scale=scale, causal=causal, window=window)
    return out.contiguous(), lse.to(_lse_dtype(q.dtype)).contiguous()


@exact_attention_op.register_kernel("cpu")
def _(q, k, v, scale, causal, window, threads):
    B, N, H, D = q.shape
    Hkv, Dv = k.shape[2], v.shape[3]
    if N == 1 and H > Hkv and window == 0:
        # A decode step: one query sees every key, causal or not, so the H / Hkv query
        # heads of a KV head are as many queries of that head, and the kernel reads each
        # KV head once instead of H / Hkv times (SmolLM2, 9 heads on 3, M = 2048: 0.66 ->
        # 0.25 ms a layer). Query head h = hkv G + g becomes query g of KV head hkv.
        folded = q.reshape(B, Hkv, H // Hkv, D).transpose(1, 2)  # [B, G, Hkv, D]
        out, lse = _cpu.run(_core.exact_attention_forward, (folded, k, v),
                            accepted=_EXACT_DTYPES, scale=scale, causal=False, window=0,
                            threads=threads)
        out = out.transpose(1, 2).reshape(B, 1, H, Dv)  # [B, Hkv, G, Dv] -> [B, 1, H, Dv]
        lse = lse.reshape(B, H, 1)  # [B, Hkv, G] -> [B, H, 1]
    else:
        out, lse = _cpu.run(_core.exact_attention_forward, (q, k, v), accepted=_EXACT_DTYPES,
                            scale=scale, causal=causal, window=window, threads=threads)
    return out.to(q.dtype), lse.to(_lse_dtype(q.dtype))


@exact_attention_op.register_fake
def _(q, k, v, scale, causal, window, threads):
    B, N, H = q.shape[:3]
    return q.new_empty(B, N, H, v.shape[3]), q.new_empty(B, H, N, dtype=_lse_dtype(q.dtype))


@custom_op("subquad::exact_attention_backward", mutates_args=())
def exact_attention_backward_op(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                                dout: Tensor, dlse: Tensor, scale: Optional[float],
                                causal: bool, window: int,
                                threads: int) -> Tuple[Tensor, Tensor, Tensor]:
    return _cpu.contiguous(reference.vjp(reference.exact_attention, (q, k, v), (dout, dlse),
                                         scale=scale, causal=causal, window=window))


@exact_attention_backward_op.register_kernel("cpu")
def _(q, k, v, out, lse, dout, dlse, scale, causal, window, threads):
    # lse and dlse: float32 in a bfloat16 call, else the dtype of the call.
    lse_dtype = _lse_dtype(_cpu.work_dtype(q.dtype, _EXACT_DTYPES))
    grads = _cpu.run(
        lambda q, k, v, out, dout: _core.exact_attention_backward(
            q, k, v, out, _cpu.readable(lse.to(lse_dtype)), dout,
            dlse=_cpu.readable(dlse.to(lse_dtype)), scale=scale, causal=causal, window=window,
            threads=threads), (q, k, v, out, dout), accepted=_EXACT_DTYPES)
    return tuple(g.to(q.dtype) for g in grads)


@exact_attention_backward_op.register_fake
def _(q, k, v, out, lse, dout, dlse, scale, causal, window, threads):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _exact_setup(ctx, inputs, output):
    q, k, v, *options = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.options = options


def _exact_backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    return (*exact_attention_backward_op(q, k, v, out, lse, dout, dlse, *ctx.options),
            None, None, None, None)


exact_attention_op.register_autograd(_exact_backward, setup_context=_exact_setup)


def exact_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: Optional[float] = None,
                    causal: bool = False, window: int = 0,
                    threads: int = 0) -> Tuple[Tensor, Tensor]:
    """Exact softmax attention, differentiable in q, k, v (through out and lse).

    q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> (out [B, N, H, Dv],
    lse [B, H, N]). scale None: 1/sqrt(D); causal bottom-right aligned (query i sees key j
    iff j <= i + M - N); window w > 0 also requires j > i + M - N - w. threads: the C++
    kernels' thread count (0: all cores).
    """
    return exact_attention_op(q, k, v, scale, causal, window, threads)


# --------------------------------------------------------------------------------------
# Merge


@custom_op("subquad::merge_attention", mutates_args=())
def merge_attention_op(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor,
                       threads: int) -> Tuple[Tensor, Tensor]:
    return _cpu.contiguous(reference.merge_attention(out_a, lse_a, out_b, lse_b))


@merge_attention_op.register_kernel("cpu")
def _(out_a, lse_a, out_b, lse_b, threads):
    out, lse = _cpu.run(_core.merge_attention, (out_a, lse_a, out_b, lse_b), threads=threads)
    return out.to(out_a.dtype), lse.to(lse_a.dtype)


@merge_attention_op.register_fake
def _(out_a, lse_a, out_b, lse_b, threads):
    return torch.empty_like(out_a), torch.empty_like(lse_a)


@custom_op("subquad::merge_attention_backward", mutates_args=())
def merge_attention_backward_op(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor,
                                out: Tensor, lse: Tensor, dout: Tensor, dlse: Tensor,
                                threads: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return _cpu.contiguous(reference.vjp(reference.merge_attention,
                                         (out_a, lse_a, out_b, lse_b), (dout, dlse)))


@merge_attention_backward_op.register_kernel("cpu")
def _(out_a, lse_a, out_b, lse_b, out, lse, dout, dlse, threads):
    grads = _cpu.run(
        lambda *tensors: _core.merge_attention_backward(*tensors[:6], dout=tensors[6],
                                                        dlse=tensors[7], threads=threads),
        (out_a, lse_a, out_b, lse_b, out, lse, dout, dlse))
    return tuple(g.to(like.dtype) for g, like in zip(grads, (out_a, lse_a, out_b, lse_b)))


@merge_attention_backward_op.register_fake
def _(out_a, lse_a, out_b, lse_b, out, lse, dout, dlse, threads):
    return tuple(torch.empty_like(t) for t in (out_a, lse_a, out_b, lse_b))


def _merge_setup(ctx, inputs, output):
    *tensors, threads = inputs
    ctx.save_for_backward(*tensors, *output)
    ctx.threads = threads


def _merge_backward(ctx, dout, dlse):
    return (*merge_attention_backward_op(*ctx.saved_tensors, dout, dlse, ctx.threads), None)


merge_attention_op.register_autograd(_merge_backward, setup_context=_merge_setup)


def merge_attention(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, *,
                    threads: int = 0) -> Tuple[Tensor, Tensor]:
    """Merges attention over two disjoint key sets, differentiably.

    out_a, out_b [B, N, H, Dv], lse_a, lse_b [B, H, N] -> (out [B, N, H, Dv], lse [B, H, N]).
    """
    return merge_attention_op(out_a, lse_a, out_b, lse_b, threads)
