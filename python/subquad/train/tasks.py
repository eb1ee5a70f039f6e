"""One task per model family: its data, its model, its training batches and loss, and its
evaluation. A batch is a pure function of (seed, step), so a resumed run draws exactly the
batches an uninterrupted one would."""

import math
from typing import Dict, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import data as datasets
from .. import models
from ..layers.registry import ATTENTIONS, accepted_options
from .config import STEP_STREAMS, ConfigError  # seeds of step generators (see config)
EVAL_STREAM = -1  # the step index of the evaluation stream (fixed across the run)
TEST_STREAM = -2  # of the test stream (tasks that draw their test data)
SPLITS = ("validation", "test")
SHORT_CONTEXT, LONG_CONTEXT_FROM = 128, 512  # the causal LM's position buckets


def step_generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * STEP_STREAMS + step + 1)


def model_options(config) -> Dict:
    """Keyword arguments shared by every family's model."""
    model, run = config["model"], config["run"]
    attention_options = {name: dict(options)
                         for name, options in model["attention_options"].items()}
    for name in set(model["pattern"] or [model["attention"]]):
        if name in ATTENTIONS and "threads" in accepted_options(ATTENTIONS[name].factory):
            attention_options.setdefault(name, {}).setdefault("threads", run["threads"])
    return dict(dim=model["dim"], heads=model["heads"], layers=model["layers"],
                attention=model["attention"], pattern=model["pattern"] or None,
                mlp_ratio=float(model["mlp_ratio"]), attention_options=attention_options,
                mup=model["mup"], attention_scale=model["attention_scale"] or None)


class Task:
    """The interface the trainer runs: model, batch(step), loss(batch), evaluate()."""

    model: nn.Module
    state: Dict[str, str] = {}  # text to keep with checkpoints (e.g. a trained tokeniser)

    def __init__(self, config):
        self.config, self.seed = config, config["run"]["seed"]
        self.batch_size = config["train"]["batch_size"]

    def batch(self, step: int):
        raise NotImplementedError

    def loss(self, batch) -> Tuple[Tensor, Dict[str, float]]:
        raise NotImplementedError

    def tokens(self, batch) -> int:
        raise NotImplementedError

    @torch.no_grad()
    def evaluate(self, split: str = "validation") -> Dict[str, float]:
        """Metrics on `split` ("validation" selects; "test" is read once, at the end)."""
        raise NotImplementedError


def check_split(split: str, splits=SPLITS) -> str:
    if split not in splits:
        raise ValueError(f"split: expected one of {list(splits)}, got {split!r}")
    return split


def _windows(ids: np.ndarray, length: int, starts: np.ndarray) -> Tensor:
    return torch.from_numpy(ids[starts[:, None] + np.arange(length)])


