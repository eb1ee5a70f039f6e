"""What every model family shares: the per-layer attention pattern, a pre-LayerNorm
transformer block around any registry entry (or torch's own attention, the baseline of
the benchmarks), and the initialisation (standard or muP-style)."""

import math
from typing import Dict, List, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import layers
from ..layers.registry import ATTENTIONS, accepted_options

# torch's own attention (SDPA on torch >= 2.0, the plain math path before): the baseline
# every subquad entry is compared with; not a registry entry.
TORCH_ATTENTION = "torch"
STANDARD_INIT_STD = 0.02  # GPT-2 / BERT / ViT initialisation of hidden weights
MUP_EMBEDDING_STD = 0.02  # muP embeddings (the structured-attention code's wte / wpe)


def expand_pattern(attention: str, pattern: Optional[Sequence[str]], depth: int) -> List[str]:
    """The attention name of each of `depth` layers: `pattern` repeated (e.g. ["cat",
    "exact"] gives CAT-Alter), or `attention` in every layer when pattern is None."""
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"layers: expected a positive int, got {depth!r}")
    if pattern is None or len(pattern) == 0:
        return [attention] * depth
    pattern = list(pattern)
    if depth % len(pattern):
        raise ValueError(f"pattern: its length {len(pattern)} must divide layers = {depth} "
                         f"(the pattern repeats), got {pattern}")
    return pattern * (depth // len(pattern))


class TorchAttention(nn.Module):
    """Multi-head softmax attention with torch's own kernel, same contract as the
    registry's layers: x [B, T, dim] -> (y [B, T, dim], None), by
    torch.nn.functional.scaled_dot_product_attention. No cache."""

    def __init__(self, dim: int, heads: int, *, causal: bool = False,
                 scale: Optional[float] = None, mup: bool = False):
        super().__init__()
        if dim % heads:
            raise ValueError(f"heads: expected a divisor of dim = {dim}, got {heads}")
        self.heads, self.head_dim, self.causal = heads, dim // heads, causal
        self.scale = scale if scale is not None else (
            layers.base.MUP_LOGIT_MULTIPLIER / self.head_dim if mup  # as the entries' muP
            else 1.0 / math.sqrt(self.head_dim))
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor, attention_mask: Optional[Tensor] = None, cache=None):
        if cache is not None:
            raise ValueError("torch attention: no decoding cache; use 'exact'")
        B, T, dim = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        keep = None  # [B, 1, T, T] bool: which keys a query may read
        if attention_mask is not None:
            keep = attention_mask.bool()[:, None, None, :].expand(B, 1, T, T)
        if self.causal:
            lower = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            keep = lower if keep is None else keep & lower
        # A row that sees no key (left padding under the causal mask) comes out as 0.
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=self.scale)
        y = self.out(y.transpose(1, 2).reshape(B, T, dim))
        if attention_mask is not None:
            y = y * attention_mask[..., None].to(y.dtype)
        return y, None


def check_attention_options(pattern: Sequence[str], options, causal: bool,
                            only_used: bool = False) -> None:
    """The per-entry options of a model whose layers are `pattern`: every entry named is
    registered (or "torch"), and none sets the direction, which the model decides (a
    causal option in an encoder, or causal=False in a decoder, would let a token see what
    it must not, or hide what it should see). Options of registered entries the model
    does not use are not read (one table can serve several models), unless only_used
    (a training config describes one model: there they are a mistake). ValueError naming
    attention_options.<entry>[.causal]."""
    if options is None:
        return
    if not isinstance(options, Mapping):
        raise ValueError(f"attention_options: expected a mapping of entry names to options, "
                         f"got {options!r}")
    used = list(dict.fromkeys(pattern))
    for name, own in options.items():
        if name != TORCH_ATTENTION and name not in ATTENTIONS:
            raise ValueError(f"attention_options: unknown entry {name!r}; registered: "
                             f"{', '.join(ATTENTIONS)} (and {TORCH_ATTENTION!r})")
        if only_used and name not in used:
            raise ValueError(f"attention_options.{name}: the model has no {name} layer (its "
                             f"layers: {', '.join(used)}); remove these options")
        if not isinstance(own, Mapping):
            raise ValueError(f"attention_options.{name}: expected a mapping of options, got "
                             f"{own!r}")
        if "causal" in own and own["causal"] != causal:
            direction = "causal" if causal else "bidirectional"
            raise ValueError(f"attention_options.{name}.causal: {own['causal']!r} contradicts "
                             f"the model, which is {direction} (the model decides the "
                             f"direction); remove the option")


