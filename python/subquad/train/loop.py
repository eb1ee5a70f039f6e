"""The training loop: AdamW, linear warm-up then cosine decay, gradient clipping, bf16
autocast on request, periodic or log-spaced evaluation, early stopping on the validation
loss (train.patience), metrics with the run's CPU and wall seconds, plots and safetensors
checkpoints with exact resume (same seed and thread count: bit-identical to an
uninterrupted run)."""

import json
import math
import os
import sys
import time
from contextlib import nullcontext
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from . import checkpoint, rundir
from .config import ConfigError, differences, resolve
from .metrics import CSV, JSONL, LOSS_PNG, MetricsLog, plot_runs, read_rows
from .progress import Progress
from .stopping import EarlyStopping
from .tasks import make_task

CHECKPOINT = "checkpoint.safetensors"
CONFIG_JSON = "config.json"
EARLY_STOP = "early_stop"  # the split of the metrics.jsonl row written when patience ends a run
# What a run writes: a directory holding any of RUN_FILES holds a run; --overwrite
# removes RUN_FILES and OUTPUTS before starting again.
RUN_FILES = [CHECKPOINT, JSONL, CONFIG_JSON]
OUTPUTS = [CHECKPOINT + checkpoint.PARTIAL, CSV, LOSS_PNG]
# Keys that do not change what a run computes, so a resume (or a finished result) with
# other values is the same run: where it is written (both are found there) and whether a
# progress bar is drawn. More train.steps continue the run (its cosine and evaluations then
# span the new total); fewer cannot (it has trained past them). Everything else must match;
# run.threads because the kernels' sums then run in another order (no longer
# bit-identical to an uninterrupted run).
NEUTRAL_KEYS = ("run.out", "run.progress")
WHY_NOT = {"train.steps": "a resumed run may train for more steps than it was started "
                          "with, not fewer",
           "run.threads": "another thread count sums in another order, so the run would "
                          "no longer be bit-identical to an uninterrupted one"}


def config_differences(saved: Dict, config: Dict) -> List[str]:
    """The keys (with both values) in which two configurations make different runs."""
    return differences(saved, config, ignore=NEUTRAL_KEYS)


def explain(keys: List[str]) -> str:
    """keys "table.key: a -> b", and why the ones that need it matter."""
    reasons = [f"{name}: {why}" for name, why in WHY_NOT.items()
               if any(key.startswith(name + ":") for key in keys)]
    return "; ".join(keys) + (f" ({'; '.join(reasons)})" if reasons else "")


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


def saved_config(path: str, saved: Dict) -> Dict:
    """A configuration read back from `path`, resolved again (keys added to the schema
    since take their defaults)."""
    try:
        return resolve(saved)
    except ConfigError as error:
        raise ConfigError(f"{path}: its configuration is not valid now ({error})") from None


def _check_trainable(model: torch.nn.Module) -> None:
    """Refuses to train, from scratch, a model with a layer that cannot learn: a bilinear
    MLR level whose LayerNorm sees fewer than 4 features per head (sign_levels)."""
    from ..layers.structured import BilinearMLRAttention

    for layer in model.modules():
        if isinstance(layer, BilinearMLRAttention) and layer.sign_levels():
            levels = layer.sign_levels()
            raise ConfigError(
                f"model.attention_options.bilinear-mlr.ranks: {layer.ranks} gives level(s) "
                f"{levels} r_l 2^l = {[layer.ranks[l] << l for l in levels]} features per "
                f"head, whose LayerNorm is a sign with no gradient; expected r_l 2^l >= 4 at "
                f"every level l (e.g. ranks [4, 2] at a head dim of 8)")


def _make_directory(out: str) -> None:
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ConfigError(f"run.out: {out} is a file, expected a directory")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"run.out: cannot create the directory {out} "
                          f"({error.strerror})") from None


def _read_json(path: str) -> Tuple[str, Dict]:
    """(path, the JSON object in it); an unreadable file is an error naming it."""
    try:
        with open(path) as file:
            return path, json.load(file)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path}: not a readable configuration ({error})") from None


