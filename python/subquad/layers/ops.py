"""One entry per operator for the layers: the C++ kernels (subquad.torch) for CPU tensors,
the torch-native math (layers.native) for tensors on any other device.

backend "auto" picks by device; "cpp" insists on the C++ kernels (CPU tensors only);
"torch" forces the native math (how tests use it as the oracle of the C++ path on CPU).
The C++ kernels take float32 and float64; CPU tensors of other floating dtypes (bfloat16
under autocast, float16) are computed in float32 and cast back, so autocast keeps working.
"""

from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import _core
from .. import torch as functions  # the autograd Functions on the C++ kernels
from . import native, native_wildcat

BACKENDS = ("auto", "cpp", "torch")
CPP_DTYPES = (torch.float32, torch.float64)


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend


def use_cpp(backend: str, *tensors: Tensor) -> bool:
    """Whether these tensors go to the C++ kernels under `backend`."""
    on_cpu = all(t.device.type == "cpu" for t in tensors)
    if backend == "cpp" and not on_cpu:
        devices = sorted({str(t.device) for t in tensors})
        raise ValueError(f"backend: 'cpp' runs the C++ kernels on CPU tensors only, got "
                         f"tensors on {', '.join(devices)}; use backend 'auto' or 'torch'")
    return backend != "torch" and on_cpu


def _on_cpp(function: Callable, tensors: Sequence[Tensor], float32_only: bool = False):
    """Calls function(*tensors) in a dtype the kernels take and casts the results back."""
    dtype = tensors[0].dtype
    accepted = (torch.float32,) if float32_only else CPP_DTYPES
    work = dtype if dtype in accepted else torch.float32
    result = function(*(t.to(work) for t in tensors))
    if isinstance(result, tuple):
        return tuple(r.to(dtype) for r in result)
    return result.to(dtype)


def exact_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: Optional[float], causal: bool,
                    window: int, backend: str, threads: int) -> Tuple[Tensor, Tensor]:
    """q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> (out [B, N, H, Dv], lse [B, H, N])."""
    if use_cpp(backend, q, k, v):
        return _on_cpp(lambda q, k, v: functions.exact_attention(
            q, k, v, scale=scale, causal=causal, window=window, threads=threads), (q, k, v))
    return native.exact_attention(q, k, v, scale=scale, causal=causal, window=window)


def cat(z: Tensor, v: Tensor, *, convention: str, backend: str, threads: int) -> Tensor:
    """z [B, N, H], v [B, N, H, Dv] -> out [B, N, H, Dv]."""
    if use_cpp(backend, z, v):
        return _on_cpp(lambda z, v: functions.cat(z, v, convention=convention, threads=threads),
                       (z, v))
    return native.cat(z, v, convention=convention)


def cat_avgkey(q: Tensor, k: Tensor, v: Tensor, *, scale: Optional[float], convention: str,
               backend: str, threads: int) -> Tensor:
    """q, k [B, N, H, D], v [B, N, H, Dv] -> out [B, N, H, Dv]."""
    if use_cpp(backend, q, k, v):
        return _on_cpp(lambda q, k, v: functions.cat_avgkey(
            q, k, v, scale=scale, convention=convention, threads=threads), (q, k, v))
    return native.cat_avgkey(q, k, v, scale=scale, convention=convention)


def cat_causal(z: Tensor, v: Tensor, *, backend: str, threads: int) -> Tensor:
    """z [B, N, H], v [B, N, H, Dv] -> out [B, N, H, Dv]."""
    if use_cpp(backend, z, v):
        return _on_cpp(lambda z, v: functions.cat_causal(z, v, threads=threads), (z, v))
    return native.cat_causal(z, v)


def circulant2d(q: Tensor, k: Tensor, v: Tensor, *, scale_mode: str, scale: Optional[float],
                backend: str, threads: int) -> Tensor:
    """q, k [B, Hg, Wg, H, D], v [B, Hg, Wg, H, Dv] -> out [B, Hg, Wg, H, Dv]."""
    if use_cpp(backend, q, k, v):
        return _on_cpp(lambda q, k, v: functions.circulant2d(
            q, k, v, scale_mode=scale_mode, scale=scale, threads=threads), (q, k, v))
    c = _core.circulant2d_scale(q.shape[1] * q.shape[2], q.shape[-1], scale_mode=scale_mode,
                                scale=scale)
    return native.circulant2d(q, k, v, scale=c)


def mlr_attention(q: Tensor, k: Tensor, v: Tensor, *, ranks: Sequence[int], causal: bool,
                  block_divide: bool, backend: str, threads: int) -> Tensor:
    """q [B, T, H, D], k [B, T, Hkv, D], v [B, T, Hkv, Dv] -> out [B, T, H, Dv]."""
    if use_cpp(backend, q, k, v):
        return _on_cpp(lambda q, k, v: functions.mlr_attention(
            q, k, v, ranks=ranks, causal=causal, block_divide=block_divide, threads=threads),
            (q, k, v))
    return native.mlr_attention(q, k, v, ranks=ranks, causal=causal, block_divide=block_divide)


def bilinear_mlr_project(x: Tensor, weights: Sequence[Tensor], *, ranks: Sequence[int],
                         heads: int, level_scale: Sequence[float], rms_cap: bool,
                         backend: str, threads: int) -> Tensor:
    """x [B, N, Dm], weights[l] [2^l, Dm / 2^l, heads r_l] -> y [B, N, heads, E]."""
    options = dict(ranks=ranks, heads=heads, level_scale=level_scale, rms_cap=rms_cap)
    if use_cpp(backend, x, *weights):
        return _on_cpp(lambda x, *w: functions.bilinear_mlr_project(
            x, w, threads=threads, **options), (x, *weights))
    return native.bilinear_mlr_project(x, weights, **options)


def btt_project(x: Tensor, w1: Tensor, w2: Tensor, *, heads: int, rank: int, rms_cap: bool,
                backend: str, threads: int) -> Tensor:
    """x [B, N, D], w1 [a, b, heads b rank], w2 [heads b, a, a rank] -> y [B, N, heads, D]."""
    options = dict(heads=heads, rank=rank, rms_cap=rms_cap)
    if use_cpp(backend, x, w1, w2):
        return _on_cpp(lambda x, w1, w2: functions.btt_project(
            x, w1, w2, threads=threads, **options), (x, w1, w2))
    return native.btt_project(x, w1, w2, **options)


def wildcat_attention(q: Tensor, k: Tensor, v: Tensor, *, rank: int, bins: int, seed: int,
                      scale: Optional[float], method: str, backend: str, threads: int) -> Tensor:
    """q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> out [B, N, H, Dv], no grad.

    The C++ kernel computes in float32; the native WildCat (layers.native_wildcat) draws its
    pivots from torch's generator, so the two agree exactly only where a bin fits whole.
    """
    options = dict(rank=rank, bins=bins, seed=seed, scale=scale, method=method)
    q, k, v = q.detach(), k.detach(), v.detach()
    if use_cpp(backend, q, k, v):
        return _on_cpp(lambda q, k, v: functions.wildcat_attention(
            q, k, v, threads=threads, **options), (q, k, v), float32_only=True)
    return native_wildcat.wildcat_attention(q, k, v, **options)
