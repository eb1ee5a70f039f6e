"""Decoding caches of the causal CAT and MLR layers, both subquad.cache.Cache.

Their state is tensors the cache owns, on the layer's device; each step is one stateless
operator over them (subquad.ops.cat_causal_decode, subquad.ops.mlr_decode), so the
dispatcher picks the C++ kernel on the CPU and subquad.reference elsewhere, as for every
other operator:
- causal CAT keeps every token's scores z and values v;
- MLR keeps every value, but only the keys of the current block of each level (level l's
  r_l key columns in [B, Hkv, context / 2^(l-1), r_l]), so its keys take
  context sum_l r_l / 2^(l-1) floats per kv head instead of context D; it rolls back within
  the current finest block only (ValueError beyond: the keys before it are gone).
"""

from typing import List, Optional, Sequence

import torch
from torch import Tensor

from .. import ops, reference
from ..cache import GROWTH, MIN_CAPACITY, Cache


def _check(name: str, x: Tensor, shape: Sequence, dtype, device) -> None:
    """x must be [*shape] (None: any) of dtype on device."""
    ok = isinstance(x, Tensor) and x.dim() == len(shape) and all(
        want is None or got == want for got, want in zip(x.shape, shape))
    if not ok:
        got = list(x.shape) if isinstance(x, Tensor) else type(x).__name__
        want = ", ".join("T" if s is None else str(s) for s in shape)
        raise ValueError(f"{name}: expected [{want}], got {got}")
    if x.dtype != dtype or x.device != torch.device(device):
        raise ValueError(f"{name}: expected {dtype} on {device}, got {x.dtype} on {x.device}")


class _Tokens:
    """A growing [B, S, ...] tensor of per-token state along dim 1: appends are amortised
    O(1) and the storage stays within GROWTH of the tokens held (as KVCache's)."""

    def __init__(self):
        self._buffer: Optional[Tensor] = None
        self.length = 0

    def append(self, x: Tensor) -> Tensor:
        """Appends x [B, T, ...]; returns the view of every token held."""
        end = self.length + x.shape[1]
        if self._buffer is None or end > self._buffer.shape[1]:
            capacity = max(MIN_CAPACITY, end, int(0 if self._buffer is None
                                                  else self._buffer.shape[1] * GROWTH))
            grown = x.new_empty(x.shape[0], capacity, *x.shape[2:])
            if self._buffer is not None:
                grown[:, :self.length] = self._buffer[:, :self.length]
            self._buffer = grown
        self._buffer[:, self.length:end] = x
        self.length = end
        return self._buffer[:, :end]

    @property
    def nbytes(self) -> int:
        b = self._buffer
        return 0 if b is None else b.numel() * b.element_size()

    def clone(self) -> "_Tokens":
        copy = _Tokens()
        copy.length = self.length
        copy._buffer = None if self._buffer is None else self._buffer.clone()
        return copy


class _DecodingState(Cache):
    """What the CAT and MLR caches share: the growing token tensors and their verbs."""

    _tokens: List[_Tokens]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self._tokens)

    def _check_length(self, length: int) -> None:
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.seen:
            raise ValueError(f"length: expected an int in [0, {self.seen}], got {length!r}")

    def truncate(self, length: int) -> None:
        self._check_length(length)
        for t in self._tokens:
            t.length = length
        self.seen = length

    def clone(self) -> "_DecodingState":
        copy = type(self).__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy._tokens = [t.clone() for t in self._tokens]
        return copy


class CatCausalCache(_DecodingState):
    """Causal CAT state: CatCausalCache(batch, heads, value_dim, *, dtype, device).

    update(z [B, T, H], v [B, T, H, Dv]) -> out [B, T, H, Dv]: appends T tokens and returns
    their rows of cat_causal over everything seen.
    """

    def __init__(self, batch: int, heads: int, value_dim: int, *,
                 dtype: torch.dtype = torch.float32, device="cpu"):
        self.batch, self.heads, self.value_dim = batch, heads, value_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.seen = 0
        self._tokens = [_Tokens(), _Tokens()]  # z [B, S, H], v [B, S, H, Dv]

    def update(self, z: Tensor, v: Tensor) -> Tensor:
        _check("z", z, (self.batch, None, self.heads), self.dtype, self.device)
        _check("v", v, (self.batch, z.shape[1], self.heads, self.value_dim), self.dtype,
               self.device)
        scores, values = (t.append(x.detach()) for t, x in zip(self._tokens, (z, v)))
        self.seen += z.shape[1]
        return ops.cat_causal_decode(scores, values, tokens=z.shape[1])


