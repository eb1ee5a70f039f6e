"""subquad.layers: every registry entry builds, runs forward and backward, agrees with the
torch-native path (float64, values and gradients), trains, and raises clear errors for
bad options and impossible combinations. Allocations are NaN-poisoned throughout."""

import pathlib

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: subquad.layers needs it")
import subquad.layers as layers  # noqa: E402
from subquad import ops  # noqa: E402
from layer_cases import CASES, build, entry, nan_poisoned_allocations  # noqa: E402

F64_TOL = 1e-10


@pytest.fixture(autouse=True)
def poisoned_and_seeded():
    torch.manual_seed(0)
    with nan_poisoned_allocations():
        yield


def assert_close(actual, expected, tol=F64_TOL, what=""):
    assert actual.shape == expected.shape, what
    assert torch.isfinite(actual).all() and torch.isfinite(expected).all(), what
    bound = tol * max(1.0, expected.abs().max().item())
    error = (actual - expected).abs().max().item()
    assert error <= bound, f"{what}: max abs error {error:.3g} > {bound:.3g}"


def trainable(case):
    return layers.capabilities(entry(case)).backward


def test_allocations_are_poisoned():
    assert torch.isnan(torch.empty(3)).all() and torch.isnan(torch.zeros(2).new_empty(4)).all()


def test_every_registry_name_has_a_case():
    assert {entry(case) for case in CASES} == set(layers.names())


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_and_backward(case):
    layer, tokens = build(case)
    layer = layer.double()
    x = torch.randn(2, tokens, layer.dim, dtype=torch.float64, requires_grad=True)
    if not trainable(case):
        layer.eval()
        with torch.no_grad():
            y, cache = layer(x)
        assert cache is None and y.shape == x.shape and torch.isfinite(y).all()
        return
    y, cache = layer(x)
    assert cache is None and y.shape == x.shape
    assert torch.isfinite(y).all() and y.abs().max() > 0
    (y * torch.randn_like(y)).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().max() > 0
    for name, parameter in layer.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name


@pytest.mark.parametrize("case", sorted(c for c in CASES if CASES[c][0].get("mup")))
def test_mup_starts_from_a_zero_output_projection(case):
    layer, tokens = build(case, keep_init=True)
    x = torch.randn(2, tokens, layer.dim)
    y, _ = layer(x)
    assert (y == 0).all()
    y.sum().backward()
    assert layer.w_o.weight.grad.abs().max() > 0


def values_and_gradients(layer, x, dy, mask=None):
    x = x.clone().requires_grad_()
    layer.zero_grad()
    y, _ = layer(x, attention_mask=mask)
    (y * dy).sum().backward()
    return y.detach(), x.grad, {n: p.grad for n, p in layer.named_parameters()}


def left_padding(tokens, multiple):
    """[2, T]: row 0 unpadded, row 1 left-padded to a token count divisible by multiple."""
    mask = torch.ones(2, tokens, dtype=torch.long)
    count = (tokens - 1) // multiple * multiple
    mask[1, :tokens - count] = 0
    return mask


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("case", sorted(c for c in CASES if trainable(c)))
def test_cpp_path_matches_the_reference_path(case, padded):
    layer, tokens = build(case)
    layer = layer.double()
    mask = None
    if padded:
        if not layer.capabilities.padding_mask:
            pytest.skip("the entry takes no padding mask")
        mask = left_padding(tokens, layer.length_multiple)
    x = torch.randn(2, tokens, layer.dim, dtype=torch.float64)
    dy = torch.randn(2, tokens, layer.dim, dtype=torch.float64)
    y, dx, grads = values_and_gradients(layer, x, dy, mask)
    with ops.reference_on_cpu():
        y_ref, dx_ref, grads_ref = values_and_gradients(layer, x, dy, mask)
    assert_close(y, y_ref, what="y")
    assert_close(dx, dx_ref, what="dx")
    for name in grads_ref:
        assert_close(grads[name], grads_ref[name], what=name)


