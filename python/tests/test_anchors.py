"""The non-neural anchors (subquad.experiments.anchors) on small hand-made fixtures: add-k
n-gram and neighbour counts against counts taken by hand, ridge against numpy's lstsq,
NLinear on series whose forecast is known. The real-data levels are not tested here."""

import math
from collections import Counter

import numpy as np
import pytest

from subquad.data import fashion_mnist
from subquad.experiments import anchors


def reference_perplexity(train: bytes, text: bytes, order: int, k: float) -> float:
    """Add-k n-gram perplexity by counting substrings: byte i of text is predicted from
    the min(i, order - 1) bytes before it."""
    total = 0.0
    for i in range(len(text)):
        context = text[max(0, i - order + 1):i]
        width = len(context)
        joint = sum(train[j:j + width + 1] == context + text[i:i + 1]
                    for j in range(len(train) - width))
        seen = sum(train[j:j + width] == context for j in range(len(train) - width))
        total -= math.log((joint + k) / (seen + 256 * k))
    return math.exp(total / len(text))


def test_bigram_by_hand():
    # train "abab": P(a) = (2 + 1) / (4 + 256); after "a": count(ab) = 2, count(a.) = 2.
    expected = math.exp(-(math.log(3 / 260) + math.log(3 / 258)) / 2)
    assert anchors.ngram_perplexity(b"abab", b"ab", order=2, k=1.0) == pytest.approx(
        expected, rel=1e-12)
    # The final "b" of the training text is followed by nothing: count(b.) = 1, not 2.
    expected = math.exp(-(math.log(3 / 260) + math.log((1 + 1) / (1 + 256))) / 2)
    assert anchors.ngram_perplexity(b"abab", b"ba", order=2, k=1.0) == pytest.approx(
        expected, rel=1e-12)


@pytest.mark.parametrize("order", [1, 2, 3, 4])
@pytest.mark.parametrize("k", [0.01, 0.5])
def test_ngram_matches_counting_substrings(order, k, rng):
    train = bytes(rng.choice(list(b"abcd \n"), 300, p=[.3, .2, .2, .1, .15, .05]).tolist())
    text = b"abracadabra" + bytes(rng.choice(list(b"abcdz "), 40).tolist())
    actual = anchors.ngram_perplexity(train, text, order, k)
    assert math.isfinite(actual) and actual > 1
    assert actual == pytest.approx(reference_perplexity(train, text, order, k), rel=1e-10)


def test_ngram_model_accepts_str_and_ids_and_checks():
    model = anchors.NGramModel("héllo wörld", 3)
    ids = anchors.byte_ids("hé")
    assert model.perplexity("hé", 3, 0.1) == pytest.approx(model.perplexity(ids, 3, 0.1))
    with pytest.raises(ValueError, match="order"):
        model.counts(b"x", 4)
    with pytest.raises(ValueError, match="k"):
        model.perplexity(b"x", 1, 0.0)


def test_choose_k_is_the_best_of_the_grid():
    train, validation = b"the cat sat on the mat. " * 20, b"the rat sat on the hat."
    k, perplexity = anchors.choose_k(train, validation, 3)
    others = [anchors.ngram_perplexity(train, validation, 3, g) for g in anchors.K_GRID]
    assert k in anchors.K_GRID
    assert perplexity == pytest.approx(min(others), rel=1e-12)
    assert perplexity == pytest.approx(anchors.ngram_perplexity(train, validation, 3, k))
    assert max(others) > perplexity  # k matters here, so the choice is tested


def test_count_table_ties_go_to_the_more_frequent_byte():
    # After "a": "b" once and "c" once; "c" is more frequent in the text.
    ids = anchors.byte_ids(b"abaccc")
    unigram = np.bincount(ids, minlength=256)
    table = anchors.CountTable(ids[:-1], ids[1:], unigram)
    joint, total, best = table.lookup(np.array([ord("a"), ord("z")]),
                                      np.array([ord("b"), ord("b")]))
    assert joint.tolist() == [1, 0] and total.tolist() == [2, 0]
    assert best.tolist() == [ord("c"), ord("c")]  # unseen "z": the most frequent byte