class LanguageTask(Task):
    """lm (next-token loss, perplexity) and mlm (masked-token loss, accuracy) on Austen:
    random windows of the five training novels; evaluation on consecutive windows of
    Persuasion's first half (validation) or second half (test): the first
    eval_batches * batch_size windows, or all of them when eval_batches is 0."""

    def __init__(self, config, tokenizer_json: str = None):
        super().__init__(config)
        data, family = config["data"], config["run"]["family"]
        self.causal, self.length = family == "lm", data["length"]
        self.splits = splits = datasets.austen_splits()
        if tokenizer_json is not None and data["tokenizer"] == "bpe":
            self.tokenizer = datasets.BpeTokenizer.from_json(tokenizer_json)
        else:
            try:
                self.tokenizer = datasets.make_tokenizer(data["tokenizer"], splits["train"],
                                                         data["vocab_size"])
            except ValueError as error:
                raise ConfigError(f"data.{error}") from None
        self.state = {"tokenizer": self.tokenizer.to_json()}
        self.train_ids = self.tokenizer.encode(splits["train"])
        self.eval_ids = self.tokenizer.encode(splits["validation"])
        self.test_ids = None  # encoded when first asked for
        window = self.length + self.causal  # the LM reads one token past its inputs
        if len(self.eval_ids) < window:
            raise ValueError(f"data.length: {self.length} is longer than the validation text")
        family_model = models.CausalLM if self.causal else models.MaskedLM
        self.model = family_model(self.tokenizer.vocab_size, self.length,
                                  position_embedding=config["model"]["position_embedding"],
                                  **model_options(config))

    def batch(self, step: int) -> Tensor:
        window = self.length + self.causal
        generator = step_generator(self.seed, step)
        starts = torch.randint(len(self.train_ids) - window + 1, (self.batch_size,),
                               generator=generator).numpy()
        return _windows(self.train_ids, window, starts), generator

    def loss(self, batch):
        ids, generator = batch
        if self.causal:
            return self.model.loss(ids), {}
        loss, accuracy = self.model.loss(ids, generator)
        return loss, {"accuracy": float(accuracy)}

    def tokens(self, batch) -> int:
        return batch[0].shape[0] * self.length

    def split_ids(self, split: str) -> np.ndarray:
        if check_split(split) == "validation":
            return self.eval_ids
        if self.test_ids is None:
            self.test_ids = self.tokenizer.encode(self.splits["test"])
        return self.test_ids

    @torch.no_grad()
    def evaluate(self, split: str = "validation"):
        return self.score(self.split_ids(split))

    def _scored_positions(self, chunk: Tensor) -> int:
        """The positions of the evaluation's fixed masking that a chunk's mean loss
        averages (mlm)."""
        mask_id = self.model.mask_id
        _, labels = models.bert_mask(chunk, mask_id, mask_id,
                                     step_generator(self.seed, EVAL_STREAM),
                                     self.model.mask_rate)
        return int((labels != models.IGNORE_INDEX).sum())

    @torch.no_grad()
    def score(self, ids: np.ndarray) -> Dict[str, float]:
        """Metrics on consecutive windows of the token ids: the mean over every scored
        token (chunks weighted by their scored tokens)."""
        window = self.length + self.causal
        if len(ids) < window:
            raise ValueError(f"text: {len(ids)} tokens, fewer than one window of "
                             f"data.length{' + 1' if self.causal else ''} = {window}")
        count = len(ids) // window
        if self.config["train"]["eval_batches"]:
            count = min(count, self.config["train"]["eval_batches"] * self.batch_size)
        windows = _windows(ids, window, np.arange(count) * window)
        if self.causal:
            return self._score_causal(windows)
        loss_sum, correct, scored = 0.0, 0.0, 0
        for chunk in windows.split(self.batch_size):
            loss, metrics = self.loss((chunk, step_generator(self.seed, EVAL_STREAM)))
            weight = self._scored_positions(chunk)
            loss_sum += float(loss) * weight
            correct += metrics["accuracy"] * weight
            scored += weight
        loss = loss_sum / scored
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)),
                "accuracy": correct / scored}

    def _score_causal(self, windows: Tensor) -> Dict[str, float]:
        """Next-token loss over every position; with windows longer than
        LONG_CONTEXT_FROM, also the loss of the first SHORT_CONTEXT positions and of those
        from LONG_CONTEXT_FROM on (whether long context is used at all)."""
        per_position = torch.zeros(self.length, dtype=torch.float64)
        for chunk in windows.split(self.batch_size):
            logits, _ = self.model(chunk[:, :-1])
            losses = F.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten(),
                                     reduction="none").view(chunk.shape[0], self.length)
            per_position += losses.sum(0).double()
        per_position /= len(windows)
        loss = float(per_position.mean())
        result = {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}
        if self.length > LONG_CONTEXT_FROM:
            result[f"loss_positions_lt{SHORT_CONTEXT}"] = float(
                per_position[:SHORT_CONTEXT].mean())
            result[f"loss_positions_ge{LONG_CONTEXT_FROM}"] = float(
                per_position[LONG_CONTEXT_FROM:].mean())
        return result


SHIFT = 2  # pixels: augmentation moves an image by up to this much each way


