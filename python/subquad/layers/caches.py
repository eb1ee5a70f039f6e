"""Decoding caches of the causal CAT and MLR layers, both subquad.cache.Cache.

On CPU in float32/float64 they wrap the C++ decoders (CatCausalDecoder, MlrDecoder: one
for the batch each, with the DecodeCache verbs update, truncate, clone, memory_bytes).
The C++ MLR decoder keeps only the keys of the current level blocks, so it rolls back
within the current finest block only (ValueError beyond). Elsewhere (other devices, other
dtypes, backend="torch") the state is tensors and a step is the torch-native math: CAT
keeps z and v (as the C++ decoder does), MLR keeps every key and value.
"""

from typing import Optional, Sequence

import torch
from torch import Tensor

from .. import _core
from ..cache import Cache
from . import native
from .ops import CPP_DTYPES, check_backend

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64"}


def _cpp_state(backend: str, dtype: torch.dtype, device) -> bool:
    """Whether a cache of this dtype and device keeps its state in a C++ decoder."""
    check_backend(backend)
    on_cpu = torch.device(device).type == "cpu"
    if backend == "cpp" and not (on_cpu and dtype in CPP_DTYPES):
        raise ValueError(f"backend: 'cpp' decoders hold float32 or float64 on the CPU, got "
                         f"{dtype} on {device}")
    return backend != "torch" and on_cpu and dtype in CPP_DTYPES


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


class CatCausalCache(Cache):
    """Causal CAT state: CatCausalCache(batch, heads, value_dim, *, dtype, device, backend).

    update(z [B, T, H], v [B, T, H, Dv]) -> out [B, T, H, Dv]: appends T tokens and returns
    their rows of cat_causal_forward over everything seen.
    """

    def __init__(self, batch: int, heads: int, value_dim: int, *,
                 dtype: torch.dtype = torch.float32, device="cpu", backend: str = "auto"):
        self.batch, self.heads, self.value_dim = batch, heads, value_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.seen = 0
        self.on_cpp = _cpp_state(backend, dtype, device)
        if self.on_cpp:
            self._decoder = _core.CatCausalDecoder(batch, heads, value_dim,
                                                   dtype=_DTYPE_NAMES[dtype])
        self._z: Optional[Tensor] = None  # [B, S, H] (torch state)
        self._v: Optional[Tensor] = None  # [B, S, H, Dv]

    @property
    def nbytes(self) -> int:
        if self.on_cpp:
            # Per sequence the decoder holds z [S, H] and a running max and sum [H] in
            # double, and v [S, H, Dv] in the dtype (include/subquad/cat.h; vector
            # capacity beyond the length not counted).
            item = torch.finfo(self.dtype).bits // 8
            double = torch.finfo(torch.float64).bits // 8
            per_sequence = (self.seen + 2) * self.heads * double + \
                self.seen * self.heads * self.value_dim * item
            return self.batch * per_sequence
        return sum(t.numel() * t.element_size() for t in (self._z, self._v) if t is not None)

    def update(self, z: Tensor, v: Tensor) -> Tensor:
        _check("z", z, (self.batch, None, self.heads), self.dtype, self.device)
        _check("v", v, (self.batch, z.shape[1], self.heads, self.value_dim), self.dtype,
               self.device)
        z, v = z.detach(), v.detach()
        tokens = z.shape[1]
        if self.on_cpp:
            out = torch.from_numpy(self._decoder.update(z=z.contiguous(), v=v.contiguous()))
        else:
            self._z = z.clone() if self._z is None else torch.cat([self._z, z], dim=1)
            self._v = v.clone() if self._v is None else torch.cat([self._v, v], dim=1)
            out = native.cat_causal_rows(self._z, self._v, self.seen)
        self.seen += tokens
        return out

    def truncate(self, length: int) -> None:
        if not isinstance(length, int) or not 0 <= length <= self.seen:
            raise ValueError(f"length: expected an int in [0, {self.seen}], got {length!r}")
        if self.on_cpp:
            self._decoder.truncate(length)
        elif self._z is not None:
            self._z, self._v = self._z[:, :length].clone(), self._v[:, :length].clone()
        self.seen = length

    def clone(self) -> "CatCausalCache":
        copy = CatCausalCache.__new__(CatCausalCache)
        copy.__dict__.update(self.__dict__)
        if self.on_cpp:
            copy._decoder = self._decoder.clone()
        copy._z = None if self._z is None else self._z.clone()
        copy._v = None if self._v is None else self._v.clone()
        return copy


