"""CAT, averaged-key CAT and causal CAT (and its decoding) as torch operators.

CPU tensors run the C++ kernels (src/cat); other devices run subquad.reference (torch.fft
for CAT, a masked matmul for causal CAT). CAT and causal CAT read sequence-last memory in
place (v = x.permute(0, 3, 1, 2) of a contiguous x [B, H, Dv, N]) and answer in the layout
of their inputs, on every device, so that the fake tensors torch.compile plans with have
the strides of the real ones.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.library import custom_op

from .. import _core, reference
from . import _cpu


def _sequence_last(t: Tensor) -> bool:
    """Whether the kernels treat `t` [B, N, ...] as sequence-last (the rule of
    python/src/cat.cpp: the sequence dimension contiguous, the last one not)."""
    return (t.shape[1] > 1 and t.stride(1) == 1 and t.shape[-1] > 1 and t.stride(-1) != 1)


def _empty_like_layout(like: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
    """An empty tensor shaped like `like`, sequence-last when `like` is."""
    dtype = like.dtype if dtype is None else dtype
    if not _sequence_last(like):
        return torch.empty(like.shape, dtype=dtype, device=like.device)
    order = (0, *range(2, like.dim()), 1)  # [B, H, (Dv,) N] in memory
    memory = torch.empty([like.shape[i] for i in order], dtype=dtype, device=like.device)
    return memory.permute(*[order.index(i) for i in range(like.dim())])


def _in_layout_of(result: Tensor, like: Tensor) -> Tensor:
    return _empty_like_layout(like, result.dtype).copy_(result)


# --------------------------------------------------------------------------------------
# CAT


@custom_op("subquad::cat", mutates_args=())
def cat_op(z: Tensor, v: Tensor, convention: str, path: str, threads: int) -> Tensor:
    return _in_layout_of(reference.cat(z, v, convention=convention), v)


@cat_op.register_kernel("cpu")
def _(z, v, convention, path, threads):
    out = _cpu.run(_core.cat_forward, (z, v), prepare=_cpu.sequence_readable, convention=convention, path=path,
                   threads=threads)
    return out.to(v.dtype)


@cat_op.register_fake
def _(z, v, convention, path, threads):
    return _empty_like_layout(v)


@custom_op("subquad::cat_backward", mutates_args=())
def cat_backward_op(z: Tensor, v: Tensor, dout: Tensor, convention: str, path: str,
                    threads: int) -> Tuple[Tensor, Tensor]:
    dz, dv = reference.vjp(reference.cat, (z, v), dout, convention=convention)
    return _in_layout_of(dz, z), _in_layout_of(dv, v)


@cat_backward_op.register_kernel("cpu")
def _(z, v, dout, convention, path, threads):
    dz, dv = _cpu.run(_core.cat_backward, (z, v, dout), prepare=_cpu.sequence_readable, convention=convention, path=path,
                      threads=threads)
    return dz.to(z.dtype), dv.to(v.dtype)


@cat_backward_op.register_fake
def _(z, v, dout, convention, path, threads):
    return _empty_like_layout(z), _empty_like_layout(v)


def _cat_setup(ctx, inputs, output):
    z, v, *options = inputs
    ctx.save_for_backward(z, v)
    ctx.options = options


def _cat_backward(ctx, dout):
    z, v = ctx.saved_tensors
    return (*cat_backward_op(z, v, dout, *ctx.options), None, None, None)


cat_op.register_autograd(_cat_backward, setup_context=_cat_setup)


def cat(z: Tensor, v: Tensor, *, convention: str = "roll", path: str = "automatic",
        threads: int = 0) -> Tensor:
    """CAT, differentiable in z and v: z [B, N, H], v [B, N, H, Dv] -> out [B, N, H, Dv].

    s = softmax(z) over the sequence; convention "roll": out[i] = sum_m s[m] v[(i + m) mod N],
    "conv": out[i] = sum_m s[m] v[(i - m) mod N]. path "automatic", "direct" or "fft" (the
    C++ kernels). Fastest on sequence-last memory from N = 1024 on (src/cat/README.md).
    """
    return cat_op(z, v, convention, path, threads)


# --------------------------------------------------------------------------------------
# Averaged-key CAT


@custom_op("subquad::cat_avgkey", mutates_args=())
def cat_avgkey_op(q: Tensor, k: Tensor, v: Tensor, scale: Optional[float], convention: str,
                  path: str, threads: int) -> Tensor:
    return reference.cat_avgkey(q, k, v, scale=scale, convention=convention).contiguous()


@cat_avgkey_op.register_kernel("cpu")
def _(q, k, v, scale, convention, path, threads):
    out = _cpu.run(_core.cat_avgkey_forward, (q, k, v), scale=scale, convention=convention, path=path, threads=threads)
    return out.to(v.dtype)


@cat_avgkey_op.register_fake
def _(q, k, v, scale, convention, path, threads):
    return torch.empty_like(v, memory_format=torch.contiguous_format)


@custom_op("subquad::cat_avgkey_backward", mutates_args=())
def cat_avgkey_backward_op(q: Tensor, k: Tensor, v: Tensor, dout: Tensor,
                           scale: Optional[float], convention: str, path: str,
                           threads: int) -> Tuple[Tensor, Tensor, Tensor]:
    return _cpu.contiguous(reference.vjp(reference.cat_avgkey, (q, k, v), dout, scale=scale,
                                         convention=convention))


@cat_avgkey_backward_op.register_kernel("cpu")
def _(q, k, v, dout, scale, convention, path, threads):
    grads = _cpu.run(_core.cat_avgkey_backward, (q, k, v, dout),
                     scale=scale, convention=convention,
                     path=path, threads=threads)
    return tuple(g.to(v.dtype) for g in grads)


@cat_avgkey_backward_op.register_fake
def _(q, k, v, dout, scale, convention, path, threads):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _cat_avgkey_setup(ctx, inputs, output):
    q, k, v, *options = inputs
    ctx.save_for_backward(q, k, v)
    ctx.options = options


def _cat_avgkey_backward(ctx, dout):
    return (*cat_avgkey_backward_op(*ctx.saved_tensors, dout, *ctx.options),
            None, None, None, None)


cat_avgkey_op.register_autograd(_cat_avgkey_backward, setup_context=_cat_avgkey_setup)


def cat_avgkey(q: Tensor, k: Tensor, v: Tensor, *, scale: Optional[float] = None,
               convention: str = "roll", path: str = "automatic",
               threads: int = 0) -> Tensor:
    """Averaged-key CAT, differentiable: q, k [B, N, H, D], v [B, N, H, Dv] -> out.

    z = scale <q[i], mean_j k[j]> (scale None: 1/sqrt(D)), then CAT.
    """
    return cat_avgkey_op(q, k, v, scale, convention, path, threads)


# --------------------------------------------------------------------------------------
# Causal CAT


@custom_op("subquad::cat_causal", mutates_args=())
def cat_causal_op(z: Tensor, v: Tensor, path: str, threads: int) -> Tensor:
    return _in_layout_of(reference.cat_causal(z, v), v)


@cat_causal_op.register_kernel("cpu")
def _(z, v, path, threads):
    out = _cpu.run(_core.cat_causal_forward, (z, v), prepare=_cpu.sequence_readable, path=path, threads=threads)
    return out.to(v.dtype)


@cat_causal_op.register_fake
def _(z, v, path, threads):
    return _empty_like_layout(v)


@custom_op("subquad::cat_causal_backward", mutates_args=())
def cat_causal_backward_op(z: Tensor, v: Tensor, out: Tensor, dout: Tensor, path: str,
                           threads: int) -> Tuple[Tensor, Tensor]:
    dz, dv = reference.vjp(reference.cat_causal, (z, v), dout)
    return _in_layout_of(dz, z), _in_layout_of(dv, v)


@cat_causal_backward_op.register_kernel("cpu")
def _(z, v, out, dout, path, threads):
    dz, dv = _cpu.run(_core.cat_causal_backward, (z, v, out, dout),
                      prepare=_cpu.sequence_readable,
                      path=path, threads=threads)
    return dz.to(z.dtype), dv.to(v.dtype)


@cat_causal_backward_op.register_fake
def _(z, v, out, dout, path, threads):
    return _empty_like_layout(z), _empty_like_layout(v)


def _cat_causal_setup(ctx, inputs, output):
    z, v, *options = inputs
    ctx.save_for_backward(z, v, output)
    ctx.options = options


def _cat_causal_backward(ctx, dout):
    return (*cat_causal_backward_op(*ctx.saved_tensors, dout, *ctx.options), None, None)


cat_causal_op.register_autograd(_cat_causal_backward, setup_context=_cat_causal_setup)


def cat_causal(z: Tensor, v: Tensor, *, path: str = "automatic", threads: int = 0) -> Tensor:
    """Causal CAT, differentiable: z [B, N, H], v [B, N, H, Dv] -> out [B, N, H, Dv],
    out[i] = sum_{k <= i} exp(z[k]) v[i - k] / sum_{k <= i} exp(z[k]).

    Layouts as cat's: sequence-last v (and z) is read in place; out, dz and dv come back
    in the inputs' layouts.
    """
    return cat_causal_op(z, v, path, threads)


# --------------------------------------------------------------------------------------
# Causal CAT decoding (no grad: the state of a decode loop, layers.CatCausalCache)


@custom_op("subquad::cat_causal_decode", mutates_args=())
def cat_causal_decode_op(z: Tensor, v: Tensor, tokens: int, threads: int) -> Tensor:
    if tokens == 0:
        return v.new_empty(v.shape[0], 0, *v.shape[2:])
    return reference.cat_causal_rows(z, v, z.shape[1] - tokens)


@cat_causal_decode_op.register_kernel("cpu")
def _(z, v, tokens, threads):
    out = _cpu.run(_core.cat_causal_decode, (z, v), tokens=tokens, threads=threads)
    return out.to(v.dtype)


@cat_causal_decode_op.register_fake
def _(z, v, tokens, threads):
    return v.new_empty(v.shape[0], tokens, *v.shape[2:])


def cat_causal_decode(z: Tensor, v: Tensor, *, tokens: int, threads: int = 0) -> Tensor:
    """Causal CAT rows of the newest `tokens` of everything seen: z [B, S, H] and
    v [B, S, H, Dv] hold every token (slices of a caller's larger buffers are read in place)
    -> out [B, tokens, H, Dv], rows S - tokens .. S - 1 of cat_causal(z, v)."""
    return cat_causal_decode_op(z, v, tokens, threads)
