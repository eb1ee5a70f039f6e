"""The FLOP model of subquad.experiments.flops: counted against hand-written formulas for
the in-context regressor (exact, bilinear MLR, BTT), through the curriculum."""

import pytest

torch = pytest.importorskip("torch")
from subquad.experiments import flops  # noqa: E402
from subquad.models import InContextRegressor, ViTClassifier  # noqa: E402
from subquad.train.config import resolve  # noqa: E402

DIMS, POINTS, DIM, LAYERS = 6, 9, 32, 2
HIDDEN = 4 * DIM  # mlp_ratio 4


def dense_weights(dims: int = DIMS) -> int:
    """Weights of read-in, q/k/v/o and the MLP of every layer, read-out (no biases)."""
    return dims * DIM + LAYERS * (4 * DIM * DIM + 2 * DIM * HIDDEN) + DIM


def test_exact_forward_flops_match_the_formula():
    model = InContextRegressor(DIMS, POINTS, dim=DIM, heads=4, layers=LAYERS)
    assert flops.matmul_weights(model) == dense_weights()  # position table excluded
    length = 2 * POINTS
    pairs = length * (length + 1) // 2
    head_dim = DIM // 4
    expected = 2 * dense_weights() * length + LAYERS * 2 * pairs * 4 * (2 * head_dim)
    assert flops.forward_flops(model, length, causal=True) == expected
    bidirectional = 2 * dense_weights() * length + LAYERS * 2 * length**2 * 4 * 2 * head_dim
    assert flops.forward_flops(model, length, causal=False) == bidirectional


