"""Exact attention bindings against subquad.reference (float64): forward, backward, merge,
views and errors."""

import numpy as np
import pytest
from conftest import assert_close, reference_gradients, reference_of

import subquad
from subquad import reference


def reference_forward(q, k, v, scale=None, causal=False, window=0):
    return reference_of(reference.exact_attention, q, k, v, scale=scale, causal=causal,
                        window=window)


def reference_backward(q, k, v, dout, scale=None, causal=False, window=0, dlse=None):
    B, N, H, _ = q.shape
    dlse = np.zeros((B, H, N)) if dlse is None else dlse
    return reference_gradients(reference.exact_attention, (q, k, v), (dout, dlse),
                               scale=scale, causal=causal, window=window)


def inputs(rng, B, N, M, H, Hkv, D, Dv, dtype):
    q = rng.standard_normal((B, N, H, D)).astype(dtype)
    k = rng.standard_normal((B, M, Hkv, D)).astype(dtype)
    v = rng.standard_normal((B, M, Hkv, Dv)).astype(dtype)
    return q, k, v


CASES = [
    # B, N, M, H, Hkv, D, Dv, scale, causal, window
    (1, 7, 7, 1, 1, 5, 3, None, False, 0),
    (2, 13, 17, 4, 2, 8, 6, None, True, 0),
    (1, 19, 11, 3, 1, 4, 7, 0.3, True, 0),  # N > M: the first rows see no key
    (2, 16, 16, 2, 2, 9, 9, None, False, 5),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES)
def test_forward_matches_reference(rng, dtype, case):
    B, N, M, H, Hkv, D, Dv, scale, causal, window = case
    q, k, v = inputs(rng, B, N, M, H, Hkv, D, Dv, dtype)
    out, lse = subquad.exact_attention_forward(q, k, v, scale=scale, causal=causal,
                                               window=window)
    assert out.dtype == dtype and lse.dtype == dtype
    assert out.shape == (B, N, H, Dv) and lse.shape == (B, H, N)
    expected_out, expected_lse = reference_forward(q, k, v, scale, causal, window)
    assert_close(out, expected_out, dtype)
    assert_close(lse, expected_lse, dtype)
    assert np.any(out != 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES)
def test_backward_matches_reference(rng, dtype, case):
    B, N, M, H, Hkv, D, Dv, scale, causal, window = case
    q, k, v = inputs(rng, B, N, M, H, Hkv, D, Dv, dtype)
    dout = rng.standard_normal((B, N, H, Dv)).astype(dtype)
    options = dict(scale=scale, causal=causal, window=window)
    out, lse = subquad.exact_attention_forward(q, k, v, **options)
    dq, dk, dv = subquad.exact_attention_backward(q, k, v, out, lse, dout, **options)
    for actual, expected in zip((dq, dk, dv), reference_backward(q, k, v, dout, **options)):
        assert actual.dtype == dtype
        assert_close(actual, expected, dtype, scale=4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES)
def test_backward_with_dlse_matches_reference(rng, dtype, case):
    B, N, M, H, Hkv, D, Dv, scale, causal, window = case
    q, k, v = inputs(rng, B, N, M, H, Hkv, D, Dv, dtype)
    dout = rng.standard_normal((B, N, H, Dv)).astype(dtype)
    dlse = rng.standard_normal((B, H, N)).astype(dtype)
    options = dict(scale=scale, causal=causal, window=window)
    out, lse = subquad.exact_attention_forward(q, k, v, **options)
    grads = subquad.exact_attention_backward(q, k, v, out, lse, dout, dlse=dlse, **options)
    expected = reference_backward(q, k, v, dout, **options, dlse=dlse.astype(np.float64))
    for actual, want in zip(grads, expected):
        assert_close(actual, want, dtype, scale=4)
    with pytest.raises(ValueError, match="dlse"):
        subquad.exact_attention_backward(q, k, v, out, lse, dout, dlse=dlse[:, :, :-1],
                                         **options)


def reference_merge(out_a, lse_a, out_b, lse_b):
    return reference_of(reference.merge_attention, out_a, lse_a, out_b, lse_b)