def augment(images: Tensor, background: float, generator: torch.Generator) -> Tensor:
    """images [B, 1, H, W] moved by a random shift of -SHIFT..SHIFT pixels on each axis
    (the uncovered border filled with `background`, a blank pixel's value) and flipped left
    to right with probability 1/2: the light augmentation of a small-image ViT."""
    B, _, H, W = images.shape
    shifts = torch.randint(2 * SHIFT + 1, (2, B), generator=generator)
    flips = torch.rand(B, generator=generator) < 0.5
    padded = F.pad(images[:, 0], (SHIFT, SHIFT, SHIFT, SHIFT), value=background)
    rows = shifts[0][:, None] + torch.arange(H)                      # [B, H]
    cols = shifts[1][:, None] + torch.arange(W)                      # [B, W]
    moved = padded[torch.arange(B)[:, None, None], rows[:, :, None], cols[:, None, :]]
    return torch.where(flips[:, None, None], moved.flip(-1), moved).unsqueeze(1)


def vision_model(config) -> nn.Module:
    """The vit family's classifier: 28 x 28 grey Fashion-MNIST images, 10 classes."""
    model = config["model"]
    return models.ViTClassifier(28, model["patch"], 1, 10, pool=model["pool"],
                                **model_options(config))


class VisionTask(Task):
    """vit on Fashion-MNIST: cross-entropy on random training images (optionally
    augmented). With data.validation_size = V > 0 (the evidence protocol's split) the last
    V training images are held out for validation, never trained on, and test is all
    10,000 test images; with V = 0 (older configurations) validation is the first
    eval_size test images."""

    def __init__(self, config):
        super().__init__(config)
        data, model = config["data"], config["model"]
        images, labels = datasets.load_fashion_mnist("train")
        self.held_out = data["validation_size"]
        if self.held_out:
            held_images, held_labels = images[-self.held_out:], labels[-self.held_out:]
            images, labels = images[:-self.held_out], labels[:-self.held_out]
        if data["train_size"]:
            images, labels = images[:data["train_size"]], labels[:data["train_size"]]
        pixels = images.astype(np.float32) / 255.0
        mean, std = float(pixels.mean()), float(pixels.std())
        self.images = torch.from_numpy(datasets.normalise(images, mean, std))
        self.labels = torch.from_numpy(labels)
        self.background = -mean / std  # a blank pixel, standardised
        self.augment = data["augment"]
        test_images, test_labels = datasets.load_fashion_mnist("test")
        self.moments, self.test_count = (mean, std), len(test_labels)
        if self.held_out:
            self.eval_images = torch.from_numpy(datasets.normalise(held_images, mean, std))
            self.eval_labels = torch.from_numpy(held_labels)
        else:
            self.eval_images = torch.from_numpy(
                datasets.normalise(test_images[:data["eval_size"]], mean, std))
            self.eval_labels = torch.from_numpy(test_labels[:data["eval_size"]])
        self.test_images = self.test_labels = None  # all 10,000, loaded when first asked
        self.model = vision_model(config)
        self.patches = (28 // model["patch"]) ** 2

    def batch(self, step: int):
        generator = step_generator(self.seed, step)
        index = torch.randint(len(self.images), (self.batch_size,), generator=generator)
        images = self.images[index]
        if self.augment:
            images = augment(images, self.background, generator)
        return images, self.labels[index]

    def loss(self, batch):
        images, labels = batch
        logits = self.model(images).float()
        accuracy = (logits.argmax(-1) == labels).float().mean()
        return F.cross_entropy(logits, labels), {"accuracy": float(accuracy)}

    def tokens(self, batch) -> int:
        return batch[0].shape[0] * self.patches

    def split_data(self, split: str) -> Tuple[Tensor, Tensor]:
        if check_split(split) == "validation":
            return self.eval_images, self.eval_labels
        if self.test_images is None:
            images, labels = datasets.load_fashion_mnist("test")
            self.test_images = torch.from_numpy(datasets.normalise(images, *self.moments))
            self.test_labels = torch.from_numpy(labels)
        return self.test_images, self.test_labels

    def evaluate(self, split: str = "validation"):
        return self.outcomes(split)[0]

    @torch.no_grad()
    def outcomes(self, split: str = "validation") -> Tuple[Dict[str, float], Tensor]:
        """(evaluate's metrics, correct): correct [count] (bool) says per image of the
        split, in its order, whether the top class is the label (what a McNemar test of
        two models pairs)."""
        images_all, labels_all = self.split_data(split)
        losses, correct = [], []
        for images, labels in zip(images_all.split(self.batch_size),
                                  labels_all.split(self.batch_size)):
            logits = self.model(images).float()
            losses.append(float(F.cross_entropy(logits, labels, reduction="sum")))
            correct.append(logits.argmax(-1) == labels)
        count, correct = len(labels_all), torch.cat(correct)
        return {"loss": sum(losses) / count, "accuracy": int(correct.sum()) / count}, correct


class RegressionTask(Task):
    """regression: in-context linear regression with the dimension curriculum; loss and
    evaluation are the squared error divided by the active dimension (Garg et al.), so
    predicting zero scores 1. Evaluation also reports the zero predictor's and the
    least-squares fit's (the best possible) error on the same prompts."""

    def __init__(self, config):
        super().__init__(config)
        data = config["data"]
        self.dims, self.points = data["dims"], data["points"]
        self.curriculum = datasets.Curriculum(
            dims_start=data["curriculum_dims_start"] or self.dims, dims_end=self.dims,
            points_start=data["curriculum_points_start"] or self.points,
            points_end=self.points, interval=data["curriculum_interval"])
        self.model = models.InContextRegressor(self.dims, self.points,
                                               **model_options(config))
        self.step = 0
        self.references = {}  # (split, active, points) -> [zero, least-squares] MSE

    def batch(self, step: int):
        active, points = self.curriculum.at(step)
        xs, ys = datasets.sample_linear_regression(self.batch_size, points, self.dims,
                                                   active, step_generator(self.seed, step))
        self.step = step
        return xs, ys, active

    def loss(self, batch):
        xs, ys, active = batch
        predictions = self.model(xs, ys).float()
        return F.mse_loss(predictions, ys) / active, {}

    def tokens(self, batch) -> int:
        return batch[0].shape[0] * batch[0].shape[1] * 2

    @torch.no_grad()
    def evaluate(self, split: str = "validation"):
        """Fresh prompts of the current curriculum stage; the test prompts come from
        another stream than the validation ones."""
        active, points = self.curriculum.at(self.step)
        stream = EVAL_STREAM if check_split(split) == "validation" else TEST_STREAM
        generator = step_generator(self.seed, stream)
        errors, references = [], []
        for _ in range(self.config["train"]["eval_batches"]):
            xs, ys = datasets.sample_linear_regression(self.batch_size, points, self.dims,
                                                       active, generator)
            errors.append(float(F.mse_loss(self.model(xs, ys).float(), ys)) / active)
            if (split, active, points) not in self.references:
                references.append((float(ys.pow(2).mean()) / active, float(F.mse_loss(
                    datasets.prefix_least_squares(xs, ys), ys)) / active))
        if references:  # the same prompts at every evaluation of one (active, points)
            self.references[split, active, points] = np.mean(references, axis=0).tolist()
        zero, least_squares = self.references[split, active, points]
        return {"loss": float(np.mean(errors)), "mse": float(np.mean(errors)),
                "zero_mse": zero, "least_squares_mse": least_squares,
                "active_dims": active, "points": points}


class ForecastTask(Task):
    """forecast on ETTh1/ETTh2: MSE of z-scored forecasts of all seven channels; MSE
    and MAE on the validation windows (eval_batches batches, evenly spaced)."""

    def __init__(self, config):
        super().__init__(config)
        data, model = config["data"], config["model"]
        if data["dataset"] not in datasets.ett.SHA256:
            raise ConfigError(f"data.dataset: expected one of {sorted(datasets.ett.SHA256)}, "
                              f"got {data['dataset']!r}")
        splits = datasets.load_ett(data["dataset"])
        context, horizon = data["context"], data["horizon"]
        self.inputs, self.targets = (torch.from_numpy(a) for a in datasets.forecast_windows(
            splits, "train", context, horizon))
        self.splits = splits
        self.eval_inputs, self.eval_targets = self.split_windows("validation")
        self.model = models.PatchForecaster(context, horizon, model["patch"],
                                            **model_options(config))
        self.patches_per_series = context // model["patch"]

    def batch(self, step: int):
        index = torch.randint(len(self.inputs), (self.batch_size,),
                              generator=step_generator(self.seed, step))
        return self.inputs[index], self.targets[index]

    def loss(self, batch):
        inputs, targets = batch
        forecasts = self.model(inputs).float()
        return F.mse_loss(forecasts, targets), {}

    def tokens(self, batch) -> int:
        return batch[0].shape[0] * batch[0].shape[2] * self.patches_per_series

    def split_windows(self, split: str) -> Tuple[Tensor, Tensor]:
        """Every window of the split when eval_batches is 0, else eval_batches *
        batch_size windows evenly spaced over it."""
        data = self.config["data"]
        inputs, targets = datasets.forecast_windows(self.splits, check_split(split),
                                                    data["context"], data["horizon"])
        count = len(inputs)
        if self.config["train"]["eval_batches"]:
            count = min(count, self.config["train"]["eval_batches"] * self.batch_size)
        pick = np.linspace(0, len(inputs) - 1, count).round().astype(np.int64)
        return torch.from_numpy(inputs[pick]), torch.from_numpy(targets[pick])

    @torch.no_grad()
    def evaluate(self, split: str = "validation"):
        inputs_all, targets_all = ((self.eval_inputs, self.eval_targets)
                                   if check_split(split) == "validation"
                                   else self.split_windows(split))
        squared, absolute = 0.0, 0.0
        for inputs, targets in zip(inputs_all.split(self.batch_size),
                                   targets_all.split(self.batch_size)):
            error = self.model(inputs).float() - targets
            squared += float(error.pow(2).sum())
            absolute += float(error.abs().sum())
        count = targets_all.numel()
        return {"loss": squared / count, "mse": squared / count, "mae": absolute / count}


class RetrievalTask(Task):
    """retrieval: nearest-neighbour retrieval on the sphere (data.retrieval); cross-entropy
    over the labels, accuracy. Validation and test are eval_batches batches drawn from
    their own fixed streams."""

    def __init__(self, config):
        super().__init__(config)
        data = config["data"]
        self.shape = dict(keys=data["keys"], dims=data["dims"], noise=data["noise"])
        self.model = models.NeighbourRetriever(data["dims"], data["keys"],
                                               **model_options(config))

    def batch(self, step: int):
        return datasets.sample_sphere_retrieval(self.batch_size, **self.shape,
                                                generator=step_generator(self.seed, step))

    def loss(self, batch):
        logits = self.model(batch.keys, batch.labels, batch.queries).float()
        accuracy = (logits.argmax(-1) == batch.targets).float().mean()
        return F.cross_entropy(logits, batch.targets), {"accuracy": float(accuracy)}

    def tokens(self, batch) -> int:
        return batch.keys.shape[0] * (batch.keys.shape[1] + 1)

    @torch.no_grad()
    def evaluate(self, split: str = "validation"):
        stream = EVAL_STREAM if check_split(split) == "validation" else TEST_STREAM
        generator = step_generator(self.seed, stream)
        loss_sum, correct, count = 0.0, 0, 0
        for _ in range(self.config["train"]["eval_batches"]):
            batch = datasets.sample_sphere_retrieval(self.batch_size, **self.shape,
                                                     generator=generator)
            logits = self.model(batch.keys, batch.labels, batch.queries).float()
            loss_sum += float(F.cross_entropy(logits, batch.targets, reduction="sum"))
            correct += int((logits.argmax(-1) == batch.targets).sum())
            count += len(batch.targets)
        return {"loss": loss_sum / count, "accuracy": correct / count}


def make_task(config, state: Dict[str, str] = None) -> Task:
    family = config["run"]["family"]
    if family in ("lm", "mlm"):
        return LanguageTask(config, (state or {}).get("tokenizer"))
    return {"vit": VisionTask, "regression": RegressionTask, "forecast": ForecastTask,
            "retrieval": RetrievalTask}[family](config)
