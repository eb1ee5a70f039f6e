"""Results pages of experiments: per-run rows (CSV), mean ± std per variant over seeds,
a plot of the compared validation metric against training steps and against measured
training time (mean ± std band over seeds), and docs/results/<name>.md built from them.
A page describes the runs as they were made (the configurations stored with their
results, and the --set that reproduces them when they differ from the file); without a
finished run nothing is written. Text below the page's NOTES marker is kept when the
page is rebuilt.

    python -m subquad.experiments.report configs/experiments/cat_mlm.toml [...]
        [--docs docs/results] [--commit abc1234]
"""

import argparse
import csv
import json
import math
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from ..train.config import differences
from ..train.loop import NEUTRAL_KEYS
from ..train.metrics import read_rows
from .flops import training_flop_counter
from .protocol import early_stop_text, run_config
from ..records import git_commit
from .run import RESULT
from .spec import Experiment, load_experiment

NOTES = "<!-- notes: kept when the page is rebuilt -->"


def results(experiment: Experiment) -> List[Dict]:
    """The result rows of the finished runs, in variant then seed order."""
    rows = []
    for variant in experiment.variants:
        for seed in experiment.seeds:
            path = os.path.join(experiment.run_dir(variant.name, seed), RESULT)
            if os.path.exists(path):
                with open(path) as file:
                    rows.append(json.load(file))
    return rows


Configs = Dict[Tuple[str, int], Dict]  # (variant, seed) -> the configuration of its run


def run_configs(experiment: Experiment, rows: List[Dict]) -> Configs:
    """The configuration each result row's run was made with; ValueError when one has
    none stored, or when the runs of one variant differ in more than their seed (a mean
    over seeds must be over one configuration)."""
    configs: Configs = {}
    for row in rows:
        directory = experiment.run_dir(row["variant"], row["seed"])
        config = run_config(directory, row)
        if config is None:
            raise ValueError(f"{directory}: no configuration stored with its result (no "
                             f"config.json either); cannot say what was run")
        configs[row["variant"], row["seed"]] = config
    for variant in experiment.variants:
        mine = [(seed, c) for (name, seed), c in configs.items() if name == variant.name]
        for seed, config in mine[1:]:
            changed = differences(mine[0][1], config, ignore=NEUTRAL_KEYS + ("run.seed",))
            if changed:
                raise ValueError(f"{variant.name}: seeds {mine[0][0]} and {seed} were made "
                                 f"with different configurations ({'; '.join(changed)})")
    return configs


