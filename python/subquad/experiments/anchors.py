"""Non-neural anchors of the experiments' tasks (evidence protocol, section 4): byte n-gram
LMs and the masked-byte neighbour-count model (add-k counts), ridge classifiers on
Fashion-MNIST pixels and on random ReLU features, NLinear closed-form ridge on ETT, and
the in-context regression references. Each task's anchors take seconds on one core.

    for_task("lm" | "mlm" | "vit" | "forecast" | "regression", split, **settings)
        -> {anchor name: {metric: value}}
    python -m subquad.experiments.anchors TASK [--split validation|test] [...]
"""

import argparse
import inspect
import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import data as datasets

ALPHABET = 256  # bytes
K_GRID = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)  # add-k candidates (log grid)
# Ridge strengths, in units of the mean eigenvalue of the centred Gram matrix (the
# scale-free form, so one grid serves pixels, random features and series).
RIDGE_GRID = tuple(10.0 ** power for power in range(-6, 3))
SPLITS = ("validation", "test")
Text = Union[bytes, str, np.ndarray]


def byte_ids(text: Text) -> np.ndarray:
    """int64 [len] byte values of bytes, a str (UTF-8, as ByteTokenizer) or an id array."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    if isinstance(text, (bytes, bytearray)):
        return np.frombuffer(bytes(text), dtype=np.uint8).astype(np.int64)
    ids = np.asarray(text, dtype=np.int64)
    if ids.ndim != 1 or (ids.size and (ids.min() < 0 or ids.max() >= ALPHABET)):
        raise ValueError(f"text: expected bytes, str or a 1-D array of 0..255, got shape "
                         f"{ids.shape}")
    return ids


def _check_k(k: float) -> None:
    if not k > 0:
        raise ValueError(f"k: expected > 0 (add-k smoothing), got {k}")


class CountTable:
    """Counts of (context, byte) pairs of training occurrences: count(context, x),
    count(context) and the most frequent byte after each context (ties: the byte more
    frequent in the whole text, then the lower byte). Contexts are int64 codes."""

    def __init__(self, contexts: np.ndarray, symbols: np.ndarray, unigram: np.ndarray):
        if len(symbols) == 0:
            raise ValueError("training text too short: no occurrence to count")
        self.keys, self.counts = np.unique(contexts * ALPHABET + symbols, return_counts=True)
        key_contexts, key_symbols = self.keys // ALPHABET, self.keys % ALPHABET
        self.contexts, starts = np.unique(key_contexts, return_index=True)
        self.context_counts = np.add.reduceat(self.counts, starts)
        # Sorted by context first, so each context keeps its index range; last = best.
        order = np.lexsort((-key_symbols, unigram[key_symbols], self.counts, key_contexts))
        ends = np.append(starts[1:], len(self.keys)) - 1
        self.best = key_symbols[order[ends]]
        self.fallback = int(np.argmax(unigram))

    def lookup(self, contexts: np.ndarray, symbols: np.ndarray
               ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(count(context, x), count(context), most frequent byte after the context) of
        each query; 0, 0 and the most frequent byte overall for an unseen context."""
        joint = _find(self.keys, self.counts, contexts * ALPHABET + symbols, 0)
        total = _find(self.contexts, self.context_counts, contexts, 0)
        best = _find(self.contexts, self.best, contexts, self.fallback)
        return joint, total, best


def _find(keys: np.ndarray, values: np.ndarray, queries: np.ndarray, missing: int):
    """values[keys == query] of each query (keys sorted, unique), `missing` if absent."""
    index = np.minimum(np.searchsorted(keys, queries), len(keys) - 1)
    return np.where(keys[index] == queries, values[index], missing)


def add_k_nll(joint: np.ndarray, total: np.ndarray, k: float) -> np.ndarray:
    """-log P(x | context) with P = (count(context, x) + k) / (count(context) + 256 k)."""
    _check_k(k)
    return np.log(total + k * ALPHABET) - np.log(joint + k)


