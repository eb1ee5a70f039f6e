"""Runs the (variant, seed) trainings of experiment files, resumably: a finished run has
result.json in its directory (with the configuration it was made with) and is skipped; one
made with another configuration (an edited file, another --set) stops the runner, naming
the keys that differ, rather than stand for the new one; an interrupted one resumes from
its checkpoint. Several workers may run the same files at once (e.g. one per core): each run
is claimed by locking its CLAIM file, and a claim whose process has died is free.

Files with a [protocol] table run in two stages (docs/specs/evidence-protocol.md): the
learning-rate sweep of every variant on the tuning seed (protocol.sweep_fraction of the
steps, a third by default), then the reported seeds of each variant at its chosen rate,
each scored on the test split once at the end and tested for convergence against the
task's anchor. A worker with nothing to
start while another still sweeps a variant waits for it.

    python -m subquad.experiments.run configs/experiments/cat_mlm.toml [more.toml ...]
        [--variants a b] [--seeds 0 1] [--set table.key=value ...] [--out-root DIR]
"""

import argparse
import functools
import json
import os
import sys
import time
from typing import Dict, Iterable, List, Optional

from ..train.config import ConfigError
from ..train.loop import Trainer
from ..train.rundir import claim, release  # the trainer's claim of a run directory
from .flops import regression_tokens, training_flop_counter
from .protocol import (RESULT, convergence, early_stop_text, experiment_anchors, read_result,
                       sweep_state, validation_curve)
from ..records import load_average, machine
from .spec import Experiment, Variant, load_experiment

WAIT_S = 30  # a worker blocked on another's sweep looks again after this long


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


@functools.lru_cache(maxsize=None)
def this_process() -> Dict:
    """The machine and the commit of the code this process imported (read once: edits
    made to the tree while it runs do not change what it runs)."""
    return machine()


def anchor_value(experiment: Experiment) -> float:
    """The primary metric of the protocol's anchor on the validation split."""
    anchors = experiment_anchors(experiment)[experiment.protocol.anchor]
    return anchors["validation"][experiment.metrics[0]]


