"""muP initialisation of the models (the spec's stability rules): embeddings N(0, 0.02^2),
hidden weights N(0, 1 / fan_in), every block's output projections and the readout zero,
so each block starts as the identity."""

import pytest
import torch

from subquad import models


@pytest.mark.parametrize("attention", ["exact", "bilinear-mlr", "btt", "torch"])
def test_regressor_mup_zero_outputs_and_small_embeddings(attention):
    torch.manual_seed(0)
    model = models.InContextRegressor(8, 40, dim=32, heads=4, layers=2, attention=attention,
                                      mup=True)
    assert abs(float(model.positions.weight.std()) - 0.02) < 0.004
    assert (model.read_out.weight == 0).all()
    for block in model.blocks:
        projection = getattr(block.attention, "w_o", getattr(block.attention, "out", None))
        assert (projection.weight == 0).all()
        assert (block.mlp[-1].weight == 0).all() and (block.mlp[-1].bias == 0).all()
        hidden = block.mlp[0].weight  # [128, 32]: N(0, 1 / 32)
        assert abs(float(hidden.std()) - 32 ** -0.5) < 0.02
    # A block starting as the identity: the whole model predicts 0 at initialisation and
    # still gets a gradient at its readout.
    xs, ys = torch.randn(2, 5, 8), torch.randn(2, 5)
    prediction = model(xs, ys)
    assert (prediction == 0).all()
    ((prediction - ys) ** 2).sum().backward()
    assert float(model.read_out.weight.grad.abs().sum()) > 0


def test_standard_init_keeps_random_output_projections():
    torch.manual_seed(0)
    model = models.InContextRegressor(8, 40, dim=32, heads=4, layers=2)
    block = model.blocks[0]
    assert float(block.attention.w_o.weight.abs().sum()) > 0
    assert abs(float(model.positions.weight.std()) - 0.02) < 0.004