def best_k(joint: np.ndarray, total: np.ndarray, grid: Sequence[float] = K_GRID
           ) -> Tuple[float, float]:
    """(k, perplexity) of the k in `grid` with the lowest perplexity on these counts."""
    perplexities = [math.exp(float(np.mean(add_k_nll(joint, total, k)))) for k in grid]
    index = int(np.argmin(perplexities))
    return float(grid[index]), perplexities[index]


# ---- byte n-gram language models --------------------------------------------------------

def _context_codes(ids: np.ndarray, positions: np.ndarray, width: int) -> np.ndarray:
    """Code of the `width` bytes before each position (base 256, oldest byte first)."""
    code = np.zeros(len(positions), dtype=np.int64)
    for offset in range(width, 0, -1):
        code = code * ALPHABET + ids[positions - offset]
    return code


class NGramModel:
    """Byte n-gram counts of orders 1..max_order of a training text, scored with add-k
    over the 256 bytes. Byte i of a scored text is predicted from the order - 1 bytes
    before it; the first order - 1 bytes from the i bytes that exist (lower orders)."""

    def __init__(self, train: Text, max_order: int = 4):
        ids = byte_ids(train)
        if max_order < 1 or len(ids) < max_order:
            raise ValueError(f"max_order: expected 1..len(train) = {len(ids)}, got "
                             f"{max_order}")
        unigram = np.bincount(ids, minlength=ALPHABET)
        self.max_order = max_order
        self.tables = []  # by context width 0 .. max_order - 1
        for width in range(max_order):
            positions = np.arange(width, len(ids))
            self.tables.append(CountTable(_context_codes(ids, positions, width),
                                          ids[positions], unigram))

    def counts(self, text: Text, order: int) -> Tuple[np.ndarray, np.ndarray]:
        """count(context, x) and count(context), int64 [len(text)], of every byte."""
        if not 1 <= order <= self.max_order:
            raise ValueError(f"order: expected 1..{self.max_order}, got {order}")
        ids = byte_ids(text)
        joint, total = np.zeros(len(ids), np.int64), np.zeros(len(ids), np.int64)
        for width in range(order):
            if width < order - 1:  # the one position that has exactly `width` bytes before
                positions = np.arange(width, min(width + 1, len(ids)))
            else:
                positions = np.arange(width, len(ids))
            found = self.tables[width].lookup(_context_codes(ids, positions, width),
                                              ids[positions])
            joint[positions], total[positions] = found[0], found[1]
        return joint, total

    def perplexity(self, text: Text, order: int, k: float) -> float:
        joint, total = self.counts(text, order)
        return math.exp(float(np.mean(add_k_nll(joint, total, k))))


def ngram_perplexity(train: Text, text: Text, order: int, k: float) -> float:
    """Perplexity (exp of the mean negative log-likelihood per byte) of `text` under the
    add-k byte n-gram model of `train` (every byte of `text` is predicted, see NGramModel)."""
    return NGramModel(train, order).perplexity(text, order, k)


def choose_k(train: Text, validation: Text, order: int,
             grid: Sequence[float] = K_GRID) -> Tuple[float, float]:
    """(k, validation perplexity): the add-k of `grid` that scores `validation` best."""
    return best_k(*NGramModel(train, order).counts(validation, order), grid)


# ---- masked byte LM: neighbour counts -----------------------------------------------------

