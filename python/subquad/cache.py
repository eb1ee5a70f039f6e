"""Decoding caches: one interface for every layer (and the LLM) that decodes token by token.

`Cache` is what a decode loop relies on for any layer's state: how many tokens it has seen,
the bytes it holds, rolling back, copying. `KVCache` holds the keys and values of exact,
sliding-window and GQA attention and is compressed in place by KV-cache presses
(`compress`: keep chosen entries per KV head, optionally with per-entry log-weights).

Layout: tokens `[B, T, H, D]` in and out, as every subquad operator; storage
`[B, Hkv, S, D]` so that a press can gather per head. Attention through the cache is
causal by token position (the queries are the last tokens appended): on CPU, in float32
or float64 and uncompressed, it runs subquad's exact kernel on views of the storage (no
copies); otherwise (other devices, other dtypes, compressed caches) the same math in torch.
"""

import math
from typing import Optional

from ._optional import require

require("subquad.cache", "torch", ["torch"])

import torch
from torch import Tensor

__all__ = ["Cache", "KVCache"]

_KERNEL_DTYPES = (torch.float32, torch.float64)
MIN_CAPACITY = 16  # entries per head allocated at first use
# Capacity grows by this factor when an append does not fit: appends stay amortised O(1)
# (each entry is copied at most 1 / (GROWTH - 1) = 4 times on average) while the storage
# never exceeds 1.25x the entries held plus the append, also right after a compression,
# which leaves capacity = entries (doubling would then double a just-compressed cache).
GROWTH = 1.25
# exp(-1e4) is 0 in float32 and float64: an entry whose log-weight is -inf (a coreset point
# whose weight is not positive) stays out of every softmax without -inf arithmetic.
LOG_WEIGHT_FLOOR = -1e4


class Cache:
    """The state of one layer across decoding steps."""

    seen: int = 0  # tokens appended so far: the position of the next token

    @property
    def nbytes(self) -> int:
        """Bytes of tensor memory held (what is really stored, not what is attended)."""
        raise NotImplementedError

    def truncate(self, length: int) -> None:
        """Roll back to the state after the first `length` tokens."""
        raise NotImplementedError

    def clone(self) -> "Cache":
        """An independent copy (decoding one copy leaves the other unchanged)."""
        raise NotImplementedError


def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
    return value


