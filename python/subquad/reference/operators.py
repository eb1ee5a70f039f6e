"""The reference of subquad's operators in torch: the same math as the C++ kernels, written
with torch.fft and masked matmuls, on any device and any floating dtype.

It is the test oracle of the C++ kernels and the implementation subquad.ops registers for
tensors off the CPU (CUDA, MPS, ...). Autograd differentiates it (vjp below), so it needs
no backward of its own. Costs: exact, MLR and causal CAT form their scores in blocks of
query rows (O(N M) time, O(block M) memory for the forward; autograd keeps every block's
scores for the backward); CAT and 2D Circulant Attention use FFTs (O(N log N)).
Layouts and argument meanings are those of subquad.ops: tokens [B, N, H, D], scores of
CAT [B, N, H].
"""

import math
from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import Tensor

# Constants of the C++ projections (src/structured/projection_common.h).
RMS_EPSILON = 1e-8
LAYER_NORM_EPSILON = 1e-5


def _spectral_dtype(x: Tensor) -> torch.dtype:
    """FFTs run in float32 at least: torch.fft has no bfloat16 and half only for powers of 2."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def vjp(function: Callable, inputs: Sequence[Tensor], grads, **options):
    """The gradients of function(*inputs, **options) with respect to `inputs`, for the
    incoming gradients `grads` of its output (a tensor, or a tuple like the output)."""
    _, pullback = torch.func.vjp(lambda *x: function(*x, **options), *inputs)
    return pullback(grads)


# The dense score methods (exact, causal CAT, MLR) run their query rows in blocks of at
# most this many score elements, so that memory is O(block x M), not O(N x M): at N = M =
# 65,536 with 8 heads a block holds 32 rows (64 MiB of float32 scores), where one dense
# matrix would hold 128 GiB. Each block is the plain math on its rows.
SCORE_BLOCK_ELEMENTS = 1 << 24


def _row_blocks(rows: int, elements_per_row: int):
    """(first, last) row ranges of at most SCORE_BLOCK_ELEMENTS score elements each."""
    step = max(1, SCORE_BLOCK_ELEMENTS // max(1, elements_per_row))
    return [(first, min(rows, first + step)) for first in range(0, rows, step)]


def _repeat_kv(x: Tensor, heads: int) -> Tensor:
    """[B, M, Hkv, C] -> [B, M, heads, C]: query head h reads kv head h // (heads // Hkv)."""
    group = heads // x.shape[2]
    return x if group == 1 else x.repeat_interleave(group, dim=2)


# --------------------------------------------------------------------------------------
# Exact attention


def exact_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: Optional[float] = None,
                    causal: bool = False, window: int = 0) -> Tuple[Tensor, Tensor]:
    """q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> (out [B, N, H, Dv],
    lse [B, H, N]). Causal bottom-right aligned (query i sees key j iff j <= i + M - N);
    window w > 0 also requires j > i + M - N - w. A row that sees no key: zeros, lse -inf."""
    B, N, H, D = q.shape
    M = k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    k, v = _repeat_kv(k, H), _repeat_kv(v, H)
    outs, lses = [], []
    for first, last in _row_blocks(N, B * H * M):
        scores = torch.einsum("bnhd,bmhd->bhnm", q[:, first:last], k) * scale  # [B, H, R, M]
        if causal or window > 0:
            i = torch.arange(first, last, device=q.device).unsqueeze(1) + (M - N)
            j = torch.arange(M, device=q.device).unsqueeze(0)
            visible = j <= i
            if window > 0:
                visible = visible & (j > i - window)
            scores = scores.masked_fill(~visible, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)  # [B, H, R]
        # Rows without a visible key: lse = -inf; exp(s - lse) would be NaN, so use 0 there.
        safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
        p = torch.exp(scores - safe.unsqueeze(-1))
        outs.append(torch.einsum("bhnm,bmhd->bnhd", p, v))
        lses.append(lse)
    return torch.cat(outs, dim=1), torch.cat(lses, dim=2)


