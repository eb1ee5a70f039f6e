"""torch.compile(fullgraph=True) on every registry layer, forward and backward, equals
eager: the subquad operators trace as custom ops (fake implementations for the shapes,
register_autograd for the backward). Every entry under AOTAutograd ("aot_eager": the whole
trace, forward and backward graphs, without code generation); a few under Inductor, which
also generates the code around the operators. And a decoding step through the CAT and MLR
caches (the decode operators)."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: subquad.layers needs it")
import subquad.layers as layers  # noqa: E402
from layer_cases import CASES, build, entry  # noqa: E402

INDUCTOR_CASES = ["exact", "cat-causal", "mlr"]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch.manual_seed(0)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def forward_and_backward(layer, x, trainable):
    """The output and the gradients of x and the weights (inference-only layers: the
    output, under no_grad)."""
    if not trainable:
        with torch.no_grad():
            return [layer(x)[0]]
    x = x.detach().requires_grad_(True)
    layer.zero_grad()
    y, _ = layer(x)
    y.square().sum().backward()
    return [y.detach(), x.grad, *(p.grad for p in layer.parameters())]


def check_compiled_equals_eager(case, backend):
    layer, tokens = build(case)
    layer = layer.double()
    x = torch.randn(2, tokens, layer.dim, dtype=torch.float64)
    trainable = layers.capabilities(entry(case)).backward
    eager = forward_and_backward(layer, x, trainable)
    compiled = forward_and_backward(torch.compile(layer, fullgraph=True, backend=backend), x,
                                    trainable)
    assert len(compiled) == len(eager)
    for got, want in zip(compiled, eager):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_layer_compiles_whole(case):
    check_compiled_equals_eager(case, "aot_eager")


@pytest.mark.parametrize("case", INDUCTOR_CASES)
def test_inductor_compiles_the_layers(case):
    check_compiled_equals_eager(case, "inductor")


@pytest.mark.parametrize("name", ["cat-causal", "mlr"])
def test_a_decode_step_compiles_whole(name):
    """One decoding step (prefill, then a token) through the layer's cache: the decode
    operators (cat_causal_decode, mlr_decode) trace with fullgraph=True and give eager's
    rows."""
    options = dict(dim=16, heads=2, ranks=[4, 2, 1, 1], context=32) if name == "mlr" else \
        dict(dim=12, heads=3)
    layer = layers.build(name, **options).double().eval()
    x = torch.randn(1, 12, layer.dim, dtype=torch.float64)

    def decode(cache, tokens):
        return layer(tokens, cache=cache)[0]

    compiled = torch.compile(decode, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        eager_cache, compiled_cache = layer.init_cache(1), layer.init_cache(1)
        for part in (x[:, :11], x[:, 11:]):
            torch.testing.assert_close(compiled(compiled_cache, part), decode(eager_cache, part),
                                       rtol=0, atol=1e-12)
