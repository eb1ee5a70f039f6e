"""subquad.ops exact attention and merge: values against the NumPy bindings and
torch.autograd.gradcheck in float64."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: subquad.ops needs it")
import subquad  # noqa: E402
import subquad.ops as st  # noqa: E402


def randn(*shape, requires_grad=True):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=requires_grad)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def test_exact_values_match_the_numpy_binding():
    q, k, v = randn(2, 5, 4, 3), randn(2, 6, 2, 3), randn(2, 6, 2, 2)
    out, lse = st.exact_attention(q, k, v, causal=True)
    expected_out, expected_lse = subquad.exact_attention_forward(
        q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), causal=True)
    np.testing.assert_array_equal(out.detach().numpy(), expected_out)
    np.testing.assert_array_equal(lse.detach().numpy(), expected_lse)


@pytest.mark.parametrize("options", [dict(), dict(causal=True), dict(window=3, scale=0.7)])
def test_exact_gradcheck(options):
    q, k, v = randn(1, 5, 4, 3), randn(1, 6, 2, 3), randn(1, 6, 2, 2)
    assert torch.autograd.gradcheck(lambda *x: st.exact_attention(*x, **options), (q, k, v))


def test_exact_gradcheck_out_only_and_lse_only():
    q, k, v = randn(1, 4, 2, 3), randn(1, 4, 2, 3), randn(1, 4, 2, 2)
    assert torch.autograd.gradcheck(lambda *x: st.exact_attention(*x)[0], (q, k, v))
    assert torch.autograd.gradcheck(lambda *x: st.exact_attention(*x)[1], (q, k, v))


def test_exact_backward_through_a_reduction():
    # A sum's gradient arrives expanded (stride 0); it must still reach the kernel.
    q, k, v = randn(1, 4, 2, 3), randn(1, 4, 2, 3), randn(1, 4, 2, 2)
    st.exact_attention(q, k, v)[0].sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(v.grad).all()


def test_exact_accepts_non_contiguous_last_dims():
    q = randn(1, 4, 3, 2).transpose(2, 3)  # [1, 4, 2, 3], last stride 2
    k, v = randn(1, 4, 2, 3), randn(1, 4, 2, 3)
    out, _ = st.exact_attention(q, k, v)
    expected, _ = st.exact_attention(q.contiguous(), k, v)
    assert torch.equal(out, expected)


def test_merge_gradcheck():
    q, k, v = randn(1, 3, 2, 2), randn(1, 5, 2, 2), randn(1, 5, 2, 2)

    def merged(q, k, v):
        out_a, lse_a = st.exact_attention(q, k[:, :2], v[:, :2])
        out_b, lse_b = st.exact_attention(q, k[:, 2:], v[:, 2:])
        return st.merge_attention(out_a, lse_a, out_b, lse_b)

    assert torch.autograd.gradcheck(merged, (q, k, v))
    out, lse = merged(q, k, v)
    expected_out, expected_lse = st.exact_attention(q, k, v)
    assert torch.allclose(out, expected_out) and torch.allclose(lse, expected_lse)
    parts = (randn(1, 3, 2, 2), randn(1, 2, 3), randn(1, 3, 2, 2), randn(1, 2, 3))
    assert torch.autograd.gradcheck(st.merge_attention, parts)


def test_wrong_dtype_raises_value_error():
    q = torch.ones(1, 2, 1, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="expected floating-point tensors, got torch.int32"):
        st.exact_attention(q, q, q)

