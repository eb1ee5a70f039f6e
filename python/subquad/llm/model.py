"""A llama decoder (SmolLM2) on torch: weights from a GGUF, subquad's exact attention.

Per block: x += Wo attn(rope(Wq n(x)), rope(Wk n(x)), Wv n(x)); x += Wd (silu(Wg n(x)) *
Wu n(x)), n = RMSNorm. Full forwards (`logits`) call subquad.ops.exact_attention (causal,
GQA); `prefill` / `step` go through a `LlamaCache` (one subquad.cache.KVCache per block),
which is what KV-cache presses compress. Cost per token: ~2 x 135M MACs + attention.

RoPE convention: llama.cpp's converter permutes HF's Q/K rows so that GGUF llama models
rotate *adjacent* pairs (x[2i], x[2i+1]) by theta_i = base^(-2i/D) (ggml's "normal" rope),
not HF's half-split pairs (x[i], x[i + D/2]); `rope_layout="half"` exists only to show the
difference (perplexity jumps when the wrong one is used, see docs/results/kv-compression.md).
"""

from typing import Callable, Dict, List, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..cache import Cache
from .gguf_file import GgufModelFile, LlamaConfig
from .pressed_cache import PressedKVCache

__all__ = ["LlamaCache", "LlamaModel"]

ROPE_LAYOUTS = ("adjacent", "half")