def run_one(experiment: Experiment, variant: Variant, seed: int,
            overrides: Iterable[str] = (), lr_factor: Optional[float] = None,
            sweep: bool = False) -> Optional[Dict]:
    """Trains (variant, seed) unless it is finished or another live worker holds it;
    returns its result row (None when skipped). Under a protocol: lr_factor scales the
    rate, sweep=True makes it a tuning run, and a reported run is also scored on the
    test split and tested for convergence."""
    config = experiment.config(variant, seed, overrides, lr_factor=lr_factor, sweep=sweep)
    directory = config["run"]["out"]
    result_path = os.path.join(directory, RESULT)
    if read_result(directory, config) is not None or not claim(directory):
        return None  # finished (with this configuration: another one raises), or held
    load_before = load_average()
    trainer = Trainer(config, resume=True)
    resumed_from = trainer.start
    # A line as each run starts: a worker's log shows what it is on (the trainer's own
    # progress, when the config enables it, is a dozen lines per run in a log).
    print(f"{experiment.name} {variant.name} seed {seed}"
          f"{' sweep lr x%g' % lr_factor if sweep else ''}: started"
          f"{f' at step {resumed_from}' if resumed_from else ''}", flush=True)
    train = config["train"]
    row = {"experiment": experiment.name, "variant": variant.name, "label": variant.label,
           "config": config,
           "seed": seed, "params": sum(p.numel() for p in trainer.model.parameters()),
           "attention_params": attention_parameters(trainer.model),
           "steps": train["steps"], "batch_size": train["batch_size"], "lr": train["lr"],
           "tokens": trainer.task.tokens(trainer.task.batch(0)) * train["steps"],
           "resumed_from_step": resumed_from, "threads": config["run"]["threads"]}
    if lr_factor is not None:
        row.update(lr_factor=lr_factor, sweep=sweep)
    try:
        evaluation = trainer.run()
    except FloatingPointError as error:  # a sweep's too-high rate: recorded, not fatal
        if experiment.protocol is None:
            raise
        evaluation = {}
        row.update(diverged=True, error=str(error))
    # With early stopping (train.patience) the validation metrics are the best
    # evaluation's, and the trainer has restored its weights for the test split.
    stopping = {} if row.get("diverged") else trainer.early_stopping()
    trained = stopping.get("stopped_at", train["steps"])
    row.update(**{f"val_{k}": v for k, v in evaluation.items()}, **stopping,
               **trainer.clock(),
               wall_s_this_process=time.perf_counter() - trainer.wall_began,
               load_before=load_before, load_after=load_average(), **this_process())
    if experiment.protocol is not None and not sweep and not row.get("diverged"):
        row.update(**{f"test_{k}": v for k, v in trainer.evaluate(trainer.weights_step(),
                                                                  "test").items()})
        row["convergence"] = convergence(
            validation_curve(directory), train["steps"], experiment.metrics[0],
            anchor_value(experiment), experiment.lower_is_better,
            experiment.protocol.plateau_tolerance, stopping)
    counter = training_flop_counter(config)
    row["train_flops"] = counter(train["steps"])
    if config["run"]["family"] == "regression":  # tokens follow the curriculum
        row["tokens"] = regression_tokens(config, train["steps"])
    if trained != train["steps"]:  # early stopping: what was trained, beside the budget
        row["tokens_trained"] = (regression_tokens(config, trained)
                                 if config["run"]["family"] == "regression"
                                 else row["tokens"] // train["steps"] * trained)
        row["train_flops_trained"] = counter(trained)
    tmp = result_path + ".tmp"
    with open(tmp, "w") as file:
        json.dump(row, file, indent=1)
    os.replace(tmp, result_path)
    release(directory)
    return row


def describe(experiment: Experiment, row: Dict) -> str:
    metric = experiment.metrics[0]
    text = (f"{experiment.name} {row['variant']} seed {row['seed']}"
            f"{' sweep lr x%g' % row['lr_factor'] if row.get('sweep') else ''}: ")
    if row.get("diverged"):
        return text + f"diverged ({row['error']})"
    text += f"val {metric} {row.get('val_' + metric):.5g}"
    if "test_" + metric in row:
        text += f", test {row['test_' + metric]:.5g}"
    if row.get("stopped_early"):
        text += f", {early_stop_text(row)}"
    if "convergence" in row:
        verdict = row["convergence"]
        text += ", converged" if verdict["converged"] else f", NOT converged ({verdict['reason']})"
    return text + f" ({row['cpu_s']:.0f} CPU s, {row['wall_s']:.0f} s wall)"


def pending_runs(experiment: Experiment, variants: List[Variant], seeds: List[int],
                 overrides: Iterable[str] = ()):
    """(the unfinished runs that can start now, in order: every variant's sweep, then the
    reported seeds seed-major; whether some reported runs wait for their sweep). A
    finished run made with another configuration than (variant, seed, overrides) raises
    ConfigError naming the keys (its numbers are not this experiment's)."""
    tuning = experiment.protocol.tuning_seed
    states = {v.name: sweep_state(experiment, v.name) for v in variants}
    for variant in variants:
        for factor in states[variant.name].scores:
            read_result(experiment.sweep_dir(variant.name, factor), experiment.config(
                variant, tuning, overrides, lr_factor=factor, sweep=True))
    runs = [(variant, tuning, factor, True)
            for variant in variants for factor in states[variant.name].pending]
    waiting = False
    for seed in seeds:
        for variant in variants:
            chosen = states[variant.name].chosen
            if chosen is None:
                waiting = True
            elif read_result(experiment.run_dir(variant.name, seed), experiment.config(
                    variant, seed, overrides, lr_factor=chosen)) is None:
                runs.append((variant, seed, chosen, False))
    return runs, waiting


def run_protocol(experiment: Experiment, variants: List[Variant], seeds: List[int],
                 overrides: Iterable[str]) -> bool:
    """Runs the protocol's runs that can start; True when every run is finished, False
    when the rest are held by other workers or wait for a sweep another worker holds."""
    while True:
        runs, waiting = pending_runs(experiment, variants, seeds, overrides)
        if not runs and not waiting:
            return True
        for variant, seed, factor, sweep in runs:
            row = run_one(experiment, variant, seed, overrides, lr_factor=factor, sweep=sweep)
            if row is not None:
                print(describe(experiment, row), flush=True)
                break  # a finished sweep may unblock runs: look again from the top
        else:
            return False


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m subquad.experiments.run",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiments", nargs="+", help="experiment TOML files, run in order")
    parser.add_argument("--variants", nargs="*", help="only these variants")
    parser.add_argument("--seeds", nargs="*", type=int, help="only these (reported) seeds")
    parser.add_argument("--set", nargs="*", default=[], metavar="table.key=value",
                        help="override every variant's config (e.g. train.steps=2)")
    parser.add_argument("--out-root", default="runs/experiments",
                        help="where run directories go (experiment.out overrides)")
    args = parser.parse_args(argv)
    this_process()
    try:
        experiments = [load_experiment(path, args.out_root) for path in args.experiments]
        unfinished = []
        for experiment in experiments:
            variants = ([experiment.variant(v) for v in args.variants] if args.variants
                        else list(experiment.variants))
            seeds = list(args.seeds if args.seeds is not None else experiment.seeds)
            if experiment.protocol is not None:
                unfinished.append((experiment, variants, seeds))
                continue
            for seed in seeds:  # a result of another configuration stops us before any run
                for variant in variants:
                    read_result(experiment.run_dir(variant.name, seed),
                                experiment.config(variant, seed, args.set))
            for seed in seeds:
                for variant in variants:
                    row = run_one(experiment, variant, seed, args.set)
                    if row is not None:
                        print(describe(experiment, row), flush=True)
        while unfinished:  # protocol files: on to the next file while one is blocked
            unfinished = [job for job in unfinished if not run_protocol(*job, args.set)]
            if unfinished:
                time.sleep(WAIT_S)
    except (ConfigError, ValueError) as error:
        print(f"experiments: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
