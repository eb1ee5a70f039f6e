"""Autograd Functions on subquad's C++ operators (CPU tensors), all built by one pattern.

`_function(name, forward, backward)` makes a torch.autograd.Function from two plain
functions on arrays: `forward(*arrays, **options)` returns the operator's outputs and
`backward(inputs, outputs, grads, **options)` returns one gradient (or None) per tensor
input. The pattern saves every input and output, passes the options as one argument
and adds the None gradients of the non-tensor arguments, so that no Function counts
saved tensors or None paddings by hand. Missing incoming gradients (autograd passes
None when an output is unused) become zeros shaped like that output, or stay None
where the C++ backward accepts "no gradient" (exact attention's dlse, the merge).

Tensors reach the C++ operators without copies (the extension reads them in place
through DLPack) and results come back as tensors sharing the memory of the NumPy
outputs (``torch.from_numpy``), so nothing is built against torch. Inputs whose last
dimension is not contiguous are made contiguous first; incoming gradients likewise
(CAT, causal CAT too, also reads tensors whose sequence dimension is contiguous in place).
Dtypes: float32 or float64 (WildCat: float32 only); all tensors of one call share the
dtype. Exact attention also takes bfloat16 (q, k, v and the gradients bfloat16, lse
float32); its bfloat16 outputs come back through DLPack. Bad arguments raise ValueError
with the C++ message. Backward passes are the library's own (first order only: double
backward raises).
"""

from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.utils.dlpack
from torch import Tensor
from torch.autograd.function import once_differentiable

from .. import _core

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


def _sequence_array(tensor: Tensor) -> Tensor:
    """`tensor` detached, read in place when its sequence dimension (1) is contiguous (CAT and
    causal CAT read sequence-last memory in place), else as _array."""
    tensor = tensor.detach()
    if tensor.dim() > 1 and tensor.shape[1] > 1 and tensor.stride(1) == 1:
        return tensor
    return _array(tensor)


def _tensor(array) -> Tensor:
    """A tensor sharing the memory of an output of _core: a NumPy array, or for bfloat16
    (which NumPy lacks) a DLPack array."""
    if isinstance(array, np.ndarray):
        return torch.from_numpy(array)
    return torch.utils.dlpack.from_dlpack(array)


def _grad(grad: Optional[Tensor], output: Tensor) -> Tensor:
    """The incoming gradient of `output` as an array _core can read: zeros shaped like the
    output when autograd passes None."""
    if grad is None:
        return torch.zeros_like(output)
    # Gradients of reductions arrive expanded (stride 0 everywhere): not a valid view.
    return grad.contiguous()


def _optional_grad(grad: Optional[Tensor]) -> Optional[Tensor]:
    """An incoming gradient for a C++ backward that takes None as "no gradient"."""
    return None if grad is None else grad.contiguous()


def _tensors(results) -> Tuple[Tensor, ...]:
    """_core's output (one array, a tuple or a list of arrays) as a tuple of tensors."""
    if isinstance(results, (tuple, list)):
        return tuple(_tensor(r) for r in results)
    return (_tensor(results),)


def _function(name: str, forward: Callable, backward: Callable,
              returns: int = 1, array: Callable = _array) -> type:
    """A torch.autograd.Function applied as `Function.apply(options, *tensors)`.

    forward(*arrays, **options) -> outputs; the first `returns` outputs are returned (any
    further ones, such as an lse the backward needs, are saved only). `array` readies each
    input tensor for _core (_array, or _sequence_array where sequence-last memory is read in
    place).
    backward(inputs, outputs, grads, **options) -> one gradient per tensor input.
    """

    def forward_(ctx, options, *tensors):
        outputs = _tensors(forward(*map(array, tensors), **options))
        ctx.options = options
        ctx.inputs = len(tensors)
        ctx.save_for_backward(*tensors, *outputs)
        ctx.set_materialize_grads(False)
        return outputs[0] if returns == 1 else outputs[:returns]

    @once_differentiable
    def backward_(ctx, *grads):
        saved = ctx.saved_tensors
        inputs, outputs = saved[:ctx.inputs], saved[ctx.inputs:]
        gradients = backward(inputs, outputs, grads[:returns], **ctx.options)
        return (None, *(None if g is None else _tensor(g) for g in gradients))

    return type(name, (torch.autograd.Function,), {
        "__doc__": f"Autograd Function of {name[:-len('Function')]} (subquad.torch.functional).",
        "forward": staticmethod(forward_),
        "backward": staticmethod(backward_),
    })


# --------------------------------------------------------------------------------------
# Exact attention


def _exact_backward(inputs, outputs, grads, **options):
    (q, k, v), (out, lse), (dout, dlse) = inputs, outputs, grads
    return _core.exact_attention_backward(_array(q), _array(k), _array(v), out, lse,
                                          _grad(dout, out), dlse=_optional_grad(dlse),
                                          **options)