class LlamaCache(Cache):
    """One KVCache per block (a PressedKVCache: compressed caches attend on the exact
    kernel)."""

    def __init__(self, config: LlamaConfig, batch: int, dtype: torch.dtype):
        self.layers: List[PressedKVCache] = [
            PressedKVCache(batch, config.kv_heads, config.head_dim, dtype=dtype)
            for _ in range(config.blocks)]
        self.batch = batch

    @property
    def seen(self) -> int:
        return self.layers[0].seen

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)

    @property
    def lengths(self) -> List[int]:
        """Entries held per KV head, by block."""
        return [layer.length for layer in self.layers]

    def truncate(self, length: int) -> None:
        for layer in self.layers:
            layer.truncate(length)

    def clone(self) -> "LlamaCache":
        copy = LlamaCache.__new__(LlamaCache)
        copy.layers = [layer.clone() for layer in self.layers]
        copy.batch = self.batch
        return copy


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class LlamaModel:
    """The model: tokenize / detokenize / logits / prefill / step / generate.

    LlamaModel(file, tokenizer=None, dtype=float32, rope_layout="adjacent").
    `file` is a checked GgufModelFile, or a dict of float tensors named as in GGUF with a
    LlamaConfig (`from_tensors`, for tests).
    """

    def __init__(self, config: LlamaConfig, tensors: Dict[str, Tensor], tokenizer=None, *,
                 dtype: torch.dtype = torch.float32, rope_layout: str = "adjacent"):
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype: expected torch.float32 or torch.float64, got {dtype}")
        if rope_layout not in ROPE_LAYOUTS:
            raise ValueError(f"rope_layout: expected one of {ROPE_LAYOUTS}, got {rope_layout!r}")
        self.config, self.tokenizer, self.dtype = config, tokenizer, dtype
        self.file = None  # the GgufModelFile it came from, when loaded from one
        self.rope_layout = rope_layout
        self.w = {name: tensor.to(dtype).contiguous() for name, tensor in tensors.items()}
        self.w_output = self.w.get("output.weight", self.w["token_embd.weight"])  # [V, dim]
        half = config.head_dim // 2
        # theta_i = base^(-2i/D), i < D/2
        self._inv_freq = config.rope_base ** (
            -torch.arange(half, dtype=torch.float64) * 2 / config.head_dim)

    @classmethod
    def from_gguf(cls, file: GgufModelFile, tokenizer=None, **options) -> "LlamaModel":
        tensors = {name: torch.from_numpy(file.tensor(name)) for name in file.tensor_names
                   if name != "rope_freqs.weight"}
        return cls(file.config, tensors, tokenizer, **options)

    # ---- text ----
    def tokenize(self, text: str, **options) -> List[int]:
        return self._need_tokenizer().tokenize(text, **options)

    def detokenize(self, ids: Sequence[int], **options) -> str:
        return self._need_tokenizer().detokenize(ids, **options)

    def chat(self, messages, **options) -> str:
        return self._need_tokenizer().chat(messages, **options)

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError("this model was built without a tokenizer")
        return self.tokenizer

    # ---- caches ----
    def new_cache(self, batch: int = 1) -> LlamaCache:
        return LlamaCache(self.config, batch, self.dtype)

    # ---- forwards ----
    def logits(self, ids: Tensor) -> Tensor:
        """Full causal forward: ids [B, T] int64 -> logits [B, T, V] (no cache)."""
        ids = self._check_ids(ids)
        return self._forward(ids, 0, None, all_logits=True)

    def prefill(self, ids: Tensor, cache: LlamaCache, *, all_logits: bool = False) -> Tensor:
        """Append ids [B, T] to `cache` (positions cache.seen ...) and return the logits of
        the last token [B, V] (all_logits: [B, T, V])."""
        ids = self._check_ids(ids, cache)
        out = self._forward(ids, cache.seen, cache, all_logits=all_logits)
        return out if all_logits else out[:, -1]

    def step(self, ids: Tensor, cache: LlamaCache) -> Tensor:
        """Decode ids [B, T] (usually T = 1) after what `cache` holds: logits [B, T, V].
        Works on compressed caches; positions continue from cache.seen (the original,
        uncompressed positions)."""
        ids = self._check_ids(ids, cache)
        return self._forward(ids, cache.seen, cache, all_logits=True)

    def step_each(self, ids: Tensor, caches: Sequence[LlamaCache]) -> Tensor:
        """Decode row i of ids [P, T] after caches[i] (P caches of batch 1 that have seen
        the same number of tokens, e.g. one prompt's cache under several presses): logits
        [P, T, V]. One forward for all P, so a decode step reads the weights once, not P
        times; each row attends to its own cache only."""
        caches = list(caches)
        ids = self._check_ids(ids)
        if len(caches) != ids.shape[0] or any(c.batch != 1 for c in caches):
            raise ValueError(f"caches: expected {ids.shape[0]} caches of batch 1 (one per "
                             f"row of ids), got {len(caches)} of batches "
                             f"{[c.batch for c in caches]}")
        if len({id(c) for c in caches}) != len(caches):
            raise ValueError("caches: expected distinct caches (a cache given twice would "
                             "take two rows' tokens)")
        if len({c.seen for c in caches}) > 1:
            raise ValueError(f"caches: expected caches that have seen the same number of "
                             f"tokens, got {sorted({c.seen for c in caches})}")
        return self._forward(ids, caches[0].seen, caches, all_logits=True)

    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int = 64, *,
                 cache: Optional[LlamaCache] = None, press: Optional[Callable] = None,
                 stop_ids: Optional[Sequence[int]] = None,
                 on_token: Optional[Callable[[int], None]] = None) -> List[int]:
        """Greedy decoding: prefill the prompt (into `cache` if given), apply `press`
        (cache -> None) once after prefill, then up to max_new_tokens argmax tokens, stopping
        after a stop id (default: the tokenizer's <|im_end|> and eos). Returns new ids."""
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens: expected >= 0, got {max_new_tokens}")
        prompt_ids = list(prompt_ids)
        if not prompt_ids:
            raise ValueError("prompt_ids: expected at least one token")
        cache = self.new_cache(1) if cache is None else cache
        # Checked before the first token is printed: the last new token is not fed back.
        self._check_positions(cache.seen, len(prompt_ids) + max(max_new_tokens - 1, 0))
        if stop_ids is None:
            tokenizer = self.tokenizer
            stop_ids = [] if tokenizer is None else [
                i for i in (tokenizer.im_end_id, tokenizer.eos_id) if i is not None]
        logits = self.prefill(torch.tensor([prompt_ids]), cache)
        if press is not None:
            press(cache)
        new: List[int] = []
        while len(new) < max_new_tokens:
            token = int(logits[0].argmax())
            new.append(token)
            if on_token is not None:
                on_token(token)
            if token in stop_ids or len(new) == max_new_tokens:
                break
            logits = self.step(torch.tensor([[token]]), cache)[:, -1]
        return new

    # ---- internals ----
    def _check_ids(self, ids, cache: Optional[LlamaCache] = None) -> Tensor:
        ids = torch.as_tensor(ids)
        if ids.dim() != 2 or ids.dtype != torch.int64 or ids.shape[1] == 0:
            raise ValueError(f"ids: expected int64 [B, T] with T >= 1, got {ids.dtype} "
                             f"{list(ids.shape)}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab:
            raise ValueError(f"ids: expected token ids in [0, {self.config.vocab}), got "
                             f"[{int(ids.min())}, {int(ids.max())}]")
        if cache is not None and cache.batch != ids.shape[0]:
            raise ValueError(f"ids: cache holds batch {cache.batch}, ids have {ids.shape[0]}")
        return ids

    def _check_positions(self, start: int, tokens: int) -> None:
        """Positions start .. start + tokens - 1 must be the model's: RoPE beyond
        llama.context_length is outside what the model was trained on."""
        if start + tokens > self.config.context_length:
            raise ValueError(f"positions {start} .. {start + tokens - 1}: the model has "
                             f"{self.config.context_length} (llama.context_length)")

    def _rope(self, x: Tensor, start: int) -> Tensor:
        """x [B, T, H, D] rotated at positions start .. start + T - 1."""
        tokens, dim = x.shape[1], x.shape[3]
        positions = torch.arange(start, start + tokens, dtype=torch.float64)
        angles = positions[:, None] * self._inv_freq[None]  # [T, D/2]
        cos = torch.cos(angles).to(x.dtype)[None, :, None]  # [1, T, 1, D/2]
        sin = torch.sin(angles).to(x.dtype)[None, :, None]
        if self.rope_layout == "adjacent":
            pairs = x.reshape(*x.shape[:3], dim // 2, 2)
            even, odd = pairs[..., 0], pairs[..., 1]
            return torch.stack([even * cos - odd * sin, even * sin + odd * cos],
                               dim=-1).reshape(x.shape)
        first, second = x[..., :dim // 2], x[..., dim // 2:]
        return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)

    def _forward(self, ids: Tensor, start: int,
                 cache: Optional[Union[LlamaCache, List[LlamaCache]]], *, all_logits: bool,
                 observe: Optional[Callable] = None) -> Tensor:
        """cache: None (no cache), a LlamaCache, or a list of LlamaCaches of batch 1, one
        per row of ids. observe(block, q, k, v), when given, sees every block's attention
        inputs."""
        from ..ops import exact_attention

        c, w = self.config, self.w
        batch, tokens = ids.shape
        self._check_positions(start, tokens)
        x = F.embedding(ids, w["token_embd.weight"])  # [B, T, dim]
        for block in range(c.blocks):
            p = f"blk.{block}."
            h = _rms_norm(x, w[p + "attn_norm.weight"], c.norm_eps)
            q = F.linear(h, w[p + "attn_q.weight"]).view(batch, tokens, c.heads, c.head_dim)
            k = F.linear(h, w[p + "attn_k.weight"]).view(batch, tokens, c.kv_heads, c.head_dim)
            v = F.linear(h, w[p + "attn_v.weight"]).view(batch, tokens, c.kv_heads, c.head_dim)
            q, k = self._rope(q, start), self._rope(k, start)
            if observe is not None:
                observe(block, q, k, v)
            if cache is None:
                attended, _ = exact_attention(q, k, v, causal=True)  # [B, T, H, D]
            elif isinstance(cache, list):
                attended = torch.cat([row.layers[block].update(q[i:i + 1], k[i:i + 1],
                                                               v[i:i + 1])
                                      for i, row in enumerate(cache)])
            else:
                attended = cache.layers[block].update(q, k, v)
            x = x + F.linear(attended.reshape(batch, tokens, c.dim), w[p + "attn_output.weight"])
            h = _rms_norm(x, w[p + "ffn_norm.weight"], c.norm_eps)
            gate = F.silu(F.linear(h, w[p + "ffn_gate.weight"]))
            x = x + F.linear(gate * F.linear(h, w[p + "ffn_up.weight"]), w[p + "ffn_down.weight"])
        if not all_logits:
            x = x[:, -1:]
        x = _rms_norm(x, w["output_norm.weight"], c.norm_eps)
        return F.linear(x, self.w_output)  # [B, T | 1, V]