def toml_value(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def file_differences(experiment: Experiment, configs: Configs,
                     ignore: Sequence[str] = ()) -> Tuple[Optional[List[str]], str]:
    """How the runs differ from what the file gives (keys in `ignore` left out): (the
    --set arguments that reproduce them when every run differs the same way, else None;
    a sentence for the page, empty when the runs are the file's)."""
    ignore = tuple(NEUTRAL_KEYS) + tuple(ignore)
    changed: Dict[Tuple[str, int], Dict[str, object]] = {}
    for (variant, seed), config in configs.items():
        expected = experiment.config(experiment.variant(variant), seed)
        changed[variant, seed] = {
            f"{table}.{key}": config[table].get(key)
            for table in config for key in config[table]
            if f"{table}.{key}" not in ignore
            and config[table].get(key) != expected.get(table, {}).get(key)}
    if not any(changed.values()):
        return [], ""
    shared = list(changed.values())[0]
    if all(c == shared for c in changed.values()):
        overrides = [f"{name}={toml_value(value)}" for name, value in shared.items()]
        return overrides, (f"The runs were made with settings other than the file's: "
                           f"`--set {' '.join(overrides)}`.")
    lines = "; ".join(f"{variant} seed {seed}: " + ", ".join(
        f"{name} = {toml_value(value)}" for name, value in c.items())
        for (variant, seed), c in changed.items() if c)
    return None, f"The runs were made with settings other than the file's: {lines}."


def rerun_set(overrides: Optional[List[str]]) -> str:
    """The --set part of a page's rerun command."""
    if overrides is None:
        return " --set (per run, see above)"
    return f" --set {' '.join(repr(o) if ' ' in o else o for o in overrides)}" \
        if overrides else ""


def mean_std(values: Sequence[float]):
    """(mean, sample std) of values; std is nan for a single value."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
    return mean, std


def table_cell(text: str) -> str:
    """`text` inside a Markdown table row: a "|" (e.g. MLR's ranks 16|4|2) would end the cell."""
    return text.replace("|", "\\|")


def fmt(mean: float, std: float, digits: int = 4) -> str:
    if math.isnan(std):
        return f"{mean:.{digits}g} (1 seed)"
    return f"{mean:.{digits}g} ± {std:.2g}"


def summary(experiment: Experiment, rows: List[Dict]) -> List[Dict]:
    """One row per variant with runs: seeds, params, mean ± std of each metric, wall time."""
    out = []
    for variant in experiment.variants:
        mine = [r for r in rows if r["variant"] == variant.name]
        if not mine:
            continue
        row = {"variant": variant.name, "label": variant.label,
               "seeds": len(mine), "params": mine[0]["params"],
               "attention_params": mine[0]["attention_params"], "steps": mine[0]["steps"],
               "tokens": mine[0]["tokens"], "train_flops": mine[0].get("train_flops"),
               "wall_s": mean_std([r["wall_s"] for r in mine])}
        for metric in experiment.metrics:
            values = [r[f"val_{metric}"] for r in mine if f"val_{metric}" in r]
            if values:
                row[metric] = mean_std(values)
        out.append(row)
    return out


def curves(experiment: Experiment, variant: str, metric: str):
    """Per seed: [(step, elapsed training seconds, validation metric)]."""
    per_seed = []
    for seed in experiment.seeds:
        path = os.path.join(experiment.run_dir(variant, seed), "metrics.jsonl")
        if not os.path.exists(os.path.join(experiment.run_dir(variant, seed), RESULT)):
            continue
        rows = read_rows(path)
        elapsed = {r["step"]: r["elapsed_s"] for r in rows if r["split"] == "train"}
        per_seed.append([(r["step"], elapsed.get(r["step"], math.nan), r[metric])
                         for r in rows if r["split"] == "validation" and metric in r])
    return per_seed


def plot(experiment: Experiment, path: str, scale: str, configs: Configs) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = experiment.metrics[0]
    first: Dict[str, Dict] = {}
    for (variant, _), config in configs.items():
        first.setdefault(variant, config)
    counters = {name: training_flop_counter(config) for name, config in first.items()}
    figure, axes = plt.subplots(1, 3, figsize=(16, 4.2))  # steps, time, compute
    for variant in experiment.variants:
        per_seed = curves(experiment, variant.name, metric)
        if not per_seed:
            continue
        steps = sorted(set.intersection(*[{p[0] for p in c} for c in per_seed]))
        if not steps:
            continue
        stats = [mean_std([dict((p[0], p[2]) for p in c)[s] for c in per_seed]) for s in steps]
        times = [mean_std([dict((p[0], p[1]) for p in c)[s] for c in per_seed])[0]
                 for s in steps]
        means = [m for m, _ in stats]
        stds = [0.0 if math.isnan(s) else s for _, s in stats]
        low = [m - s for m, s in zip(means, stds)]
        high = [m + s for m, s in zip(means, stds)]
        label = f"{variant.label} ({len(per_seed)} seeds)"
        xs = (steps, times, [counters[variant.name](s) for s in steps])
        for axis, x in zip(axes, xs):
            line, = axis.plot(x, means, marker="o", label=label)
            axis.fill_between(x, low, high, color=line.get_color(), alpha=0.2)
    axes[0].set_xlabel("training step")
    axes[1].set_xlabel("training time on one shared core (s)")
    axes[2].set_xlabel("training FLOPs (model count: 3 x forward)")
    axes[2].set_xscale("log")
    for axis in axes:
        axis.set_ylabel(f"validation {metric}")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.suptitle(f"{experiment.name}: {scale}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def write_csv(rows: List[Dict], path: str) -> str:
    """The rows as CSV (a row's stored configuration left out: the run directory has it)."""
    rows = [{k: v for k, v in row.items() if k != "config"} for row in rows]
    columns: List[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_page(path: str, body: str) -> str:
    """Writes `body` (ending with the NOTES marker) to the page `path`, keeping the text
    that stood below the marker in the page it replaces. The marker ends its line: Markdown
    renders the rest of a comment's line as raw HTML, so a heading there would not show."""
    notes = ""
    if os.path.exists(path):
        with open(path) as file:
            text = file.read()
        if NOTES in text:
            notes = text.split(NOTES, 1)[1].removeprefix("\n")
    with open(path, "w") as file:
        file.write(body + "\n" + notes)
    return path


def table(experiment: Experiment, stats: List[Dict]) -> str:
    flops = all(row.get("train_flops") for row in stats)
    head = ["method", "seeds", "params (attention)"] + [f"val {m}" for m in
                                                        experiment.metrics] + ["wall s/run"]
    head += ["train FLOPs/run"] if flops else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in stats:
        cells = [table_cell(row["label"]), str(row["seeds"]),
                 f"{row['params']:,} ({row['attention_params']:,})"]
        cells += [fmt(*row[m]) if m in row else "" for m in experiment.metrics]
        cells.append(fmt(*row["wall_s"], digits=3))
        cells += [f"{row['train_flops']:.3g}"] if flops else []
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def early_stops(rows: List[Dict]) -> str:
    """A paragraph naming the runs early stopping ended (their metrics are the best
    evaluation's), or "" when none was."""
    stopped = [f"{table_cell(row['label'])} seed {row['seed']}: {early_stop_text(row)}"
               for row in rows if row.get("stopped_early")]
    if not stopped:
        return ""
    return ("\nEarly stopping (`train.patience`) ended " + "; ".join(stopped) + ". Their "
            "metrics are those of the best evaluation's weights.\n")


def page(experiment: Experiment, docs: str, commit: Optional[str] = None) -> str:
    """Writes docs/<name>.csv, .png and .md; returns the .md path."""
    rows = results(experiment)
    if not rows:
        raise ValueError(f"{experiment.name}: no finished runs under {experiment.out}; "
                         f"the page is left as it is")
    configs = run_configs(experiment, rows)
    overrides, note = file_differences(experiment, configs)
    os.makedirs(docs, exist_ok=True)
    stats = summary(experiment, rows)
    config = configs[rows[0]["variant"], rows[0]["seed"]]
    model, train = config["model"], config["train"]
    scale = (f"dim {model['dim']}, {model['layers']} layers, {train['steps']} steps of "
             f"batch {train['batch_size']} ({rows[0]['tokens']:,} tokens/positions per run)")
    name = experiment.name
    write_csv(rows, os.path.join(docs, f"{name}.csv"))
    plot(experiment, os.path.join(docs, f"{name}.png"), scale, configs)
    path = os.path.join(docs, f"{name}.md")
    total_wall = sum(r["wall_s"] for r in rows)
    seeds = sorted({r["seed"] for r in rows})
    body = f"""# {name}

Config: `{experiment.path}`. {note} Rerun (resumable; finished runs are skipped):

```
python -m subquad.experiments.run {experiment.path}{rerun_set(overrides)}
python -m subquad.experiments.report {experiment.path}
```

Paper: {experiment.paper}.

Scale: {scale}; seeds {seeds}; {config['run']['threads']} thread per run.
Commit {commit or git_commit()}; machine: {rows[0]['cpu']} (2 cores shared with other
jobs, so wall times are only comparable within one table); total training wall time
{total_wall / 60:.1f} min. Mean ± sample std over seeds; per-run rows in `{name}.csv`.

{table(experiment, stats)}
{early_stops(rows)}
![{name}]({name}.png)

{NOTES}"""
    return write_page(path, body)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m subquad.experiments.report",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiments", nargs="+")
    parser.add_argument("--docs", default="docs/results")
    parser.add_argument("--out-root", default="runs/experiments")
    parser.add_argument("--commit", help="the commit the runs were made at (default HEAD)")
    args = parser.parse_args(argv)
    status = 0
    for path in args.experiments:
        try:
            experiment = load_experiment(path, args.out_root)
            if experiment.protocol is not None:
                from .protocol import experiment_anchors
                from .protocol_report import page as protocol_page

                print(protocol_page(experiment, args.docs, experiment_anchors(experiment),
                                    args.commit))
                continue
            print(page(experiment, args.docs, args.commit))
        except (ValueError, OSError) as error:  # ConfigError and DataError are ValueErrors
            print(f"report: error: {error}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