def build_attention(name: str, dim: int, heads: int, *, causal: bool,
                    options: Optional[Mapping[str, Mapping[str, object]]] = None,
                    mup: bool = False, scale: Optional[float] = None) -> nn.Module:
    """The attention layer `name` (a registry entry or "torch") for a causal or a
    bidirectional model. options: per-entry keyword options ({"mlr": {"ranks": [...]}});
    mup and scale are passed to entries that take them (muP init, logit scale)."""
    own = dict((options or {}).get(name, {}))
    if name == TORCH_ATTENTION:
        check_attention_options([name], {name: own}, causal)
        own.pop("causal", None)  # the model's own, checked above
        unknown = [key for key in own if key not in accepted_options(TorchAttention)]
        if unknown:
            raise ValueError(f"{name}: unknown option{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(unknown)}; accepted: "
                             f"{', '.join(accepted_options(TorchAttention))}")
        return TorchAttention(dim, heads, **{"causal": causal, "scale": scale, "mup": mup,
                                             **own})
    entry = ATTENTIONS[name]  # raises for an unknown name, listing the registered ones
    accepted = accepted_options(entry.factory)
    if "causal" in accepted:
        own.setdefault("causal", causal)
    else:  # an entry fixed to one direction (e.g. cat-causal): it must be the right one
        entry.capabilities.require(name, "causal" if causal else "bidirectional",
                                   "the model needs it")
    if mup and "mup" in accepted:
        own.setdefault("mup", True)
    if scale is not None and "scale" in accepted:
        own.setdefault("scale", scale)
    return layers.build(name, dim, heads, **own)


class MLP(nn.Sequential):
    def __init__(self, dim: int, ratio: float):
        hidden = int(round(dim * ratio))
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attention(LN(x)), then x + MLP(LN(x)).
    x [B, T, dim] -> ([B, T, dim], cache)."""

    def __init__(self, dim: int, heads: int, attention: str, *, causal: bool,
                 mlp_ratio: float = 4.0, options=None, mup: bool = False,
                 scale: Optional[float] = None):
        super().__init__()
        self.attention_name = attention
        self.norm1 = nn.LayerNorm(dim)
        self.attention = build_attention(attention, dim, heads, causal=causal,
                                         options=options, mup=mup, scale=scale)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, mlp_ratio)

    def forward(self, x: Tensor, attention_mask: Optional[Tensor] = None, cache=None):
        y, cache = self.attention(self.norm1(x), attention_mask=attention_mask, cache=cache)
        x = x + y
        return x + self.mlp(self.norm2(x)), cache


def blocks(dim: int, heads: int, names: Sequence[str], *, causal: bool, mlp_ratio: float,
           options, mup: bool, scale: Optional[float]) -> nn.ModuleList:
    check_attention_options(names, options, causal)
    return nn.ModuleList(Block(dim, heads, name, causal=causal, mlp_ratio=mlp_ratio,
                               options=options, mup=mup, scale=scale) for name in names)


def initialise(model: nn.Module, mup: bool, readout: Optional[nn.Linear] = None) -> None:
    """Standard: every Linear and Embedding N(0, 0.02^2), zero biases. muP-style
    (Yang et al. 2021, as the structured-attention code uses): hidden Linear weights
    N(0, 1 / fan_in), embeddings N(0, 0.02^2), and zero output projections (each block's
    attention output and second MLP layer) and readout, so every block starts as the
    identity, the logits start at 0 and the update size does not depend on the width.
    LayerNorms stay (1, 0); modules with their own reset (the attention layers'
    structured weights) keep it under muP."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            std = 1.0 / math.sqrt(module.in_features) if mup else STANDARD_INIT_STD
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=MUP_EMBEDDING_STD if mup else STANDARD_INIT_STD)
    if not mup:
        return
    outputs = [readout] if readout is not None else []
    for module in model.modules():
        if isinstance(module, Block):
            projection = getattr(module.attention, "w_o", getattr(module.attention, "out", None))
            outputs += [projection, module.mlp[-1]]
    for output in outputs:
        if isinstance(output, nn.Linear):
            nn.init.zeros_(output.weight)
            if output.bias is not None:
                nn.init.zeros_(output.bias)


def attention_names(model: nn.Module) -> Dict[str, int]:
    """How many layers of the model use each attention."""
    counts: Dict[str, int] = {}
    for module in model.modules():
        if isinstance(module, Block):
            counts[module.attention_name] = counts.get(module.attention_name, 0) + 1
    return counts
