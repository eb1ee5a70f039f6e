"""subquad.models: every family builds with every registry entry it can use and trains
on a tiny batch of real data with falling loss; patterns, pooling, caches and muP init;
impossible combinations raise saying why."""

import os

import pytest

torch = pytest.importorskip("torch")
import subquad.layers as layers  # noqa: E402
from subquad import data, models  # noqa: E402
from subquad.data import austen, fashion_mnist  # noqa: E402

STEPS = 20
needs_austen = pytest.mark.skipif(
    not os.path.isfile(os.path.join(austen.DIRECTORY, "Rdata.rdb")),
    reason="r-cran-janeaustenr missing (scripts/install.sh installs it)")
needs_fashion = pytest.mark.skipif(not os.path.isdir(fashion_mnist.DIRECTORY),
                                   reason="dataset-fashion-mnist missing")
# Options an entry needs to fit the tiny shapes of these tests.
ENTRY_OPTIONS = {"sliding-window": {"window": 8}, "mlr": {"ranks": [4, 2]},
                 "bilinear-mlr": {"ranks": [4, 2]}}
SMALL = dict(dim=32, heads=2, layers=2)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on one thread: on a busy machine torch's intra-op threads spin while
    waiting for a core, which made these tests 10x slower with two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def trainable(direction):
    """Registry entries with a backward that support `direction` ("causal" or
    "bidirectional"), plus torch's own attention."""
    names = [n for n in layers.names() if layers.capabilities(n).backward
             and getattr(layers.capabilities(n), direction)]
    return names + [models.TORCH_ATTENTION]


