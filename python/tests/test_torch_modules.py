"""subquad.torch nn.Modules: shapes, a few optimiser steps lower the loss, gradients reach
every parameter; the WildCat layer reproduces exact attention at full rank."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: subquad.torch is optional")
import subquad.torch as st  # noqa: E402


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def train(module, x, steps=5, lr=1e-2):
    """Fits module(x) to a fixed random target with Adam; returns the losses."""
    target = torch.randn_like(module(x))
    optimiser = torch.optim.Adam(module.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        optimiser.zero_grad()
        loss = torch.nn.functional.mse_loss(module(x), target)
        loss.backward()
        losses.append(loss.item())
        for name, parameter in module.named_parameters():
            assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
        optimiser.step()
    return losses


MODULES = {
    "cat": (lambda: st.CATLayer(16, 4), (2, 12, 16)),
    "cat_conv": (lambda: st.CATLayer(16, 2, convention="conv"), (2, 9, 16)),
    "cat_causal": (lambda: st.CATLayer(16, 4, causal=True), (2, 12, 16)),
    "circulant2d_attention": (lambda: st.Circulant2dAttention(8, 4, scale_mode="paper"),
                              (2, 3, 4, 8)),
    "circulant2d_block": (lambda: st.Circulant2dBlock(8), (2, 4, 4, 8)),
    "mlr": (lambda: st.MLRAttention(16, 2, [4, 2, 2], kv_heads=1), (2, 16, 16)),
    "bilinear_mlr": (lambda: st.BilinearMLRAttention(16, 2, [2, 2]), (2, 10, 16)),
    "btt": (lambda: st.BTTAttention(16, 2, rank=2), (2, 10, 16)),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_training_steps_lower_the_loss(name):
    make, shape = MODULES[name]
    module = make()
    x = torch.randn(*shape)
    assert module(x).shape == x.shape
    losses = train(module, x)
    assert losses[-1] < losses[0], losses


def test_modules_run_in_float64():
    module = st.MLRAttention(8, 2, [2, 2]).double()
    x = torch.randn(1, 8, 8, dtype=torch.float64, requires_grad=True)
    module(x).sum().backward()
    assert x.grad.dtype == torch.float64 and torch.isfinite(x.grad).all()


def test_causal_modules_do_not_look_ahead():
    for module in (st.CATLayer(8, 2, causal=True), st.MLRAttention(8, 2, [2, 2]),
                   st.BilinearMLRAttention(8, 2, [2, 2]), st.BTTAttention(8, 2)):
        x = torch.randn(1, 8, 8)
        changed = x.clone()
        changed[:, 5:] += 1
        assert torch.allclose(module(x)[:, :5], module(changed)[:, :5], atol=1e-6)


def test_wildcat_layer_matches_exact_attention_at_full_rank():
    layer = st.WildcatAttention(16, 4, kv_heads=2, rank=64)
    x = torch.randn(2, 10, 16)
    out = layer(x)
    assert not out.requires_grad
    with torch.no_grad():
        q = layer.w_q(x).unflatten(-1, (4, 4))
        k = layer.w_k(x).unflatten(-1, (2, 4))
        v = layer.w_v(x).unflatten(-1, (2, 4))
        expected = layer.w_o(st.exact_attention(q, k, v)[0].flatten(-2))
    assert torch.allclose(out, expected, atol=1e-3), (out - expected).abs().max()
    context = torch.randn(2, 30, 16)
    assert layer(x, context).shape == x.shape


def test_bad_module_arguments():
    with pytest.raises(ValueError, match="heads"):
        st.CATLayer(10, 3)
    with pytest.raises(ValueError):
        st.MLRAttention(8, 2, [1, 1, 1])(torch.randn(1, 6, 8))  # 6 tokens, 3 levels