class NeighbourModel:
    """P(x | previous byte, next byte) by add-k counts on a training text. The neighbours
    are the true bytes of the window, also where they are masked themselves (the network
    sees [MASK] or a random byte there, so this anchor knows a little more). A window's
    first byte backs off to P(x | next byte), its last to P(x | previous byte), a window
    of one byte to P(x); the window's neighbours outside it are not used."""

    def __init__(self, train: Text):
        ids = byte_ids(train)
        if len(ids) < 3:
            raise ValueError(f"train: expected at least 3 bytes, got {len(ids)}")
        unigram = np.bincount(ids, minlength=ALPHABET)
        self.both = CountTable(ids[:-2] * ALPHABET + ids[2:], ids[1:-1], unigram)
        self.previous = CountTable(ids[:-1], ids[1:], unigram)
        self.next = CountTable(ids[1:], ids[:-1], unigram)
        self.none = CountTable(np.zeros_like(ids), ids, unigram)

    def counts(self, windows: np.ndarray, mask: np.ndarray
               ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(count(neighbours, x), count(neighbours), predicted byte) of each position of
        windows int [n, T] where mask (bool [n, T]) is set, in row-major order."""
        windows, mask = np.asarray(windows, dtype=np.int64), np.asarray(mask, dtype=bool)
        if windows.ndim != 2 or mask.shape != windows.shape:
            raise ValueError(f"windows, mask: expected [n, T] and the same shape, got "
                             f"{list(windows.shape)} and {list(mask.shape)}")
        if windows.size and (windows.min() < 0 or windows.max() >= ALPHABET):
            raise ValueError("windows: expected byte values 0..255")
        rows, columns = np.nonzero(mask)
        last = windows.shape[1] - 1
        padded = np.pad(windows, ((0, 0), (1, 1)))  # the pad is read only where unused
        before, after = padded[rows, columns], padded[rows, columns + 2]
        symbols = windows[rows, columns]
        out = [np.zeros(len(rows), np.int64) for _ in range(3)]
        cases = [(self.both, (columns > 0) & (columns < last), before * ALPHABET + after),
                 (self.next, (columns == 0) & (last > 0), after),
                 (self.previous, (columns == last) & (last > 0), before),
                 (self.none, np.full(len(rows), last == 0), np.zeros_like(symbols))]
        for table, where, contexts in cases:
            for target, found in zip(out, table.lookup(contexts[where], symbols[where])):
                target[where] = found
        return out[0], out[1], out[2]

    def scores(self, windows: np.ndarray, mask: np.ndarray, k: float) -> Dict[str, float]:
        """Perplexity and top-1 accuracy (which no k changes) over the masked positions."""
        joint, total, predicted = self.counts(windows, mask)
        symbols = np.asarray(windows)[np.asarray(mask, dtype=bool)]
        return {"perplexity": math.exp(float(np.mean(add_k_nll(joint, total, k)))),
                "accuracy": float(np.mean(predicted == symbols)), "positions": len(symbols)}


def neighbour_scores(train: Text, windows: np.ndarray, mask: np.ndarray,
                     k: float) -> Dict[str, float]:
    """Perplexity, top-1 accuracy and count of the masked positions of windows [n, T]
    under the add-k neighbour-count model of `train` (see NeighbourModel)."""
    return NeighbourModel(train).scores(windows, mask, k)


def mlm_eval_positions(text: Text, length: int, batch_size: int, seed: int,
                       eval_batches: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """The windows int64 [n, length] and masked positions bool [n, length] that
    LanguageTask.evaluate scores (byte tokenizer): consecutive windows from the start of
    `text`, eval_batches * batch_size of them (None or 0: all that fit), each chunk of
    batch_size windows masked by MaskedLM's BERT rule with a fresh evaluation generator."""
    from ..models.language import IGNORE_INDEX, MaskedLM, bert_mask
    from ..train.tasks import EVAL_STREAM, step_generator

    ids = byte_ids(text)
    count = len(ids) // length
    if eval_batches:
        count = min(count, eval_batches * batch_size)
    if count < 1:
        raise ValueError(f"length: {length} is longer than the text ({len(ids)} bytes)")
    windows = ids[:count * length].reshape(count, length)
    rate = inspect.signature(MaskedLM).parameters["mask_rate"].default
    masks = []
    for first in range(0, count, batch_size):
        chunk = torch.from_numpy(windows[first:first + batch_size])
        _, labels = bert_mask(chunk, ALPHABET, ALPHABET, step_generator(seed, EVAL_STREAM),
                              rate)
        masks.append((labels != IGNORE_INDEX).numpy())
    return windows, np.concatenate(masks)


# ---- ridge regression (Fashion-MNIST, ETT) ----------------------------------------------

class RidgeStatistics:
    """Sums of x, y, x^T x and x^T y over rows added in chunks (float64), from which the
    ridge fits of any strength follow: W = (Xc^T Xc + lam I)^-1 Xc^T Yc with X and Y
    centred, so the intercept b = mean(y) - mean(x) W is not penalised."""

    def __init__(self, features: int, outputs: int):
        self.n = 0
        self.sum_x, self.sum_y = np.zeros(features), np.zeros(outputs)
        self.xx, self.xy = np.zeros((features, features)), np.zeros((features, outputs))

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        self.n += len(x)
        self.sum_x += x.sum(axis=0)
        self.sum_y += y.sum(axis=0)
        self.xx += x.T @ x
        self.xy += x.T @ y

    def solutions(self, strengths: Sequence[float], relative: bool = True
                  ) -> List[Tuple[np.ndarray, np.ndarray]]:
        """(W [features, outputs], b [outputs]) per strength; relative strengths are in
        units of the centred Gram matrix's mean eigenvalue."""
        mean_x, mean_y = self.sum_x / self.n, self.sum_y / self.n
        gram = self.xx - self.n * np.outer(mean_x, mean_x)
        cross = self.xy - self.n * np.outer(mean_x, mean_y)
        eigenvalues, vectors = np.linalg.eigh(gram)
        eigenvalues = np.maximum(eigenvalues, 0)  # round-off of a singular Gram matrix
        projected = vectors.T @ cross
        unit = float(np.trace(gram)) / len(gram) if relative else 1.0
        fits = []
        for strength in strengths:
            weights = vectors @ (projected / (eigenvalues + strength * unit)[:, None])
            fits.append((weights, mean_y - mean_x @ weights))
        return fits


def ridge_fit(x: np.ndarray, y: np.ndarray, strength: float
              ) -> Tuple[np.ndarray, np.ndarray]:
    """(W, b) minimising |x W + b - y|^2 + strength |W|^2 (x [n, d], y [n, m])."""
    if not strength > 0:
        raise ValueError(f"strength: expected > 0, got {strength}")
    statistics = RidgeStatistics(x.shape[1], y.shape[1])
    statistics.add(x, y)
    return statistics.solutions([strength], relative=False)[0]


def _pixels(images: np.ndarray) -> np.ndarray:
    return images.reshape(len(images), -1).astype(np.float64) / 255.0


class RandomReluFeatures:
    """relu(z W + c) of standardised pixels z, W ~ N(0, 1/d) [d, features] and
    c ~ N(0, 1), from a fixed seed."""

    def __init__(self, inputs: int, features: int, seed: int, mean: float, std: float):
        generator = np.random.default_rng(seed)
        self.weights = generator.standard_normal((inputs, features)) / math.sqrt(inputs)
        self.offsets = generator.standard_normal(features)
        self.mean, self.std = mean, std

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        return np.maximum(((pixels - self.mean) / self.std) @ self.weights + self.offsets, 0)


def _classifier_accuracies(transform, train_images, train_labels, held_images,
                           held_labels, test_images, test_labels, eval_size: int,
                           chunk: int = 5000) -> Dict[str, float]:
    """One-vs-rest least squares on one-hot targets: strength chosen on the held-out
    training images, then accuracy on them ("holdout_accuracy") and on the test images
    (all, and the first eval_size)."""
    classes = len(datasets.fashion_mnist.CLASSES)
    statistics = None
    for first in range(0, len(train_images), chunk):
        x = transform(_pixels(train_images[first:first + chunk]))
        statistics = statistics or RidgeStatistics(x.shape[1], classes)
        statistics.add(x, np.eye(classes)[train_labels[first:first + chunk]])
    fits = statistics.solutions(RIDGE_GRID)
    held = transform(_pixels(held_images))
    held_accuracy = [float(np.mean(np.argmax(held @ w + b, axis=1) == held_labels))
                     for w, b in fits]
    choice = int(np.argmax(held_accuracy))
    weights, bias = fits[choice]
    correct = np.argmax(transform(_pixels(test_images)) @ weights + bias, axis=1) == test_labels
    return {"holdout_accuracy": held_accuracy[choice],
            "test_accuracy": float(np.mean(correct)),
            f"test_accuracy_first_{eval_size}": float(np.mean(correct[:eval_size])),
            "strength": RIDGE_GRID[choice]}


def fashion_mnist_anchors(split: str = "validation", eval_size: int = 2000,
                          validation_size: int = 5000, features: int = 2000,
                          feature_seed: int = 0, held_out_validation: bool = False
                          ) -> Dict[str, Dict[str, float]]:
    """Ridge on raw pixels (in [0, 1]) and on `features` random ReLU features, fitted on
    the training images but the last validation_size, which choose the strength.
    "accuracy" is VisionTask's on `split`: validation is the first eval_size test images,
    or with held_out_validation (data.validation_size > 0) those last validation_size
    training images; test is all 10,000."""
    _check_split(split)
    images, labels = datasets.load_fashion_mnist("train")
    test_images, test_labels = datasets.load_fashion_mnist("test")
    if not 0 < validation_size < len(images):
        raise ValueError(f"validation_size: expected 1..{len(images) - 1}, got "
                         f"{validation_size}")
    cut = len(images) - validation_size
    fit_data = (images[:cut], labels[:cut], images[cut:], labels[cut:], test_images,
                test_labels, eval_size)
    train_pixels = _pixels(images[:cut])
    relu = RandomReluFeatures(train_pixels.shape[1], features, feature_seed,
                              float(train_pixels.mean()), float(train_pixels.std()))
    out = {"pixel ridge": _classifier_accuracies(lambda x: x, *fit_data),
           f"{features} random ReLU features + ridge": _classifier_accuracies(relu, *fit_data)}
    key = ("test_accuracy" if split == "test" else "holdout_accuracy" if held_out_validation
           else f"test_accuracy_first_{eval_size}")
    return {name: {"accuracy": metrics[key], **metrics} for name, metrics in out.items()}


def nlinear_rows(inputs: np.ndarray, targets: np.ndarray
                 ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NLinear's view of windows [W, context, C], [W, horizon, C]: every channel's window
    minus its last input value, as rows [W C, context] and [W C, horizon], and the last
    values [W C, 1] (added back to the forecasts)."""
    x = np.asarray(inputs, np.float64).transpose(0, 2, 1).reshape(-1, inputs.shape[1])
    y = np.asarray(targets, np.float64).transpose(0, 2, 1).reshape(-1, targets.shape[1])
    last = x[:, -1:]
    return x - last, y - last, last


def nlinear_forecast(inputs: np.ndarray, weights: np.ndarray, bias: np.ndarray
                     ) -> np.ndarray:
    """Forecasts [W, horizon, C] of inputs [W, context, C] by NLinear (W [context,
    horizon], b [horizon], shared by the channels)."""
    x, _, last = nlinear_rows(inputs, np.zeros((len(inputs), 1, inputs.shape[2])))
    forecasts = x @ weights + bias + last
    return forecasts.reshape(len(inputs), inputs.shape[2], -1).transpose(0, 2, 1)


def nlinear_anchor(split: str = "validation", dataset: str = "ETTh1", context: int = 512,
                   horizon: int = 96, windows: Optional[int] = None) -> Dict[str, float]:
    """NLinear by closed-form ridge on every training window (all channels), strength
    chosen on every validation window ("validation_mse"); MSE and MAE (z-scored) on
    `split`: every window, or `windows` of them evenly spaced (as ForecastTask with
    eval_batches * batch_size)."""
    _check_split(split)
    splits = datasets.load_ett(dataset)
    statistics = RidgeStatistics(context, horizon)
    statistics.add(*nlinear_rows(*datasets.forecast_windows(splits, "train", context,
                                                            horizon))[:2])
    fits = statistics.solutions(RIDGE_GRID)
    inputs, targets = datasets.forecast_windows(splits, "validation", context, horizon)
    errors = [float(np.mean((nlinear_forecast(inputs, *fit) - targets) ** 2)) for fit in fits]
    choice = int(np.argmin(errors))
    inputs, targets = datasets.forecast_windows(splits, split, context, horizon)
    if windows:
        pick = np.linspace(0, len(inputs) - 1, min(windows, len(inputs)))
        pick = pick.round().astype(np.int64)
        inputs, targets = inputs[pick], targets[pick]
    error = nlinear_forecast(inputs, *fits[choice]) - targets
    return {"mse": float(np.mean(error ** 2)), "mae": float(np.mean(np.abs(error))),
            "validation_mse": errors[choice], "strength": RIDGE_GRID[choice]}


# ---- in-context linear regression -------------------------------------------------------

def regression_references(split: str = "validation", dims: int = 5, points: int = 11,
                          active: Optional[int] = None, batch_size: int = 64,
                          eval_batches: int = 4, seed: int = 0
                          ) -> Dict[str, Dict[str, object]]:
    """The zero predictor and least squares on the prefix (data.prefix_least_squares) on
    RegressionTask.evaluate's prompts of `split` (active = dims: the curriculum's end):
    squared error / active dimension, overall and per position."""
    from ..train.tasks import EVAL_STREAM, TEST_STREAM, step_generator

    _check_split(split)
    if eval_batches < 1:
        raise ValueError(f"eval_batches: expected >= 1, got {eval_batches}")
    active = dims if active is None else active
    generator = step_generator(seed, EVAL_STREAM if split == "validation" else TEST_STREAM)
    squared = {"least squares on the prefix": [], "zero predictor": []}
    for _ in range(eval_batches):
        xs, ys = datasets.sample_linear_regression(batch_size, points, dims, active,
                                                   generator)
        ys64 = ys.double()
        squared["least squares on the prefix"].append(
            (datasets.prefix_least_squares(xs, ys).double() - ys64).pow(2).numpy())
        squared["zero predictor"].append(ys64.pow(2).numpy())
    out = {}
    for name, errors in squared.items():
        errors = np.concatenate(errors) / active  # [prompts, points]
        out[name] = {"mse": float(errors.mean()),
                     "per_position": errors.mean(axis=0).tolist()}
    return out


# ---- nearest-neighbour retrieval on the sphere ---------------------------------------------

RETRIEVAL_RANKS = (2, 4, 8)  # the low-rank heads' d_head values the probe compares


def retrieval_references(split: str = "validation", dims: int = 16, keys: int = 32,
                         noise: float = 1.0, batch_size: int = 256, eval_batches: int = 4,
                         seed: int = 0) -> Dict[str, Dict[str, float]]:
    """On RetrievalTask.evaluate's sequences of `split`: chance (a uniform guess over the
    labels: accuracy 1 / keys, cross-entropy log keys), and the nearest neighbour by the
    inner product of all `dims` coordinates (the best rule there is: the query is closest
    in angle to its key in expectation) or of r < dims of them (what one head of rank r
    sees)."""
    from ..train.tasks import EVAL_STREAM, TEST_STREAM, step_generator

    _check_split(split)
    if eval_batches < 1:
        raise ValueError(f"eval_batches: expected >= 1, got {eval_batches}")
    generator = step_generator(seed, EVAL_STREAM if split == "validation" else TEST_STREAM)
    batches = [datasets.sample_sphere_retrieval(batch_size, keys, dims, noise, generator)
               for _ in range(eval_batches)]
    out = {"chance": {"accuracy": 1.0 / keys, "loss": math.log(keys)}}
    for rank in [r for r in RETRIEVAL_RANKS if r < dims] + [dims]:
        accuracy = float(np.mean([datasets.nearest_neighbour_accuracy(batch, rank)
                                  for batch in batches]))
        name = ("nearest neighbour" if rank == dims
                else f"nearest neighbour on {rank} coordinates")
        out[name] = {"accuracy": accuracy}
    return out


# ---- one entry point per task -------------------------------------------------------------

# The anchors for_task names with its default settings: an experiment file's
# protocol.anchor is checked against them when it loads, before any run starts.
ANCHOR_NAMES = {
    "lm": tuple(f"{order}-gram" for order in range(1, 5)),
    "mlm": ("neighbour counts",),
    "vit": ("pixel ridge", "2000 random ReLU features + ridge"),
    "forecast": ("NLinear ridge",),
    "regression": ("least squares on the prefix", "zero predictor"),
    "retrieval": ("chance", "nearest neighbour"),
}

def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")


def lm_anchors(split: str = "validation", max_order: int = 4) -> Dict[str, Dict[str, float]]:
    """Byte n-grams of orders 1..max_order on Austen: counts of the five training novels,
    k chosen on Persuasion's first half (validation), perplexity of `split`."""
    _check_split(split)
    texts = datasets.austen_splits()
    model = NGramModel(texts["train"], max_order)
    out = {}
    for order in range(1, max_order + 1):
        k, perplexity = best_k(*model.counts(texts["validation"], order))
        if split != "validation":
            perplexity = model.perplexity(texts[split], order, k)
        out[f"{order}-gram"] = {"perplexity": perplexity, "k": k}
    return out