def reference_neighbours(train: bytes, windows: np.ndarray, mask: np.ndarray, k: float):
    """(perplexity, accuracy) of the neighbour model by counting: both neighbours inside
    the window, the one that exists at an edge."""
    triples = Counter((train[i], train[i + 1], train[i + 2]) for i in range(len(train) - 2))
    after = Counter((train[i], train[i + 1]) for i in range(len(train) - 1))
    unigram = Counter(train)

    def count(before, x, after_byte):
        if before is not None and after_byte is not None:
            return triples[before, x, after_byte]
        if before is not None:
            return after[before, x]
        if after_byte is not None:
            return after[x, after_byte]
        return unigram[x]

    nll, correct, n = 0.0, 0, 0
    T = windows.shape[1]
    for row, column in zip(*np.nonzero(mask)):
        before = int(windows[row, column - 1]) if column > 0 else None
        after_byte = int(windows[row, column + 1]) if column < T - 1 else None
        x = int(windows[row, column])
        counts = [count(before, y, after_byte) for y in range(256)]
        nll -= math.log((counts[x] + k) / (sum(counts) + 256 * k))
        best = max(range(256), key=lambda y: (counts[y], unigram[y], -y))
        correct += best == x
        n += 1
    return math.exp(nll / n), correct / n


def test_neighbour_model_matches_counting(rng):
    train = bytes(rng.choice(list(b"abcde "), 400).tolist()) + b"xyz"
    windows = rng.choice(list(b"abcdexq"), (5, 9)).astype(np.int64)
    mask = rng.random((5, 9)) < 0.4
    mask[:, 0] = mask[:, -1] = True  # both edges, which back off
    scores = anchors.neighbour_scores(train, windows, mask, k=0.1)
    perplexity, accuracy = reference_neighbours(train, windows, mask, 0.1)
    assert scores["positions"] == int(mask.sum())
    assert scores["perplexity"] == pytest.approx(perplexity, rel=1e-10)
    assert scores["accuracy"] == pytest.approx(accuracy)
    assert 0 < scores["accuracy"] < 1


def test_neighbour_model_by_hand():
    # "abc" seen twice, "abd" once: x between "a" and "c" is "b" with (2 + k) / (2 + 256 k).
    model = anchors.NeighbourModel(b"abc abc abd")
    windows = np.array([[ord("a"), ord("b"), ord("c")], [ord("a"), ord("b"), ord("d")]])
    mask = np.array([[False, True, False], [False, True, False]])
    joint, total, best = model.counts(windows, mask)
    assert joint.tolist() == [2, 1] and total.tolist() == [2, 1]
    assert best.tolist() == [ord("b"), ord("b")]
    scores = model.scores(windows, mask, k=1.0)
    assert scores["perplexity"] == pytest.approx(
        math.exp(-(math.log(3 / 258) + math.log(2 / 257)) / 2), rel=1e-12)
    assert scores["accuracy"] == 1.0
    one = model.scores(np.array([[ord("b")]]), np.array([[True]]), k=1.0)  # no neighbour
    assert one["perplexity"] == pytest.approx((11 + 256) / (3 + 1), rel=1e-12)
    with pytest.raises(ValueError, match="same shape"):
        model.counts(windows, mask[:, :2])


def test_mlm_eval_positions_follow_the_evaluation():
    text = bytes(range(32, 127)) * 4  # 380 bytes: 11 windows of 32
    windows, mask = anchors.mlm_eval_positions(text, length=32, batch_size=4, seed=3)
    assert windows.shape == mask.shape == (11, 32)
    assert windows.reshape(-1).tolist() == list(text[:11 * 32])
    assert mask.any(axis=1).all()  # at least one masked position per window
    assert 0.05 < mask.mean() < 0.3
    # A fresh evaluation generator per chunk of batch_size windows (LanguageTask.evaluate).
    np.testing.assert_array_equal(mask[:4], mask[4:8])
    few, few_mask = anchors.mlm_eval_positions(text, 32, 4, seed=3, eval_batches=2)
    assert few.shape == (8, 32)
    np.testing.assert_array_equal(few_mask, mask[:8])
    other = anchors.mlm_eval_positions(text, 32, 4, seed=4)[1]
    assert not np.array_equal(other, mask)