ExactAttentionFunction = _function("ExactAttentionFunction", _core.exact_attention_forward,
                                   _exact_backward, returns=2)


def exact_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: Optional[float] = None,
                    causal: bool = False, window: int = 0,
                    threads: int = 0) -> Tuple[Tensor, Tensor]:
    """Exact softmax attention, differentiable in q, k, v (through out and lse).

    q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> (out [B, N, H, Dv],
    lse [B, H, N]). scale None: 1/sqrt(D); causal bottom-right aligned; window 0: none.
    See subquad.exact_attention_forward.
    """
    options = dict(scale=scale, causal=causal, window=window, threads=threads)
    return ExactAttentionFunction.apply(options, q, k, v)


def _merge_backward(inputs, outputs, grads, **options):
    (out_a, lse_a, out_b, lse_b), (out, lse), (dout, dlse) = inputs, outputs, grads
    return _core.merge_attention_backward(
        _array(out_a), _array(lse_a), _array(out_b), _array(lse_b), out, lse,
        dout=_optional_grad(dout), dlse=_optional_grad(dlse), **options)


MergeAttentionFunction = _function("MergeAttentionFunction", _core.merge_attention,
                                   _merge_backward, returns=2)


def merge_attention(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, *,
                    threads: int = 0) -> Tuple[Tensor, Tensor]:
    """Merges attention over two disjoint key sets, differentiably.

    out_a, out_b [B, N, H, Dv], lse_a, lse_b [B, H, N] -> (out [B, N, H, Dv], lse [B, H, N]).
    """
    return MergeAttentionFunction.apply(dict(threads=threads), out_a, lse_a, out_b, lse_b)


# --------------------------------------------------------------------------------------
# CAT


def _sequence_grad(grad: Optional[Tensor], output: Tensor) -> Tensor:
    """An incoming gradient for CAT's backward: read in place when its sequence dimension is
    contiguous, zeros in the output's layout when autograd passes None, else as _grad."""
    if grad is None:
        return torch.zeros_like(output)  # keeps the output's layout
    if grad.dim() > 1 and grad.shape[1] > 1 and grad.stride(1) == 1:
        return grad.detach()
    return _grad(grad, output)


def _cat_backward(inputs, outputs, grads, **options):
    (z, v), (out,), (dout,) = inputs, outputs, grads
    return _core.cat_backward(_sequence_array(z), _sequence_array(v), _sequence_grad(dout, out),
                              **options)


CatFunction = _function("CatFunction", _core.cat_forward, _cat_backward,
                        array=_sequence_array)


def cat(z: Tensor, v: Tensor, *, convention: str = "roll", path: str = "automatic",
        threads: int = 0) -> Tensor:
    """CAT, differentiable in z and v: z [B, N, H], v [B, N, H, Dv] -> out [B, N, H, Dv].

    convention "roll" (A[i, j] = s[(j - i) mod N]) or "conv"; path "automatic", "direct"
    or "fft". See subquad.cat_forward. Fastest on sequence-last memory from N = 1024 on (and
    for every backward): v (and z) a permuted view, v = x.permute(0, 3, 1, 2) of a contiguous
    x [B, H, Dv, N], read in place; at N = 256 the float32 forward on [B, N, H, Dv] measured
    faster. out, dz and dv come back in the inputs' layouts.
    """
    return CatFunction.apply(dict(convention=convention, path=path, threads=threads), z, v)


def _cat_avgkey_backward(inputs, outputs, grads, **options):
    (q, k, v), (out,), (dout,) = inputs, outputs, grads
    return _core.cat_avgkey_backward(_array(q), _array(k), _array(v), _grad(dout, out),
                                     **options)


CatAvgKeyFunction = _function("CatAvgKeyFunction", _core.cat_avgkey_forward,
                              _cat_avgkey_backward)


def cat_avgkey(q: Tensor, k: Tensor, v: Tensor, *, scale: Optional[float] = None,
               convention: str = "roll", path: str = "automatic",
               threads: int = 0) -> Tensor:
    """Averaged-key CAT, differentiable: q, k [B, N, H, D], v [B, N, H, Dv] -> out.

    z = scale <q[i], mean_j k[j]> (scale None: 1/sqrt(D)), then CAT.
    """
    options = dict(scale=scale, convention=convention, path=path, threads=threads)
    return CatAvgKeyFunction.apply(options, q, k, v)


def _cat_causal_backward(inputs, outputs, grads, **options):
    (z, v), (out,), (dout,) = inputs, outputs, grads
    return _core.cat_causal_backward(_sequence_array(z), _sequence_array(v), out,
                                     _sequence_grad(dout, out), **options)


