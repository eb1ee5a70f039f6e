"""Torch-native WildCat (the math of src/wildcat, for tensors off the CPU): keys recentred per
(batch, kv head), split into bins; each bin compressed to a weighted coreset by randomly
pivoted Cholesky on the temperature-scaled Gaussian kernel and Nyström weights; then
weighted attention with the denominator guard and the clamp to the values' range.
O(B Hkv (M r^2 + M r (D + Dv)) + B H N r (D + Dv)), computed in float64.

The pivots are drawn from torch's generator, not the C++ kernel's counter-based stream, so
the coresets differ from the C++ ones except where a bin fits whole (rank >= bin size: the
bin itself, weight 1, i.e. exact attention). Same seed, device and inputs give the same
output.
"""

import math
from typing import Optional

import torch
from torch import Tensor

from .. import _core

WORK = torch.float64
EPSILON = torch.finfo(WORK).eps
# A residual below this counts as represented (the C++ kernel's sqrt(eps) rule, in float64).
RESIDUAL_TOLERANCE = math.sqrt(EPSILON)
METHODS = ("wildcat", "uniform_nystrom", "uniform_subsample")
QUERY_RADII = ("keys", "queries")


def _split(count: int, parts: int, part: int):
    """(first, size) of part `part` of `count` items split into `parts` near-equal parts."""
    base, extra = divmod(count, parts)
    return part * base + min(part, extra), base + (1 if part < extra else 0)


def _pivoted_cholesky(kt: Tensor, rank: int, uniform: bool, generator) -> tuple:
    """Pivots [G, rank] (-1 where a group stopped early) and G_SS^-1 [G, rank, rank] of the
    unit-diagonal Gaussian kernel exp(<kt_i, kt_j> - sq_i / 2 - sq_j / 2) of kt [G, n, D]."""
    G, n, _ = kt.shape
    sq = kt.square().sum(-1)  # [G, n]
    residual = torch.ones(G, n, dtype=WORK, device=kt.device)  # diagonal of G - G_{:S} ...
    rows = torch.zeros(G, rank, n, dtype=WORK, device=kt.device)  # G[S, :]
    inverse = torch.zeros(G, rank, rank, dtype=WORK, device=kt.device)
    pivots = torch.full((G, rank), -1, dtype=torch.long, device=kt.device)
    groups = torch.arange(G, device=kt.device)
    for t in range(rank):
        # Gumbel-max: P(i) proportional to d_i exp(sq_i) (wildcat) or uniform over d_i > 0.
        live = residual > 0
        logits = torch.zeros_like(residual) if uniform else residual.log() + sq
        uniforms = torch.rand(G, n, dtype=WORK, device=kt.device, generator=generator)
        gumbel = -torch.log(-torch.log(uniforms.clamp(min=EPSILON)))
        score = torch.where(live, logits + gumbel, torch.full_like(logits, -math.inf))
        best, s = score.max(dim=1)  # [G]
        active = torch.isfinite(best)
        if not active.any():
            break
        pivots[:, t] = torch.where(active, s, torch.full_like(s, -1))
        d_s = residual[groups, s].clamp(min=EPSILON)
        # g = [M a; -1] / sqrt(d_s), a = G[S, s]; M <- [[M, 0], [0, 0]] + g g^T grows G_SS^-1.
        a = rows[groups, :t, s]  # [G, t]
        g = torch.cat([torch.einsum("gij,gj->gi", inverse[:, :t, :t], a),
                       -torch.ones(G, 1, dtype=WORK, device=kt.device)], dim=1)
        g = g / d_s.sqrt().unsqueeze(1) * active.unsqueeze(1)  # inactive groups: no change
        inverse[:, :t + 1, :t + 1] += g.unsqueeze(2) * g.unsqueeze(1)
        key = kt[groups, s]  # [G, D]
        row = torch.exp(torch.einsum("gd,gnd->gn", key, kt) - 0.5 * sq[groups, s, None]
                        - 0.5 * sq).clamp(max=1.0)
        rows[:, t] = row * active.unsqueeze(1)
        y = torch.einsum("gt,gtn->gn", g, rows[:, :t + 1])  # the new Cholesky column
        residual = residual - y.square()
        residual[groups, s] = 0.0
        residual = torch.where(residual >= RESIDUAL_TOLERANCE, residual,
                               torch.zeros_like(residual))
    return pivots, inverse, sq


