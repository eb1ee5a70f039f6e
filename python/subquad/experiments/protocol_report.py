"""Results pages of experiments that follow the evidence protocol: the pre-registered
claims and gate, the anchors, the learning-rate sweep, per-seed rows with the convergence
test, the gate's outcome per control run, mean ± std over converged seeds, paired
differences with t-intervals and the verdict, learning curves (log-spaced evaluations;
runs that did not converge dashed), CPU time, and the final checkpoints (model only; with
early stopping the best evaluation's weights) committed next to the page."""

import json
import math
import os
from typing import Dict, List, Optional, Tuple

from ..train import checkpoint
from ..train.config import resolve
from ..train.loop import CHECKPOINT
from .flops import training_flop_counter
from .protocol import (NOT_TESTED, converged, decide, early_stop_text, gate_outcome,
                       paired_relative, read_result, sweep_state, validation_curve)
from ..records import git_commit
from .report import (NOTES, Configs, file_differences, fmt, mean_std, rerun_set, run_configs,
                     table_cell, write_csv, write_page)
from .spec import Experiment


def reported_rows(experiment: Experiment) -> List[Dict]:
    rows = []
    for variant in experiment.variants:
        for seed in experiment.seeds:
            row = read_result(experiment.run_dir(variant.name, seed))
            if row is not None:
                rows.append(row)
    return rows


def sweep_table(experiment: Experiment) -> str:
    metric = experiment.metrics[0]
    lines = [f"| method | lr x factor: validation {metric} (tuning seed "
             f"{experiment.protocol.tuning_seed}, {experiment.protocol.sweep_fraction:.3g} of "
             f"the steps) | chosen lr |",
             "|---|---|---|"]
    for variant in experiment.variants:
        state = sweep_state(experiment, variant.name)
        cells = ", ".join(f"x{f:g}: {'diverged' if math.isinf(v) else f'{v:.4g}'}"
                          for f, v in sorted(state.scores.items()))
        if state.chosen:  # the rate the chosen sweep run was made with (else the file's)
            result = read_result(experiment.sweep_dir(variant.name, state.chosen)) or {}
            lr = result.get("lr", state.chosen * experiment.config(
                variant, experiment.protocol.tuning_seed)["train"]["lr"])
            chosen = f"{lr:.3g} (x{state.chosen:g})"
        else:
            chosen = "sweep unfinished"
        lines.append(f"| {table_cell(variant.label)} | {cells or 'not run'} | {chosen} |")
    return "\n".join(lines)