CatCausalFunction = _function("CatCausalFunction", _core.cat_causal_forward,
                              _cat_causal_backward, array=_sequence_array)


def cat_causal(z: Tensor, v: Tensor, *, path: str = "automatic", threads: int = 0) -> Tensor:
    """Causal CAT, differentiable: z [B, N, H], v [B, N, H, Dv] -> out [B, N, H, Dv],
    out[i] = sum_{k <= i} exp(z[k]) v[i - k] / sum_{k <= i} exp(z[k]).

    Layouts as cat's: sequence-last v (and z), v = x.permute(0, 3, 1, 2) of a contiguous
    x [B, H, Dv, N], is read in place; out, dz and dv come back in the inputs' layouts.
    """
    return CatCausalFunction.apply(dict(path=path, threads=threads), z, v)


# --------------------------------------------------------------------------------------
# 2D Circulant Attention


def _circulant2d_backward(inputs, outputs, grads, **options):
    (q, k, v), (out, _weights), (dout,) = inputs, outputs, grads
    return _core.circulant2d_backward(_array(q), _array(k), _array(v), _grad(dout, out),
                                      **options)


Circulant2dFunction = _function("Circulant2dFunction", _core.circulant2d_forward,
                                _circulant2d_backward)


def circulant2d(q: Tensor, k: Tensor, v: Tensor, *, scale_mode: str = "paper",
                scale: Optional[float] = None, threads: int = 0) -> Tensor:
    """2D Circulant Attention, differentiable: q, k [B, Hg, Wg, H, D], v [B, Hg, Wg, H, Dv]
    -> out [B, Hg, Wg, H, Dv]. scale_mode "paper" (1/(N sqrt(D))) or "code" (1/sqrt(N));
    scale overrides it. See subquad.circulant2d_forward."""
    options = dict(scale_mode=scale_mode, scale=scale, threads=threads)
    return Circulant2dFunction.apply(options, q, k, v)


# --------------------------------------------------------------------------------------
# Structured attention


def _mlr_backward(inputs, outputs, grads, **options):
    (q, k, v), (out, lse), (dout,) = inputs, outputs, grads
    return _core.mlr_attention_backward(_array(q), _array(k), _array(v), out, lse,
                                        _grad(dout, out), **options)


MlrAttentionFunction = _function("MlrAttentionFunction", _core.mlr_attention_forward,
                                 _mlr_backward)


def mlr_attention(q: Tensor, k: Tensor, v: Tensor, *, ranks: Sequence[int],
                  causal: bool = False, block_divide: bool = False,
                  threads: int = 0) -> Tensor:
    """MLR attention, differentiable: q [B, T, H, D], k [B, T, Hkv, D], v [B, T, Hkv, Dv]
    -> out [B, T, H, Dv]; ranks split D (sum = D). See subquad.mlr_attention_forward."""
    options = dict(ranks=list(ranks), causal=causal, block_divide=block_divide,
                   threads=threads)
    return MlrAttentionFunction.apply(options, q, k, v)


def _bilinear_forward(x, *weights, **options):
    return _core.bilinear_mlr_project_forward(x, [w.contiguous() for w in weights], **options)


def _bilinear_backward(inputs, outputs, grads, **options):
    (x, *weights), (y,), (dy,) = inputs, outputs, grads
    dx, dweights = _core.bilinear_mlr_project_backward(
        _array(x), [w.detach().contiguous() for w in weights], _grad(dy, y), **options)
    return (dx, *dweights)


BilinearMlrProjectFunction = _function("BilinearMlrProjectFunction", _bilinear_forward,
                                       _bilinear_backward)


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
    return BilinearMlrProjectFunction.apply(options, x, *weights)


def _btt_forward(x, w1, w2, **options):
    return _core.btt_project_forward(x, w1.contiguous(), w2.contiguous(), **options)


def _btt_backward(inputs, outputs, grads, **options):
    (x, w1, w2), (y,), (dy,) = inputs, outputs, grads
    return _core.btt_project_backward(_array(x), w1.detach().contiguous(),
                                      w2.detach().contiguous(), _grad(dy, y), **options)


BttProjectFunction = _function("BttProjectFunction", _btt_forward, _btt_backward)


def btt_project(x: Tensor, w1: Tensor, w2: Tensor, *, heads: int = 1, rank: int = 1,
                layer_norm: bool = True, rms_cap: bool = True, threads: int = 0) -> Tensor:
    """BTT projection, differentiable: x [B, N, D], w1 [a, b, heads b rank],
    w2 [heads b, a, a rank] -> y [B, N, heads, D], (a, b) = subquad.btt_factors(D)."""
    options = dict(heads=heads, rank=rank, layer_norm=layer_norm, rms_cap=rms_cap,
                   threads=threads)
    return BttProjectFunction.apply(options, x, w1, w2)


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
