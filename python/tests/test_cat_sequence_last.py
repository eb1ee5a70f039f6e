"""CAT and causal CAT on sequence-last memory: v, dout [B, N, H, Dv] views of [B, H, Dv, N]
arrays and z [B, N, H] views of [B, H, N], read in place (NumPy and torch), against the same
call on contiguous arrays and subquad.reference; outputs come back in the inputs' layout."""

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from conftest import assert_close, reference_of

import subquad
from subquad import reference


def sequence_last(x):
    """x [B, N, H, Dv] or [B, N, H] as a view of sequence-last memory, equal values."""
    order = (0, 2, 3, 1) if x.ndim == 4 else (0, 2, 1)
    back = (0, 3, 1, 2) if x.ndim == 4 else (0, 2, 1)
    return np.ascontiguousarray(x.transpose(order)).transpose(back)


def is_sequence_last(x):
    return x.strides[1] == x.itemsize and x.strides[-1] != x.itemsize


def circular_reference(z, v, convention):
    return reference_of(reference.cat, z, v, convention=convention)


def causal_reference(z, v):
    return reference_of(reference.cat_causal, z, v)


@dataclass(frozen=True)
class Operator:
    """One CAT operator under a common signature: backward(z, v, out, dout) -> (dz, dv)."""
    forward: Callable
    backward: Callable
    reference: Callable


OPERATORS = {
    "roll": Operator(lambda z, v: subquad.cat_forward(z, v, convention="roll"),
                     lambda z, v, out, g: subquad.cat_backward(z, v, g, convention="roll"),
                     lambda z, v: circular_reference(z, v, "roll")),
    "conv": Operator(lambda z, v: subquad.cat_forward(z, v, convention="conv"),
                     lambda z, v, out, g: subquad.cat_backward(z, v, g, convention="conv"),
                     lambda z, v: circular_reference(z, v, "conv")),
    "causal": Operator(subquad.cat_causal_forward, subquad.cat_causal_backward,
                       causal_reference),
}


@pytest.mark.parametrize("name", list(OPERATORS))
@pytest.mark.parametrize("N", [1, 7, 24, 97, 256, 300])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_contiguous_inputs(rng, name, N, dtype):
    op = OPERATORS[name]
    B, H, Dv = 2, 3, 5
    z = rng.standard_normal((B, N, H)).astype(dtype)
    v = rng.standard_normal((B, N, H, Dv)).astype(dtype)
    dout = rng.standard_normal((B, N, H, Dv)).astype(dtype)
    zl, vl, gl = sequence_last(z), sequence_last(v), sequence_last(dout)
    assert is_sequence_last(vl) or N == 1

    out = op.forward(zl, vl)
    assert N == 1 or is_sequence_last(out)
    expected = op.forward(z, v)
    assert_close(out, expected, dtype, scale=4)  # the same arithmetic in both layouts
    assert_close(out, op.reference(z.astype(np.float64), v.astype(np.float64)), dtype, scale=4)
    dz, dv = op.backward(zl, vl, out, gl)
    assert N == 1 or (is_sequence_last(dv) and dz.strides[1] == dz.itemsize)
    dz_c, dv_c = op.backward(z, v, expected, dout)
    assert_close(dz, dz_c, dtype, scale=4)
    assert_close(dv, dv_c, dtype, scale=4)
    assert np.any(dv != 0)


@pytest.mark.parametrize("name", list(OPERATORS))
def test_mixed_layouts(rng, name):
    op = OPERATORS[name]
    z = rng.standard_normal((1, 33, 2))
    v = rng.standard_normal((1, 33, 2, 4))
    dout = rng.standard_normal((1, 33, 2, 4))
    expected = op.forward(z, v)
    dz_c, dv_c = op.backward(z, v, expected, dout)
    assert_close(op.forward(z, sequence_last(v)), expected, np.float64)
    assert_close(op.forward(sequence_last(z), v), expected, np.float64)
    dz, dv = op.backward(z, sequence_last(v), expected, sequence_last(dout))
    assert_close(dz, dz_c, np.float64)
    assert_close(dv, dv_c, np.float64)


@pytest.mark.parametrize("name", list(OPERATORS))
def test_neither_axis_contiguous_is_refused(rng, name):
    z = rng.standard_normal((1, 16, 2))
    v = np.asfortranarray(rng.standard_normal((1, 16, 2, 3)))[:, ::2]
    with pytest.raises(ValueError, match="sequence dimension 1"):
        OPERATORS[name].forward(z[:, ::2], v)


@pytest.mark.parametrize("torch_name", ["cat", "cat_causal"])
def test_torch_permuted_tensors_are_read_in_place(torch_name):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import subquad.ops as st
    from subquad.ops import _cpu

    attend = getattr(st, torch_name)
    B, H, Dv, N = 1, 3, 6, 200
    zl = torch.randn(B, H, N, dtype=torch.float64, requires_grad=True)       # [B, H, N]
    vl = torch.randn(B, H, Dv, N, dtype=torch.float64, requires_grad=True)   # [B, H, Dv, N]
    z, v = zl.transpose(1, 2), vl.permute(0, 3, 1, 2)                        # [B, N, H(, Dv)]
    # The views reach _core as they are (the same memory, no copy), and _core saw them
    # sequence-last: out comes back in that layout.
    assert _cpu.sequence_readable(v).data_ptr() == vl.data_ptr()
    assert _cpu.sequence_readable(z).data_ptr() == zl.data_ptr()
    out = attend(z, v)
    assert out.shape == (B, N, H, Dv) and out.stride(1) == 1
    zc = z.detach().contiguous().requires_grad_()
    vc = v.detach().contiguous().requires_grad_()
    expected = attend(zc, vc)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    # A sequence-last incoming gradient is read in place too; dv comes back like v.
    dout_l = torch.randn(B, H, Dv, N, dtype=torch.float64)
    dout = dout_l.permute(0, 3, 1, 2)
    assert _cpu.sequence_readable(dout).data_ptr() == dout_l.data_ptr()
    out.backward(dout)
    expected.backward(dout.contiguous())
    assert vl.grad.is_contiguous()
    torch.testing.assert_close(zl.grad.transpose(1, 2), zc.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(vl.grad.permute(0, 3, 1, 2), vc.grad, rtol=0, atol=1e-12)
