"""Decoding caches of the causal CAT and MLR layers, both subquad.cache.Cache.

On CPU in float32/float64 they wrap the C++ decoders (CatCausalDecoder, MlrDecoder: one
for the batch each, with the DecodeCache verbs update, truncate, clone, memory_bytes).
The C++ MLR decoder keeps only the keys of the current level blocks, so it rolls back
within the current finest block only (ValueError beyond). Elsewhere (other devices, other
dtypes, backend="torch") the state is tensors and a step is subquad.reference's math: CAT
keeps z and v (as the C++ decoder does), MLR keeps every key and value.
"""

from typing import List, Optional, Sequence

import torch
from torch import Tensor

from .. import _core, reference
from ..cache import Cache

_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64"}
CPP_DTYPES = tuple(_DTYPE_NAMES)
BACKENDS = ("auto", "cpp", "torch")


def _cpp_state(backend: str, dtype: torch.dtype, device) -> bool:
    """Whether a cache of this dtype and device keeps its state in a C++ decoder: "auto"
    where one can (float32 or float64 on the CPU), "cpp" insists, "torch" never."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
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


class _DecoderState(Cache):
    """The state of a decoding layer: a C++ decoder (`on_cpp`), else the history of the
    token tensors it needs, each [B, S, ...] along dim 1 (torch state)."""

    on_cpp = False
    _decoder = None
    _history: Optional[List[Tensor]] = None

    def _extend(self, *tensors: Tensor) -> List[Tensor]:
        """The history with `tensors` [B, T, ...] appended along the sequence."""
        if self._history is None:
            self._history = [t.clone() for t in tensors]
        else:
            self._history = [torch.cat([h, t], dim=1) for h, t in zip(self._history, tensors)]
        return self._history

    @property
    def nbytes(self) -> int:
        if self.on_cpp:
            return self._decoder.memory_bytes
        return sum(t.numel() * t.element_size() for t in self._history or ())

    def truncate(self, length: int) -> None:
        if not isinstance(length, int) or not 0 <= length <= self.seen:
            raise ValueError(f"length: expected an int in [0, {self.seen}], got {length!r}")
        if self.on_cpp:
            self._decoder.truncate(length)  # the MLR decoder: ValueError past its block
        elif self._history is not None:
            self._history = [t[:, :length].clone() for t in self._history]
        self.seen = length

    def clone(self) -> "_DecoderState":
        copy = type(self).__new__(type(self))
        copy.__dict__.update(self.__dict__)
        if self.on_cpp:
            copy._decoder = self._decoder.clone()
        if self._history is not None:
            copy._history = [t.clone() for t in self._history]
        return copy


class CatCausalCache(_DecoderState):
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
        # torch state: the history z [B, S, H], v [B, S, H, Dv]

    def update(self, z: Tensor, v: Tensor) -> Tensor:
        _check("z", z, (self.batch, None, self.heads), self.dtype, self.device)
        _check("v", v, (self.batch, z.shape[1], self.heads, self.value_dim), self.dtype,
               self.device)
        z, v = z.detach(), v.detach()
        tokens = z.shape[1]
        if self.on_cpp:
            out = torch.from_numpy(self._decoder.update(z=z.contiguous(), v=v.contiguous()))
        else:
            out = reference.cat_causal_rows(*self._extend(z, v), self.seen)
        self.seen += tokens
        return out



class MlrCache(_DecoderState):
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
        reference.mlr_block_sizes(ranks, context)  # raises unless 2^(L-1) divides context
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
        # torch state: the history k [B, S, Hkv, D], v [B, S, Hkv, Dv]

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
            out = reference.mlr_attention_rows(q, *self._extend(k, v), ranks=self.ranks,
                                            block_divide=self.block_divide,
                                            context=self.context)
        self.seen += tokens
        return out
