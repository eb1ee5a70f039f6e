"""Language models over token ids: a decoder-only (causal) LM with per-layer decoding
caches, and an encoder masked LM with BERT's masking. Learned absolute positions, or none
(position_embedding="none": positions come from the attention, e.g. exact with rope); the
readout is tied to the token embedding unless muP asks for a separate zero readout."""

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .blocks import attention_names, blocks, expand_pattern, initialise

IGNORE_INDEX = -100  # label of positions that carry no loss (F.cross_entropy's default)
POSITION_EMBEDDINGS = ("learned", "none")  # a learned absolute table, or no table


class _TokenTransformer(nn.Module):
    def __init__(self, vocab_size: int, max_length: int, dim: int, heads: int, depth: int,
                 attention: str, pattern: Optional[Sequence[str]], causal: bool,
                 mlp_ratio: float, attention_options, mup: bool,
                 attention_scale: Optional[float], position_embedding: str):
        super().__init__()
        if vocab_size < 2 or max_length < 1:
            raise ValueError(f"vocab_size >= 2 and max_length >= 1 expected, got "
                             f"{vocab_size}, {max_length}")
        if position_embedding not in POSITION_EMBEDDINGS:
            raise ValueError(f"position_embedding: expected one of {list(POSITION_EMBEDDINGS)}, "
                             f"got {position_embedding!r}")
        self.vocab_size, self.max_length = vocab_size, max_length
        self.pattern = expand_pattern(attention, pattern, depth)
        self.tokens = nn.Embedding(vocab_size, dim)
        self.position_embedding = position_embedding
        self.positions = nn.Embedding(max_length, dim) if position_embedding == "learned" \
            else None
        self.blocks = blocks(dim, heads, self.pattern, causal=causal, mlp_ratio=mlp_ratio,
                             options=attention_options, mup=mup, scale=attention_scale)
        self.norm = nn.LayerNorm(dim)
        self.readout = nn.Linear(dim, vocab_size, bias=False)
        initialise(self, mup, self.readout)
        if not mup:
            self.readout.weight = self.tokens.weight

    def attention_counts(self):
        return attention_names(self)

    def run(self, ids: Tensor, attention_mask: Optional[Tensor], caches, start: int):
        """ids [B, T] -> (logits [B, T, vocab], caches)."""
        if ids.dim() != 2:
            raise ValueError(f"ids: expected [B, T], got {list(ids.shape)}")
        T = ids.shape[1]
        if start + T > self.max_length:
            raise ValueError(f"ids: positions {start}..{start + T - 1} exceed max_length = "
                             f"{self.max_length}")
        if caches is not None:
            seen = {cache.seen for cache in caches if cache is not None}
            if seen and seen != {start}:
                # positions and rotary angles come from start: they must continue the caches
                raise ValueError(f"start: expected the {sorted(seen)[0]} tokens the caches "
                                 f"have seen, got {start}")
        x = self.tokens(ids)  # [B, T, dim]
        if self.positions is not None:
            x = x + self.positions(torch.arange(start, start + T, device=ids.device))
        caches = caches if caches is not None else [None] * len(self.blocks)
        new_caches = []
        for block, cache in zip(self.blocks, caches):
            x, cache = block(x, attention_mask=attention_mask, cache=cache)
            new_caches.append(cache)
        return self.readout(self.norm(x)), new_caches


