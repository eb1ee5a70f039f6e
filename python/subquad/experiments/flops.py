"""Training FLOPs of a transformer of subquad.models, counted from its modules, for plots
of a metric against compute. Every weight matrix (dense Linear, bilinear MLR levels, BTT
factors) multiplies each token once: 2 FLOPs per weight per token. Attention does
2 * keys * H * (score dim + value dim) per query (scores, then the weighted values); a
causal query t reads t + 1 keys. CAT mixes each head's values by FFT, counted as
include/subquad/cat.h's models do (a real transform of n points 2.5 n log2 n, a complex
product 6): Dv forward and Dv inverse transforms of v's columns and one of the scores, Dv
products of n / 2 + 1 bins, with n = T (causal: the padded 2T); averaged-key CAT adds
2 T D per head for its scores. MLR attention scores level l's pairs, those inside its
2^(l-1) blocks, at rank r_l; a sliding window scores only the pairs it covers. Training costs 3 forwards (the backward is two matmuls
per forward matmul). LayerNorm, softmax, biases and embedding lookups are left out, and so
is RoPE (the exact layers' rope option: elementwise, 3 FLOPs per feature of q and k).
ViTs (vit_forward_flops) add their convolutions as weights used once per patch and count
2D Circulant Attention as include/subquad/circulant2d.h's forward model does; a
forecaster (forecaster_forward_flops) runs each channel's patches through its blocks and
its head once per window.
"""

import math
from typing import Callable, Dict, Mapping, Tuple

from torch import nn

from ..layers.cat import CATAvgKeyLayer, CATLayer
from ..layers.circulant2d import Circulant2dAttention
from ..layers.exact import ExactAttention
from ..layers.structured import BilinearMLRAttention, BTTAttention, MLRAttention
from ..models.blocks import Block, TorchAttention

TRAINING_PASSES = 3  # forward + backward (gradients of inputs and of weights)


def attention_widths(layer: nn.Module) -> Tuple[int, int, int]:
    """(heads, score dim per head, value dim per head) of an attention layer: the widths
    of the q.k products and of the weighted sum of values."""
    if isinstance(layer, (ExactAttention, TorchAttention)):
        return layer.heads, layer.head_dim, layer.head_dim
    if isinstance(layer, BilinearMLRAttention):
        return layer.heads, layer.score_dim, layer.value_dim
    if isinstance(layer, BTTAttention):
        return layer.heads, layer.dim, layer.value_dim  # q is x itself: full-width scores
    raise ValueError(f"attention_widths: no FLOP model for {type(layer).__name__} "
                     f"(exact, torch, bilinear-mlr and btt have one)")


def matmul_weights(model: nn.Module) -> int:
    """Weights that multiply every token once: every Linear's weight (a readout tied to
    the embedding table included: it still multiplies), and the other parameters with
    >= 2 dimensions (structured factors) less embedding tables (looked up, not
    multiplied)."""
    linear = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    seen = {id(w) for w in linear}
    seen |= {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    others = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in seen]
    return sum(w.numel() for w in linear) + sum(p.numel() for p in others)


def forward_flops(model: nn.Module, length: int, *, causal: bool) -> int:
    """FLOPs of one forward pass of one sequence of `length` tokens."""
    if length < 1:
        raise ValueError(f"length: expected >= 1, got {length}")
    attention = 0
    for block in model.modules():
        if not isinstance(block, Block):
            continue
        attention += attention_flops(block.attention, length, causal)
    return 2 * matmul_weights(model) * length + attention


def query_key_pairs(length: int, causal: bool, window: int = 0) -> int:
    """(query, key) pairs scored: all, the causal triangle, or the last `window` keys."""
    if not causal:
        return length * length
    if window <= 0 or window >= length:
        return length * (length + 1) // 2
    return window * (window + 1) // 2 + (length - window) * window


def attention_flops(layer: nn.Module, length: int, causal: bool) -> int:
    """One sequence of `length` tokens through the attention of one layer (its
    projections are counted with the weights)."""
    if isinstance(layer, (CATLayer, CATAvgKeyLayer)):
        return cat_flops(layer, length)
    if isinstance(layer, MLRAttention):
        return mlr_flops(layer, length)
    heads, score, value = attention_widths(layer)
    pairs = query_key_pairs(length, causal, getattr(layer, "window", 0))
    return 2 * pairs * heads * (score + value)