class MlrCache(_DecodingState):
    """Causal MLR state with blocks on positions 0..context-1:
    MlrCache(batch, heads, kv_heads, head_dim, value_dim, context, *, ranks,
    block_divide=False, dtype, device).

    update(q [B, T, H, D], k [B, T, Hkv, D], v [B, T, Hkv, Dv]) -> out [B, T, H, Dv]: the
    rows of the causal MLR forward over `context` tokens at the T new positions.
    """

    def __init__(self, batch: int, heads: int, kv_heads: int, head_dim: int, value_dim: int,
                 context: int, *, ranks: Sequence[int], block_divide: bool = False,
                 dtype: torch.dtype = torch.float32, device="cpu"):
        if isinstance(context, bool) or not isinstance(context, int) or context < 1:
            raise ValueError(f"context: expected the most tokens to decode (an int >= 1), got "
                             f"{context!r}")
        if sum(ranks) != head_dim:
            raise ValueError(f"ranks: expected ranks summing to head_dim = {head_dim}, got "
                             f"{list(ranks)}")
        # Raises unless 2^(L-1) divides context.
        self.block_sizes = reference.mlr_block_sizes(ranks, context)
        self.batch, self.heads, self.kv_heads = batch, heads, kv_heads
        self.head_dim, self.value_dim, self.context = head_dim, value_dim, context
        self.ranks, self.block_divide = list(ranks), block_divide
        self.dtype, self.device = dtype, torch.device(device)
        self.seen = 0
        self._tokens = [_Tokens()]  # v [B, S, Hkv, Dv]
        self._level_keys: Optional[List[Tensor]] = None  # [B, Hkv, s_l, r_l], at first use

    @property
    def nbytes(self) -> int:
        keys = sum(t.numel() * t.element_size() for t in self._level_keys or ())
        return keys + super().nbytes

    def update(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        _check("q", q, (self.batch, None, self.heads, self.head_dim), self.dtype, self.device)
        tokens = q.shape[1]
        _check("k", k, (self.batch, tokens, self.kv_heads, self.head_dim), self.dtype,
               self.device)
        _check("v", v, (self.batch, tokens, self.kv_heads, self.value_dim), self.dtype,
               self.device)
        if self.seen + tokens > self.context:
            raise ValueError(f"q: {tokens} more tokens exceed the context of {self.context} "
                             f"({self.seen} seen); build the cache with a larger context")
        if self._level_keys is None:
            self._level_keys = [k.new_empty(self.batch, self.kv_heads, size, rank)
                                for size, rank in zip(self.block_sizes, self.ranks)]
        q, k, v = q.detach(), k.detach(), v.detach()
        # Parts within one finest block: a later block's keys overwrite the slots an
        # earlier part still reads.
        finest, outs, first = self.block_sizes[-1], [], 0
        while first < tokens:
            position = self.seen + first
            last = min(tokens, first + finest - position % finest)
            self._store_keys(k[:, first:last], position)
            values = self._tokens[0].append(v[:, first:last])
            outs.append(ops.mlr_decode(q[:, first:last], self._level_keys, values,
                                       ranks=self.ranks, block_divide=self.block_divide,
                                       context=self.context))
            first = last
        self.seen += tokens
        if not outs:
            return q.new_empty(self.batch, 0, self.heads, self.value_dim)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)

    def _store_keys(self, k: Tensor, position: int) -> None:
        """Level l's columns of the keys k [B, n, Hkv, D] of positions position.. into slots
        p mod s_l (n within one finest block, so within one block of every level)."""
        offset = 0
        for cache, size, rank in zip(self._level_keys, self.block_sizes, self.ranks):
            slot = position % size
            cache[:, :, slot:slot + k.shape[1]] = k[..., offset:offset + rank].transpose(1, 2)
            offset += rank

    def truncate(self, length: int) -> None:
        self._check_length(length)
        finest = self.block_sizes[-1]
        if not (length in (0, self.seen) or (length - 1) // finest == (self.seen - 1) // finest):
            start = (self.seen - 1) // finest * finest
            raise ValueError(f"length: {length} rolls back past the start of the current "
                             f"level block (tokens {start} .. {self.seen - 1}), whose earlier "
                             f"keys the level caches no longer hold")
        super().truncate(length)

    def clone(self) -> "MlrCache":
        copy = super().clone()
        if self._level_keys is not None:
            copy._level_keys = [t.clone() for t in self._level_keys]
        return copy