def mlm_anchors(split: str = "validation", length: int = 128, batch_size: int = 16,
                eval_batches: Optional[int] = 0, seed: int = 0
                ) -> Dict[str, Dict[str, float]]:
    """The neighbour-count model on the masked positions of mlm_eval_positions(split's
    text, ...); k chosen on the validation split's masked positions."""
    _check_split(split)
    texts = datasets.austen_splits()
    model = NeighbourModel(texts["train"])
    masked = {name: mlm_eval_positions(texts[name], length, batch_size, seed, eval_batches)
              for name in {"validation", split}}
    joint, total, _ = model.counts(*masked["validation"])
    k, _ = best_k(joint, total)
    return {"neighbour counts": {**model.scores(*masked[split], k), "k": k}}


def for_task(task: str, split: str = "validation", **settings) -> Dict[str, Dict]:
    """Anchor name -> metrics of `task` on `split` ("validation" or "test").

    Each anchor's main metrics carry the names the task's evaluate(split) reports
    (perplexity, accuracy, mse, mae), on the same data. Settings, as in the run's
    configuration: lm: max_order (4). mlm: length, batch_size, eval_batches, seed.
    vit: eval_size, validation_size, features, feature_seed. forecast: dataset, context,
    horizon, windows (eval_batches * batch_size; None: all). regression: dims, points,
    active, batch_size, eval_batches, seed. retrieval: dims, keys, noise, batch_size,
    eval_batches, seed."""
    _check_split(split)
    if task == "lm":
        return lm_anchors(split, **settings)
    if task == "mlm":
        return mlm_anchors(split, **settings)
    if task == "vit":
        return fashion_mnist_anchors(split, **settings)
    if task == "forecast":
        return {"NLinear ridge": nlinear_anchor(split, **settings)}
    if task == "regression":
        return regression_references(split, **settings)
    if task == "retrieval":
        return retrieval_references(split, **settings)
    raise ValueError(f"task: expected one of {', '.join(ANCHOR_NAMES)}, got {task!r}")