def seed_table(experiment: Experiment, rows: List[Dict]) -> str:
    metric = experiment.metrics[0]
    lines = [f"| method | seed | lr | val {metric} | test {metric} | converged | "
             f"last-quarter change | CPU s | wall s |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        test = row.get("convergence", {})
        status = "yes" if converged(row) else f"**no**: {test.get('reason', 'diverged')}"
        change = test.get("last_quarter_improvement", math.nan)
        plateau = early_stop_text(row) or f"{-change:+.2%}"
        lines.append(
            f"| {table_cell(row['label'])} | {row['seed']} | {row['lr']:.3g} | "
            f"{row.get('val_' + metric, math.nan):.4g} | "
            f"{row.get('test_' + metric, math.nan):.4g} | {status} | {plateau} | "
            f"{row['cpu_s']:.0f} | {row['wall_s']:.0f} |")
    return "\n".join(lines)


def summary_table(experiment: Experiment, rows: List[Dict], configs: Configs) -> str:
    """Mean ± std of every metric on the test split, over the converged seeds."""
    head = (["method", "params (attention)", "train FLOPs/run", "converged seeds"]
            + [f"test {m}" for m in experiment.metrics] + ["CPU s/run"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for variant in experiment.variants:
        mine = [r for r in rows if r["variant"] == variant.name]
        if not mine:
            continue
        good = [r for r in mine if converged(r)]
        counter = training_flop_counter(configs[variant.name, mine[0]["seed"]])
        # What each run trained: early stopping (train.patience) ends runs before the budget.
        flops = [counter(r.get("stopped_at", r["steps"])) for r in mine]
        cells = [table_cell(variant.label), f"{mine[0]['params']:,} ({mine[0]['attention_params']:,})",
                 (f"{flops[0]:.3g}" if len(set(flops)) == 1
                  else fmt(*mean_std(flops), digits=3)),
                 f"{len(good)} of {len(mine)}"]
        for metric in experiment.metrics:
            values = [r[f"test_{metric}"] for r in good if f"test_{metric}" in r]
            cells.append(fmt(*mean_std(values)) if values else "not converged")
        cells.append(fmt(*mean_std([r["cpu_s"] for r in mine]), digits=3))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def claim_rows(experiment: Experiment, rows: List[Dict]) -> List[Dict]:
    """Per claim: the paired relative differences of the test metric and the verdict;
    while the protocol's gate is not met, no comparison is read: every claim is not
    tested, naming what failed the gate."""
    metric, out = experiment.metrics[0], []
    by = {(r["variant"], r["seed"]): r for r in rows}
    gate = experiment.protocol.gate
    if gate is not None:
        outcome = gate_outcome(gate, by, experiment.seeds)
        if not outcome["met"]:
            return [{"claim": claim, "differences": {}, "verdict": NOT_TESTED,
                     "reason": "gate not met: " + outcome["reason"]}
                    for claim in experiment.protocol.claims]
    for claim in experiment.protocol.claims:
        missing = [f"{v} seed {s}" for v in (claim.variant, claim.baseline)
                   for s in experiment.seeds if (v, s) not in by]
        failed = [f"{v} seed {s}" for v in (claim.variant, claim.baseline)
                  for s in experiment.seeds if (v, s) in by and not converged(by[v, s])]
        values = {v: {s: by[v, s][f"test_{metric}"] for s in experiment.seeds
                      if (v, s) in by and converged(by[v, s])}
                  for v in (claim.variant, claim.baseline)}
        differences = paired_relative(values[claim.variant], values[claim.baseline])
        if missing:
            decision = {"verdict": NOT_TESTED, "reason": "runs unfinished: " + ", ".join(missing)}
        else:
            decision = decide(claim, differences, experiment.lower_is_better, failed)
        out.append({"claim": claim, "differences": differences, **decision})
    return out


def claims_table(experiment: Experiment, decided: List[Dict]) -> str:
    metric = experiment.metrics[0]
    lines = [f"| claim | rule | paired test {metric} difference per seed | mean [95% "
             f"t-interval] | verdict |", "|---|---|---|---|---|"]
    for row in decided:
        claim = row["claim"]
        rule = (f"{claim.variant} better than {claim.baseline}" if claim.rule == "better"
                else f"{claim.variant} within ±{claim.margin:.0%} of {claim.baseline}")
        per_seed = ", ".join(f"{s}: {d:+.2%}" for s, d in row["differences"].items()) or "-"
        interval = (f"{row['mean']:+.2%} [{row['low']:+.2%}, {row['high']:+.2%}]"
                    if "mean" in row else "-")
        lines.append(f"| {table_cell(claim.text)} | {rule} | {per_seed} | {interval} | "
                     f"**{row['verdict']}**: {row['reason']} |")
    return "\n".join(lines)


def gate_text(experiment: Experiment) -> str:
    """The gate as pre-registered, a paragraph of the page's first section ("" without
    one)."""
    gate = experiment.protocol.gate
    if gate is None:
        return ""
    names = ", ".join(f"`{v}`" for v in gate.variants)
    return (f"\n\nGate, read before any claim: {gate.rule()} in every reported seed of {names}, "
            f"each run converged; until it is met every claim is not tested.")


def gate_table(experiment: Experiment, rows: List[Dict]) -> str:
    """Per gate variant and seed: the gated quantity, convergence, and whether it passes."""
    gate = experiment.protocol.gate
    if gate is None:
        return ""
    outcome = gate_outcome(gate, {(r["variant"], r["seed"]): r for r in rows},
                           experiment.seeds)
    labels = {v.name: v.label for v in experiment.variants}
    lines = [f"Gate ({gate.rule()}): **{'met' if outcome['met'] else 'not met'}**.", "",
             f"| control | seed | {gate.quantity()} | converged | passes |",
             "|---|---|---|---|---|"]
    for check in outcome["checks"]:
        value = "unfinished" if not check["finished"] else (
            "not recorded" if check["value"] is None else f"{check['value']:.4g}")
        lines.append(f"| {table_cell(labels[check['variant']])} | {check['seed']} | {value} | "
                     f"{'yes' if check['converged'] else 'no'} | "
                     f"{'yes' if check['passes'] else '**no**'} |")
    return "\n".join(lines) + "\n\n"


def anchors_table(anchors: Dict[str, Dict[str, Dict[str, float]]], chosen: str) -> str:
    lines = ["| anchor | validation | test |", "|---|---|---|"]
    for name, splits in anchors.items():
        cells = [", ".join(f"{k} {v:.4g}" for k, v in splits.get(s, {}).items()
                           if isinstance(v, (int, float))) for s in ("validation", "test")]
        marker = " (the runs must beat it)" if name == chosen else ""
        lines.append(f"| {name}{marker} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


CURVE_AXES = [("step", "training step"), ("cpu_s", "CPU seconds (training + evaluation)")]
FLOPS_AXIS = ("flops", "training FLOPs (model count: 3 x forward)")


def run_curves(experiment: Experiment, rows: List[Dict], configs: Configs) -> Tuple[
        List[Tuple[str, str]], Dict[Tuple[str, int], List[Dict]]]:
    """(the x axes of the learning curves, {(variant, seed): validation curve}). Each point
    also carries its training FLOPs so far: FLOPs is a third axis, on which runs of
    different widths share one compute scale."""
    curves = {}
    for row in rows:
        variant, seed = row["variant"], row["seed"]
        counter = training_flop_counter(configs[variant, seed])
        curves[variant, seed] = [p | {"flops": counter(p["step"])}
                                 for p in validation_curve(experiment.run_dir(variant, seed))]
    return CURVE_AXES + [FLOPS_AXIS], curves


def plot(experiment: Experiment, rows: List[Dict], anchor: Optional[float], path: str,
         configs: Configs) -> str:
    """Validation metric against each axis of run_curves (log x), one line per reported
    run; runs that did not converge dashed; the anchor as a grey line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = experiment.metrics[0]
    axes_of, curves = run_curves(experiment, rows, configs)
    figure, axes = plt.subplots(1, len(axes_of), figsize=(6 * len(axes_of), 4.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, variant in enumerate(experiment.variants):
        for row in (r for r in rows if r["variant"] == variant.name):
            curve = curves[variant.name, row["seed"]]
            style = "-" if converged(row) else "--"
            label = f"{variant.label}" + ("" if converged(row) else " (not converged)")
            for axis, (key, _) in zip(axes, axes_of):
                axis.plot([p[key] for p in curve if key in p],
                          [p[metric] for p in curve if key in p], style, marker=".",
                          color=colours[index % len(colours)], label=label)
    for axis, (_, xlabel) in zip(axes, axes_of):
        if anchor is not None:
            axis.axhline(anchor, color="grey", linewidth=1, label="anchor")
        axis.set_xscale("log")
        # A span under two decades would label its minor ticks too, over one another.
        axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axis.set_xlabel(xlabel)
        axis.set_ylabel(f"validation {metric}")
        axis.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    axes[0].legend(unique.values(), unique.keys(), fontsize=8)
    figure.suptitle(experiment.name, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def export_checkpoints(experiment: Experiment, rows: List[Dict], folder: str) -> List[str]:
    """The weights every reported run reports (its last step's; with early stopping its
    best evaluation's, at that step), model only, with the configuration and tokeniser
    (subquad-train --evaluate reads them): <folder>/<variant>-seed<k>.safetensors. A file
    whose model and metadata are unchanged is not rewritten."""
    from ..train.evaluate import load_run

    os.makedirs(folder, exist_ok=True)
    paths = []
    for row in rows:
        source = os.path.join(experiment.run_dir(row["variant"], row["seed"]), CHECKPOINT)
        target = os.path.join(folder, f"{row['variant']}-seed{row['seed']}.safetensors")
        if not os.path.exists(source):
            continue
        metadata = checkpoint.read_metadata(source)
        config = resolve(json.loads(metadata["config"]))
        state = json.loads(metadata["task_state"])
        task, step = load_run(source)
        fresh = target + checkpoint.PARTIAL
        checkpoint.save(fresh, task.model, None, step, config, state,
                        json.loads(metadata.get("clock", "{}")),
                        stopping=checkpoint.early_stopping(metadata))
        # An unchanged model keeps its file, so that rebuilding a page leaves the
        # committed checkpoints alone.
        if os.path.exists(target) and checkpoint.same_contents(fresh, target):
            os.remove(fresh)
        else:
            os.replace(fresh, target)
        paths.append(target)
    return paths


def page(experiment: Experiment, docs: str, anchors: Dict, commit: Optional[str] = None,
         checkpoints: bool = True) -> str:
    """Writes docs/<name>.md (.csv, .png, <name>/ checkpoints) from the finished runs, as
    they were made (their stored configurations); ValueError, writing nothing, when no
    run (sweep or reported) has finished."""
    rows = reported_rows(experiment)
    name, metric = experiment.name, experiment.metrics[0]
    swept = any(sweep_state(experiment, v.name).scores for v in experiment.variants)
    if not rows and not swept:
        raise ValueError(f"{name}: no finished runs under {experiment.out}; the page is left "
                         f"as it is")
    configs = run_configs(experiment, rows)
    overrides, note = file_differences(experiment, configs, ignore=("train.lr",))
    os.makedirs(docs, exist_ok=True)
    anchor = anchors.get(experiment.protocol.anchor, {}).get("validation", {}).get(metric)
    if rows:
        write_csv([{k: v for k, v in r.items() if k != "convergence"} |
                   {f"convergence_{k}": v for k, v in r.get("convergence", {}).items()}
                   for r in rows], os.path.join(docs, f"{name}.csv"))
        plot(experiment, rows, anchor, os.path.join(docs, f"{name}.png"), configs)
        if checkpoints:
            export_checkpoints(experiment, rows, os.path.join(docs, name))
    decided = claim_rows(experiment, rows)
    config = (configs[rows[0]["variant"], rows[0]["seed"]] if rows else
              experiment.config(experiment.variants[0], experiment.seeds[0]))
    train = config["train"]

    def scale(table: str, key: str) -> str:
        """A setting of the runs' configurations; its values, when the variants differ."""
        values = sorted({c[table][key] for c in configs.values()} or {config[table][key]})
        return (str(values[0]) if len(values) == 1 else
                " / ".join(map(str, values)) + " (by variant)")

    sweep_cpu = sum(r.get("cpu_s", 0.0) for v in experiment.variants
                    for f in sweep_state(experiment, v.name).scores
                    for r in [read_result(experiment.sweep_dir(v.name, f)) or {}])
    reported_cpu = sum(r["cpu_s"] for r in rows)
    machines = sorted({f"{r['cpu']} ({r.get('cores', '?')} cores)" for r in rows})
    commits = sorted({r.get("commit", "unknown") for r in rows})
    claims = "\n".join(f"- {c.text} (rule: `{c.rule}`"
                       f"{f', margin ±{c.margin:.0%}' if c.rule == 'matches' else ''})"
                       for c in experiment.protocol.claims) or (
        f"No claim here: these are the source models of `{experiment.protocol.source_of}`, "
        f"which pre-registers what is tested on them.")
    verdicts = (claims_table(experiment, decided) if decided else
                f"None here; see `{experiment.protocol.source_of}`.")
    figure = f"![{name}]({name}.png)" if rows else "(no finished runs yet)"
    tokens = f" ({rows[0]['tokens']:,} tokens or positions per run)" if rows else ""
    patience = (f"; early stopping after {train['patience']} evaluations without a better "
                f"validation loss, reporting the best evaluation's weights"
                if train.get("patience") else "")
    sizes = (f"dim {scale('model', 'dim')}, {scale('model', 'layers')} layers, "
             f"{scale('model', 'heads')} heads, {scale('train', 'steps')} steps of batch "
             f"{scale('train', 'batch_size')}")
    body = f"""# {name}

{experiment.paper}

## Pre-registered (in `{experiment.path}`)
{claims}

Primary metric: {metric} ({'lower' if experiment.lower_is_better else 'higher'} is
better), chosen on the whole validation split, reported once on the test split. Reported
seeds {list(experiment.seeds)}; learning rate per method from the sweep on seed
{experiment.protocol.tuning_seed}. A run counts only if it beats the anchor
`{experiment.protocol.anchor}` on validation, its validation loss improved by less than
{experiment.protocol.plateau_tolerance:.0%} over the last quarter of the steps (or early
stopping ended it), and its curve has at least 10 evaluations.{gate_text(experiment)}

Scale: {sizes}{tokens}{patience}. {note}

Rerun (resumable; finished runs are skipped; one worker per core):

```
taskset -c 0 python -m subquad.experiments.run {experiment.path}{rerun_set(overrides)} &
taskset -c 1 python -m subquad.experiments.run {experiment.path}{rerun_set(overrides)}
python -m subquad.experiments.report {experiment.path}
subquad-train --evaluate docs/results/{name}/<variant>-seed<k>.safetensors --split test
```

## Verdicts
{gate_table(experiment, rows)}{verdicts}

## Anchors (non-neural, `subquad.experiments.anchors`)
{anchors_table(anchors, experiment.protocol.anchor)}

## Learning-rate sweep
{sweep_table(experiment)}

## Reported runs (test split; mean ± sample std over converged seeds)
{summary_table(experiment, rows, configs)}

{seed_table(experiment, rows)}

{figure}

Cost: {sweep_cpu / 3600:.2f} CPU hours of sweeps, {reported_cpu / 3600:.2f} of reported
runs. Machine(s): {'; '.join(machines) or '-'}. Commit(s) of the runs:
{', '.join(commits) or '-'}; page built at {commit or git_commit()}. Final checkpoints
(model only): `{name}/`.

{NOTES}"""
    return write_page(os.path.join(docs, f"{name}.md"), body)