class Trainer:
    """Trainer(config).run() trains from scratch, or resumes from out/checkpoint.safetensors
    when resume=True and it exists. The run directory is claimed for the trainer's process
    (another live process's claim is an error) and released when run() ends; a directory
    that holds a run is refused unless resume (continue it) or overwrite (start again)."""

    def __init__(self, config: Dict, resume: bool = False, stop_at: Optional[int] = None,
                 overwrite: bool = False):
        self.config, self.train = config, config["train"]
        self.out = config["run"]["out"]
        self.stop_at = self.train["steps"] if stop_at is None else stop_at
        if resume and overwrite:
            raise ConfigError("resume and overwrite: choose one (continue the run in "
                              "run.out, or start it again)")
        _make_directory(self.out)
        # A claim this process held before (the experiment runner's) outlives the trainer.
        self.releases = not rundir.holds(self.out)
        if not rundir.claim(self.out):
            raise ConfigError(f"run.out: {self.out} is in use by process "
                              f"{rundir.owner(self.out)} (another trainer); wait for it to "
                              f"end or use another run.out")
        try:
            self._start(resume, overwrite)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        if self.releases:
            rundir.release(self.out)

    def _start(self, resume: bool, overwrite: bool) -> None:
        config = self.config
        held = rundir.present(self.out, RUN_FILES)
        if held and overwrite:
            rundir.remove(self.out, RUN_FILES + OUTPUTS)
        elif held and not resume:
            raise ConfigError(f"run.out: {self.out} holds a run ({', '.join(held)}); "
                              f"continue it with --resume, start it again with "
                              f"--overwrite, or use another run.out")
        torch.set_num_threads(config["run"]["threads"])
        torch.manual_seed(config["run"]["seed"])  # the model's initial weights
        path = os.path.join(self.out, CHECKPOINT)
        state, self.start, clock, saved, stopping = None, 0, {}, None, None
        if resume and os.path.lexists(path):
            metadata = checkpoint.read_metadata(path)
            state = json.loads(metadata["task_state"])
            clock = json.loads(metadata.get("clock", "{}"))
            saved = saved_config(path, json.loads(metadata["config"]))
            stopping = checkpoint.early_stopping(metadata)
        elif resume and CONFIG_JSON in held:  # started, killed before its first checkpoint
            saved = saved_config(*_read_json(os.path.join(self.out, CONFIG_JSON)))
        if saved is not None:
            changed = config_differences(saved, config)
            stopped_at = (stopping or {}).get("stopped_at")
            if stopped_at is not None and saved["train"]["steps"] < config["train"]["steps"]:
                raise ConfigError(f"resume: {self.out} was ended by early stopping at step "
                                  f"{stopped_at} (train.patience = "
                                  f"{saved['train']['patience']}): it is finished, and more "
                                  f"train.steps cannot continue it (its best weights were "
                                  f"chosen); start again with --overwrite or use another "
                                  f"run.out")
            if saved["train"]["steps"] < config["train"]["steps"]:
                changed = [key for key in changed if not key.startswith("train.steps:")]
                print(f"resume: {self.out}: continuing from {saved['train']['steps']} to "
                      f"{config['train']['steps']} steps; the learning-rate cosine and the "
                      f"evaluations now span the new total", file=sys.stderr)
            if changed:
                raise ConfigError(f"resume: {self.out} holds a run of another configuration: "
                                  f"{explain(changed)}; resume with its configuration or use "
                                  f"another run.out")
        self.task = make_task(config, state)
        self.model = self.task.model
        if state is None:
            _check_trainable(self.model)
        self.optimizer = make_optimizer(self.model, self.train)
        if state is not None:
            self.start, _ = checkpoint.load(path, self.model, self.optimizer)
        self.stopping = EarlyStopping(
            self.train["patience"], stopping,
            checkpoint.best_weights(path) if stopping is not None else None)
        # The run's CPU (time.process_time) and wall seconds, summed over its processes.
        self.cpu_before, self.wall_before = clock.get("cpu_s", 0.0), clock.get("wall_s", 0.0)
        self.cpu_began, self.wall_began = time.process_time(), time.perf_counter()
        self.evaluations = set(evaluation_steps(self.train))
        self.metrics = MetricsLog(self.out, self.start if state is not None else -1)
        self.autocast = autocast_context(self.train["precision"])
        config_path = os.path.join(self.out, CONFIG_JSON)
        try:
            with open(config_path, "w") as file:
                json.dump(config, file, indent=2)
        except OSError as error:
            raise rundir.RunFileError(config_path, "write it", error) from None

    def clock(self) -> Dict[str, float]:
        """The run's CPU and wall seconds so far (training and evaluation)."""
        return {"cpu_s": self.cpu_before + time.process_time() - self.cpu_began,
                "wall_s": self.wall_before + time.perf_counter() - self.wall_began}

    def save(self, step: int) -> None:
        stopping = self.stopping.enabled
        checkpoint.save(os.path.join(self.out, CHECKPOINT), self.model, self.optimizer, step,
                        self.config, self.task.state, self.clock(),
                        best=self.stopping.weights if stopping else None,
                        stopping=self.stopping.state() if stopping else None)

    def evaluate(self, step: int, split: str = "validation") -> Dict[str, float]:
        self.model.eval()
        with self.autocast:
            result = self.task.evaluate(split)
        self.model.train()
        self.metrics.append({"step": step, "split": split, **result, **self.clock()})
        return result

    def last_evaluation(self, step: Optional[int] = None) -> Dict[str, float]:
        """The metrics of the validation row of metrics.jsonl at `step` (None: the last
        one), or a new evaluation when there is none."""
        rows = [row for row in read_rows(self.metrics.path) if row["split"] == "validation"
                and (step is None or row["step"] == step)]
        if not rows:
            return self.evaluate(self.start)
        skip = {"step", "split", *self.clock()}
        return {key: value for key, value in rows[-1].items() if key not in skip}

    def weights_step(self) -> int:
        """The step of the weights a finished run reports: the best evaluation's with
        early stopping (train.patience > 0), else the last step."""
        if self.stopping.enabled and self.stopping.best_step is not None:
            return self.stopping.best_step
        return self.train["steps"]

    def early_stopping(self) -> Dict:
        """{} without early stopping; else patience, stopped_early, best_step, best_loss
        and stopped_at (the step a finished run's training ended at)."""
        if not self.stopping.enabled:
            return {}
        return self.stopping.summary(self.stopping.stopped_at or self.train["steps"])

    def _finish(self, finished: bool) -> Dict[str, float]:
        """The result of a run that trains no further: a finished run with early stopping
        reports its best evaluation (the model takes its weights, the result is its
        validation row); any other its last evaluation."""
        step = None
        if finished and self.stopping.enabled:
            step = self.stopping.restore(self.model)
        return self.last_evaluation(step)

    def run(self) -> Dict[str, float]:
        """Trains steps [start, stop_at), or until early stopping ends the run; returns the
        last evaluation (a finished run with early stopping: the best one, whose weights
        the model then holds). Releases the run directory's claim when it ends (unless
        the process held it before)."""
        try:
            return self._run()
        finally:
            self.release()

    def _run(self) -> Dict[str, float]:
        progress = Progress(self.start, self.train["steps"], self.config["run"]["progress"])
        self.model.train()
        started, result = time.perf_counter(), {}
        if self.start >= self.stop_at or self.stopping.stopped_at is not None:
            # finished before: its last (or best) evaluation stands
            return self._finish(self.stopping.stopped_at is not None
                                or self.start >= self.train["steps"])
        done = self.start
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
            stop = False
            if done in self.evaluations:
                result = self.evaluate(done)
                progress.message(f"step {done}: " + ", ".join(
                    f"{k} {v:.4g}" for k, v in result.items()))
                stop = self._patience_ended(done, result["loss"], progress)
            if stop or done % self.train["checkpoint_every"] == 0 or done == self.stop_at:
                self.save(done)
            if stop:
                break
        progress.close()
        self.metrics.write_csv()
        plot_runs([self.out], os.path.join(self.out, LOSS_PNG))
        if self.stopping.enabled and (self.stopping.stopped_at is not None
                                      or done >= self.train["steps"]):
            return self._finish(True)
        return result

    def _patience_ended(self, done: int, loss: float, progress: Progress) -> bool:
        """Early stopping's decision after the evaluation at step `done`: True ends the
        run there (not at the last step, which ends it anyway), logged as an early_stop
        row of metrics.jsonl."""
        if not (self.stopping.enabled and self.stopping.update(done, loss, self.model)):
            return False
        if done >= self.train["steps"]:
            return False
        self.stopping.stopped_at = done
        self.metrics.append({"step": done, "split": EARLY_STOP,
                             "best_step": self.stopping.best_step,
                             "best_loss": self.stopping.best_loss,
                             "patience": self.stopping.patience, **self.clock()})
        progress.message(f"step {done}: early stop, no better validation loss than step "
                         f"{self.stopping.best_step}'s for {self.stopping.patience} "
                         f"evaluations")
        return True
