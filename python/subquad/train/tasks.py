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

STEP_STREAMS = 1_000_003  # seeds of step generators: seed * STEP_STREAMS + step
EVAL_STREAM = -1  # the step index of the evaluation stream (fixed across the run)


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
    def evaluate(self) -> Dict[str, float]:
        raise NotImplementedError


def _windows(ids: np.ndarray, length: int, starts: np.ndarray) -> Tensor:
    return torch.from_numpy(ids[starts[:, None] + np.arange(length)])


class LanguageTask(Task):
    """lm (next-token loss, perplexity) and mlm (masked-token loss, accuracy) on Austen:
    random windows of the five training novels; evaluation on fixed windows of
    Persuasion's first half."""

    def __init__(self, config, tokenizer_json: str = None):
        super().__init__(config)
        data, family = config["data"], config["run"]["family"]
        self.causal, self.length = family == "lm", data["length"]
        splits = datasets.austen_splits()
        if tokenizer_json is not None and data["tokenizer"] == "bpe":
            self.tokenizer = datasets.BpeTokenizer.from_json(tokenizer_json)
        else:
            self.tokenizer = datasets.make_tokenizer(data["tokenizer"], splits["train"],
                                                     data["vocab_size"])
        self.state = {"tokenizer": self.tokenizer.to_json()}
        self.train_ids = self.tokenizer.encode(splits["train"])
        self.eval_ids = self.tokenizer.encode(splits["validation"])
        window = self.length + self.causal  # the LM reads one token past its inputs
        if len(self.eval_ids) < window:
            raise ValueError(f"data.length: {self.length} is longer than the validation text")
        family_model = models.CausalLM if self.causal else models.MaskedLM
        self.model = family_model(self.tokenizer.vocab_size, self.length,
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

    @torch.no_grad()
    def evaluate(self):
        window = self.length + self.causal
        count = min(self.config["train"]["eval_batches"] * self.batch_size,
                    len(self.eval_ids) // window)
        ids = _windows(self.eval_ids, window, np.arange(count) * window)
        losses, accuracies = [], []
        for chunk in ids.split(self.batch_size):
            loss, metrics = self.loss((chunk, step_generator(self.seed, EVAL_STREAM)))
            losses.append(float(loss))
            accuracies.append(metrics.get("accuracy"))
        loss = float(np.mean(losses))
        result = {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}
        if not self.causal:
            result["accuracy"] = float(np.mean(accuracies))
        return result


class VisionTask(Task):
    """vit on Fashion-MNIST: cross-entropy on random training images; accuracy on the
    first eval_size test images."""

    def __init__(self, config):
        super().__init__(config)
        data, model = config["data"], config["model"]
        images, labels = datasets.load_fashion_mnist("train")
        if data["train_size"]:
            images, labels = images[:data["train_size"]], labels[:data["train_size"]]
        pixels = images.astype(np.float32) / 255.0
        mean, std = float(pixels.mean()), float(pixels.std())
        self.images = torch.from_numpy(datasets.normalise(images, mean, std))
        self.labels = torch.from_numpy(labels)
        test_images, test_labels = datasets.load_fashion_mnist("test")
        self.test_images = torch.from_numpy(
            datasets.normalise(test_images[:data["eval_size"]], mean, std))
        self.test_labels = torch.from_numpy(test_labels[:data["eval_size"]])
        self.model = models.ViTClassifier(28, model["patch"], 1, 10, pool=model["pool"],
                                          **model_options(config))
        self.patches = (28 // model["patch"]) ** 2

    def batch(self, step: int):
        index = torch.randint(len(self.images), (self.batch_size,),
                              generator=step_generator(self.seed, step))
        return self.images[index], self.labels[index]

    def loss(self, batch):
        images, labels = batch
        logits = self.model(images).float()
        accuracy = (logits.argmax(-1) == labels).float().mean()
        return F.cross_entropy(logits, labels), {"accuracy": float(accuracy)}

    def tokens(self, batch) -> int:
        return batch[0].shape[0] * self.patches

    @torch.no_grad()
    def evaluate(self):
        losses, correct = [], 0
        for images, labels in zip(self.test_images.split(self.batch_size),
                                  self.test_labels.split(self.batch_size)):
            logits = self.model(images).float()
            losses.append(float(F.cross_entropy(logits, labels, reduction="sum")))
            correct += int((logits.argmax(-1) == labels).sum())
        count = len(self.test_labels)
        return {"loss": sum(losses) / count, "accuracy": correct / count}


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
        self.references = {}  # (active, points) -> [zero, least-squares] MSE on the eval prompts

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
    def evaluate(self):
        active, points = self.curriculum.at(self.step)
        generator = step_generator(self.seed, EVAL_STREAM)
        errors, references = [], []
        for _ in range(self.config["train"]["eval_batches"]):
            xs, ys = datasets.sample_linear_regression(self.batch_size, points, self.dims,
                                                       active, generator)
            errors.append(float(F.mse_loss(self.model(xs, ys).float(), ys)) / active)
            if (active, points) not in self.references:
                references.append((float(ys.pow(2).mean()) / active, float(F.mse_loss(
                    datasets.prefix_least_squares(xs, ys), ys)) / active))
        if references:  # the same prompts at every evaluation of one (active, points)
            self.references[active, points] = np.mean(references, axis=0).tolist()
        zero, least_squares = self.references[active, points]
        return {"loss": float(np.mean(errors)), "mse": float(np.mean(errors)),
                "zero_mse": zero, "least_squares_mse": least_squares,
                "active_dims": active, "points": points}


class ForecastTask(Task):
    """forecast on ETTh1/ETTh2: MSE of z-scored forecasts of all seven channels; MSE
    and MAE on the validation windows (eval_batches batches, evenly spaced)."""

    def __init__(self, config):
        super().__init__(config)
        data, model = config["data"], config["model"]
        splits = datasets.load_ett(data["dataset"])
        context, horizon = data["context"], data["horizon"]
        self.inputs, self.targets = (torch.from_numpy(a) for a in datasets.forecast_windows(
            splits, "train", context, horizon))
        inputs, targets = datasets.forecast_windows(splits, "validation", context, horizon)
        count = min(len(inputs), config["train"]["eval_batches"] * self.batch_size)
        pick = np.linspace(0, len(inputs) - 1, count).round().astype(np.int64)
        self.eval_inputs = torch.from_numpy(inputs[pick])
        self.eval_targets = torch.from_numpy(targets[pick])
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

    @torch.no_grad()
    def evaluate(self):
        squared, absolute = 0.0, 0.0
        for inputs, targets in zip(self.eval_inputs.split(self.batch_size),
                                   self.eval_targets.split(self.batch_size)):
            error = self.model(inputs).float() - targets
            squared += float(error.pow(2).sum())
            absolute += float(error.abs().sum())
        count = self.eval_targets.numel()
        return {"loss": squared / count, "mse": squared / count, "mae": absolute / count}


def make_task(config, state: Dict[str, str] = None) -> Task:
    family = config["run"]["family"]
    if family in ("lm", "mlm"):
        return LanguageTask(config, (state or {}).get("tokenizer"))
    return {"vit": VisionTask, "regression": RegressionTask,
            "forecast": ForecastTask}[family](config)