class KVCache(Cache):
    """Keys and values of exact attention, by KV head; see the module docstring.

    KVCache(batch, kv_heads, head_dim, value_dim=None, *, window=None, dtype=float32,
    device="cpu"). `window` W: a query sees the W most recent positions (itself included),
    and only the last W entries are kept in memory, so `nbytes` stays bounded.
    """

    def __init__(self, batch: int, kv_heads: int, head_dim: int,
                 value_dim: Optional[int] = None, *, window: Optional[int] = None,
                 dtype: torch.dtype = torch.float32, device="cpu"):
        self.batch = _check_int("batch", batch, 1)
        self.kv_heads = _check_int("kv_heads", kv_heads, 1)
        self.head_dim = _check_int("head_dim", head_dim, 1)
        self.value_dim = head_dim if value_dim is None else _check_int("value_dim", value_dim, 1)
        self.window = None if window is None else _check_int("window", window, 1)
        self.dtype, self.device = dtype, torch.device(device)
        self.seen = 0
        self.length = 0  # S: entries held per head
        self.evicted = 0  # the window has dropped every position before this one
        # [B, Hkv, capacity, D | Dv]; once weighted the keys have one more column, the
        # log-weights, so that q' = [q, 1 / scale] against k' = [k, lw] adds them to the
        # scores inside an exact-attention call (PressedKVCache) without copying anything.
        self._keys = self._values = None
        self._positions: Optional[Tensor] = None  # [B, Hkv, capacity] once compressed

    # ---- views of what is held ----
    @property
    def keys(self) -> Tensor:
        """[B, Hkv, S, D] (a view of the storage)."""
        return self._storage(self._keys, self.head_dim)[..., :self.head_dim]

    @property
    def values(self) -> Tensor:
        """[B, Hkv, S, Dv] (a view of the storage)."""
        return self._storage(self._values, self.value_dim)

    @property
    def positions(self) -> Tensor:
        """[B, Hkv, S] int64: the original token position of every entry held."""
        if self._positions is not None:
            return self._positions[:, :, :self.length]
        first = self.seen - self.length
        return torch.arange(first, self.seen, device=self.device).expand(
            self.batch, self.kv_heads, self.length)

    @property
    def weighted(self) -> bool:
        return self._keys is not None and self._keys.shape[-1] == self.head_dim + 1

    @property
    def log_weights(self) -> Optional[Tensor]:
        """[B, Hkv, S]: what each entry adds to its scores (a coreset's log-weights, at
        least LOG_WEIGHT_FLOOR; 0 for entries appended since), or None while every weight
        is 1 (a view of the storage)."""
        return self.keys_and_log_weights[..., self.head_dim] if self.weighted else None

    @property
    def keys_and_log_weights(self) -> Tensor:
        """[B, Hkv, S, D + 1] once weighted: the keys with their log-weights as a last
        column (a view of the storage)."""
        if not self.weighted:
            raise ValueError("keys_and_log_weights: the cache holds no log-weights")
        return self._keys[:, :, :self.length]

    @property
    def compressed(self) -> bool:
        return self._positions is not None

    @property
    def capacity(self) -> int:
        """Entries per head the storage holds before it grows."""
        return 0 if self._keys is None else self._keys.shape[2]

    @property
    def nbytes(self) -> int:
        held = [t for t in (self._keys, self._values, self._positions) if t is not None]
        return sum(t.numel() * t.element_size() for t in held)

    def _storage(self, buffer: Optional[Tensor], dim: int) -> Tensor:
        if buffer is None:
            return torch.empty(self.batch, self.kv_heads, 0, dim, dtype=self.dtype,
                               device=self.device)
        return buffer[:, :, :self.length]

    # ---- the decode verbs ----
    def append(self, k: Tensor, v: Tensor) -> None:
        """Add the keys k [B, T, Hkv, D] and values v [B, T, Hkv, Dv] of T new tokens."""
        self._check_tokens("k", k, self.kv_heads, self.head_dim)
        self._check_tokens("v", v, self.kv_heads, self.value_dim)
        if k.shape[1] != v.shape[1]:
            raise ValueError(f"v: expected {k.shape[1]} tokens like k, got {v.shape[1]}")
        tokens = k.shape[1]
        if self.window is not None:
            self._drop_oldest(max(0, self.length - self.window))
        self._reserve(self.length + tokens)
        end = self.length + tokens
        self._keys[:, :, self.length:end, :self.head_dim] = k.detach().transpose(1, 2)
        self._values[:, :, self.length:end] = v.detach().transpose(1, 2)
        if self._positions is not None:
            self._positions[:, :, self.length:end] = torch.arange(
                self.seen, self.seen + tokens, device=self.device)
        if self.weighted:
            self._keys[:, :, self.length:end, self.head_dim] = 0.0  # new entries: weight 1
        self.length, self.seen = end, self.seen + tokens

    def attend(self, q: Tensor, *, scale: Optional[float] = None) -> Tensor:
        """Attention of the last T appended tokens' queries q [B, T, H, D] -> [B, T, H, Dv].

        Causal by position (a query sees the entries at or before its own position), the
        window applied by position, H a multiple of Hkv (GQA).
        """
        self._check_tokens("q", q, None, self.head_dim)
        heads, tokens = q.shape[2], q.shape[1]
        if heads % self.kv_heads:
            raise ValueError(f"q: expected a head count that is a multiple of kv_heads = "
                             f"{self.kv_heads}, got {heads}")
        if tokens > self.seen:
            raise ValueError(f"q: {tokens} queries but only {self.seen} tokens appended")
        if tokens == 0:
            return q.new_zeros(self.batch, 0, heads, self.value_dim)
        if self.window is not None and self.evicted > max(
                0, self.seen - tokens - self.window + 1):
            # The first query's window reaches keys the window already dropped: its answer
            # would come from the keys left, not from its window.
            most = self.seen - self.evicted - self.window + 1
            raise ValueError(f"q: {tokens} queries, but the window of {self.window} keeps "
                             f"positions from {self.evicted} on, which covers the last "
                             f"{most} queries only (attend right after each append)")
        scale = 1.0 / math.sqrt(self.head_dim) if scale is None else scale
        if (q.device.type == "cpu" and q.dtype in _KERNEL_DTYPES and not self.compressed
                and self.log_weights is None and self.length >= tokens):
            from .ops import exact_attention  # the C++ kernel on CPU (imports _core)
            keys, values = self.keys.transpose(1, 2), self.values.transpose(1, 2)
            out, _ = exact_attention(q, keys, values, scale=scale, causal=True,
                                     window=self.window or 0)
            return out
        return self._attend_torch(q, scale)

    def update(self, q: Tensor, k: Tensor, v: Tensor, *,
               scale: Optional[float] = None) -> Tensor:
        """append(k, v) then attend(q): one layer's prefill or decode step (q, k, v in the
        order of every subquad operator and cache)."""
        self.append(k, v)
        return self.attend(q, scale=scale)

    def compress(self, keep: Tensor, log_weights: Optional[Tensor] = None,
                 values: Optional[Tensor] = None) -> None:
        """Keep the entries keep [B, Hkv, S'] (indices into the S held) of every KV head.

        log_weights [B, Hkv, S'] are added to the scores of the kept entries (CompressKV's
        coreset weights, as logs; stored at least LOG_WEIGHT_FLOOR, so that -inf, an
        entry never attended, takes part in no -inf arithmetic); values [B, Hkv, S', Dv], when given, replace the kept
        entries' values (a coreset's values with the dropped ones folded in); the memory of
        the dropped entries is released.
        """
        if keep.dtype != torch.int64 or keep.dim() != 3 or tuple(keep.shape[:2]) != (
                self.batch, self.kv_heads):
            raise ValueError(f"keep: expected int64 [{self.batch}, {self.kv_heads}, S'], got "
                             f"{keep.dtype} {list(keep.shape)}")
        if keep.numel() and (int(keep.min()) < 0 or int(keep.max()) >= self.length):
            raise ValueError(f"keep: indices must lie in [0, {self.length}), got "
                             f"[{int(keep.min())}, {int(keep.max())}]")
        if log_weights is not None:
            if tuple(log_weights.shape) != tuple(keep.shape):
                raise ValueError(f"log_weights: expected shape {list(keep.shape)}, got "
                                 f"{list(log_weights.shape)}")
            if torch.isnan(log_weights).any():
                raise ValueError("log_weights: expected no NaN")
        if values is not None and tuple(values.shape) != tuple(keep.shape) + (self.value_dim,):
            raise ValueError(f"values: expected shape {list(keep.shape) + [self.value_dim]}, "
                             f"got {list(values.shape)}")
        keep = keep.to(self.device)
        positions = torch.gather(self.positions, 2, keep)
        keys = torch.gather(self.keys, 2, keep[..., None].expand(-1, -1, -1, self.head_dim))
        if values is None:
            values = torch.gather(self.values, 2,
                                  keep[..., None].expand(-1, -1, -1, self.value_dim))
        else:
            values = values.to(self.device, self.dtype)
        if log_weights is None and self.log_weights is not None:
            log_weights = torch.gather(self.log_weights, 2, keep)
        if log_weights is not None:
            floored = log_weights.to(self.device, self.dtype).clamp(min=LOG_WEIGHT_FLOOR)
            keys = torch.cat([keys, floored[..., None]], dim=-1)
        self._keys, self._values = keys.contiguous(), values.contiguous()
        self._positions = positions.contiguous()
        self.length = keep.shape[2]

    def truncate(self, length: int) -> None:
        _check_int("length", length, 0)
        if self.compressed:
            raise ValueError("truncate: a compressed cache cannot be rolled back")
        if length > self.seen:
            raise ValueError(f"length: expected at most the {self.seen} tokens seen, got {length}")
        first = self.seen - self.length
        if length < first:
            raise ValueError(f"length: the window no longer holds tokens before {first}, "
                             f"got {length}")
        self.length, self.seen = length - first, length

    def clone(self) -> "KVCache":
        copy = KVCache.__new__(KVCache)
        copy.__dict__.update(self.__dict__)
        for name in ("_keys", "_values", "_positions"):
            tensor = getattr(self, name)
            setattr(copy, name, None if tensor is None else tensor.clone())
        return copy

    # ---- internals ----
    def _check_tokens(self, name: str, x: Tensor, heads: Optional[int], dim: int) -> None:
        if not isinstance(x, Tensor) or x.dim() != 4:
            shape = list(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{name}: expected a tensor [B, T, H, D], got {shape}")
        if x.shape[0] != self.batch or x.shape[3] != dim or (
                heads is not None and x.shape[2] != heads):
            want = f"[{self.batch}, T, {heads if heads is not None else 'H'}, {dim}]"
            raise ValueError(f"{name}: expected shape {want}, got {list(x.shape)}")
        if x.dtype != self.dtype or x.device != self.device:
            raise ValueError(f"{name}: expected {self.dtype} on {self.device}, got {x.dtype} "
                             f"on {x.device}")

    def _reserve(self, entries: int) -> None:
        if entries <= self.capacity:
            return
        capacity = max(MIN_CAPACITY, entries, int(self.capacity * GROWTH))
        key_columns = self.head_dim + (1 if self.weighted else 0)
        self._keys = self._grown(self._keys, capacity, key_columns)
        self._values = self._grown(self._values, capacity, self.value_dim)
        self._positions = self._grown(self._positions, capacity)

    def _grown(self, buffer: Optional[Tensor], capacity: int,
               dim: Optional[int] = None) -> Optional[Tensor]:
        """`buffer` [B, Hkv, capacity(, dim)] with its first `length` entries kept (the rest
        is never read: not initialised); keys and values start from None, the positions
        stay None until a compression makes them."""
        if buffer is None and dim is None:
            return None
        shape = (self.batch, self.kv_heads, capacity) + (() if dim is None else (dim,))
        dtype = self.dtype if buffer is None else buffer.dtype
        grown = torch.empty(shape, dtype=dtype, device=self.device)
        if buffer is not None:
            grown[:, :, :self.length] = buffer[:, :, :self.length]
        return grown

    def _drop_oldest(self, count: int) -> None:
        if count == 0:
            return
        dropped = int(self.positions[:, :, :count].max()) + 1
        self.evicted = max(self.evicted, dropped)
        kept = self.length - count
        for buffer in (self._keys, self._values, self._positions):
            if buffer is not None:
                buffer[:, :, :kept] = buffer[:, :, count:self.length].clone()
        self.length = kept

    def _attend_torch(self, q: Tensor, scale: float) -> Tensor:
        """The same attention in torch: masked scores by position, log-weights added."""
        batch, tokens, heads, _ = q.shape
        group = heads // self.kv_heads
        # q [B, T, H, D] -> [B, Hkv, G, T, D]; keys [B, Hkv, S, D]
        queries = q.reshape(batch, tokens, self.kv_heads, group, self.head_dim).permute(
            0, 2, 3, 1, 4)
        keys, values = self.keys.to(q.dtype), self.values.to(q.dtype)
        scores = torch.einsum("bhgtd,bhsd->bhgts", queries, keys) * scale  # [B, Hkv, G, T, S]
        if self.log_weights is not None:
            scores = scores + self.log_weights.to(scores.dtype)[:, :, None, None, :]
        query_positions = torch.arange(self.seen - tokens, self.seen, device=q.device)
        key_positions = self.positions[:, :, None, None, :]  # [B, Hkv, 1, 1, S]
        visible = key_positions <= query_positions[:, None]
        if self.window is not None:
            visible = visible & (key_positions > query_positions[:, None] - self.window)
        scores = scores.masked_fill(~visible, -math.inf)
        # A row that sees nothing (every entry before it pressed away) gives zeros; NaN
        # inputs still propagate.
        weights = torch.softmax(scores, dim=-1).masked_fill(~visible.any(-1, keepdim=True), 0.0)
        finite = torch.isfinite(values)
        if finite.all():
            out = torch.einsum("bhgts,bhsd->bhgtd", weights, values)  # [B, Hkv, G, T, Dv]
        else:
            # A non-finite value reaches exactly the outputs whose weight on it is > 0
            # (0 * NaN would also poison the queries that cannot see it).
            out = torch.einsum("bhgts,bhsd->bhgtd", weights, values.masked_fill(~finite, 0))
            seen_bad = torch.einsum("bhgts,bhsd->bhgtd", (weights > 0).to(values.dtype),
                                    (~finite).to(values.dtype))
            out = out.masked_fill(seen_bad > 0, math.nan)
        return out.permute(0, 3, 1, 2, 4).reshape(batch, tokens, heads, self.value_dim)
