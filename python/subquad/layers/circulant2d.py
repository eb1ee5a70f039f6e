"""2D Circulant Attention layers (Han et al. 2026; registry: "circulant2d"): BCCB attention
on an Hg x Wg token grid, O(N log N) per head by 2D FFTs, and the CA-DeiT block
(depthwise-conv position encoding, gated Circulant Attention, MLP). The block takes its
token mixing as an argument: "exact" keeps everything else of the block (convolution,
gate, MLP) around softmax attention over the grid, the control that isolates what the
circulant adds.
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _core
from .. import ops
from .base import AttentionLayer, check_heads, linear, split_heads
from .registry import Capabilities, check_threads

# The grid of T tokens is a constant of the traced graph: torch.compile cannot look into
# the C++ function, so it calls it while tracing and keeps the answer.
@torch.compiler.assume_constant_result
def _grid_for_tokens(tokens: int) -> Tuple[int, int]:
    return tuple(_core.circulant2d_grid_for_tokens(tokens))


CIRCULANT2D = Capabilities(
    causal=False, bidirectional=True, padding_mask=False, decoding_cache=False, backward=True,
    dtypes=("float32", "float64"), gqa=False,
    reasons={"causal": "the BCCB matrix mixes every grid position with every other (a "
                       "torus has no order)",
             "padding_mask": "the attention is defined on a fixed Hg x Wg token grid; "
                             "dropping tokens would change the grid and its circulant",
             "decoding_cache": "bidirectional: no token-by-token order",
             "gqa": "the circulant logits a[m] = sum_n <q[n], k[n + m]> pair each query "
                    "head with its own key head"})
MIXINGS = ("circulant2d", "exact")  # BCCB attention; softmax attention over all N tokens


class Circulant2dAttention(AttentionLayer):
    """2D Circulant Attention with the token-reweighting gate (the released code):
    x [B, T, dim] (tokens of an Hg x Wg grid, row-major, T = Hg Wg) -> [B, T, dim].

    q, k, v = x W_qkv (bias-free), CA per head on the grid, times the gate
    SiLU(x W_T + b_T) (a BCCB matrix has equal row sums; the gate restores per-token
    emphasis), then W_proj + b_proj. Options: grid (Hg, Wg) (None:
    subquad.circulant2d_grid_for_tokens(T)), scale_mode ("code": c = 1/sqrt(N), the
    released model; "paper": 1 / (N sqrt(D))), scale (an explicit c), gate, mup,
    threads, mixing ("circulant2d"; "exact": softmax attention over the N tokens at scale
    1/sqrt(D) in CA's place, everything else kept; scale_mode and scale are then unused).
    heads = dim gives the released model's one channel per head.
    """

    name = "circulant2d"
    capabilities = CIRCULANT2D

    def __init__(self, dim: int, heads: int, *, grid: Optional[Tuple[int, int]] = None,
                 causal: bool = False, scale_mode: str = "code", scale: Optional[float] = None,
                 gate: bool = True, mup: bool = False, threads: int = 0,
                 mixing: str = "circulant2d"):
        super().__init__(dim)
        check_heads(dim, heads)
        if mixing not in MIXINGS:
            raise ValueError(f"mixing: expected one of {MIXINGS}, got {mixing!r}")
        if causal:
            CIRCULANT2D.require(self.name, "causal")
        if grid is not None and not (len(grid) == 2 and all(
                isinstance(g, int) and g >= 1 for g in grid)):
            raise ValueError(f"grid: expected (Hg, Wg) of ints >= 1, got {grid!r}")
        if scale_mode not in ("code", "paper"):
            raise ValueError(f"scale_mode: expected 'code' or 'paper', got {scale_mode!r}")
        self.heads, self.grid, self.causal = heads, grid, False
        self.scale_mode, self.scale, self.threads = scale_mode, scale, threads
        self.mixing = mixing
        self.qkv = linear(dim, 3 * dim, bias=False, mup=mup)
        self.gate = linear(dim, dim, bias=True, mup=mup) if gate else None
        self.proj = linear(dim, dim, bias=True, mup=mup, output=True)

    def attend(self, x: Tensor) -> Tensor:
        tokens = x.shape[1]
        grid = self.grid or _grid_for_tokens(tokens)
        if grid[0] * grid[1] != tokens:
            raise ValueError(f"x: expected T = Hg * Wg = {grid[0] * grid[1]} tokens of the grid "
                             f"{tuple(grid)}, got {tokens}")
        return self.attend_grid(x.unflatten(1, tuple(grid))).flatten(1, 2)

    def attend_grid(self, u: Tensor) -> Tensor:
        """u [B, Hg, Wg, dim] -> [B, Hg, Wg, dim]."""
        q, k, v = (split_heads(t, self.heads) for t in self.qkv(u).chunk(3, dim=-1))
        if self.mixing == "exact":  # [B, Hg, Wg, H, D] as N = Hg Wg tokens
            out, _ = ops.exact_attention(q.flatten(1, 2), k.flatten(1, 2), v.flatten(1, 2),
                                         scale=None, causal=False, window=0,
                                         threads=self.threads)
            out = out.unflatten(1, u.shape[1:3]).flatten(-2)
        else:
            out = ops.circulant2d(q, k, v, scale_mode=self.scale_mode, scale=self.scale,
                                  threads=self.threads).flatten(-2)
        if self.gate is not None:
            out = out * F.silu(self.gate(u))
        return self.proj(out)


class Circulant2dBlock(nn.Module):
    """The CA-DeiT transformer block: x [B, Hg, Wg, dim] -> [B, Hg, Wg, dim].

    x = x + dwconv3x3(x) (conditional position encoding, one 3x3 filter per channel);
    x = x + Circulant2dAttention(LN(x)); x = x + MLP(LN(x)) (GELU, hidden mlp_ratio * dim).
    Circulant2dBlock(dim, heads=None (dim: one channel per head), *, attention=
    "circulant2d" (or "exact": the same block, gate included, with softmax attention as its
    mixing), mlp_ratio=4.0, scale_mode="code", threads=0).
    """

    def __init__(self, dim: int, heads: Optional[int] = None, *,
                 attention: str = "circulant2d", mlp_ratio: float = 4.0,
                 scale_mode: str = "code", threads: int = 0):
        super().__init__()
        check_threads(threads)
        if attention not in MIXINGS:
            raise ValueError(f"attention: expected one of {MIXINGS}, got {attention!r}")
        self.position = nn.Conv2d(dim, dim, kernel_size=3, padding=1, groups=dim)
        self.norm1 = nn.LayerNorm(dim)
        self.attention = Circulant2dAttention(dim, dim if heads is None else heads,
                                              scale_mode=scale_mode, threads=threads,
                                              mixing=attention)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.position(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        x = x + self.attention.attend_grid(self.norm1(x))
        return x + self.mlp(self.norm2(x))