def for_config(config, split: str = "validation") -> Dict[str, Dict]:
    """for_task with the settings of a resolved subquad-train configuration."""
    family, data, train = config["run"]["family"], config["data"], config["train"]
    if family in ("lm", "mlm") and data["tokenizer"] != "byte":
        raise ValueError(f"data.tokenizer: the anchors are byte models, got "
                         f"{data['tokenizer']!r}")
    settings = {
        "lm": {},
        "mlm": dict(length=data.get("length"), batch_size=train["batch_size"],
                    eval_batches=train["eval_batches"], seed=config["run"]["seed"]),
        "vit": (dict(validation_size=data["validation_size"], held_out_validation=True)
                if data.get("validation_size") else dict(eval_size=data.get("eval_size"))),
        "forecast": dict(dataset=data.get("dataset"), context=data.get("context"),
                         horizon=data.get("horizon"),
                         windows=train["eval_batches"] * train["batch_size"] or None),
        "regression": dict(dims=data.get("dims"), points=data.get("points"),
                           batch_size=train["batch_size"],
                           eval_batches=train["eval_batches"], seed=config["run"]["seed"]),
        "retrieval": dict(dims=data.get("dims"), keys=data.get("keys"),
                          noise=data.get("noise"), batch_size=train["batch_size"],
                          eval_batches=train["eval_batches"], seed=config["run"]["seed"]),
    }[family]
    return for_task(family, split, **settings)