def test_structured_scores_count_their_own_widths():
    exact = InContextRegressor(DIMS, POINTS, dim=DIM, heads=4, layers=LAYERS)
    btt = InContextRegressor(DIMS, POINTS, dim=DIM, heads=4, layers=LAYERS, attention="btt")
    mlr = InContextRegressor(DIMS, POINTS, dim=DIM, heads=4, layers=LAYERS,
                             attention="bilinear-mlr",
                             attention_options={"bilinear-mlr": {"ranks": [4, 2, 1, 1]}})
    for model in (btt, mlr):
        layer = model.blocks[0].attention
        heads, score, value = flops.attention_widths(layer)
        assert (heads, value) == (4, DIM // 4)
        assert score == (DIM if model is btt else 4 + 2 * 2 + 1 * 4 + 1 * 8)
        # the structured weights are used once per token, as a dense matrix's are
        structured = sum(p.numel() for p in layer.parameters() if p.dim() >= 2)
        dense_attention = sum(p.numel() for p in exact.blocks[0].attention.parameters())
        assert flops.matmul_weights(model) == (dense_weights() - LAYERS * dense_attention
                                               + LAYERS * structured)
        length = 2 * POINTS
        pairs = length * (length + 1) // 2
        assert flops.forward_flops(model, length, causal=True) == (
            2 * flops.matmul_weights(model) * length
            + LAYERS * 2 * pairs * heads * (score + value))
    with pytest.raises(ValueError, match="length"):
        flops.forward_flops(exact, 0, causal=True)
    with pytest.raises(ValueError, match="no FLOP model"):
        flops.attention_widths(exact.blocks[0].mlp)


def regression_config(**data):
    return resolve({"run": {"family": "regression"},
                    "data": {"dims": DIMS, "points": POINTS, **data},
                    "model": {"dim": DIM, "heads": 4, "layers": LAYERS},
                    "train": {"steps": 40, "batch_size": 3, "warmup": 2}})


def test_regression_training_flops_follow_the_curriculum():
    config = regression_config(curriculum_dims_start=2, curriculum_points_start=5,
                               curriculum_interval=10)
    counter = flops.training_flop_counter(config)
    model = InContextRegressor(DIMS, POINTS, dim=DIM, heads=4, layers=LAYERS)
    step = {points: 3 * 3 * flops.forward_flops(model, 2 * points, causal=True)
            for points in (5, 7, 9)}  # points 5, 7, 9, 9 over the four intervals
    assert counter(0) == 0
    assert counter(10) == 10 * step[5]
    assert counter(25) == 10 * step[5] + 10 * step[7] + 5 * step[9]
    assert counter(40) == 10 * step[5] + 10 * step[7] + 20 * step[9]
    assert flops.regression_tokens(config, 25) == 3 * 2 * (10 * 5 + 10 * 7 + 5 * 9)
    plain = flops.training_flop_counter(regression_config())
    assert plain(40) == 40 * step[9]


def test_language_models_count_the_tied_readout_and_cat_by_its_transforms():
    import math

    from subquad.models import CausalLM, MaskedLM

    dim, heads, length, vocab = 16, 2, 8, 256
    block = 4 * dim * dim + 2 * dim * 4 * dim  # q, k, v, o and the MLP
    readout = dim * vocab  # tied to the embedding table, still a matmul per token
    exact = CausalLM(vocab, length, dim=dim, heads=heads, layers=1)
    assert flops.matmul_weights(exact) == block + readout
    pairs = length * (length + 1) // 2
    assert flops.forward_flops(exact, length, causal=True) == (
        2 * (block + readout) * length + 2 * pairs * heads * 2 * (dim // heads))
    cat = MaskedLM(vocab, length, dim=dim, heads=heads, layers=1, attention="cat")
    head_dim = dim // heads
    # CAT: W_A (dim -> heads scores), W_V, W_O; readout over vocab + [MASK].
    weights = dim * heads + 2 * dim * dim + 2 * dim * 4 * dim + dim * (vocab + 1)
    assert flops.matmul_weights(cat) == weights
    transform = 2.5 * length * math.log2(length)
    mixing = heads * ((2 * head_dim + 1) * transform + 6 * head_dim * (length // 2 + 1))
    assert flops.forward_flops(cat, length, causal=False) == 2 * weights * length + round(mixing)
    counter = flops.training_flop_counter(resolve({
        "run": {"family": "mlm"}, "data": {"length": length},
        "model": {"dim": dim, "heads": heads, "layers": 1, "attention": "cat"},
        "train": {"batch_size": 3, "steps": 10, "warmup": 0}}))
    assert counter(10) == 10 * 3 * 3 * flops.forward_flops(cat, length, causal=False)


def test_windows_and_mlr_levels_count_only_the_pairs_they_score():
    from subquad.models import CausalLM

    assert flops.query_key_pairs(10, causal=False) == 100
    assert flops.query_key_pairs(10, causal=True) == 55
    assert flops.query_key_pairs(10, causal=True, window=3) == 1 + 2 + 8 * 3
    window = CausalLM(256, 16, dim=16, heads=2, layers=1, attention="sliding-window",
                      attention_options={"sliding-window": {"window": 4}})
    layer = window.blocks[0].attention
    assert flops.attention_flops(layer, 16, causal=True) == 2 * (10 + 12 * 4) * 2 * (8 + 8)
    mlr = CausalLM(256, 16, dim=16, heads=2, layers=1, attention="mlr",
                   attention_options={"mlr": {"ranks": [4, 2, 2]}})
    layer = mlr.blocks[0].attention
    # levels: one block of 16 (136 causal pairs), two of 8 (2 x 36), four of 4 (4 x 10)
    scores = 2 * (4 * 136 + 2 * 72 + 2 * 40)
    assert flops.attention_flops(layer, 16, causal=True) == 2 * (scores + 2 * 136 * 8)


def test_forecasters_count_each_channels_patches_and_the_head_once():
    from subquad.models import PatchForecaster

    context, horizon, patch, dim, heads = 64, 24, 8, 16, 2
    patches = context // patch
    block = 4 * dim * dim + 2 * dim * 4 * dim  # q, k, v, o and the MLP
    embed, head = patch * dim, patches * dim * horizon
    model = PatchForecaster(context, horizon, patch, dim=dim, heads=heads, layers=2)
    attention = 2 * patches**2 * heads * 2 * (dim // heads)  # bidirectional, per layer
    expected = 2 * embed * patches + 2 * (2 * block * patches + attention) + 2 * head
    assert flops.forecaster_forward_flops(model) == expected  # the head once, not per patch
    counter = flops.training_flop_counter(resolve({
        "run": {"family": "forecast"},
        "data": {"dataset": "ETTh1", "context": context, "horizon": horizon},
        "model": {"dim": dim, "heads": heads, "layers": 2, "patch": patch},
        "train": {"batch_size": 3, "steps": 10, "warmup": 0}}))
    assert counter(10) == 10 * 3 * 7 * 3 * expected  # steps x passes x channels x batch


def test_vits_count_the_classifier_of_the_trainer():
    config = resolve({"run": {"family": "vit"}, "model": {"patch": 7, "dim": DIM, "heads": 4,
                      "layers": LAYERS, "pool": "cls"}, "train": {"batch_size": 3}})
    model = ViTClassifier(28, 7, 1, 10, dim=DIM, heads=4, layers=LAYERS, pool="cls")
    counter = flops.training_flop_counter(config)
    assert counter(5) == 5 * 3 * 3 * flops.vit_forward_flops(model) > 0
