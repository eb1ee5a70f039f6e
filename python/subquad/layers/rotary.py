"""Rotary position embeddings (RoPE, Su et al. 2021) for q [B, T, H, D] and k [B, T, Hkv, D]
at absolute positions start .. start + T - 1, so that q_i . k_j depends on i - j only.
Elementwise, O(B T H D); the reference is `rotate_reference` (a complex product per pair).

Layout: "rotate half" (GPT-NeoX, Hugging Face llama): feature i pairs with i + D/2 and the
pair turns by the angle t * base^(-2i/D), i < D/2. The paper's interleaved pairs
(x[2i], x[2i+1], as GGUF llama files, see subquad.llm) are the same up to a fixed
permutation of the features, which a learned projection absorbs.
"""

import functools
import math
from typing import Tuple

import torch
from torch import Tensor

DEFAULT_BASE = 10000.0
_MIN_TABLE = 64  # positions per table at least; tables then double (decoding reuses one)


def check_base(base: float) -> float:
    """base as a float; ValueError naming `rope_base` unless it is finite and > 0."""
    if isinstance(base, bool) or not (isinstance(base, (int, float)) and math.isfinite(base)
                                      and base > 0):
        raise ValueError(f"rope_base: expected a positive finite number, got {base!r}")
    return float(base)


def check_head_dim(head_dim: int) -> None:
    """ValueError naming `rope` for an odd head dim (RoPE turns pairs of features)."""
    if head_dim % 2:
        raise ValueError(f"rope: rotary embeddings turn pairs of features, so the head dim "
                         f"(dim / heads) must be even, got {head_dim}")


@functools.lru_cache(maxsize=32)
def _table(positions: int, head_dim: int, base: float, dtype: torch.dtype,
           device: torch.device) -> Tuple[Tensor, Tensor]:
    """(cos, cos), (-sin, sin) [positions, D] of the angles t * base^(-2i/D), computed in
    float64. Normal tensors even when first asked for under inference_mode (a training
    step may read the same cached table later)."""
    with torch.inference_mode(False):
        half = torch.arange(head_dim // 2, dtype=torch.float64)
        frequencies = base ** (-half * 2 / head_dim)  # [D/2]
        angles = torch.arange(positions, dtype=torch.float64)[:, None] * frequencies  # [T, D/2]
        cos, sin = torch.cos(angles), torch.sin(angles)
        return (torch.cat([cos, cos], dim=1).to(device, dtype),
                torch.cat([-sin, sin], dim=1).to(device, dtype))


def rotary_table(start: int, tokens: int, head_dim: int, base: float, dtype: torch.dtype,
                 device) -> Tuple[Tensor, Tensor]:
    """cos, signed sin [tokens, D] for positions start .. start + tokens - 1, as _table
    (views of a cached table of a power-of-two length, shared by every layer of the same
    head dim and base)."""
    end = start + tokens
    positions = max(_MIN_TABLE, 1 << (end - 1).bit_length())
    cos, sin = _table(positions, head_dim, base, dtype, torch.device(device))
    return cos[start:end], sin[start:end]


def _swap_halves(x: Tensor) -> Tensor:
    """(x1, x2) -> (x2, x1) along the last dim: a permutation that is its own transpose."""
    half = x.shape[-1] // 2
    return torch.cat([x[..., half:], x[..., :half]], dim=-1)


class _Rotation(torch.autograd.Function):
    """y = x * cos + swap(x) * sin, tables [T, H, D]: (x1, x2) -> (x1 cos - x2 sin,
    x2 cos + x1 sin). Written out, as autograd's own backward of these ops (slices
    scattered into zeros, then summed) took about twice the time."""

    @staticmethod
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        ctx.save_for_backward(cos, sin)
        return torch.addcmul(x * cos, _swap_halves(x), sin)

    @staticmethod
    def backward(ctx, dy: Tensor):
        cos, sin = ctx.saved_tensors
        # in the forward pass this was: y = x * cos + swap(x) * sin, so
        # dx = cos * dy + swap^T(sin * dy), and swap^T = swap
        return dy * cos + _swap_halves(dy * sin), None, None


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, T, H, D] with cos, signed sin [T, D] (rotary_table) -> x rotated [B, T, H, D].
    The tables are copied out to [T, H, D] first: a product with one broadcast over B only
    runs ~3x faster than one that also broadcasts over H (one thread, [16, 256, 4, 16])."""
    heads = x.shape[2]
    cos = cos[:, None].expand(-1, heads, -1).contiguous()  # [T, H, D]
    sin = sin[:, None].expand(-1, heads, -1).contiguous()
    return _Rotation.apply(x, cos, sin)


def rotate(q: Tensor, k: Tensor, start: int = 0, base: float = DEFAULT_BASE
           ) -> Tuple[Tensor, Tensor]:
    """q [B, T, H, D], k [B, T, Hkv, D] -> both rotated at positions start .. start + T - 1."""
    if q.shape[1] != k.shape[1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"k: expected [B, T, Hkv, D] with T, D as q {list(q.shape)}, got "
                         f"{list(k.shape)}")
    base = check_base(base)
    check_head_dim(q.shape[-1])
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ValueError(f"start: expected an int >= 0, got {start!r}")
    cos, sin = rotary_table(start, q.shape[1], q.shape[-1], base, q.dtype, q.device)
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


def rotate_reference(x: Tensor, start: int = 0, base: float = DEFAULT_BASE) -> Tensor:
    """The naive rotation of x [B, T, H, D], in complex float64: pair i of position t is
    (x[i] + i x[i + D/2]) e^{i t theta_i}."""
    half = x.shape[-1] // 2
    pairs = torch.complex(x[..., :half].double(), x[..., half:].double())
    theta = base ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    t = torch.arange(start, start + x.shape[1], dtype=torch.float64)
    angles = t[:, None] * theta  # [T, D/2]
    turned = pairs * torch.polar(torch.ones_like(angles), angles)[:, None]
    return torch.cat([turned.real, turned.imag], dim=-1).to(x.dtype)
