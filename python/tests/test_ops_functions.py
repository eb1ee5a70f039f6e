"""subquad.ops autograd Functions of CAT, 2D Circulant, MLR, bilinear MLR and BTT:
torch.autograd.gradcheck in float64, and values equal to the NumPy bindings'."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: subquad.ops needs it")
import subquad  # noqa: E402
import subquad.ops as st  # noqa: E402


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def randn(*shape, scale=1.0):
    return (scale * torch.randn(*shape, dtype=torch.float64)).requires_grad_()


def gradcheck(function, inputs):
    assert torch.autograd.gradcheck(function, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("convention", ["roll", "conv"])
def test_cat_gradcheck(convention):
    z, v = randn(2, 6, 2), randn(2, 6, 2, 3)
    gradcheck(lambda z, v: st.cat(z, v, convention=convention), (z, v))
    expected = subquad.cat_forward(z.detach().numpy(), v.detach().numpy(),
                                   convention=convention)
    np.testing.assert_array_equal(st.cat(z, v, convention=convention).detach().numpy(),
                                  expected)


def test_cat_avgkey_gradcheck():
    q, k, v = randn(1, 5, 2, 3), randn(1, 5, 2, 3), randn(1, 5, 2, 2)
    gradcheck(lambda q, k, v: st.cat_avgkey(q, k, v, scale=0.7), (q, k, v))


def test_cat_causal_gradcheck():
    z, v = randn(1, 7, 2), randn(1, 7, 2, 2)
    gradcheck(st.cat_causal, (z, v))


@pytest.mark.parametrize("scale_mode", ["paper", "code"])
def test_circulant2d_gradcheck(scale_mode):
    q, k, v = randn(1, 2, 3, 2, 2), randn(1, 2, 3, 2, 2), randn(1, 2, 3, 2, 3)
    gradcheck(lambda q, k, v: st.circulant2d(q, k, v, scale_mode=scale_mode), (q, k, v))


@pytest.mark.parametrize("causal,block_divide", [(False, False), (True, True)])
def test_mlr_gradcheck(causal, block_divide):
    q, k, v = randn(1, 8, 2, 3), randn(1, 8, 1, 3), randn(1, 8, 1, 2)
    gradcheck(lambda q, k, v: st.mlr_attention(q, k, v, ranks=[2, 1], causal=causal,
                                               block_divide=block_divide), (q, k, v))


@pytest.mark.parametrize("layer_norm", [True, False])
def test_bilinear_mlr_gradcheck(layer_norm):
    ranks, heads = [2, 1], 2
    x = randn(1, 3, 4)
    weights = [randn(2**l, 4 // 2**l, heads * r) for l, r in enumerate(ranks)]
    gradcheck(lambda x, *w: st.bilinear_mlr_project(x, w, ranks=ranks, heads=heads,
                                                    level_scale=[0.5, 2.0],
                                                    layer_norm=layer_norm),
              (x, *weights))


def test_btt_gradcheck():
    heads, rank = 2, 1
    a, b = subquad.btt_factors(6)
    x = randn(1, 2, 6)
    w1, w2 = randn(a, b, heads * b * rank), randn(heads * b, a, a * rank)
    gradcheck(lambda x, w1, w2: st.btt_project(x, w1, w2, heads=heads, rank=rank),
              (x, w1, w2))


def test_wildcat_is_inference_only():
    q = torch.randn(1, 4, 2, 8, requires_grad=True)
    k, v = torch.randn(1, 16, 1, 8), torch.randn(1, 16, 1, 3)
    out = st.wildcat_attention(q, k, v, rank=16)
    assert not out.requires_grad
    expected, _ = st.exact_attention(q.detach().double(), k.double(), v.double())
    np.testing.assert_allclose(out.numpy(), expected.numpy(), atol=2e-4)
    # float64 inputs are computed in float32 and come back as float64.
    again = st.wildcat_attention(q.double(), k.double(), v.double(), rank=16)
    assert again.dtype == torch.float64
    np.testing.assert_array_equal(again.float().numpy(), out.numpy())
