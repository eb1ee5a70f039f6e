"""CAT bindings against subquad.reference (float64): circulant (roll and conv),
averaged-key and causal variants, backward by finite differences of the reference, the
causal decoder."""

import numpy as np
import pytest
from conftest import assert_close, numeric_gradient, reference_of

import subquad
from subquad import reference


def cat_reference(z, v, convention="roll"):
    return reference_of(reference.cat, z, v, convention=convention)


def avgkey_reference(q, k, v, scale=None, convention="roll"):
    return reference_of(reference.cat_avgkey, q, k, v, scale=scale, convention=convention)


def causal_reference(z, v):
    return reference_of(reference.cat_causal, z, v)


def cat_inputs(rng, B, N, H, Dv, dtype, z_range=2.0):
    return ((z_range * rng.standard_normal((B, N, H))).astype(dtype),
            rng.standard_normal((B, N, H, Dv)).astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("convention", ["roll", "conv"])
@pytest.mark.parametrize("path", ["automatic", "direct", "fft"])
@pytest.mark.parametrize("N", [1, 7, 32])
def test_forward_matches_dense_circulant(rng, dtype, convention, path, N):
    z, v = cat_inputs(rng, 2, N, 3, 4, dtype)
    out = subquad.cat_forward(z, v, convention=convention, path=path)
    assert out.dtype == dtype and out.shape == v.shape
    assert_close(out, cat_reference(z, v, convention), dtype)


@pytest.mark.parametrize("convention", ["roll", "conv"])
def test_backward_matches_finite_differences(rng, convention):
    z, v = cat_inputs(rng, 1, 6, 2, 3, np.float64)
    dout = rng.standard_normal(v.shape)
    dz, dv = subquad.cat_backward(z, v, dout, convention=convention)
    dense = lambda: cat_reference(z, v, convention)
    assert_close(dz, numeric_gradient(dense, z, dout), np.float32)
    assert_close(dv, numeric_gradient(dense, v, dout), np.float32)
    dz32, dv32 = subquad.cat_backward(*(x.astype(np.float32) for x in (z, v, dout)),
                                      convention=convention, path="fft")
    assert_close(dz32, dz, np.float32)
    assert_close(dv32, dv, np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("options", [dict(), dict(scale=0.3, convention="conv")])
def test_avgkey(rng, dtype, options):
    q = rng.standard_normal((2, 9, 2, 5)).astype(dtype)
    k = rng.standard_normal((2, 9, 2, 5)).astype(dtype)
    v = rng.standard_normal((2, 9, 2, 3)).astype(dtype)
    out = subquad.cat_avgkey_forward(q, k, v, **options)
    dense = lambda: avgkey_reference(q, k, v, **options)
    assert_close(out, dense(), dtype)
    if dtype == np.float64:
        dout = rng.standard_normal(v.shape)
        grads = subquad.cat_avgkey_backward(q, k, v, dout, **options)
        for x, grad in zip((q, k, v), grads):
            assert_close(grad, numeric_gradient(dense, x, dout), np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("path", ["automatic", "direct"])
@pytest.mark.parametrize("N,z_range", [(1, 1.0), (13, 2.0), (300, 50.0)])
def test_causal_forward(rng, dtype, path, N, z_range):
    z, v = cat_inputs(rng, 1, N, 2, 3, dtype, z_range)
    out = subquad.cat_causal_forward(z, v, path=path)
    assert_close(out, causal_reference(z, v), dtype, scale=4)


def test_causal_backward_matches_finite_differences(rng):
    z, v = cat_inputs(rng, 1, 7, 2, 2, np.float64)
    dout = rng.standard_normal(v.shape)
    out = subquad.cat_causal_forward(z, v)
    dz, dv = subquad.cat_causal_backward(z, v, out, dout)
    dense = lambda: causal_reference(z, v)
    assert_close(dz, numeric_gradient(dense, z, dout), np.float32)
    assert_close(dv, numeric_gradient(dense, v, dout), np.float32)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_causal_decode_reproduces_the_forward(rng, dtype):
    z, v = cat_inputs(rng, 2, 10, 3, 2, dtype)
    full = subquad.cat_causal_forward(z, v)
    # A prefill of 4, then single tokens, each from the prefix of everything seen.
    for first, last in [(0, 4)] + [(i, i + 1) for i in range(4, 10)]:
        out = subquad.cat_causal_decode(z[:, :last], v[:, :last], tokens=last - first)
        assert_close(out, full[:, first:last], np.dtype(dtype), scale=4)
    assert subquad.cat_causal_decode(z, v, tokens=0).shape == (2, 0, 3, 2)
    with pytest.raises(ValueError, match="tokens"):
        subquad.cat_causal_decode(z[:, :3], v[:, :3], tokens=4)
    with pytest.raises(ValueError, match="dtype"):
        subquad.cat_causal_decode(z[:, :1].astype(np.float16), v[:, :1], tokens=1)


def test_strided_views(rng):
    z, v = cat_inputs(rng, 2, 8, 2, 3, np.float64)
    z_t = np.ascontiguousarray(z.transpose(1, 0, 2)).transpose(1, 0, 2)  # only H contiguous
    v_wide = np.concatenate([v, v], axis=-1)[..., :3]
    np.testing.assert_array_equal(subquad.cat_forward(z_t, v_wide), subquad.cat_forward(z, v))


def test_bad_inputs(rng):
    z, v = cat_inputs(rng, 1, 5, 2, 3, np.float64)
    with pytest.raises(ValueError, match="convention"):
        subquad.cat_forward(z, v, convention="lag")
    with pytest.raises(ValueError, match="path"):
        subquad.cat_forward(z, v, path="gpu")
    with pytest.raises(ValueError):
        subquad.cat_forward(z[:, :4], v)
    bad = z.copy()
    bad[0, 1, 1] = np.inf  # propagates (docs/conventions.md): head 1 is NaN, head 0 as it was
    out = subquad.cat_forward(bad, v)
    assert np.isnan(out[:, :, 1]).all()
    np.testing.assert_array_equal(out[:, :, 0], subquad.cat_forward(z, v)[:, :, 0])
    with pytest.raises(ValueError, match="dtype"):
        subquad.cat_causal_forward(z.astype(np.int32), v)
    with pytest.raises(ValueError, match="contiguous"):  # neither N nor Dv contiguous
        subquad.cat_backward(z[:, ::2], v[:, ::2], np.asfortranarray(v)[:, ::2])
    with pytest.raises(ValueError, match="v"):
        subquad.cat_causal_decode(z, v[:, :4], tokens=1)