class CausalLM(_TokenTransformer):
    """Decoder-only LM: ids [B, T] -> logits [B, T, vocab] (position t predicts t + 1).

    CausalLM(vocab_size, max_length, dim, heads, layers, attention="exact", pattern=None,
    mlp_ratio=4, attention_options=None, mup=False, attention_scale=None,
    position_embedding="learned"). position_embedding "none" drops the learned position
    table (no `positions` parameter): the attention must see positions itself (rope)."""

    def __init__(self, vocab_size: int, max_length: int, dim: int = 128, heads: int = 4,
                 layers: int = 4, attention: str = "exact",
                 pattern: Optional[Sequence[str]] = None, mlp_ratio: float = 4.0,
                 attention_options=None, mup: bool = False,
                 attention_scale: Optional[float] = None, position_embedding: str = "learned"):
        super().__init__(vocab_size, max_length, dim, heads, layers, attention, pattern, True,
                         mlp_ratio, attention_options, mup, attention_scale,
                         position_embedding)

    def forward(self, ids: Tensor, attention_mask: Optional[Tensor] = None,
                caches: Optional[List] = None, start: int = 0) -> Tuple[Tensor, List]:
        """With caches (from init_caches) the tokens are appended at position `start`
        (the tokens seen so far) and the updated caches come back."""
        return self.run(ids, attention_mask, caches, start)

    def init_caches(self, batch: int) -> List:
        """One decoding cache per layer (each layer's own init_cache)."""
        caches = []
        for block in self.blocks:
            attention = block.attention
            if not hasattr(attention, "init_cache"):
                raise ValueError(f"{block.attention_name}: no decoding cache; decode with "
                                 f"an entry that has one (exact, sliding-window, "
                                 f"cat-causal, mlr)")
            # context: MLR's level blocks sit on positions 0..max_length-1
            caches.append(attention.init_cache(batch, context=self.max_length))
        return caches

    def loss(self, ids: Tensor) -> Tensor:
        """Mean next-token cross-entropy of ids [B, T + 1]."""
        logits, _ = self(ids[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())

    @torch.no_grad()
    def generate(self, prompt: Tensor, new_tokens: int, temperature: float = 0.0,
                 generator: Optional[torch.Generator] = None) -> Tensor:
        """prompt [B, P] -> [B, P + new_tokens]: prefill, then one token at a time through
        the caches; temperature 0 is greedy."""
        caches = self.init_caches(prompt.shape[0])
        logits, caches = self(prompt, caches=caches, start=0)
        out = [prompt]
        for step in range(new_tokens):
            last = logits[:, -1].float()
            if temperature > 0:
                probabilities = torch.softmax(last / temperature, dim=-1)
                token = torch.multinomial(probabilities, 1, generator=generator)
            else:
                token = last.argmax(dim=-1, keepdim=True)
            out.append(token)
            if step + 1 < new_tokens:
                logits, caches = self(token, caches=caches,
                                      start=prompt.shape[1] + step)
        return torch.cat(out, dim=1)


def bert_mask(ids: Tensor, vocab_size: int, mask_id: int, generator: torch.Generator,
              rate: float = 0.15, attention_mask: Optional[Tensor] = None
              ) -> Tuple[Tensor, Tensor]:
    """BERT's masking (Devlin et al. 2019): each token is selected with probability `rate`
    (at least one per row); of those 80% become mask_id, 10% a random token, 10% stay.
    ids [B, T] -> (inputs [B, T], labels [B, T] with IGNORE_INDEX off the selection)."""
    if not 0 < rate < 1:
        raise ValueError(f"rate: expected in (0, 1), got {rate}")
    draws = torch.rand(ids.shape, generator=generator)
    if attention_mask is not None:
        draws = draws.masked_fill(attention_mask == 0, 2.0)  # never select padding
    selected = draws < rate
    selected[torch.arange(ids.shape[0]), draws.argmin(dim=1)] = True
    labels = ids.masked_fill(~selected, IGNORE_INDEX)
    action = torch.rand(ids.shape, generator=generator)
    random_tokens = torch.randint(vocab_size, ids.shape, generator=generator)
    inputs = torch.where(selected & (action < 0.8), torch.full_like(ids, mask_id), ids)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_tokens, inputs)
    return inputs, labels


class MaskedLM(_TokenTransformer):
    """Encoder (bidirectional) masked LM: ids [B, T] -> logits [B, T, vocab + 1]; the
    extra symbol (id vocab_size) is [MASK].

    MaskedLM(vocab_size, max_length, dim, heads, layers, attention="exact", ...) as
    CausalLM."""

    def __init__(self, vocab_size: int, max_length: int, dim: int = 128, heads: int = 4,
                 layers: int = 4, attention: str = "exact",
                 pattern: Optional[Sequence[str]] = None, mlp_ratio: float = 4.0,
                 attention_options=None, mup: bool = False,
                 attention_scale: Optional[float] = None, mask_rate: float = 0.15,
                 position_embedding: str = "learned"):
        super().__init__(vocab_size + 1, max_length, dim, heads, layers, attention, pattern,
                         False, mlp_ratio, attention_options, mup, attention_scale,
                         position_embedding)
        self.mask_id, self.mask_rate = vocab_size, mask_rate

    def forward(self, ids: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        return self.run(ids, attention_mask, None, 0)[0]

    def loss(self, ids: Tensor, generator: torch.Generator) -> Tuple[Tensor, Tensor]:
        """(cross-entropy on the masked positions, accuracy there) for ids [B, T]."""
        inputs, labels = bert_mask(ids, self.mask_id, self.mask_id, generator,
                                   self.mask_rate)
        logits = self(inputs).float()
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                               ignore_index=IGNORE_INDEX)
        selected = labels != IGNORE_INDEX
        accuracy = (logits.argmax(-1)[selected] == labels[selected]).float().mean()
        return loss, accuracy