def format_table(anchors: Dict[str, Dict]) -> str:
    """A Markdown table: one row per anchor, one column per scalar metric."""
    columns = []
    for metrics in anchors.values():
        columns += [name for name, value in metrics.items()
                    if not isinstance(value, list) and name not in columns]
    lines = ["| anchor | " + " | ".join(columns) + " |",
             "|---|" + "---|" * len(columns)]
    for name, metrics in anchors.items():
        cells = [f"{metrics[c]:.4g}" if isinstance(metrics.get(c), float)
                 else str(metrics.get(c, "")) for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m subquad.experiments.anchors",
        description="Print the non-neural anchors of a task (evidence protocol, sec. 4).")
    parser.add_argument("task", choices=list(ANCHOR_NAMES))
    parser.add_argument("--split", choices=SPLITS, default="validation")
    parser.add_argument("--length", type=int, default=128, help="mlm window")
    parser.add_argument("--batch-size", type=int, help="mlm (16), regression (64), "
                                                       "retrieval (256)")
    parser.add_argument("--eval-batches", type=int,
                        help="mlm (0: every window), regression, retrieval (4)")
    parser.add_argument("--seed", type=int, default=0, help="mlm, regression, retrieval")
    parser.add_argument("--dataset", default="ETTh1", choices=["ETTh1", "ETTh2"])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--horizon", type=int, default=96)
    parser.add_argument("--windows", type=int, help="forecast: evenly spaced (default all)")
    parser.add_argument("--eval-size", type=int, default=2000, help="vit")
    parser.add_argument("--dims", type=int, help="regression (5), retrieval (16)")
    parser.add_argument("--keys", type=int, default=32, help="retrieval")
    parser.add_argument("--noise", type=float, default=1.0, help="retrieval")
    parser.add_argument("--points", type=int, default=11)
    args = parser.parse_args(argv)
    optional = {"batch_size": args.batch_size, "eval_batches": args.eval_batches}
    optional = {name: value for name, value in optional.items() if value is not None}
    settings = {
        "lm": {},
        "mlm": dict(length=args.length, seed=args.seed, **optional),
        "vit": dict(eval_size=args.eval_size),
        "forecast": dict(dataset=args.dataset, context=args.context, horizon=args.horizon,
                         windows=args.windows),
        "regression": dict(dims=args.dims or 5, points=args.points, seed=args.seed,
                           **optional),
        "retrieval": dict(dims=args.dims or 16, keys=args.keys, noise=args.noise,
                          seed=args.seed, **optional),
    }[args.task]
    anchors = for_task(args.task, args.split, **settings)
    print(format_table(anchors))
    for name, metrics in anchors.items():
        for metric, values in metrics.items():
            if isinstance(values, list):
                print(f"{name}, {metric}: " + " ".join(f"{v:.3g}" for v in values))


if __name__ == "__main__":
    main()
