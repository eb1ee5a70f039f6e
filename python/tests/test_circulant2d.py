"""2D Circulant Attention bindings against a dense NumPy BCCB reference."""

import numpy as np
import pytest
from conftest import assert_close, numeric_gradient

import subquad


def reference(q, k, v, scale_mode="paper", scale=None):
    """Dense loops over the grid shifts: logits a [B, H, Hg, Wg], weights s, out."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    B, Hg, Wg, H, D = q.shape
    N = Hg * Wg
    if scale is None:
        scale = 1 / np.sqrt(N) if scale_mode == "code" else 1 / (N * np.sqrt(D))
    a = np.zeros((B, H, Hg, Wg))
    for mi in range(Hg):
        for mj in range(Wg):
            shifted = np.roll(k, (-mi, -mj), axis=(1, 2))  # shifted[n] = k[n + m]
            a[:, :, mi, mj] = scale * np.einsum("bijhd,bijhd->bh", q, shifted)
    s = np.exp(a - a.max(axis=(2, 3), keepdims=True))
    s /= s.sum(axis=(2, 3), keepdims=True)
    out = np.zeros(v.shape[:4] + (v.shape[4],))
    for ni in range(Hg):
        for nj in range(Wg):
            shifted = np.roll(v, (-ni, -nj), axis=(1, 2))  # shifted[i] = v[i + n]
            out += s[:, :, ni, nj].transpose(0, 1)[:, None, None, :, None] * shifted
    return out, s


def grid_inputs(rng, B, Hg, Wg, H, D, Dv, dtype):
    q = rng.standard_normal((B, Hg, Wg, H, D)).astype(dtype)
    k = rng.standard_normal((B, Hg, Wg, H, D)).astype(dtype)
    v = rng.standard_normal((B, Hg, Wg, H, Dv)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,options", [
    ((1, 3, 5, 2, 4, 3), dict()),
    ((2, 4, 4, 3, 1, 2), dict(scale_mode="code")),
    ((1, 1, 7, 1, 3, 5), dict(scale=0.4)),
])
def test_forward_matches_dense_reference(rng, dtype, shape, options):
    q, k, v = grid_inputs(rng, *shape, dtype)
    out, weights = subquad.circulant2d_forward(q, k, v, **options)
    expected_out, expected_weights = reference(q, k, v, **options)
    assert out.dtype == dtype and out.shape == v.shape
    assert_close(out, expected_out, dtype)
    assert_close(weights, expected_weights, dtype)
    np.testing.assert_allclose(weights.sum(axis=(2, 3)), 1, rtol=1e-5)


@pytest.mark.parametrize("options", [dict(), dict(scale_mode="code")])
def test_backward_matches_finite_differences(rng, options):
    q, k, v = grid_inputs(rng, 1, 2, 3, 2, 2, 2, np.float64)
    dout = rng.standard_normal(v.shape)
    dq, dk, dv = subquad.circulant2d_backward(q, k, v, dout, **options)
    for x, grad in ((q, dq), (k, dk), (v, dv)):
        expected = numeric_gradient(lambda: reference(q, k, v, **options)[0], x, dout)
        assert_close(grad, expected, np.float32)  # finite differences: ~1e-9 absolute

    dq32, dk32, dv32 = subquad.circulant2d_backward(
        *(x.astype(np.float32) for x in (q, k, v, dout)), **options)
    for grad32, grad in ((dq32, dq), (dk32, dk), (dv32, dv)):
        assert grad32.dtype == np.float32
        assert_close(grad32, grad, np.float32)


def test_scale_and_grid_helpers():
    assert subquad.circulant2d_scale(16, 4) == pytest.approx(1 / (16 * 2))
    assert subquad.circulant2d_scale(16, 4, scale_mode="code") == pytest.approx(1 / 4)
    assert subquad.circulant2d_scale(16, 4, scale=0.5) == 0.5
    assert subquad.circulant2d_grid_for_tokens(4096) == (64, 64)
    assert subquad.circulant2d_grid_for_tokens(12) == (3, 4)
    assert subquad.circulant2d_grid_for_tokens(13) == (1, 13)


def test_strided_views(rng):
    q, k, v = grid_inputs(rng, 2, 3, 4, 2, 3, 2, np.float64)
    wide = np.concatenate([q, q], axis=-1)[..., :3]  # last dim contiguous, rows strided
    out, _ = subquad.circulant2d_forward(wide, k, v[::-1][::-1])
    expected, _ = subquad.circulant2d_forward(q, k, v)
    np.testing.assert_array_equal(out, expected)


def test_bad_inputs(rng):
    q, k, v = grid_inputs(rng, 1, 2, 3, 1, 2, 2, np.float64)
    with pytest.raises(ValueError, match="scale_mode"):
        subquad.circulant2d_forward(q, k, v, scale_mode="orthonormal")
    with pytest.raises(ValueError, match="5 dimensions"):
        subquad.circulant2d_forward(q[0], k, v)
    with pytest.raises(ValueError):
        subquad.circulant2d_forward(q, k[:, :1], v)
    with pytest.raises(ValueError, match="dtype"):
        subquad.circulant2d_forward(q.astype(np.float32), k, v)
    bad = q.copy()
    bad[0, 0, 0, 0, 0] = np.nan  # propagates (docs/conventions.md): its head is NaN
    out, weights = subquad.circulant2d_forward(bad, k, v)
    assert np.isnan(out).all() and np.isnan(weights).all()
    with pytest.raises(ValueError, match="contiguous"):
        subquad.circulant2d_backward(q, k, v, np.asfortranarray(v))
    with pytest.raises(ValueError):
        subquad.circulant2d_grid_for_tokens(0)