class MlrCache(Cache):
    """Causal MLR state with blocks on positions 0..context-1:
    MlrCache(batch, heads, kv_heads, head_dim, value_dim, context, *, ranks,
    block_divide=False, dtype, device, backend).

    update(q [B, T, H, D], k [B, T, Hkv, D], v [B, T, Hkv, Dv]) -> out [B, T, H, Dv]: the
    rows of the causal MLR forward over `context` tokens at the T new positions.
    """

    def __init__(self, batch: int, heads: int, kv_heads: int, head_dim: int, value_dim: int,
                 context: int, *, ranks: Sequence[int], block_divide: bool = False,
                 dtype: torch.dtype = torch.float32, device="cpu", backend: str = "auto"):
        if not isinstance(context, int) or context < 1:
            raise ValueError(f"context: expected the most tokens to decode (an int >= 1), got "
                             f"{context!r}")
        native.mlr_block_sizes(ranks, context)  # raises unless 2^(L-1) divides context
        self.batch, self.heads, self.kv_heads = batch, heads, kv_heads
        self.head_dim, self.value_dim, self.context = head_dim, value_dim, context
        self.ranks, self.block_divide = list(ranks), block_divide
        self.dtype, self.device = dtype, torch.device(device)
        self.seen = 0
        self.on_cpp = _cpp_state(backend, dtype, device)
        if self.on_cpp:
            self._decoder = _core.MlrDecoder(batch, heads, kv_heads, value_dim, context,
                                             ranks=self.ranks, block_divide=block_divide,
                                             dtype=_DTYPE_NAMES[dtype])
        self._k: Optional[Tensor] = None  # [B, S, Hkv, D] (torch state)
        self._v: Optional[Tensor] = None  # [B, S, Hkv, Dv]

    @property
    def nbytes(self) -> int:
        if self.on_cpp:  # the level key caches (one block each) and the values seen
            return self._decoder.memory_bytes
        return sum(t.numel() * t.element_size() for t in (self._k, self._v) if t is not None)

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
        q, k, v = q.detach(), k.detach(), v.detach()
        if self.on_cpp:
            out = torch.from_numpy(self._decoder.update(
                q=q.contiguous(), k=k.contiguous(), v=v.contiguous()))  # [B, T, H, Dv]
        else:
            self._k = k.clone() if self._k is None else torch.cat([self._k, k], dim=1)
            self._v = v.clone() if self._v is None else torch.cat([self._v, v], dim=1)
            out = native.mlr_attention_rows(q, self._k, self._v, ranks=self.ranks,
                                            block_divide=self.block_divide,
                                            context=self.context)
        self.seen += tokens
        return out

    def truncate(self, length: int) -> None:
        if not isinstance(length, int) or not 0 <= length <= self.seen:
            raise ValueError(f"length: expected an int in [0, {self.seen}], got {length!r}")
        if self.on_cpp:
            self._decoder.truncate(length)  # ValueError past the current finest block
        elif self._k is not None:
            self._k, self._v = self._k[:, :length].clone(), self._v[:, :length].clone()
        self.seen = length

    def clone(self) -> "MlrCache":
        copy = MlrCache.__new__(MlrCache)
        copy.__dict__.update(self.__dict__)
        if self.on_cpp:
            copy._decoder = self._decoder.clone()
        copy._k = None if self._k is None else self._k.clone()
        copy._v = None if self._v is None else self._v.clone()
        return copy