def fit(model, loss_of_batch, steps=STEPS, lr=3e-3):
    """(first loss, last loss) of `steps` AdamW steps on one fixed batch."""
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = loss_of_batch()
        assert torch.isfinite(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses[0], losses[-1]


@pytest.fixture(scope="module")
def austen_ids():
    text = data.austen_splits()["train"] if os.path.isfile(
        os.path.join(austen.DIRECTORY, "Rdata.rdb")) else None
    if text is None:
        pytest.skip("r-cran-janeaustenr missing")
    ids = data.ByteTokenizer().encode(text[100_000:100_000 + 4 * 33])
    return torch.from_numpy(ids).view(4, 33)


@needs_austen
@pytest.mark.parametrize("attention", trainable("causal"))
def test_causal_lm_trains_on_austen(attention, austen_ids):
    torch.manual_seed(0)
    model = models.CausalLM(256, 32, attention=attention, attention_options=ENTRY_OPTIONS,
                            **SMALL)
    first, last = fit(model, lambda: model.loss(austen_ids))
    assert last < 0.8 * first, (first, last)


@needs_austen
@pytest.mark.parametrize("attention", trainable("bidirectional"))
def test_masked_lm_trains_on_austen(attention, austen_ids):
    if attention == "circulant2d":
        pytest.skip("circulant2d attends over an image grid (the ViT tests cover it)")
    torch.manual_seed(0)
    model = models.MaskedLM(256, 32, attention=attention, attention_options=ENTRY_OPTIONS,
                            **SMALL)
    ids = austen_ids[:, :32]
    first, last = fit(model, lambda: model.loss(ids, torch.Generator().manual_seed(1))[0])
    assert last < 0.8 * first, (first, last)


@needs_fashion
@pytest.mark.parametrize("attention", trainable("bidirectional"))
def test_vit_trains_on_fashion_mnist(attention):
    images, labels = data.load_fashion_mnist("test")
    x = torch.from_numpy(data.normalise(images[:16]))
    y = torch.from_numpy(labels[:16])
    # 7 x 7 patches give 16 tokens (+1 class token): MLR's two levels need an even count.
    pool = "mean" if attention in ("circulant2d", "mlr") else "cls"
    torch.manual_seed(0)
    model = models.ViTClassifier(28, 7, 1, 10, pool=pool, attention=attention,
                                 attention_options=ENTRY_OPTIONS, **SMALL)
    first, last = fit(model, lambda: torch.nn.functional.cross_entropy(model(x), y))
    assert last < 0.7 * first, (first, last)


@pytest.mark.parametrize("attention", trainable("causal"))
def test_in_context_regressor_trains(attention):
    xs, ys = data.sample_linear_regression(8, 8, 4, 4, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = models.InContextRegressor(4, 8, attention=attention,
                                      attention_options=ENTRY_OPTIONS, **SMALL)
    first, last = fit(model, lambda: torch.nn.functional.mse_loss(model(xs, ys), ys))
    assert last < 0.7 * first, (first, last)


@pytest.mark.parametrize("attention", ["exact", "cat", models.TORCH_ATTENTION])
def test_forecaster_trains_on_ett(attention):
    inputs, targets = data.forecast_windows(data.load_ett("ETTh1"), "train", 32, 8)
    x, y = torch.from_numpy(inputs[::500][:8]), torch.from_numpy(targets[::500][:8])
    torch.manual_seed(0)
    model = models.PatchForecaster(32, 8, 8, attention=attention, **SMALL)
    first, last = fit(model, lambda: torch.nn.functional.mse_loss(model(x), y))
    assert last < 0.7 * first, (first, last)


def test_wildcat_is_inference_only_in_a_model():
    model = models.MaskedLM(256, 16, attention="wildcat", **SMALL)
    with pytest.raises(ValueError, match="wildcat does not support a backward"):
        model.loss(torch.randint(256, (2, 16)), torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        assert model(torch.randint(256, (2, 16))).shape == (2, 16, 257)


def test_pattern_gives_cat_alter():
    model = models.CausalLM(256, 16, dim=32, heads=2, layers=4,
                            pattern=["cat-causal", "exact"])
    assert model.pattern == ["cat-causal", "exact"] * 2
    assert model.attention_counts() == {"cat-causal": 2, "exact": 2}
    with pytest.raises(ValueError, match="must divide layers"):
        models.CausalLM(256, 16, dim=32, heads=2, layers=3, pattern=["cat-causal", "exact"])


def test_impossible_combinations_say_why():
    with pytest.raises(ValueError, match="cat does not support causal attention"):
        models.CausalLM(256, 16, attention="cat", **SMALL)
    with pytest.raises(ValueError, match="cat-causal does not support bidirectional"):
        models.MaskedLM(256, 16, attention="cat-causal", **SMALL)
    with pytest.raises(ValueError, match="class token"):
        models.ViTClassifier(28, 4, 1, 10, attention="circulant2d", pool="cls", **SMALL)
    with pytest.raises(ValueError, match="unknown name 'nope'"):
        models.CausalLM(256, 16, attention="nope", **SMALL)
    with pytest.raises(ValueError, match="unknown option"):
        models.CausalLM(256, 16, attention="exact", attention_options={"exact": {"rnaks": 1}},
                        **SMALL)


@pytest.mark.parametrize("attention", ["exact", "sliding-window", "cat-causal", "mlr"])
def test_cached_generation_matches_the_full_forward(attention):
    torch.manual_seed(0)
    options = {"sliding-window": {"window": 8}, "mlr": {"ranks": [4, 2], "context": 32}}
    model = models.CausalLM(256, 32, attention=attention, attention_options=options,
                            **SMALL).double().eval()
    prompt = torch.randint(256, (2, 9))
    generated = model.generate(prompt, 7)
    logits, _ = model(generated[:, :-1])
    assert torch.equal(logits[:, 8:].argmax(-1), generated[:, 9:])


def test_mup_zero_readout_and_standard_tied_readout():
    mup = models.CausalLM(256, 16, mup=True, **SMALL)
    assert (mup.readout.weight == 0).all()
    assert mup.readout.weight.data_ptr() != mup.tokens.weight.data_ptr()
    standard = models.CausalLM(256, 16, **SMALL)
    assert standard.readout.weight is standard.tokens.weight
    assert abs(float(standard.blocks[0].mlp[0].weight.detach().std()) - 0.02) < 0.005
    # muP logit scale of the structured-attention code: 8/D, D = 32 / 2
    assert mup.blocks[0].attention.scale == pytest.approx(8.0 / 16)


def test_bert_masking_rates():
    ids = torch.randint(100, (64, 128))
    inputs, labels = models.bert_mask(ids, 100, 100, torch.Generator().manual_seed(0))
    selected = labels != -100
    assert 0.13 < float(selected.float().mean()) < 0.17
    assert torch.equal(labels[selected], ids[selected])
    masked = inputs[selected] == 100
    assert 0.75 < float(masked.float().mean()) < 0.85
    assert torch.equal(inputs[~selected], ids[~selected])


# (model, the direction it attends in) for every family's model.
FAMILY_MODELS = {
    "CausalLM": (lambda **kw: models.CausalLM(256, 16, **kw), True),
    "MaskedLM": (lambda **kw: models.MaskedLM(256, 16, **kw), False),
    "ViTClassifier": (lambda **kw: models.ViTClassifier(8, 2, 1, 10, pool="mean", **kw), False),
    "InContextRegressor": (lambda **kw: models.InContextRegressor(3, 5, **kw), True),
    "PatchForecaster": (lambda **kw: models.PatchForecaster(8, 4, 2, **kw), False),
    "NeighbourRetriever": (lambda **kw: models.NeighbourRetriever(3, 4, **kw), False),
}


@pytest.mark.parametrize("family", sorted(FAMILY_MODELS))
@pytest.mark.parametrize("attention", ["exact", "mlr", "btt", "bilinear-mlr", "torch"])
def test_an_option_contradicting_the_models_direction_is_refused(family, attention):
    """The model decides the direction: causal=False in a decoder would let position 0
    read the last token (a leak that looks like a better perplexity)."""
    build, causal = FAMILY_MODELS[family]
    options = {attention: {"causal": not causal, **ENTRY_OPTIONS.get(attention, {})}}
    with pytest.raises(ValueError, match=f"attention_options.{attention}.causal: "
                                         f"{not causal} contradicts the model"):
        build(attention=attention, attention_options=options, **SMALL)
    # The direction it has anyway is accepted.
    same = {attention: {"causal": causal, **ENTRY_OPTIONS.get(attention, {})}}
    try:
        build(attention=attention, attention_options=same, **SMALL)
    except ValueError as error:  # an entry that cannot run this direction says so
        assert "does not support" in str(error)


def test_circulant2d_blocks_take_only_their_own_options():
    with pytest.raises(ValueError, match="circulant2d.causal: True contradicts"):
        models.ViTClassifier(8, 2, 1, 10, attention="circulant2d", pool="mean",
                             attention_options={"circulant2d": {"causal": True}}, **SMALL)
    with pytest.raises(ValueError, match="circulant2d: unknown option gate; accepted: "
                                         "attention, scale_mode, threads"):
        models.ViTClassifier(8, 2, 1, 10, attention="circulant2d", pool="mean",
                             attention_options={"circulant2d": {"gate": False}}, **SMALL)


def test_misspelt_entries_are_refused_listing_the_registered_ones():
    with pytest.raises(ValueError, match="unknown entry 'cat_causal'; registered: exact, "
                                         "sliding-window, cat"):
        models.CausalLM(256, 16, attention="cat-causal",
                        attention_options={"cat_causal": {"threads": 1}}, **SMALL)
    with pytest.raises(ValueError, match="option window required"):
        models.CausalLM(256, 16, attention="sliding-window", **SMALL)
    with pytest.raises(ValueError, match="threads: expected 0 \\(all cores\\) to 1024"):
        models.CausalLM(256, 16, attention_options={"exact": {"threads": 4096}}, **SMALL)


def test_vit_refuses_images_of_another_size():
    """A strided patch embedding would drop the pixels past the last whole patch."""
    model = models.ViTClassifier(28, 14, 1, 10, **SMALL)
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    for shape in ((2, 1, 32, 32), (2, 1, 28, 30), (2, 3, 28, 28), (1, 28, 28)):
        with pytest.raises(ValueError, match="images: expected \\[B, 1, 28, 28\\]"):
            model(torch.zeros(shape))


def test_decoding_must_continue_where_the_caches_stopped():
    """Learned positions (and rotary angles) come from `start`: another start than the
    tokens the caches have seen would place the new tokens at wrong positions."""
    model = models.CausalLM(256, 32, **SMALL).eval()
    caches = model.init_caches(1)
    _, caches = model(torch.randint(256, (1, 5)), caches=caches, start=0)
    with pytest.raises(ValueError, match="start: expected the 5 tokens the caches have "
                                         "seen, got 4"):
        model(torch.randint(256, (1, 1)), caches=caches, start=4)
    model(torch.randint(256, (1, 1)), caches=caches, start=5)