def mlr_flops(layer: nn.Module, length: int) -> int:
    """MLR attention: level l (rank r_l) scores the pairs inside each of its 2^(l-1)
    blocks; the values are weighted over every pair of the first level's one block."""
    length = layer.context or length
    pairs = [query_key_pairs(length >> level, layer.causal) << level
             for level in range(len(layer.ranks))]
    scores = sum(2 * rank * count for rank, count in zip(layer.ranks, pairs))
    return layer.heads * (scores + 2 * pairs[0] * layer.value_dim)


def real_fft_flops(n: int) -> float:
    return 2.5 * n * math.log2(max(n, 2))


def cat_flops(layer: nn.Module, length: int) -> int:
    """The circulant mixing of one sequence of `length` tokens by a CAT layer (its
    projections are counted with the weights)."""
    n = 2 * length if layer.causal else length  # causal CAT pads to 2T
    value = layer.head_dim
    mixing = (2 * value + 1) * real_fft_flops(n) + 6 * value * (n // 2 + 1)
    scores = 2 * length * layer.head_dim if isinstance(layer, CATAvgKeyLayer) else 0
    return round(layer.heads * (mixing + scores))


def circulant2d_flops(layer: Circulant2dAttention, tokens: int) -> int:
    """The token mixing of one image's `tokens` grid positions by a circulant2d layer (its
    projections and gate are counted with the weights), as src/circulant2d computes it: per
    head of D = Dv = dim / heads channels, 2 D + 2 Dv + 2 real 2D transforms of N points
    (q and k forward, the logits' inverse, the weights forward, v forward, the output
    inverse; the one-channel path pairs two heads per complex transform, the same count)
    and 2 N (D + Dv) for the spectral products, circulant2d_forward_cost's model. With
    mixing "exact", softmax attention over the N tokens, 2 N^2 (D + Dv) per head."""
    depth = layer.dim // layer.heads
    if layer.mixing == "exact":
        return 2 * tokens * tokens * layer.heads * 2 * depth
    per_head = (4 * depth + 2) * real_fft_flops(tokens) + 4 * tokens * depth
    return round(layer.heads * per_head)


def vit_forward_flops(model: nn.Module) -> int:
    """FLOPs of one image through a subquad.models.ViTClassifier: the patch embedding (a
    weight used once per patch), every block's weights once per token (linear layers and the
    CA-DeiT blocks' depthwise 3x3 convolution, borders counted as whole), its attention
    (attention_flops over the patches and the class token, if any, or circulant2d_flops
    over the patch grid) and the head once. The learned position table and the class
    token are added, not multiplied: left out with LayerNorm, softmax, GELU, the gate's
    product and biases."""
    patches = model.grid[0] * model.grid[1]
    length = patches + (model.class_token is not None)
    total = 2 * model.embed.weight.numel() * patches + 2 * model.head.weight.numel()
    for block in model.blocks:
        layer = block.attention
        if isinstance(layer, Circulant2dAttention):
            total += 2 * matmul_weights(block) * patches + circulant2d_flops(layer, patches)
        else:
            total += 2 * matmul_weights(block) * length + attention_flops(layer, length, False)
    return total


def forecaster_forward_flops(model: nn.Module) -> int:
    """FLOPs of one channel's window through a subquad.models.PatchForecaster: the patch
    embedding and every block's weights once per patch, the blocks' bidirectional attention
    over the patches, and the head (all patch features to the horizon) once. The position
    table is added, not multiplied: left out with LayerNorm, softmax, GELU, biases and the
    window's normalisation."""
    patches = model.patches
    total = 2 * model.embed.weight.numel() * patches + 2 * model.head.weight.numel()
    for block in model.blocks:
        total += (2 * matmul_weights(block) * patches
                  + attention_flops(block.attention, patches, False))
    return total


def _curriculum(config: Mapping):
    from ..data.regression import Curriculum

    data = config["data"]
    return Curriculum(
        dims_start=data["curriculum_dims_start"] or data["dims"], dims_end=data["dims"],
        points_start=data["curriculum_points_start"] or data["points"],
        points_end=data["points"], interval=data["curriculum_interval"])


def regression_tokens(config: Mapping, steps: int) -> int:
    """Tokens (2 per point) of the first `steps` steps of an in-context regression run."""
    curriculum, batch = _curriculum(config), config["train"]["batch_size"]
    return sum(batch * 2 * curriculum.at(step)[1] for step in range(steps))


def regression_flops(config: Mapping, model: nn.Module) -> Callable[[int], int]:
    """For an in-context regression run: steps -> training FLOPs of its first `steps`
    steps, following the curriculum's prompt length (2 tokens per point)."""
    batch, curriculum = config["train"]["batch_size"], _curriculum(config)
    per_points: Dict[int, int] = {}

    def step_flops(step: int) -> int:
        points = curriculum.at(step)[1]
        if points not in per_points:
            per_points[points] = TRAINING_PASSES * batch * forward_flops(
                model, 2 * points, causal=True)
        return per_points[points]

    def cumulative(steps: int) -> int:
        return sum(step_flops(step) for step in range(steps))

    return cumulative


def training_flop_counter(config: Mapping) -> Callable[[int], int]:
    """steps -> training FLOPs of a run of `config` (every family of train/config.py)."""
    family = config["run"]["family"]
    from ..models import (CausalLM, InContextRegressor, MaskedLM, NeighbourRetriever,
                          PatchForecaster)
    from ..train.tasks import model_options, vision_model

    data, batch = config["data"], config["train"]["batch_size"]
    if family == "vit":
        per_step = TRAINING_PASSES * batch * vit_forward_flops(vision_model(config))
        return lambda steps: steps * per_step
    if family == "forecast":
        from ..data.ett import COLUMNS  # every window forecasts each channel on its own

        model = PatchForecaster(data["context"], data["horizon"], config["model"]["patch"],
                                **model_options(config))
        per_step = TRAINING_PASSES * batch * len(COLUMNS) * forecaster_forward_flops(model)
        return lambda steps: steps * per_step
    if family in ("lm", "mlm"):
        vocab = 256 if data["tokenizer"] == "byte" else data["vocab_size"]
        language = CausalLM if family == "lm" else MaskedLM
        model = language(vocab, data["length"], **model_options(config),
                         position_embedding=config["model"]["position_embedding"])
        per_step = TRAINING_PASSES * batch * forward_flops(
            model, data["length"], causal=family == "lm")
        return lambda steps: steps * per_step
    if family == "retrieval":
        model = NeighbourRetriever(data["dims"], data["keys"], **model_options(config))
        # the label readout multiplies the query's row only, not each key's
        readout_on_keys = 2 * model.read_out.weight.numel() * data["keys"]
        per_step = TRAINING_PASSES * batch * (
            forward_flops(model, data["keys"] + 1, causal=False) - readout_on_keys)
        return lambda steps: steps * per_step
    model = InContextRegressor(data["dims"], data["points"], **model_options(config))
    return regression_flops(config, model)


def exact_attention_flops(N: int, M: int, H: int, D: int, Dv: int) -> int:
    """Non-causal exact attention of one batch entry: 2 N M H (D + Dv), the model of
    exact_attention_forward_cost (include/subquad/exact.h)."""
    return 2 * N * M * H * (D + Dv)


def _split(count: int, parts: int, part: int) -> int:
    """The size of part `part` of `count` items split into `parts` near-equal parts
    (src/wildcat/wildcat.cpp's split)."""
    return count // parts + (part < count % parts)


def wildcat_flops(N: int, M: int, H: int, Hkv: int, D: int, Dv: int, rank: int, bins: int,
                  method: str = "wildcat") -> int:
    """WildCat coreset attention of one batch entry, per bin of n keys and r_c points
    wildcat_attention_cost's per-(batch, kv head) terms (include/subquad/wildcat.h): RPC
    residual updates n r_c^2, kernel rows 2 n r_c D, Nystrom values 2 n r_c (Dv + 1); then
    2 N r (D + Dv + 1) per query head over the r points of every bin. The keys and the
    rank are split into min(bins, M) near-equal bins as the kernel splits them; a bin
    whose rank covers it keeps its keys (no compression), and uniform_subsample only
    samples (no compression FLOPs); wildcat_attention_cost counts the same."""
    parts = max(1, min(bins, M))
    compress, points = 0, 0
    for part in range(parts):
        n, r = _split(M, parts, part), _split(rank, parts, part)
        if r >= n:
            points += n
            continue
        points += r
        if method != "uniform_subsample":
            compress += n * r * r + 2 * n * r * D + 2 * n * r * (Dv + 1)
    return Hkv * compress + H * 2 * N * points * (D + Dv + 1)