def _nystrom_coreset(kt: Tensor, sq: Tensor, pivots: Tensor, inverse: Tensor,
                     values: Tensor) -> tuple:
    """Coreset values [G, r, Dv], weights [G, r] and log scales [G, r] of W [V, 1] with
    W = diag(e^{-sq_S / 2}) G_SS^-1 G[S, :] diag(e^{sq / 2}), each row held as
    e^{log_scale} * (row / its largest entry) so that no scale leaves float64's range."""
    G, r = pivots.shape
    kept = pivots >= 0  # [G, r]
    index = pivots.clamp(min=0)
    groups = torch.arange(G, device=kt.device).unsqueeze(1)
    pivot_keys = kt[groups, index]  # [G, r, D]
    # G[s, l] e^{sq_l / 2} = e^{<kt_s, kt_l> - sq_s / 2}: rows shifted by their own max.
    dots = torch.einsum("grd,gnd->grn", pivot_keys, kt)
    row_max = dots.max(dim=2).values  # [G, r]
    kernel = torch.exp(dots - row_max.unsqueeze(2))  # <= 1
    ones = torch.ones(*values.shape[:2], 1, dtype=WORK, device=kt.device)
    projected = kernel @ torch.cat([values, ones], dim=2)  # [G, r, Dv + 1]
    row_log_scale = torch.where(kept, row_max - 0.5 * sq[groups, index],
                                torch.full_like(row_max, -math.inf))
    # Row i: sum_j M[i, j] e^{row_log_scale_j} projected_j, its terms shifted by the largest.
    term_log = inverse.abs().log() + row_log_scale.unsqueeze(1)  # [G, r(i), r(j)]
    largest = term_log.max(dim=2).values  # [G, r]
    finite = torch.isfinite(largest)
    safe = torch.where(finite, largest, torch.zeros_like(largest))
    terms = torch.sign(inverse) * torch.exp(term_log - safe.unsqueeze(2))
    sums = terms @ projected  # [G, r, Dv + 1]
    magnitude = sums.abs().max(dim=2).values  # [G, r]
    usable = kept & finite & (magnitude > 0)
    scaled = sums / torch.where(usable, magnitude, torch.ones_like(magnitude)).unsqueeze(2)
    scaled = scaled * usable.unsqueeze(2)
    log_scales = torch.where(
        usable, largest - 0.5 * sq[groups, index] + magnitude.clamp(min=EPSILON).log(),
        torch.full_like(largest, -math.inf))
    return index, scaled[..., :-1], scaled[..., -1], log_scales