def random_tokens(tokens, vocabulary=32, batch=4):
    generator = torch.Generator().manual_seed(1)
    return torch.randint(vocabulary, (batch, tokens + 1), generator=generator)


@pytest.mark.parametrize("case", sorted(c for c in CASES if trainable(c)))
def test_twenty_training_steps_lower_the_loss(case):
    layer, tokens = build(case)
    vocabulary = 32
    model = torch.nn.ModuleDict(dict(embed=torch.nn.Embedding(vocabulary, layer.dim),
                                     attention=layer, norm=torch.nn.LayerNorm(layer.dim),
                                     head=torch.nn.Linear(layer.dim, vocabulary)))
    data = random_tokens(tokens, vocabulary)
    inputs, targets = data[:, :-1], data[:, 1:]
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        optimiser.zero_grad()
        h = model["embed"](inputs)
        h = h + model["attention"](h)[0]
        logits = model["head"](model["norm"](h))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5]), losses


@pytest.mark.parametrize("case", sorted(CASES))
def test_unknown_options_raise_naming_the_accepted_ones(case):
    options, _ = CASES[case]
    with pytest.raises(ValueError, match=r"unknown option bogus; accepted: .*threads"):
        layers.build(entry(case), **options, bogus=1)


@pytest.mark.parametrize("name", layers.names())
def test_impossible_combinations_raise_the_reason(name):
    caps = layers.capabilities(name)
    case = next(c for c in CASES if entry(c) == name)
    options, tokens = CASES[case]
    for causal, feature in ((True, "causal"), (False, "bidirectional")):
        if not getattr(caps, feature):
            with pytest.raises(ValueError, match=f"{name} does not support"):
                layers.build(name, **{**options, "causal": causal})
    if not caps.gqa:
        with pytest.raises(ValueError, match="grouped-query"):
            layers.build(name, **{**options, "kv_heads": 1})
    layer, _ = build(case)
    layer.eval()
    x = torch.randn(2, tokens, layer.dim)
    if not caps.padding_mask:
        mask = torch.ones(2, tokens)
        mask[0, -1] = 0
        with pytest.raises(ValueError, match="does not support an attention_mask"):
            layer(x, attention_mask=mask)
    if not caps.decoding_cache:
        with pytest.raises(ValueError, match="does not support a decoding cache"):
            layer(x, cache=object())
    if not caps.backward:
        layer.train()
        with pytest.raises(ValueError, match="does not support a backward"):
            layer(x)


def test_bad_arguments_name_what_is_wrong():
    layer = layers.build("exact", 16, 4)
    with pytest.raises(ValueError, match="x: expected"):
        layer(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="attention_mask: expected shape"):
        layer(torch.randn(2, 5, 16), attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="attention_mask: expected 1 for a token"):
        layer(torch.randn(2, 5, 16), attention_mask=torch.full((2, 5), 2))
    with pytest.raises(ValueError, match="heads: expected a positive divisor"):
        layers.build("exact", 16, 3)
    with pytest.raises(ValueError, match="kv_heads: expected a positive divisor"):
        layers.build("exact", 16, 4, kv_heads=3)
    with pytest.raises(ValueError, match="unknown option backend"):
        layers.build("exact", 16, 4, backend="cuda")
    with pytest.raises(ValueError, match="unknown name 'flash'"):
        layers.build("flash", 16, 4)
    with pytest.raises(ValueError, match="causal: expected a bool"):
        layers.build("exact", 16, 4, causal=1)