def test_merge_backward_matches_finite_differences(rng):
    out_a, out_b = rng.standard_normal((2, 2, 5, 3, 4))
    lse_a, lse_b = rng.standard_normal((2, 2, 3, 5))
    dout = rng.standard_normal(out_a.shape)
    dlse = rng.standard_normal(lse_a.shape)
    out, lse = subquad.merge_attention(out_a, lse_a, out_b, lse_b)
    grads = subquad.merge_attention_backward(out_a, lse_a, out_b, lse_b, out, lse, dout=dout,
                                             dlse=dlse)
    args = [out_a, lse_a, out_b, lse_b]

    def loss(values):
        o, l = reference_merge(*values)
        return np.sum(o * dout) + np.sum(l * dlse)

    step = 1e-6
    for index, grad in enumerate(grads):
        numeric = np.zeros_like(args[index])
        for position in np.ndindex(args[index].shape):
            plus = [a.copy() for a in args]
            minus = [a.copy() for a in args]
            plus[index][position] += step
            minus[index][position] -= step
            numeric[position] = (loss(plus) - loss(minus)) / (2 * step)
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)
        assert np.any(grad != 0)
    # No incoming gradients: zeros.
    for grad in subquad.merge_attention_backward(out_a, lse_a, out_b, lse_b, out, lse):
        assert not np.any(grad)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_merge_of_two_key_halves_is_full_attention(rng, dtype):
    q, k, v = inputs(rng, 2, 9, 14, 2, 1, 6, 5, dtype)
    out_a, lse_a = subquad.exact_attention_forward(q, k[:, :5], v[:, :5])
    out_b, lse_b = subquad.exact_attention_forward(q, k[:, 5:], v[:, 5:])
    out, lse = subquad.merge_attention(out_a, lse_a, out_b, lse_b)
    expected_out, expected_lse = reference_forward(q, k, v)
    assert_close(out, expected_out, dtype)
    assert_close(lse, expected_lse, dtype)


def test_merge_with_an_empty_part(rng):
    out_a = rng.standard_normal((1, 3, 2, 4))
    lse_a = rng.standard_normal((1, 2, 3))
    out, lse = subquad.merge_attention(out_a, lse_a, np.zeros_like(out_a),
                                       np.full_like(lse_a, -np.inf))
    np.testing.assert_allclose(out, out_a, rtol=1e-14)
    np.testing.assert_allclose(lse, lse_a, rtol=1e-14)


def test_strided_views_are_read_in_place(rng):
    q, k, v = inputs(rng, 2, 8, 10, 2, 2, 4, 3, np.float64)
    big_q = rng.standard_normal((2, 16, 2, 4))
    big_q[:, ::2] = q
    # k with batch and sequence axes swapped in memory, v a slice of wider rows.
    k_t = np.ascontiguousarray(k.transpose(1, 0, 2, 3)).transpose(1, 0, 2, 3)
    wide_v = rng.standard_normal((2, 10, 2, 8))
    wide_v[..., :3] = v
    out, lse = subquad.exact_attention_forward(big_q[:, ::2], k_t, wide_v[..., :3])
    expected_out, expected_lse = subquad.exact_attention_forward(q, k, v)
    np.testing.assert_array_equal(out, expected_out)
    np.testing.assert_array_equal(lse, expected_lse)


def test_bad_inputs_raise_value_error(rng):
    q, k, v = inputs(rng, 1, 4, 4, 2, 1, 3, 3, np.float64)
    with pytest.raises(ValueError, match="q: expected dtype float32 or float64, got int64"):
        subquad.exact_attention_forward(q.astype(np.int64), k, v)
    with pytest.raises(ValueError, match="float16"):
        subquad.exact_attention_forward(q, k.astype(np.float16), v)
    with pytest.raises(ValueError, match="k: expected dtype float64"):
        subquad.exact_attention_forward(q, k.astype(np.float32), v)
    with pytest.raises(ValueError, match="q: expected 4 dimensions, got 3"):
        subquad.exact_attention_forward(q[0], k, v)
    with pytest.raises(ValueError, match="contiguous"):
        subquad.exact_attention_forward(np.asfortranarray(q), k, v)
    with pytest.raises(ValueError):
        subquad.exact_attention_forward(q, k[..., :2], v)  # head dims differ
    with pytest.raises(ValueError):
        subquad.exact_attention_forward(q[:, :, :1], k[:, :, [0, 0]], v[:, :, [0, 0]])
    with pytest.raises(ValueError, match="threads"):
        subquad.exact_attention_forward(q, k, v, threads=-1)
    out, lse = subquad.exact_attention_forward(q, k, v)
    with pytest.raises(ValueError):
        subquad.exact_attention_backward(q, k, v, out, lse[:, :1], out)
    with pytest.raises(ValueError):
        subquad.merge_attention(out, lse, out[:, :2], lse)
    with pytest.raises(TypeError):
        subquad.exact_attention_forward(q.tolist(), k, v)


def test_concurrent_calls_from_python_threads(rng):
    # The GIL is released inside kernels: calls from several threads run side by side and
    # give the same results as sequential calls.
    from concurrent.futures import ThreadPoolExecutor

    problems = [inputs(rng, 1, 64, 64, 2, 2, 16, 16, np.float32) for _ in range(4)]
    expected = [subquad.exact_attention_forward(*p, threads=1)[0] for p in problems]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda p: subquad.exact_attention_forward(*p, threads=1)[0],
                                problems))
    for result, reference in zip(results, expected):
        np.testing.assert_array_equal(result, reference)
