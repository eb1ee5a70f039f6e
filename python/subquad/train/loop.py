"""The training loop: AdamW, linear warm-up then cosine decay, gradient clipping, bf16
autocast on request, periodic or log-spaced evaluation, metrics with the run's CPU and
wall seconds, plots and safetensors checkpoints with exact resume (same seed and thread
count: bit-identical to an uninterrupted run)."""

import json
import math
import os
import time
from contextlib import nullcontext
from typing import Dict, List, Optional

import numpy as np
import torch

from . import checkpoint
from .config import ConfigError, resolve
from .metrics import LOSS_PNG, MetricsLog, plot_runs, read_rows
from .progress import Progress
from .tasks import make_task

CHECKPOINT = "checkpoint.safetensors"
CONFIG_JSON = "config.json"
PLATEAU_WINDOW = 0.25  # the last quarter of the steps: the evidence protocol's plateau test
FIRST_EVALUATION = 0.01  # log-spaced evaluations start at 1% of the steps


def plateau_reference(steps: int) -> int:
    """The step the plateau test compares the last evaluation with."""
    return max(steps - round(PLATEAU_WINDOW * steps), 1)


def evaluation_steps(train: Dict) -> List[int]:
    """Steps after which the model is evaluated: every eval_every steps, or (eval_points
    = n > 0) n log-spaced steps from 1% of the steps to the last, plus the plateau
    test's reference step; always the last step."""
    steps, points = train["steps"], train["eval_points"]
    if points == 0:
        return sorted({*range(train["eval_every"], steps + 1, train["eval_every"]), steps})
    first = max(1, round(FIRST_EVALUATION * steps))
    spaced = np.geomspace(first, steps, points).round().astype(int).tolist()
    return sorted({*spaced, plateau_reference(steps), steps})


def learning_rate(step: int, train: Dict) -> float:
    """lr at `step`: linear warm-up over `warmup` steps, then cosine to min_lr_ratio * lr."""
    peak, warmup, steps = train["lr"], train["warmup"], train["steps"]
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(steps - warmup - 1, 1)
    floor = train["min_lr_ratio"]
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def autocast_context(precision: str):
    """bf16 autocast on CPU where this torch has it; float32 runs without autocast."""
    if precision == "float32":
        return nullcontext()
    try:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    except (AttributeError, RuntimeError, TypeError) as error:
        raise ConfigError(f"train.precision = 'bf16': this torch ({torch.__version__}) has no "
                          f"CPU bf16 autocast ({error})") from None


def make_optimizer(model: torch.nn.Module, train: Dict) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, norms or embeddings'
    1-D parameters)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": train["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=train["lr"], betas=tuple(train["betas"]))


class Trainer:
    """Trainer(config).run() trains from scratch, or resumes from out/checkpoint.safetensors
    when resume=True and it exists."""

    def __init__(self, config: Dict, resume: bool = False, stop_at: Optional[int] = None):
        self.config, self.train = config, config["train"]
        self.out = config["run"]["out"]
        self.stop_at = self.train["steps"] if stop_at is None else stop_at
        os.makedirs(self.out, exist_ok=True)
        torch.set_num_threads(config["run"]["threads"])
        torch.manual_seed(config["run"]["seed"])  # the model's initial weights
        path = os.path.join(self.out, CHECKPOINT)
        state, self.start, clock = None, 0, {}
        if resume and os.path.exists(path):
            metadata = checkpoint.read_metadata(path)
            state = json.loads(metadata["task_state"])
            clock = json.loads(metadata.get("clock", "{}"))
        self.task = make_task(config, state)
        self.model = self.task.model
        self.optimizer = make_optimizer(self.model, self.train)
        if state is not None:
            # Resolved again, so that keys added to the schema since it was saved take
            # their defaults instead of refusing the resume.
            saved = resolve(json.loads(checkpoint.read_metadata(path)["config"]))
            if saved != config:
                raise ConfigError(f"resume: {path} was written with another configuration; "
                                  f"resume with the same one or use a new run.out")
            self.start, _ = checkpoint.load(path, self.model, self.optimizer)
        # The run's CPU (time.process_time) and wall seconds, summed over its processes.
        self.cpu_before, self.wall_before = clock.get("cpu_s", 0.0), clock.get("wall_s", 0.0)
        self.cpu_began, self.wall_began = time.process_time(), time.perf_counter()
        self.evaluations = set(evaluation_steps(self.train))
        self.metrics = MetricsLog(self.out, self.start if state is not None else -1)
        self.autocast = autocast_context(self.train["precision"])
        with open(os.path.join(self.out, CONFIG_JSON), "w") as file:
            json.dump(config, file, indent=2)

    def clock(self) -> Dict[str, float]:
        """The run's CPU and wall seconds so far (training and evaluation)."""
        return {"cpu_s": self.cpu_before + time.process_time() - self.cpu_began,
                "wall_s": self.wall_before + time.perf_counter() - self.wall_began}

    def save(self, step: int) -> None:
        checkpoint.save(os.path.join(self.out, CHECKPOINT), self.model, self.optimizer, step,
                        self.config, self.task.state, self.clock())

    def evaluate(self, step: int, split: str = "validation") -> Dict[str, float]:
        self.model.eval()
        with self.autocast:
            result = self.task.evaluate(split)
        self.model.train()
        self.metrics.append({"step": step, "split": split, **result, **self.clock()})
        return result

    def last_evaluation(self) -> Dict[str, float]:
        """The metrics of the last validation row of metrics.jsonl (or a new evaluation)."""
        rows = [row for row in read_rows(self.metrics.path) if row["split"] == "validation"]
        if not rows:
            return self.evaluate(self.start)
        skip = {"step", "split", *self.clock()}
        return {key: value for key, value in rows[-1].items() if key not in skip}

    def run(self) -> Dict[str, float]:
        """Trains steps [start, stop_at); returns the last evaluation."""
        progress = Progress(self.start, self.train["steps"], self.config["run"]["progress"])
        self.model.train()
        started, result = time.perf_counter(), {}
        if self.start >= self.stop_at:  # finished before: its last evaluation stands
            return self.last_evaluation()
        for step in range(self.start, self.stop_at):
            rate = learning_rate(step, self.train)
            for group in self.optimizer.param_groups:
                group["lr"] = rate
            batch = self.task.batch(step)
            with self.autocast:
                loss, extra = self.task.loss(batch)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"step {step}: loss is {float(loss)}; lower train.lr "
                                         f"or set train.clip")
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm = None
            if self.train["clip"] > 0:
                norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                            self.train["clip"]))
            self.optimizer.step()
            progress.update(step, float(loss.detach()), self.task.tokens(batch))
            done = step + 1
            if done % self.train["log_every"] == 0 or done == self.train["steps"]:
                row = {"step": done, "split": "train", "loss": float(loss.detach()), "lr": rate,
                       "tokens_per_s": progress.rate(),
                       "elapsed_s": time.perf_counter() - started, **extra,
                       **self.clock()}
                if norm is not None:
                    row["grad_norm"] = norm
                self.metrics.append(row)
            if done in self.evaluations:
                result = self.evaluate(done)
                progress.message(f"step {done}: " + ", ".join(
                    f"{k} {v:.4g}" for k, v in result.items()))
            if done % self.train["checkpoint_every"] == 0 or done == self.stop_at:
                self.save(done)
        progress.close()
        self.metrics.write_csv()
        plot_runs([self.out], os.path.join(self.out, LOSS_PNG))
        return result