def wildcat_attention(q: Tensor, k: Tensor, v: Tensor, *, rank: int = 128, bins: int = 1,
                      seed: int = 0, scale: Optional[float] = None,
                      method: str = "wildcat", query_radius: str = "keys") -> Tensor:
    """q [B, N, H, D], k [B, M, Hkv, D], v [B, M, Hkv, Dv] -> out [B, N, H, Dv] (no grad).
    query_radius: the R_Q of the temperature, "keys" (R_Q = R_K of the bin) or "queries"
    (max ||q|| over the kv group's queries), as the C++ option."""
    method = method.replace("-", "_")
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    if query_radius not in QUERY_RADII:
        raise ValueError(f"query_radius: expected one of {', '.join(QUERY_RADII)}, "
                         f"got {query_radius!r}")
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank: expected an int >= 1, got {rank!r}")
    if not isinstance(bins, int) or not 1 <= bins <= rank:
        raise ValueError(f"bins: expected 1 <= bins <= rank = {rank}, got {bins!r}")
    B, N, H, D = q.shape
    M, Hkv, Dv = k.shape[1], k.shape[2], v.shape[3]
    group = H // Hkv
    beta = 1.0 / math.sqrt(D) if scale is None else scale
    generator = torch.Generator(device=q.device)
    generator.manual_seed(seed)
    with torch.no_grad():
        queries = q.to(WORK).reshape(B, N, Hkv, group, D).permute(0, 2, 3, 1, 4)  # [B,Hkv,g,N,D]
        queries = queries.reshape(B * Hkv, group * N, D)
        keys = k.to(WORK).transpose(1, 2).reshape(B * Hkv, M, D)
        values = v.to(WORK).transpose(1, 2).reshape(B * Hkv, M, Dv)
        keys = keys - keys.mean(dim=1, keepdim=True)  # scores shift per query: softmax-neutral
        if query_radius == "queries":
            norms = queries.square().sum(-1)
            radius = torch.where(torch.isfinite(norms), norms,
                                 torch.zeros_like(norms)).max(dim=1).values.sqrt()  # [G]
        else:  # a radius of 0: wildcat_temperature takes R_Q = R_K of the bin
            radius = torch.zeros(B * Hkv, dtype=WORK, device=q.device)
        core_keys, core_values, core_weights, core_log_scales = [], [], [], []
        C = min(bins, M)
        for c in range(C):
            first, size = _split(M, C, c)
            bin_rank = _split(rank, C, c)[1]
            bin_keys, bin_values = keys[:, first:first + size], values[:, first:first + size]
            if bin_rank >= size:  # the bin fits whole: itself, weight 1
                log_scales = torch.zeros(B * Hkv, size, dtype=WORK, device=q.device)
                core_keys.append(bin_keys)
                core_values.append(bin_values)
                core_weights.append(torch.ones_like(log_scales))
                core_log_scales.append(log_scales)
                continue
            if method == "uniform_subsample":  # Horvitz-Thompson weights size / rank
                order = torch.rand(B * Hkv, size, device=q.device, generator=generator,
                                   dtype=WORK).argsort(dim=1)[:, :bin_rank]
                groups = torch.arange(B * Hkv, device=q.device).unsqueeze(1)
                core_keys.append(bin_keys[groups, order])
                core_values.append(bin_values[groups, order])
                core_weights.append(torch.ones(B * Hkv, bin_rank, dtype=WORK, device=q.device))
                core_log_scales.append(torch.full((B * Hkv, bin_rank), math.log(size / bin_rank),
                                                  dtype=WORK, device=q.device))
                continue
            key_radius = bin_keys.square().sum(-1).max(dim=1).values.sqrt()  # [G]
            multiplier = torch.tensor(
                [math.sqrt(beta) / _core.wildcat_temperature(beta, float(qr), float(kr), size)
                 for qr, kr in zip(radius.tolist(), key_radius.tolist())],
                dtype=WORK, device=q.device)
            kt = bin_keys * multiplier[:, None, None]
            pivots, inverse, sq = _pivoted_cholesky(kt, bin_rank, method == "uniform_nystrom",
                                                    generator)
            index, vt, w, log_scales = _nystrom_coreset(kt, sq, pivots, inverse, bin_values)
            groups = torch.arange(B * Hkv, device=q.device).unsqueeze(1)
            core_keys.append(bin_keys[groups, index])
            core_values.append(vt)
            core_weights.append(w)
            core_log_scales.append(log_scales)
        core_k = torch.cat(core_keys, dim=1)  # [G, r', D]
        core_v = torch.cat(core_values, dim=1)  # [G, r', Dv]
        core_w = torch.cat(core_weights, dim=1)  # [G, r']
        core_l = torch.cat(core_log_scales, dim=1)  # [G, r']
        scores = beta * queries @ core_k.transpose(1, 2) + core_l.unsqueeze(1)  # [G, gN, r']
        row_max = scores.max(dim=2, keepdim=True).values
        p = torch.exp(scores - torch.where(torch.isfinite(row_max), row_max,
                                           torch.zeros_like(row_max)))
        numerator = p @ core_v  # [G, gN, Dv]
        denominator = p @ core_w.unsqueeze(2)  # [G, gN, 1]
        absolute = p @ core_w.abs().unsqueeze(2)
        # Where the weights cancel to within round-off the ratio is noise: output 0 there,
        # as the C++ kernel; the exact output is a convex combination of the values, so the
        # clamp to their per-feature range can only reduce the error.
        floor = min(core_k.shape[1] * EPSILON, 0.5)
        reliable = denominator > floor * absolute
        out = torch.where(reliable, numerator / torch.where(reliable, denominator,
                                                            torch.ones_like(denominator)),
                          torch.zeros_like(numerator))
        low = values.min(dim=1, keepdim=True).values
        high = values.max(dim=1, keepdim=True).values
        out = torch.maximum(torch.minimum(out, high), low)
        out = out.reshape(B, Hkv, group, N, Dv).permute(0, 3, 1, 2, 4).reshape(B, N, H, Dv)
    return out.to(v.dtype)
