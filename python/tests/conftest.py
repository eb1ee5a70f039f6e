"""Shared fixtures of the subquad Python tests: seeded random arrays and tolerances."""

import numpy as np
import pytest

# float32 results are compared with a float64 NumPy reference: a few units of float32
# round-off per accumulated term, scaled by the size of the values.
F32_TOL = 2e-5
F64_TOL = 1e-10


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def tolerance(dtype):
    return F32_TOL if np.dtype(dtype) == np.float32 else F64_TOL


def assert_close(actual, expected, dtype, scale=1.0):
    """Max-abs comparison relative to the magnitude of `expected` (floor 1)."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape
    assert np.all(np.isfinite(actual) == np.isfinite(expected))
    finite = np.isfinite(expected)
    bound = tolerance(dtype) * scale * max(1.0, float(np.max(np.abs(expected[finite]), initial=0)))
    error = float(np.max(np.abs(actual[finite] - expected[finite]), initial=0))
    assert error <= bound, f"max abs error {error:.3g} > {bound:.3g}"
    assert np.array_equal(actual[~finite], expected[~finite])


def numeric_gradient(function, x, dout, step=1e-6):
    """d <dout, function(x)> / dx by central differences in float64 (x is perturbed in place
    and restored)."""
    grad = np.zeros_like(x, dtype=np.float64)
    flat = x.reshape(-1)
    for index in range(flat.size):
        saved = flat[index]
        flat[index] = saved + step
        plus = np.sum(dout * function())
        flat[index] = saved - step
        minus = np.sum(dout * function())
        flat[index] = saved
        grad.reshape(-1)[index] = (plus - minus) / (2 * step)
    return grad


def reference_of(function, *arrays, **options):
    """A subquad.reference operator on NumPy arrays, computed in float64 torch: the one
    reference per method, which the binding tests read through NumPy."""
    import torch
    tensors = [torch.from_numpy(np.asarray(a, dtype=np.float64)) for a in arrays]
    with torch.no_grad():
        result = function(*tensors, **options)
    if isinstance(result, tuple):
        return tuple(r.numpy() for r in result)
    return result.numpy()


def reference_gradients(function, arrays, grads, **options):
    """The gradients of a subquad.reference operator with respect to `arrays` for the
    incoming gradients `grads` (one per output), in float64: NumPy in and out."""
    import torch
    from subquad import reference
    tensors = [torch.from_numpy(np.asarray(a, dtype=np.float64)) for a in arrays]
    incoming = tuple(torch.from_numpy(np.asarray(g, dtype=np.float64)) for g in grads)
    result = reference.vjp(function, tensors, incoming if len(incoming) > 1 else incoming[0],
                           **options)
    return tuple(r.numpy() for r in result)