def test_ridge_matches_lstsq(rng):
    x, y = rng.standard_normal((23, 5)) + 3.0, rng.standard_normal((23, 3))
    strength = 0.7
    weights, bias = anchors.ridge_fit(x, y, strength)
    # The same problem as least squares: centred rows plus sqrt(strength) I.
    xc, yc = x - x.mean(axis=0), y - y.mean(axis=0)
    stacked_x = np.vstack([xc, math.sqrt(strength) * np.eye(5)])
    stacked_y = np.vstack([yc, np.zeros((5, 3))])
    expected = np.linalg.lstsq(stacked_x, stacked_y, rcond=None)[0]
    np.testing.assert_allclose(weights, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(bias, y.mean(axis=0) - x.mean(axis=0) @ expected,
                               rtol=1e-10, atol=1e-12)
    assert np.abs(weights).max() > 0.01


def test_ridge_statistics_in_chunks_equal_one_pass(rng):
    x, y = rng.standard_normal((40, 6)), rng.standard_normal((40, 2))
    whole, chunks = anchors.RidgeStatistics(6, 2), anchors.RidgeStatistics(6, 2)
    whole.add(x, y)
    for first in range(0, 40, 7):
        chunks.add(x[first:first + 7], y[first:first + 7])
    for (w1, b1), (w2, b2) in zip(whole.solutions([1e-3, 1.0]), chunks.solutions([1e-3, 1.0])):
        np.testing.assert_allclose(w1, w2, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(b1, b2, rtol=1e-9, atol=1e-12)
    # Relative strengths are in units of the centred Gram matrix's mean eigenvalue.
    xc = x - x.mean(axis=0)
    unit = np.trace(xc.T @ xc) / 6
    relative, = whole.solutions([0.5])
    absolute, = whole.solutions([0.5 * unit], relative=False)
    np.testing.assert_allclose(relative[0], absolute[0], rtol=1e-9, atol=1e-12)
    assert not np.allclose(relative[0], whole.solutions([0.5], relative=False)[0][0])


def test_classifier_on_separable_images(rng):
    classes = len(fashion_mnist.CLASSES)
    prototypes = rng.integers(0, 256, (classes, 3, 3))

    def images(n):
        labels = rng.integers(0, classes, n)
        noise = rng.integers(-8, 9, (n, 3, 3))
        return np.clip(prototypes[labels] + noise, 0, 255).astype(np.uint8), labels

    train, held, test = images(400), images(100), images(50)
    result = anchors._classifier_accuracies(lambda x: x, *train, *held, *test, eval_size=20)
    assert result["holdout_accuracy"] == 1.0 and result["test_accuracy"] == 1.0
    assert result["strength"] in anchors.RIDGE_GRID
    relu = anchors.RandomReluFeatures(9, 50, seed=0, mean=0.5, std=0.3)
    features = relu(rng.random((4, 9)))
    assert features.shape == (4, 50) and (features >= 0).all() and (features > 0).any()
    np.testing.assert_array_equal(relu.weights,
                                  anchors.RandomReluFeatures(9, 50, 0, 0.5, 0.3).weights)


def test_nlinear_on_linear_trends(rng):
    # Every channel is a straight line: the next values are last + (h + 1) * slope, which
    # NLinear's map (a function of the window minus its last value) gives exactly.
    context, horizon, channels = 8, 3, 4

    def windows(count):
        t = np.arange(context + horizon)[None, :, None]
        slopes = rng.standard_normal((count, 1, channels))
        levels = 10 * rng.standard_normal((count, 1, channels))
        series = levels + slopes * t
        return series[:, :context], series[:, context:]

    inputs, targets = windows(30)
    x, y, last = anchors.nlinear_rows(inputs, targets)
    assert x.shape == (30 * channels, context) and y.shape == (30 * channels, horizon)
    np.testing.assert_array_equal(x[:, -1], 0)
    weights, bias = anchors.ridge_fit(x, y, 1e-9)
    test_inputs, test_targets = windows(5)
    forecasts = anchors.nlinear_forecast(test_inputs, weights, bias)
    assert forecasts.shape == test_targets.shape
    np.testing.assert_allclose(forecasts, test_targets, atol=1e-5)
    # Shifting a window shifts its forecast.
    shifted = anchors.nlinear_forecast(test_inputs + 5.0, weights, bias)
    np.testing.assert_allclose(shifted, forecasts + 5.0, atol=1e-9)


def test_regression_references():
    result = anchors.regression_references(dims=3, points=6, batch_size=16, eval_batches=2,
                                           seed=1)
    least, zero = result["least squares on the prefix"], result["zero predictor"]
    assert len(least["per_position"]) == 6
    assert least["per_position"][0] == pytest.approx(zero["per_position"][0])
    assert max(least["per_position"][4:]) < 1e-9  # 3 dimensions: exact from 3 points on
    assert 0.5 < zero["mse"] < 2 and least["mse"] < zero["mse"]
    test = anchors.regression_references("test", dims=3, points=6, batch_size=16,
                                         eval_batches=2, seed=1)
    assert test["zero predictor"]["mse"] != zero["mse"]  # the test stream's prompts
    config = {"run": {"family": "regression", "seed": 1}, "data": {"dims": 3, "points": 6},
              "train": {"batch_size": 16, "eval_batches": 2}}
    assert anchors.for_config(config) == result
    with pytest.raises(ValueError, match="tokenizer"):
        anchors.for_config({"run": {"family": "lm", "seed": 0}, "train": {},
                            "data": {"tokenizer": "bpe"}})


def test_for_task_and_cli(capsys):
    with pytest.raises(ValueError, match="task"):
        anchors.for_task("speech")
    with pytest.raises(ValueError, match="split"):
        anchors.for_task("lm", split="train")
    anchors.main(["regression", "--dims", "2", "--points", "4", "--batch-size", "8",
                  "--eval-batches", "1"])
    out = capsys.readouterr().out
    assert "| least squares on the prefix |" in out and "zero predictor, per_position" in out
    table = anchors.format_table({"a": {"x": 1.23456, "k": 0.01}, "b": {"x": 2.0}})
    assert table.splitlines()[2] == "| a | 1.235 | 0.01 |"


def test_task_entry_points_on_fixture_data(monkeypatch, rng):
    """for_task's wiring, with the loaders replaced by small synthetic data."""
    classes = len(fashion_mnist.CLASSES)
    prototypes = rng.integers(0, 256, (classes, 4, 4))

    def fashion(split):
        n = 600 if split == "train" else 100
        labels = rng.integers(0, classes, n)
        images = np.clip(prototypes[labels] + rng.integers(-8, 9, (n, 4, 4)), 0, 255)
        if split == "test":
            labels[:20] = (labels[:20] + 1) % classes  # the first 20 are mislabelled
        return images.astype(np.uint8), labels

    monkeypatch.setattr(anchors.datasets, "load_fashion_mnist", fashion)
    settings = dict(eval_size=20, validation_size=100, features=40)
    validation = anchors.for_task("vit", "validation", **settings)["pixel ridge"]
    assert validation["accuracy"] == validation["test_accuracy_first_20"] == 0.0
    held = anchors.for_task("vit", "validation", held_out_validation=True, **settings)
    assert held["pixel ridge"]["accuracy"] == held["pixel ridge"]["holdout_accuracy"]
    test = anchors.for_task("vit", "test", **settings)["40 random ReLU features + ridge"]
    assert test["accuracy"] == test["test_accuracy"] == 0.8

    t = np.arange(4 * 24 * 30 * 20)[:, None]  # 20 months of hourly rows, 7 straight lines
    series = (t * np.linspace(-1e-3, 1e-3, 7) + np.arange(7)).astype(np.float32)
    months = {"train": (0, 12), "validation": (12, 16), "test": (16, 20)}
    ett = {name: series[a * 720:b * 720] for name, (a, b) in months.items()}
    monkeypatch.setattr(anchors.datasets, "load_ett", lambda name: ett)
    for split in anchors.SPLITS:
        forecast = anchors.for_task("forecast", split, context=16, horizon=4, windows=10)
        assert forecast["NLinear ridge"]["mse"] < 1e-8

    texts = {"train": "abcabd " * 50, "validation": "abcab abd " * 10,
             "test": "abd abc " * 10}
    monkeypatch.setattr(anchors.datasets, "austen_splits", lambda: texts)
    lm = anchors.for_task("lm", "test", max_order=3)
    assert lm["3-gram"]["perplexity"] == pytest.approx(anchors.ngram_perplexity(
        texts["train"], texts["test"], 3, lm["3-gram"]["k"]))
    mlm = anchors.for_task("mlm", "test", length=8, batch_size=2, seed=0)["neighbour counts"]
    windows, mask = anchors.mlm_eval_positions(texts["test"], 8, 2, 0)
    assert mlm["perplexity"] == pytest.approx(anchors.neighbour_scores(
        texts["train"], windows, mask, mlm["k"])["perplexity"])
    assert mlm["positions"] == int(mask.sum())
