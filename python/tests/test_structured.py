"""Structured attention bindings against subquad.reference (float64): MLR attention and its
decoder, bilinear MLR and BTT projections (capping and LayerNorm included), MLBTC maps."""

import numpy as np
import pytest
from conftest import assert_close, numeric_gradient, reference_of

import subquad
from subquad import reference


# ---- MLR attention ----------------------------------------------------------------------

def mlr_reference(q, k, v, ranks, causal=False, block_divide=False):
    return reference_of(reference.mlr_attention_with_lse, q, k, v, ranks=ranks, causal=causal,
                        block_divide=block_divide)


def mlr_inputs(rng, B, T, H, Hkv, D, Dv, dtype):
    return (rng.standard_normal((B, T, H, D)).astype(dtype),
            rng.standard_normal((B, T, Hkv, D)).astype(dtype),
            rng.standard_normal((B, T, Hkv, Dv)).astype(dtype))


MLR_CASES = [
    # B, T, H, Hkv, ranks, Dv, causal, block_divide
    (1, 8, 2, 1, [2, 2, 1], 3, False, False),
    (2, 12, 2, 2, [3, 2], 4, True, True),
    (1, 16, 3, 1, [1, 1, 1, 1], 2, True, False),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", MLR_CASES)
def test_mlr_forward_matches_reference(rng, dtype, case):
    B, T, H, Hkv, ranks, Dv, causal, block_divide = case
    q, k, v = mlr_inputs(rng, B, T, H, Hkv, sum(ranks), Dv, dtype)
    options = dict(ranks=ranks, causal=causal, block_divide=block_divide)
    out, lse = subquad.mlr_attention_forward(q, k, v, **options)
    expected_out, expected_lse = mlr_reference(q, k, v, **options)
    assert out.dtype == dtype and out.shape == (B, T, H, Dv) and lse.shape == (B, H, T)
    assert_close(out, expected_out, dtype)
    assert_close(lse, expected_lse, dtype)


@pytest.mark.parametrize("case", MLR_CASES[:2])
def test_mlr_backward_matches_finite_differences(rng, case):
    B, T, H, Hkv, ranks, Dv, causal, block_divide = case
    q, k, v = mlr_inputs(rng, 1, T, H, Hkv, sum(ranks), Dv, np.float64)
    options = dict(ranks=ranks, causal=causal, block_divide=block_divide)
    dout = rng.standard_normal((1, T, H, Dv))
    out, lse = subquad.mlr_attention_forward(q, k, v, **options)
    grads = subquad.mlr_attention_backward(q, k, v, out, lse, dout, **options)
    for x, grad in zip((q, k, v), grads):
        expected = numeric_gradient(lambda: mlr_reference(q, k, v, **options)[0], x, dout)
        assert_close(grad, expected, np.float32)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_mlr_decode_reproduces_the_causal_forward(rng, dtype):
    ranks, T, Dv = [2, 1, 1], 8, 3
    q, k, v = mlr_inputs(rng, 2, T, 2, 1, sum(ranks), Dv, dtype)
    full, _ = subquad.mlr_attention_forward(q, k, v, ranks=ranks, causal=True)
    sizes = subquad.mlr_level_block_sizes(ranks, T)
    assert sizes == [8, 4, 2]
    levels = [np.zeros((2, 1, size, r), dtype) for size, r in zip(sizes, ranks)]
    offsets = np.cumsum([0] + ranks)
    for t in range(T):  # store token t's keys, then decode it
        for level, size, a, b in zip(levels, sizes, offsets[:-1], offsets[1:]):
            level[:, :, t % size] = k[:, t, :, a:b]
        out = subquad.mlr_decode(q[:, t:t + 1], levels, v[:, :t + 1], ranks=ranks, context=T)
        assert_close(out, full[:, t:t + 1], np.dtype(dtype), scale=4)
    assert sum(level[0, 0].size for level in levels) == subquad.mlr_key_cache_prediction(T, ranks)
    # Tokens 6 and 7 share the finest block of 2; 5 and 6 do not.
    assert_close(subquad.mlr_decode(q[:, 6:], levels, v, ranks=ranks, context=T), full[:, 6:],
                 np.dtype(dtype), scale=4)
    with pytest.raises(ValueError, match="finest level"):
        subquad.mlr_decode(q[:, 5:7], levels, v[:, :7], ranks=ranks, context=T)
    with pytest.raises(ValueError, match="level_keys"):
        subquad.mlr_decode(q[:, 7:], levels[:2], v, ranks=ranks, context=T)
    with pytest.raises(ValueError, match="dtype"):
        subquad.mlr_decode(q[:, 7:].astype(np.float16), levels, v, ranks=ranks, context=T)


def test_mlr_cost_models():
    assert subquad.mlr_score_macs(8, [2, 2]) == 64 * (2 + 2 / 2)
    assert subquad.mlr_key_cache_prediction(8, [2, 2]) == 8 * (2 + 2 / 2)


def test_mlr_bad_inputs(rng):
    q, k, v = mlr_inputs(rng, 1, 6, 1, 1, 3, 2, np.float64)
    with pytest.raises(ValueError):
        subquad.mlr_attention_forward(q, k, v, ranks=[1, 1])  # sum != D
    with pytest.raises(ValueError):
        subquad.mlr_attention_forward(q, k, v, ranks=[1, 1, 1])  # 6 not divisible by 4
    with pytest.raises(TypeError):
        subquad.mlr_attention_forward(q, k, v)  # ranks is required
    out, lse = subquad.mlr_attention_forward(q, k, v, ranks=[3])
    with pytest.raises(ValueError, match="contiguous"):
        subquad.mlr_attention_backward(q, k, v, out, lse, np.asfortranarray(out), ranks=[3])


# ---- projections -------------------------------------------------------------------------

def bilinear_reference(x, weights, ranks, heads, level_scale=(), layer_norm_on=True,
                       rms_cap=True):
    return reference_of(lambda x, *w, **options: reference.bilinear_mlr_project(x, w, **options),
                        x, *weights, ranks=ranks, heads=heads, level_scale=level_scale,
                        layer_norm=layer_norm_on, rms_cap=rms_cap)


def btt_reference(x, w1, w2, heads, rank, layer_norm_on=True, rms_cap=True):
    return reference_of(reference.btt_project, x, w1, w2, heads=heads, rank=rank,
                        layer_norm=layer_norm_on, rms_cap=rms_cap)


def bilinear_inputs(rng, B, N, Dm, ranks, heads, dtype):
    x = rng.standard_normal((B, N, Dm)).astype(dtype)
    weights = [rng.standard_normal((2**l, Dm // 2**l, heads * r)).astype(dtype)
               for l, r in enumerate(ranks)]
    return x, weights


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("options", [
    dict(ranks=[2, 1], heads=2),
    dict(ranks=[1, 2, 1], heads=1, level_scale=[0.5, 2.0, 1.5], rms_cap=False),
    dict(ranks=[3], heads=3, layer_norm=False),
])
def test_bilinear_mlr_projection(rng, dtype, options):
    x, weights = bilinear_inputs(rng, 2, 3, 8, options["ranks"], options["heads"], dtype)
    y = subquad.bilinear_mlr_project_forward(x, weights, **options)
    reference_options = dict(options)
    reference_options["layer_norm_on"] = reference_options.pop("layer_norm", True)
    dense = lambda: bilinear_reference(x, weights, **reference_options)
    assert y.shape == (2, 3, options["heads"], subquad.bilinear_mlr_output_dim(options["ranks"]))
    assert_close(y, dense(), dtype)

    dy = rng.standard_normal(y.shape).astype(dtype)
    dx, dweights = subquad.bilinear_mlr_project_backward(x, weights, dy, **options)
    assert len(dweights) == len(weights)
    if dtype == np.float64:
        assert_close(dx, numeric_gradient(dense, x, dy), np.float32)
        for w, dw in zip(weights, dweights):
            assert_close(dw, numeric_gradient(dense, w, dy), np.float32)


def test_bilinear_helpers():
    assert subquad.bilinear_mlr_output_dim([3, 2, 1]) == 3 + 4 + 4
    np.testing.assert_allclose(subquad.bilinear_mlr_level_scales([4, 2]), [0.5, 0.5])
    np.testing.assert_allclose(subquad.bilinear_mlr_level_scales([4, 2], mup=True), [2, 2])
    assert subquad.rms_cap_limit(16, 4) == pytest.approx(2 / 16)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("D,heads,rank,layer_norm_on", [(6, 2, 1, True), (12, 1, 2, False)])
def test_btt_projection(rng, dtype, D, heads, rank, layer_norm_on):
    a, b = subquad.btt_factors(D)
    assert a * b == D and b > np.sqrt(D)
    x = rng.standard_normal((2, 3, D)).astype(dtype)
    w1 = rng.standard_normal((a, b, heads * b * rank)).astype(dtype)
    w2 = rng.standard_normal((heads * b, a, a * rank)).astype(dtype)
    options = dict(heads=heads, rank=rank, layer_norm=layer_norm_on)
    y = subquad.btt_project_forward(x, w1, w2, **options)
    dense = lambda: btt_reference(x, w1, w2, heads, rank, layer_norm_on)
    assert y.shape == (2, 3, heads, D)
    assert_close(y, dense(), dtype)

    dy = rng.standard_normal(y.shape).astype(dtype)
    dx, dw1, dw2 = subquad.btt_project_backward(x, w1, w2, dy, **options)
    if dtype == np.float64:
        for t, grad in ((x, dx), (w1, dw1), (w2, dw2)):
            assert_close(grad, numeric_gradient(dense, t, dy), np.float32)


def test_projection_bad_inputs(rng):
    x, weights = bilinear_inputs(rng, 1, 2, 8, [2, 1], 1, np.float64)
    with pytest.raises(ValueError, match="weights"):
        subquad.bilinear_mlr_project_forward(x, weights[:1], ranks=[2, 1])
    with pytest.raises(ValueError, match="contiguous"):
        strided = [np.concatenate([w, w], axis=0)[::2] for w in weights]
        subquad.bilinear_mlr_project_forward(x, strided, ranks=[2, 1])
    with pytest.raises(ValueError, match="dtype"):
        subquad.bilinear_mlr_project_forward(x, [w.astype(np.float32) for w in weights],
                                             ranks=[2, 1])
    with pytest.raises(ValueError):
        subquad.btt_project_forward(x[..., :6], np.zeros((2, 3, 3)), np.zeros((3, 2, 3)))


# ---- MLBTC -------------------------------------------------------------------------------

def mlbtc_level_reference(x, n, m, level):
    pR, c, pL = level.right_blocks, level.right_cols, level.left_blocks
    R = np.array(level.right).reshape(pR, n // pR, c)
    u = np.einsum("kit,ki->kt", R, x.reshape(pR, n // pR)).reshape(-1)
    w = u[level.right_perm] if len(level.right_perm) else u
    L = np.array(level.left).reshape(pL, m // pL, pR * c // pL)
    z = np.einsum("kot,kt->ko", L, w.reshape(pL, -1)).reshape(-1)
    return level.alpha * (z[level.left_perm] if len(level.left_perm) else z)


def test_mlbtc_map(rng):
    n, m = 6, 4
    levels = [
        subquad.MlbtcLevel(alpha=0.5, right=list(rng.standard_normal(n * 2)), right_cols=2,
                           left=list(rng.standard_normal(m * 2))),
        subquad.MlbtcLevel(right=list(rng.standard_normal(n * 2)), right_blocks=2,
                           right_cols=2, right_perm=[3, 1, 0, 2],
                           left=list(rng.standard_normal(m * 2)), left_blocks=2,
                           left_perm=[1, 0, 3, 2]),
    ]
    mlbtc = subquad.MlbtcMap(n, m, levels)
    assert (mlbtc.in_dim, mlbtc.out_dim) == (n, m)
    x = rng.standard_normal(n)
    expected = sum(mlbtc_level_reference(x, n, m, level) for level in levels)
    np.testing.assert_allclose(mlbtc.apply(x), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mlbtc.dense() @ x, expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError):
        mlbtc.apply(x[:5])
    with pytest.raises(ValueError, match="float64"):
        mlbtc.apply(x.astype(np.float32))
    with pytest.raises(ValueError):
        subquad.MlbtcMap(n + 1, m, levels)
