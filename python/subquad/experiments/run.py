"""Runs the (variant, seed) trainings of experiment files, resumably: a finished run has
result.json in its directory and is skipped; an interrupted one resumes from its
checkpoint. Several workers may run the same files at once (e.g. one per core): each run
is claimed by creating its CLAIM file, and a claim whose process has died is taken over.

    python -m subquad.experiments.run configs/experiments/cat_mlm.toml [more.toml ...]
        [--variants a b] [--seeds 0 1] [--set table.key=value ...] [--out-root DIR]
"""

import argparse
import errno
import json
import os
import platform
import sys
import time
from typing import Dict, Iterable, List, Optional

from ..train.config import ConfigError
from ..train.loop import Trainer
from .flops import regression_tokens, training_flop_counter
from .spec import Experiment, Variant, load_experiment

RESULT, CLAIM = "result.json", "CLAIM"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as error:
        return error.errno == errno.EPERM
    return True


def claim(directory: str) -> bool:
    """True if this process now owns the run in `directory` (created or taken over)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, CLAIM)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                with open(path) as file:
                    owner = int(file.read().strip() or 0)
            except (OSError, ValueError):
                owner = 0
            if owner and (owner == os.getpid() or _alive(owner)):
                return owner == os.getpid()
            os.remove(path)  # a dead worker's claim
            continue
        with os.fdopen(fd, "w") as file:
            file.write(str(os.getpid()))
        return True
    return False


def attention_parameters(model) -> int:
    """Parameters inside the attention modules of the model's blocks (CA-DeiT blocks
    count whole, as their attention and position convolution are one unit)."""
    from ..layers import Circulant2dBlock
    from ..models.blocks import Block

    total = 0
    for module in model.modules():
        if isinstance(module, Block):
            total += sum(p.numel() for p in module.attention.parameters())
        elif isinstance(module, Circulant2dBlock):
            total += sum(p.numel() for name, p in module.named_parameters()
                         if not name.startswith(("mlp", "norm2")))
    return total


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_one(experiment: Experiment, variant: Variant, seed: int,
            overrides: Iterable[str] = ()) -> Optional[Dict]:
    """Trains (variant, seed) unless it is finished or another live worker holds it;
    returns its result row (None when skipped)."""
    config = experiment.config(variant, seed, overrides)
    directory = config["run"]["out"]
    result_path = os.path.join(directory, RESULT)
    if os.path.exists(result_path) or not claim(directory):
        return None
    started = time.perf_counter()
    trainer = Trainer(config, resume=True)
    resumed_from = trainer.start
    evaluation = trainer.run()
    wall = time.perf_counter() - started
    train = config["train"]
    row = {"experiment": experiment.name, "variant": variant.name, "label": variant.label,
           "seed": seed, "params": sum(p.numel() for p in trainer.model.parameters()),
           "attention_params": attention_parameters(trainer.model),
           "steps": train["steps"], "batch_size": train["batch_size"],
           "tokens": trainer.task.tokens(trainer.task.batch(0)) * train["steps"],
           "wall_s": wall, "resumed_from_step": resumed_from, "threads": config["run"]["threads"],
           "cpu": cpu_model(), **{f"val_{k}": v for k, v in evaluation.items()}}
    counter = training_flop_counter(config)
    if counter is not None:  # regression: FLOPs and tokens follow the curriculum
        row["train_flops"] = counter(train["steps"])
        row["tokens"] = regression_tokens(config, train["steps"])
    tmp = result_path + ".tmp"
    with open(tmp, "w") as file:
        json.dump(row, file, indent=1)
    os.replace(tmp, result_path)
    os.remove(os.path.join(directory, CLAIM))
    return row


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m subquad.experiments.run",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiments", nargs="+", help="experiment TOML files, run in order")
    parser.add_argument("--variants", nargs="*", help="only these variants")
    parser.add_argument("--seeds", nargs="*", type=int, help="only these seeds")
    parser.add_argument("--set", nargs="*", default=[], metavar="table.key=value",
                        help="override every variant's config (e.g. train.steps=2)")
    parser.add_argument("--out-root", default="runs/experiments",
                        help="where run directories go (experiment.out overrides)")
    args = parser.parse_args(argv)
    try:
        experiments = [load_experiment(path, args.out_root) for path in args.experiments]
        for experiment in experiments:
            variants = ([experiment.variant(v) for v in args.variants] if args.variants
                        else experiment.variants)
            for seed in (args.seeds if args.seeds is not None else experiment.seeds):
                for variant in variants:
                    row = run_one(experiment, variant, seed, args.set)
                    if row is not None:
                        metric = experiment.metrics[0]
                        print(f"{experiment.name} {variant.name} seed {seed}: "
                              f"{metric} {row.get('val_' + metric)} "
                              f"({row['wall_s']:.0f} s)", flush=True)
    except (ConfigError, ValueError) as error:
        print(f"experiments: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