@pytest.mark.parametrize("heads", [16, 8, 4, 2, 1])
def test_bilinear_mlr_default_ranks_give_every_level_four_features(heads):
    # LayerNorm over 2 features returns +-(1, -1) whatever the input: a level with 2 (or 1)
    # features carries one bit (or nothing), and its gradient is 0 except near ties.
    two = torch.nn.functional.layer_norm(torch.randn(1000, 2, dtype=torch.float64), (2,))
    assert torch.allclose(two[:, 0], -two[:, 1], atol=1e-12)
    assert (two.abs() > 0.99).double().mean() > 0.95
    layer = layers.build("bilinear-mlr", 16, heads).double()
    assert all(rank << level >= 4 for level, rank in enumerate(layer.ranks)), layer.ranks
    layer(torch.randn(2, 5, 16, dtype=torch.float64))[0].square().sum().backward()
    assert all(torch.isfinite(w.grad).all() and w.grad.abs().max() > 0 for w in layer.weights_q)


def test_user_entries_register_and_build():
    class Identity(layers.AttentionLayer):
        name = "identity-test"
        capabilities = layers.capabilities("exact")

        def __init__(self, dim, heads):
            super().__init__(dim)

        def attend(self, x):
            return x

    layers.register("identity-test", Identity, layers.capabilities("exact"))
    try:
        with pytest.raises(ValueError, match="registered already"):
            layers.register("identity-test", Identity, layers.capabilities("exact"))
        layer = layers.build("identity-test", 8, 2)
        x = torch.randn(1, 3, 8)
        assert torch.equal(layer(x)[0], x)
    finally:
        layers.ATTENTIONS.unregister("identity-test")
    assert "identity-test" not in layers.names()


def test_capabilities_need_reasons_for_what_they_lack():
    with pytest.raises(ValueError, match=r"reasons\['gqa'\]"):
        layers.Capabilities(causal=True, bidirectional=True, padding_mask=True,
                            decoding_cache=True, backward=True, dtypes=("float32",), gqa=False)


def test_the_readme_table_is_the_capabilities():
    readme = pathlib.Path(layers.__file__).with_name("README.md").read_text()
    table = readme.split("<!-- capabilities table -->\n", 1)[1].split("<!-- end", 1)[0]
    header, _, *rows = [line.strip("|").split("|") for line in table.strip().splitlines()]
    columns = [c.strip() for c in header][1:]
    documented = {r[0].strip(): [c.strip() for c in r[1:]] for r in rows}
    assert list(documented) == list(layers.names())
    for name, cells in documented.items():
        row = layers.capabilities(name).as_row()
        assert cells == [row[c] for c in columns], name


# Lengths past the C++ kernels' small-size paths (CAT's direct gather up to N = 24, causal
# CAT's direct leaves of 64 rows, the exact kernel's tiles), odd and prime where allowed.
LONG_CASES = {
    "exact": (dict(dim=24, heads=4, kv_heads=1, causal=True), 150),
    "sliding-window": (dict(dim=24, heads=4, kv_heads=2, window=37), 131),
    "cat": (dict(dim=12, heads=3), 97),
    "cat-avgkey": (dict(dim=12, heads=2, convention="conv"), 61),
    "cat-causal": (dict(dim=12, heads=3), 203),
    "circulant2d": (dict(dim=8, heads=2, grid=(7, 11)), 77),
    "mlr": (dict(dim=16, heads=2, ranks=[2, 2, 2, 2], causal=False), 128),
    "bilinear-mlr": (dict(dim=16, heads=2, ranks=[2, 2, 1]), 101),
    "btt": (dict(dim=16, heads=2, rank=2, causal=False), 89),
}


@pytest.mark.parametrize("name", sorted(LONG_CASES))
def test_long_sequences_match_the_reference_path(name):
    options, tokens = LONG_CASES[name]
    layer = layers.build(name, **options).double()
    x = torch.randn(1, tokens, layer.dim, dtype=torch.float64)
    dy = torch.randn(1, tokens, layer.dim, dtype=torch.float64)
    y, dx, grads = values_and_gradients(layer, x, dy)
    with ops.reference_on_cpu():
        y_ref, dx_ref, grads_ref = values_and_gradients(layer, x, dy)
    assert_close(y, y_ref, what="y")
    assert_close(dx, dx_ref, what="dx")
    for parameter in grads_ref:
        assert_close(grads[parameter], grads_ref[parameter], what=parameter)
