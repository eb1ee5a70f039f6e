"""PyTorch autograd Functions and nn.Modules on subquad's operators (CPU tensors).

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

Modules (inputs x [B, N, dim] unless stated):
    CATLayer                  z = x W_A, v = x W_V, per-head CAT, W_O
    Circulant2dAttention      2D Circulant Attention with the token-reweighting gate
    Circulant2dBlock          the CA-DeiT block: depthwise-conv position encoding, gated
                              Circulant Attention, MLP; x [B, Hg, Wg, dim]
    MLRAttention              MLR attention with QK-LayerNorm
    BilinearMLRAttention      bilinear MLR scores on the exact kernel
    BTTAttention              bilinear BTT scores on the exact kernel
    WildcatAttention          multi-head attention computed by WildCat (inference only)
"""

import math
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from . import _core

__all__ = [
    "BTTAttention",
    "BilinearMLRAttention",
    "CATLayer",
    "Circulant2dAttention",
    "Circulant2dBlock",
    "MLRAttention",
    "WildcatAttention",
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


# --------------------------------------------------------------------------------------
# Modules


def _split_heads(x: Tensor, heads: int) -> Tensor:
    """[..., heads * d] -> [..., heads, d] (a view)."""
    return x.unflatten(-1, (heads, x.shape[-1] // heads))


def _check_divisible(dim: int, heads: int) -> None:
    if heads < 1 or dim % heads:
        raise ValueError(f"heads: expected a divisor of dim = {dim}, got {heads}")


class CATLayer(nn.Module):
    """CAT attention layer (Yamada 2025): x [B, N, dim] -> [B, N, dim].

    z = score_scale * x W_A ([B, N, heads]), v = x W_V split into heads of dim // heads,
    per-head CAT (circulant of softmax(z) over the sequence), heads concatenated, W_O.
    CATLayer(dim, heads, *, causal=False, convention="roll", score_scale=1.0, bias=False,
    threads=0). causal uses the causal (lag) CAT; otherwise `convention` "roll" or "conv".
    """

    def __init__(self, dim: int, heads: int, *, causal: bool = False,
                 convention: str = "roll", score_scale: float = 1.0, bias: bool = False,
                 threads: int = 0):
        super().__init__()
        _check_divisible(dim, heads)
        self.heads, self.causal, self.convention = heads, causal, convention
        self.score_scale, self.threads = score_scale, threads
        self.w_a = nn.Linear(dim, heads, bias=bias)
        self.w_v = nn.Linear(dim, dim, bias=bias)
        self.w_o = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        z = self.w_a(x) * self.score_scale
        v = _split_heads(self.w_v(x), self.heads)
        if self.causal:
            out = cat_causal(z, v, threads=self.threads)
        else:
            out = cat(z, v, convention=self.convention, threads=self.threads)
        return self.w_o(out.flatten(-2))


class Circulant2dAttention(nn.Module):
    """2D Circulant Attention with the token-reweighting gate (Han et al. 2026, released
    code): u [B, Hg, Wg, dim] -> [B, Hg, Wg, dim].

    q, k, v = u W_qkv (bias-free), CA per head on the grid, times the gate
    T = SiLU(u W_T + b_T) (a BCCB matrix has equal row sums; the gate restores per-token
    emphasis), then W_proj + b_proj. Circulant2dAttention(dim, heads=None, *,
    scale_mode="code", threads=0); heads None: dim heads of one channel each, as the
    released model (with scale_mode "code", c = 1/sqrt(N)).
    """

    def __init__(self, dim: int, heads: Optional[int] = None, *, scale_mode: str = "code",
                 threads: int = 0):
        super().__init__()
        self.heads = dim if heads is None else heads
        _check_divisible(dim, self.heads)
        self.scale_mode, self.threads = scale_mode, threads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.gate = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, u: Tensor) -> Tensor:
        q, k, v = (_split_heads(t, self.heads) for t in self.qkv(u).chunk(3, dim=-1))
        attended = circulant2d(q, k, v, scale_mode=self.scale_mode, threads=self.threads)
        return self.proj(attended.flatten(-2) * F.silu(self.gate(u)))


class Circulant2dBlock(nn.Module):
    """The CA-DeiT transformer block: x [B, Hg, Wg, dim] -> [B, Hg, Wg, dim].

    x = x + dwconv3x3(x) (conditional position encoding, one 3x3 filter per channel);
    x = x + Circulant2dAttention(LN(x)); x = x + MLP(LN(x)) (GELU, hidden mlp_ratio * dim).
    Circulant2dBlock(dim, heads=None, *, mlp_ratio=4.0, scale_mode="code", threads=0).
    """

    def __init__(self, dim: int, heads: Optional[int] = None, *, mlp_ratio: float = 4.0,
                 scale_mode: str = "code", threads: int = 0):
        super().__init__()
        self.position = nn.Conv2d(dim, dim, kernel_size=3, padding=1, groups=dim)
        self.norm1 = nn.LayerNorm(dim)
        self.attention = Circulant2dAttention(dim, heads, scale_mode=scale_mode,
                                              threads=threads)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.position(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class MLRAttention(nn.Module):
    """MLR attention layer (Kuang et al. 2025): x [B, T, dim] -> [B, T, dim].

    q, k = LayerNorm over the head dim (no affine) of x W_q, x W_k with head dim
    sum(ranks); v = x W_v with value head dim dim // heads; MLR attention; W_o.
    MLRAttention(dim, heads, ranks, *, kv_heads=None, causal=True, block_divide=False,
    threads=0). T must be divisible by 2^(len(ranks) - 1).
    """

    def __init__(self, dim: int, heads: int, ranks: Sequence[int], *,
                 kv_heads: Optional[int] = None, causal: bool = True,
                 block_divide: bool = False, threads: int = 0):
        super().__init__()
        _check_divisible(dim, heads)
        self.heads, self.kv_heads = heads, heads if kv_heads is None else kv_heads
        self.ranks, self.causal, self.block_divide = list(ranks), causal, block_divide
        self.threads = threads
        self.head_dim, self.value_dim = sum(self.ranks), dim // heads
        self.w_q = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.w_k = nn.Linear(dim, self.kv_heads * self.head_dim, bias=False)
        self.w_v = nn.Linear(dim, self.kv_heads * self.value_dim, bias=False)
        self.w_o = nn.Linear(heads * self.value_dim, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        q = F.layer_norm(_split_heads(self.w_q(x), self.heads), (self.head_dim,))
        k = F.layer_norm(_split_heads(self.w_k(x), self.kv_heads), (self.head_dim,))
        v = _split_heads(self.w_v(x), self.kv_heads)
        out = mlr_attention(q, k, v, ranks=self.ranks, causal=self.causal,
                            block_divide=self.block_divide, threads=self.threads)
        return self.w_o(out.flatten(-2))


def _normal(shape: Sequence[int], fan_in: int) -> nn.Parameter:
    """A weight drawn from N(0, 1 / fan_in) (muP hidden-weight initialisation)."""
    return nn.Parameter(torch.randn(*shape) / math.sqrt(fan_in))


class BilinearMLRAttention(nn.Module):
    """Attention with a bilinear MLR score (Kuang et al. 2025): x [B, T, dim] -> [B, T, dim].

    q and k are bilinear MLR projections of x (weights [2^l, dim / 2^l, heads r_l] per
    level, RMS-capped, per-level LayerNorm; the level scales c_l on the query side), so
    S_h = sum_l c_l q_l k_l^T has rank up to sum_l r_l 2^l; exact attention with scale 1;
    v = x W_v (value head dim dim // heads); W_o.
    BilinearMLRAttention(dim, heads, ranks, *, causal=True, mup=False, rms_cap=True,
    threads=0). dim must be divisible by 2^(len(ranks) - 1).
    """

    def __init__(self, dim: int, heads: int, ranks: Sequence[int], *, causal: bool = True,
                 mup: bool = False, rms_cap: bool = True, threads: int = 0):
        super().__init__()
        _check_divisible(dim, heads)
        self.heads, self.ranks, self.causal = heads, list(ranks), causal
        self.rms_cap, self.threads = rms_cap, threads
        self.level_scale = _core.bilinear_mlr_level_scales(self.ranks, mup)
        shapes = [(2**l, dim // 2**l, heads * r) for l, r in enumerate(self.ranks)]
        self.weights_q = nn.ParameterList([_normal(s, s[1]) for s in shapes])
        self.weights_k = nn.ParameterList([_normal(s, s[1]) for s in shapes])
        self.w_v = nn.Linear(dim, dim, bias=False)
        self.w_o = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        options = dict(ranks=self.ranks, heads=self.heads, rms_cap=self.rms_cap,
                       threads=self.threads)
        q = bilinear_mlr_project(x, list(self.weights_q), level_scale=self.level_scale,
                                 **options)
        k = bilinear_mlr_project(x, list(self.weights_k), **options)
        v = _split_heads(self.w_v(x), self.heads)
        out, _ = exact_attention(q, k, v, scale=1.0, causal=self.causal, threads=self.threads)
        return self.w_o(out.flatten(-2))


class BTTAttention(nn.Module):
    """Attention with a bilinear BTT score (Kuang et al. 2025): x [B, T, dim] -> [B, T, dim].

    S_h[t, t'] = <x_t, LN(y_h(x_t'))> * scale with y_h the BTT projection (w1 [a, b,
    heads b rank], w2 [heads b, a, a rank], (a, b) = subquad.btt_factors(dim)): full-rank
    scores at O(dim^1.5) parameters; scale 1/sqrt(dim), or 1/dim under muP. v = x W_v
    (value head dim dim // heads); W_o. BTTAttention(dim, heads, rank=1, *, causal=True,
    mup=False, rms_cap=True, threads=0).
    """

    def __init__(self, dim: int, heads: int, rank: int = 1, *, causal: bool = True,
                 mup: bool = False, rms_cap: bool = True, threads: int = 0):
        super().__init__()
        _check_divisible(dim, heads)
        self.heads, self.rank, self.causal = heads, rank, causal
        self.rms_cap, self.threads = rms_cap, threads
        self.scale = 1.0 / dim if mup else 1.0 / math.sqrt(dim)
        a, b = _core.btt_factors(dim)
        self.w1 = _normal((a, b, heads * b * rank), b)
        self.w2 = _normal((heads * b, a, a * rank), a * rank)
        self.w_v = nn.Linear(dim, dim, bias=False)
        self.w_o = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        k = btt_project(x, self.w1, self.w2, heads=self.heads, rank=self.rank,
                        rms_cap=self.rms_cap, threads=self.threads)
        q = x.unsqueeze(2).expand(-1, -1, self.heads, -1)  # the raw input, read in place
        v = _split_heads(self.w_v(x), self.heads)
        out, _ = exact_attention(q, k, v, scale=self.scale, causal=self.causal,
                                 threads=self.threads)
        return self.w_o(out.flatten(-2))


class WildcatAttention(nn.Module):
    """Multi-head attention computed by WildCat coreset attention (inference only).

    x [B, N, dim] (queries) and context [B, M, dim] (keys and values; default x) ->
    [B, N, dim]: q = x W_q, k = context W_k, v = context W_v (kv_heads heads, grouped
    queries), WildCat attention with `rank` coreset points per (batch, kv head), W_o.
    float32; runs without autograd (the output carries no grad), so weights are meant to
    be trained elsewhere (e.g. with exact attention) and loaded here.
    WildcatAttention(dim, heads, *, kv_heads=None, rank=128, bins=1, seed=0,
    method="wildcat", bias=True, threads=0).
    """

    def __init__(self, dim: int, heads: int, *, kv_heads: Optional[int] = None,
                 rank: int = 128, bins: int = 1, seed: int = 0, method: str = "wildcat",
                 bias: bool = True, threads: int = 0):
        super().__init__()
        _check_divisible(dim, heads)
        self.heads, self.kv_heads = heads, heads if kv_heads is None else kv_heads
        _check_divisible(heads, self.kv_heads)
        self.options = dict(rank=rank, bins=bins, seed=seed, method=method, threads=threads)
        head_dim = dim // heads
        self.w_q = nn.Linear(dim, dim, bias=bias)
        self.w_k = nn.Linear(dim, self.kv_heads * head_dim, bias=bias)
        self.w_v = nn.Linear(dim, self.kv_heads * head_dim, bias=bias)
        self.w_o = nn.Linear(dim, dim, bias=bias)

    @torch.no_grad()
    def forward(self, x: Tensor, context: Optional[Tensor] = None) -> Tensor:
        context = x if context is None else context
        q = _split_heads(self.w_q(x), self.heads)
        k = _split_heads(self.w_k(context), self.kv_heads)
        v = _split_heads(self.w_v(context), self.kv_heads)
        return self.w_o(wildcat_attention(q, k, v, **self.options).flatten(-2))