def merge_attention(out_a: Tensor, lse_a: Tensor, out_b: Tensor,
                    lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    """Attention over the union of two disjoint key sets from the two results:
    out_a, out_b [B, N, H, Dv], lse_a, lse_b [B, H, N] -> (out, lse). A row with no key in
    either set (both lse -inf) stays zero with lse -inf."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    weight_a = torch.exp(lse_a - safe).transpose(1, 2).unsqueeze(-1)  # [B, N, H, 1]
    weight_b = torch.exp(lse_b - safe).transpose(1, 2).unsqueeze(-1)
    return out_a * weight_a + out_b * weight_b, lse


# --------------------------------------------------------------------------------------
# CAT


def cat(z: Tensor, v: Tensor, *, convention: str = "roll") -> Tensor:
    """z [B, N, H], v [B, N, H, Dv] -> out [B, N, H, Dv]; s = softmax(z) over the sequence,
    "roll": out[i] = sum_m s[m] v[(i + m) mod N], "conv": out[i] = sum_m s[m] v[(i - m) mod N]."""
    if convention not in ("roll", "conv"):
        raise ValueError(f"convention: expected 'roll' or 'conv', got {convention!r}")
    N = z.shape[1]
    work = _spectral_dtype(v)
    s = torch.softmax(z.to(work), dim=1)  # [B, N, H]
    fs = torch.fft.rfft(s, dim=1).unsqueeze(-1)  # [B, N/2+1, H, 1]
    fv = torch.fft.rfft(v.to(work), dim=1)  # [B, N/2+1, H, Dv]
    # Correlation (roll) multiplies by the conjugate spectrum, convolution (conv) by it.
    product = fs.conj() * fv if convention == "roll" else fs * fv
    return torch.fft.irfft(product, n=N, dim=1).to(v.dtype)


def cat_avgkey(q: Tensor, k: Tensor, v: Tensor, *, scale: Optional[float] = None,
               convention: str = "roll") -> Tensor:
    """q, k [B, N, H, D], v [B, N, H, Dv] -> out: z = scale <q[i], mean_j k[j]>, then CAT."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    z = (q * k.mean(dim=1, keepdim=True)).sum(-1) * scale  # [B, N, H]
    return cat(z, v, convention=convention)


def cat_causal(z: Tensor, v: Tensor) -> Tensor:
    """z [B, N, H], v [B, N, H, Dv] -> out[i] = sum_{k <= i} exp(z[k]) v[i - k] /
    sum_{k <= i} exp(z[k]), as a masked matmul per head over blocks of rows (stable per
    row)."""
    return cat_causal_rows(z, v, 0)


def cat_causal_rows(z: Tensor, v: Tensor, first: int) -> Tensor:
    """Rows first..N-1 of cat_causal(z, v): z [B, N, H], v [B, N, H, Dv] ->
    out [B, N - first, H, Dv] (what a decoder that has seen `first` tokens adds)."""
    B, N, H = z.shape
    blocks = _row_blocks(N - first, B * H * N)
    return torch.cat([_cat_causal_block(z, v, first + a, first + b) for a, b in blocks], dim=1)


def _cat_causal_block(z: Tensor, v: Tensor, first: int, last: int) -> Tensor:
    """Rows first..last-1 of cat_causal(z, v)."""
    N = z.shape[1]
    rows = torch.arange(first, last, device=z.device)  # [R]: absolute positions i
    lag = torch.arange(N, device=z.device)  # [N]: lags k, and key positions j
    # p[i, k] = softmax over k <= i of z[k]: row i's weights of its usable lags.
    visible = lag.unsqueeze(0) <= rows.unsqueeze(1)  # [R, N]
    prefix = z.permute(0, 2, 1).unsqueeze(2).expand(-1, -1, len(rows), -1)  # [B, H, R, N]
    p = torch.softmax(prefix.masked_fill(~visible, float("-inf")), dim=-1)
    # out[i] = sum_k p[i, k] v[i - k] = sum_j A[i, j] v[j] with A[i, j] = p[i, i - j].
    source = (rows.unsqueeze(1) - lag.unsqueeze(0)).clamp(min=0)  # [R, N]: i - j
    a = p.gather(-1, source.expand(p.shape[0], p.shape[1], -1, -1))
    a = a.masked_fill(~visible, 0.0)  # j <= i only
    return torch.einsum("bhij,bjhd->bihd", a, v)


# --------------------------------------------------------------------------------------
# 2D Circulant Attention


def circulant2d(q: Tensor, k: Tensor, v: Tensor, *, scale: float) -> Tensor:
    """q, k [B, Hg, Wg, H, D], v [B, Hg, Wg, H, Dv] -> out [B, Hg, Wg, H, Dv]: a[m] = scale
    sum_n <q[n], k[n + m]> on the torus, s = softmax(a) over the grid, out[i] = sum_n s[n]
    v[i + n]. `scale` is the logit scale c (subquad.circulant2d_scale)."""
    Hg, Wg = q.shape[1], q.shape[2]
    work = _spectral_dtype(v)
    grid = (Hg, Wg)
    fq = torch.fft.rfft2(q.to(work), dim=(1, 2))
    fk = torch.fft.rfft2(k.to(work), dim=(1, 2))
    # Correlation of q with k summed over the head dim: a[m] = sum_n <q[n], k[n + m]>.
    logits = torch.fft.irfft2((fq.conj() * fk).sum(-1), s=grid, dim=(1, 2)) * scale
    B, H = q.shape[0], q.shape[3]
    s = torch.softmax(logits.reshape(B, Hg * Wg, H), dim=1).reshape(B, Hg, Wg, H)
    fs = torch.fft.rfft2(s, dim=(1, 2)).unsqueeze(-1)
    fv = torch.fft.rfft2(v.to(work), dim=(1, 2))
    return torch.fft.irfft2(fs.conj() * fv, s=grid, dim=(1, 2)).to(v.dtype)


# --------------------------------------------------------------------------------------
# Structured attention


def mlr_block_sizes(ranks: Sequence[int], tokens: int) -> list:
    """Block length of each level: T / 2^(l-1) for levels l = 1..L."""
    levels = len(ranks)
    if tokens % (1 << (levels - 1)):
        raise ValueError(f"T: expected a multiple of 2^(len(ranks) - 1) = {1 << (levels - 1)}"
                         f" for MLR attention with {levels} levels, got {tokens}")
    return [tokens >> l for l in range(levels)]


def mlr_scores(q: Tensor, k: Tensor, *, ranks: Sequence[int], block_divide: bool = False,
               query_positions: Optional[Tensor] = None, key_positions: Optional[Tensor] = None,
               context: Optional[int] = None) -> Tensor:
    """The dense MLR scores [B, H, N, M] of q [B, N, H, D] and k [B, M, H, D] (heads already
    repeated): sum over the levels whose block holds both positions of <q_l, k_l> / r_l,
    divided by the number of such levels under block_divide. Positions default to 0..N-1
    and 0..M-1 with blocks of a `context` (default N) long sequence."""
    N, M = q.shape[1], k.shape[1]
    device = q.device
    i = torch.arange(N, device=device) if query_positions is None else query_positions
    j = torch.arange(M, device=device) if key_positions is None else key_positions
    blocks = mlr_block_sizes(ranks, N if context is None else context)
    scores = q.new_zeros(q.shape[0], q.shape[2], N, M)
    shared = torch.zeros(N, M, dtype=q.dtype, device=device)
    offset = 0
    for rank, block in zip(ranks, blocks):
        same = ((i.unsqueeze(1) // block) == (j.unsqueeze(0) // block)).to(q.dtype)  # [N, M]
        q_l, k_l = q[..., offset:offset + rank], k[..., offset:offset + rank]
        scores = scores + torch.einsum("bnhd,bmhd->bhnm", q_l, k_l) * (same / rank)
        shared = shared + same
        offset += rank
    return scores / shared if block_divide else scores


def mlr_attention(q: Tensor, k: Tensor, v: Tensor, *, ranks: Sequence[int], causal: bool = False,
                  block_divide: bool = False) -> Tensor:
    """q [B, T, H, D], k [B, T, Hkv, D], v [B, T, Hkv, Dv] -> out [B, T, H, Dv]; ranks split
    D; level l has blocks of T / 2^(l-1) tokens."""
    return mlr_attention_with_lse(q, k, v, ranks=ranks, causal=causal,
                                  block_divide=block_divide)[0]


def mlr_attention_with_lse(q: Tensor, k: Tensor, v: Tensor, *, ranks: Sequence[int],
                           causal: bool = False,
                           block_divide: bool = False) -> Tuple[Tensor, Tensor]:
    """mlr_attention's (out [B, T, H, Dv], lse [B, H, T]): the log-sum-exp of each row's
    scores, which the C++ backward reads."""
    if sum(ranks) != q.shape[-1]:
        raise ValueError(f"ranks: expected a sum equal to the head dim {q.shape[-1]}, "
                         f"got {list(ranks)}")
    B, T, H = q.shape[:3]
    k, v = _repeat_kv(k, H), _repeat_kv(v, H)
    t = torch.arange(T, device=q.device)
    outs, lses = [], []
    for first, last in _row_blocks(T, B * H * T):
        rows = t[first:last]
        scores = mlr_scores(q[:, first:last], k, ranks=ranks, block_divide=block_divide,
                            query_positions=rows, context=T)  # [B, H, R, T]
        if causal:
            scores = scores.masked_fill(t.unsqueeze(0) > rows.unsqueeze(1), float("-inf"))
        outs.append(torch.einsum("bhnm,bmhd->bnhd", torch.softmax(scores, dim=-1), v))
        lses.append(torch.logsumexp(scores, dim=-1))
    return torch.cat(outs, dim=1), torch.cat(lses, dim=2)


def mlr_attention_rows(q: Tensor, k: Tensor, v: Tensor, *, ranks: Sequence[int],
                       block_divide: bool, context: int) -> Tensor:
    """Causal MLR rows of the last T of S tokens, blocks on positions 0..context-1:
    q [B, T, H, D] (positions S-T..S-1), k [B, S, Hkv, D], v [B, S, Hkv, Dv] ->
    out [B, T, H, Dv] (what a decoder that has seen S - T tokens adds)."""
    H, T, S = q.shape[2], q.shape[1], k.shape[1]
    i = torch.arange(S - T, S, device=q.device)
    j = torch.arange(S, device=q.device)
    scores = mlr_scores(q, _repeat_kv(k, H), ranks=ranks, block_divide=block_divide,
                        query_positions=i, key_positions=j, context=context)
    scores = scores.masked_fill(j.unsqueeze(0) > i.unsqueeze(1), float("-inf"))
    return torch.einsum("bhnm,bmhd->bnhd", torch.softmax(scores, dim=-1), _repeat_kv(v, H))


def mlr_decode_rows(q: Tensor, level_keys: Sequence[Tensor], v: Tensor, *,
                    ranks: Sequence[int], block_divide: bool, context: int) -> Tensor:
    """mlr_attention_rows from level caches: q [B, T, H, D] (positions S-T..S-1, one finest
    block), level_keys[l] [B, Hkv, s_l, r_l] (slot p mod s_l), v [B, S, Hkv, Dv]. Level l
    holds the keys of the current level-l block, from its start a_l to S - 1; keys before
    a_l never share a level-l block with these rows, so their level-l columns are zeros."""
    S = v.shape[1]
    B, Hkv = v.shape[0], v.shape[2]
    keys = q.new_zeros(B, S, Hkv, sum(ranks))
    offset = 0
    for cache, rank, size in zip(level_keys, ranks, mlr_block_sizes(ranks, context)):
        start = (S - 1) - (S - 1) % size
        keys[:, start:, :, offset:offset + rank] = cache[:, :, :S - start].transpose(1, 2)
        offset += rank
    return mlr_attention_rows(q, keys, v, ranks=ranks, block_divide=block_divide,
                              context=context)


def rms_cap_limit(fan_in: int, fan_out: int) -> float:
    """The RMS cap c = sqrt(min(fan_in, fan_out)) / fan_in of a weight block."""
    return math.sqrt(min(fan_in, fan_out)) / fan_in


def cap_weight(w: Tensor, fan_in: int, fan_out: int) -> Tensor:
    """W' = g W, g = min(1, c / rms(W)), rms over the whole tensor (eps inside the root)."""
    rms = torch.sqrt(w.pow(2).mean() + RMS_EPSILON)
    return w * torch.clamp(rms_cap_limit(fan_in, fan_out) / rms, max=1.0)


def _layer_norm(x: Tensor) -> Tensor:
    return torch.nn.functional.layer_norm(x, x.shape[-1:], eps=LAYER_NORM_EPSILON)


def bilinear_mlr_project(x: Tensor, weights: Sequence[Tensor], *, ranks: Sequence[int],
                         heads: int = 1, level_scale: Sequence[float] = (),
                         layer_norm: bool = True, rms_cap: bool = True) -> Tensor:
    """x [B, N, Dm], weights[l] [2^l, Dm / 2^l, heads * ranks[l]] -> y [B, N, heads, E]:
    level l maps each of its 2^l feature blocks to r_l features per head (order: block,
    then rank), LayerNorm over the level's 2^l r_l features, times level_scale[l]."""
    B, N, Dm = x.shape
    levels = []
    for l, (w, r) in enumerate(zip(weights, ranks)):
        p = 1 << l
        m = Dm // p
        if rms_cap:
            w = cap_weight(w, m, heads * r)
        u = torch.einsum("bnpm,pmc->bnpc", x.reshape(B, N, p, m), w)  # [B, N, p, H r]
        u = u.reshape(B, N, p, heads, r).permute(0, 1, 3, 2, 4).reshape(B, N, heads, p * r)
        if layer_norm:
            u = _layer_norm(u)
        levels.append(u * (level_scale[l] if level_scale else 1.0))
    return torch.cat(levels, dim=-1)


def btt_project(x: Tensor, w1: Tensor, w2: Tensor, *, heads: int = 1, rank: int = 1,
                layer_norm: bool = True, rms_cap: bool = True) -> Tensor:
    """x [B, N, D], w1 [a, b, heads b rank], w2 [heads b, a, a rank] -> y [B, N, heads, D]:
    z[i, col] = sum_j x[i b + j] w1[i, j, col]; y[h, alpha b + beta] = sum_{i, s}
    w2[h b + beta, alpha, i rank + s] z[i, (h b + beta) rank + s]; LayerNorm over D."""
    B, N, D = x.shape
    a, b = w1.shape[0], w1.shape[1]
    if rms_cap:
        w1 = cap_weight(w1, b, heads * b * rank)
        w2 = cap_weight(w2, a * rank, a)
    z = torch.einsum("bnij,ijc->bnic", x.reshape(B, N, a, b), w1)  # [B, N, a, H b rank]
    z = z.reshape(B, N, a, heads * b, rank)  # [B, N, a(i), H b, rank]
    y = torch.einsum("bnigs,gais->bnga", z, w2.reshape(heads * b, a, a, rank))  # [B, N, Hb, a]
    y = y.reshape(B, N, heads, b, a).transpose(-1, -2).reshape(B, N, heads, D)
    return _layer_norm(y) if layer_norm else y
