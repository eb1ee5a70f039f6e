"""Non-causal CAT on sequence-last memory: v, dout [B, N, H, Dv] views of [B, H, Dv, N] arrays
and z [B, N, H] views of [B, H, N], read in place (NumPy and torch), against the same call on
contiguous arrays and the dense reference; outputs come back in the inputs' layout."""

import numpy as np
import pytest
from conftest import assert_close

import subquad


def sequence_last(x):
    """x [B, N, H, Dv] or [B, N, H] as a view of sequence-last memory, equal values."""
    order = (0, 2, 3, 1) if x.ndim == 4 else (0, 2, 1)
    back = (0, 3, 1, 2) if x.ndim == 4 else (0, 2, 1)
    return np.ascontiguousarray(x.transpose(order)).transpose(back)


def is_sequence_last(x):
    return x.strides[1] == x.itemsize and x.strides[-1] != x.itemsize


def dense_reference(z, v, convention):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    s = e / e.sum(axis=1, keepdims=True)  # [B, N, H]
    N = z.shape[1]
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    index = (j - i) % N if convention == "roll" else (i - j) % N
    return np.einsum("bijh,bjhd->bihd", s[:, index, :], v)


@pytest.mark.parametrize("convention", ["roll", "conv"])
@pytest.mark.parametrize("N", [1, 7, 24, 97, 256])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_contiguous_inputs(rng, convention, N, dtype):
    B, H, Dv = 2, 3, 5
    z = rng.standard_normal((B, N, H)).astype(dtype)
    v = rng.standard_normal((B, N, H, Dv)).astype(dtype)
    dout = rng.standard_normal((B, N, H, Dv)).astype(dtype)
    zl, vl, gl = sequence_last(z), sequence_last(v), sequence_last(dout)
    assert is_sequence_last(vl) or N == 1

    out = subquad.cat_forward(zl, vl, convention=convention)
    assert N == 1 or is_sequence_last(out)
    assert_close(out, subquad.cat_forward(z, v, convention=convention), dtype, scale=4)
    assert_close(out, dense_reference(z.astype(np.float64), v.astype(np.float64), convention),
                 dtype, scale=4)
    dz, dv = subquad.cat_backward(zl, vl, gl, convention=convention)
    assert N == 1 or (is_sequence_last(dv) and dz.strides[1] == dz.itemsize)
    dz_c, dv_c = subquad.cat_backward(z, v, dout, convention=convention)
    assert_close(dz, dz_c, dtype, scale=4)
    assert_close(dv, dv_c, dtype, scale=4)
    assert np.any(dv != 0)


def test_mixed_layouts(rng):
    z = rng.standard_normal((1, 33, 2))
    v = rng.standard_normal((1, 33, 2, 4))
    expected = subquad.cat_forward(z, v)
    assert_close(subquad.cat_forward(z, sequence_last(v)), expected, np.float64)
    assert_close(subquad.cat_forward(sequence_last(z), v), expected, np.float64)


def test_neither_axis_contiguous_is_refused(rng):
    z = rng.standard_normal((1, 16, 2))
    v = np.asfortranarray(rng.standard_normal((1, 16, 2, 3)))[:, ::2]
    with pytest.raises(ValueError, match="sequence dimension 1"):
        subquad.cat_forward(z[:, ::2], v)


def test_torch_permuted_tensors_are_read_in_place(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import subquad.torch as st
    from subquad.torch import functional

    B, H, Dv, N = 1, 3, 6, 50
    zl = torch.randn(B, H, N, dtype=torch.float64, requires_grad=True)       # [B, H, N]
    vl = torch.randn(B, H, Dv, N, dtype=torch.float64, requires_grad=True)   # [B, H, Dv, N]
    z, v = zl.transpose(1, 2), vl.permute(0, 3, 1, 2)                        # [B, N, H(, Dv)]
    # The views reach _core as they are: the same memory, no copy.
    assert functional._sequence_array(v).data_ptr() == vl.data_ptr()
    assert functional._sequence_array(z).data_ptr() == zl.data_ptr()
    out = st.cat(z, v)
    assert out.shape == (B, N, H, Dv) and out.stride(1) == 1
    zc = z.detach().contiguous().requires_grad_()
    vc = v.detach().contiguous().requires_grad_()
    expected = st.cat(zc, vc)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    dout = torch.randn(B, N, H, Dv, dtype=torch.float64)
    out.backward(dout)
    expected.backward(dout)
    torch.testing.assert_close(zl.grad.transpose(1, 2), zc.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(vl.grad.permute(0, 3, 1, 2), vc.grad, rtol=0, atol=1e-12)
