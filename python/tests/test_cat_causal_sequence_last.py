"""Causal CAT on sequence-last memory: v, dout [B, N, H, Dv] views of [B, H, Dv, N] arrays and
z [B, N, H] views of [B, H, N], read in place (NumPy and torch), against the same call on
contiguous arrays and a dense causal reference; outputs come back in the inputs' layout."""

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


def causal_reference(z, v):
    """out[i] = sum_{k <= i} exp(z[k]) v[i - k] / sum_{k <= i} exp(z[k]), densely."""
    N = z.shape[1]
    i, k = np.arange(N)[:, None], np.arange(N)[None, :]
    logits = np.where(k <= i, z[:, None, :, :].transpose(0, 3, 1, 2), -np.inf)  # [B, H, i, k]
    weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    lagged = v[:, np.clip(i - k, 0, N - 1)]  # [B, i, k, H, Dv]
    return np.einsum("bhik,bikhd->bihd", weights, lagged)


@pytest.mark.parametrize("N", [1, 7, 97, 300])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_contiguous_inputs(rng, N, dtype):
    B, H, Dv = 2, 3, 5
    z = rng.standard_normal((B, N, H)).astype(dtype)
    v = rng.standard_normal((B, N, H, Dv)).astype(dtype)
    dout = rng.standard_normal((B, N, H, Dv)).astype(dtype)
    zl, vl, gl = sequence_last(z), sequence_last(v), sequence_last(dout)
    assert is_sequence_last(vl) or N == 1

    out = subquad.cat_causal_forward(zl, vl)
    assert N == 1 or is_sequence_last(out)
    expected = subquad.cat_causal_forward(z, v)
    assert_close(out, expected, dtype, scale=4)  # the same arithmetic in both layouts
    assert_close(out, causal_reference(z.astype(np.float64), v.astype(np.float64)), dtype,
                 scale=4)
    dz, dv = subquad.cat_causal_backward(zl, vl, out, gl)
    assert N == 1 or (is_sequence_last(dv) and dz.strides[1] == dz.itemsize)
    dz_c, dv_c = subquad.cat_causal_backward(z, v, expected, dout)
    assert_close(dz, dz_c, dtype, scale=4)
    assert_close(dv, dv_c, dtype, scale=4)
    assert np.any(dv != 0)


def test_mixed_layouts(rng):
    z = rng.standard_normal((1, 33, 2))
    v = rng.standard_normal((1, 33, 2, 4))
    dout = rng.standard_normal((1, 33, 2, 4))
    expected = subquad.cat_causal_forward(z, v)
    dz_c, dv_c = subquad.cat_causal_backward(z, v, expected, dout)
    assert_close(subquad.cat_causal_forward(z, sequence_last(v)), expected, np.float64)
    assert_close(subquad.cat_causal_forward(sequence_last(z), v), expected, np.float64)
    dz, dv = subquad.cat_causal_backward(z, sequence_last(v), expected, sequence_last(dout))
    assert_close(dz, dz_c, np.float64)
    assert_close(dv, dv_c, np.float64)


def test_neither_axis_contiguous_is_refused(rng):
    z = rng.standard_normal((1, 16, 2))
    v = np.asfortranarray(rng.standard_normal((1, 16, 2, 3)))[:, ::2]
    with pytest.raises(ValueError, match="sequence dimension 1"):
        subquad.cat_causal_forward(z[:, ::2], v)


def test_torch_permuted_tensors_are_read_in_place(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import subquad.torch as st
    from subquad.torch import functional

    B, H, Dv, N = 1, 3, 6, 200
    zl = torch.randn(B, H, N, dtype=torch.float64, requires_grad=True)       # [B, H, N]
    vl = torch.randn(B, H, Dv, N, dtype=torch.float64, requires_grad=True)   # [B, H, Dv, N]
    z, v = zl.transpose(1, 2), vl.permute(0, 3, 1, 2)                        # [B, N, H(, Dv)]
    # The views reach _core as they are (the same memory, no copy), and _core saw them
    # sequence-last: out comes back in that layout.
    assert functional._sequence_array(v).data_ptr() == vl.data_ptr()
    assert functional._sequence_array(z).data_ptr() == zl.data_ptr()
    out = st.cat_causal(z, v)
    assert out.shape == (B, N, H, Dv) and out.stride(1) == 1
    zc = z.detach().contiguous().requires_grad_()
    vc = v.detach().contiguous().requires_grad_()
    expected = st.cat_causal(zc, vc)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    # A sequence-last incoming gradient is read in place too; dv comes back like v.
    dout_l = torch.randn(B, H, Dv, N, dtype=torch.float64)
    dout = dout_l.permute(0, 3, 1, 2)
    assert functional._sequence_grad(dout, out).data_ptr() == dout_l.data_ptr()
    out.backward(dout)
    expected.backward(dout.contiguous())
    assert vl.grad.is_contiguous()
    torch.testing.assert_close(zl.grad.transpose(1, 2), zc.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(vl.grad.permute(0, 3, 1, 2), vc.grad, rtol=0, atol=1e-12)
