"""WildCat at inference (Schroeder & Mackey): the exact attention of trained models (the
finished runs of one variant of an experiment; with early stopping their best weights,
the ones the runs report) replaced with no retraining by WildCat, uniform Nystrom or
uniform subsampling at several coreset ranks r, or by Performer-style random features
(performer.py) at the memory of r coreset keys. Per seed and replacement: the metric on
the configured split (every layer replaced and, with first_layer = true, the first only);
on a classifier, McNemar's exact test of its per-image correctness against the exact
model's; the replaced first layer's relative output error on all rows and, with a class
token, on its row; the time of that layer against the exact one on the same input, calls
interleaved.

    python -m subquad.experiments.wildcat_swap configs/experiments/wildcat_mlm.toml
        [--docs docs/results] [--seeds ...] [--set table.key=value ...]

Resumable: each seed's rows are kept in runs/experiments/<name>/seed<k>.json.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Dict, List, Sequence

import torch

from .. import ops
from ..layers.exact import ExactAttention
from ..layers.wildcat import WildcatAttention
from ..models.blocks import Block
from ..reference.wildcat import METHODS as CORESET_METHODS
from ..train import checkpoint
from ..train.config import ConfigError, tomllib
from ..train.evaluate import load_weights
from ..train.loop import CHECKPOINT
from ..train.tasks import make_task
from ..records import cpu_model, git_commit
from .performer import PerformerAttention, equal_memory_features
from .protocol import decide, mcnemar, paired_relative, read_result
from .report import NOTES, fmt, mean_std, write_csv, write_page
from .run import RESULT
from .spec import Claim, load_experiment

KEYS = {"name", "source", "variant", "ranks", "methods", "repeats", "metric", "paper",
        "first_layer", "split", "margin"}
PAGE_ONLY = {"paper", "margin"}  # keys that change the page, not the measurement
PERFORMER = "performer"
METHODS = (*CORESET_METHODS, PERFORMER)
SPLITS = ("validation", "test")
REPLACEMENTS = (WildcatAttention, PerformerAttention)


def load_swap(path: str) -> Dict:
    with open(path, "rb") as file:
        raw = tomllib.load(file)
    spec = raw.get("wildcat")
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: expected a [wildcat] table")
    unknown = sorted(set(spec) - KEYS)
    if unknown:
        raise ConfigError(f"wildcat: unknown key(s) {unknown}; accepted: {sorted(KEYS)}")
    for key in ("name", "source", "variant", "ranks", "methods", "metric"):
        if key not in spec:
            raise ConfigError(f"wildcat.{key}: required")
    for method in spec["methods"]:
        if not isinstance(method, dict) or set(method) - {"method", "bins", "label"}:
            raise ConfigError(f"wildcat.methods: expected tables of method, bins and label, "
                              f"got {method!r}")
        if method.get("method") not in METHODS:
            raise ConfigError(f"wildcat.methods: method {method.get('method')!r} is not one "
                              f"of {list(METHODS)}")
        if method["method"] == PERFORMER and "bins" in method:
            raise ConfigError("wildcat.methods: the performer method has no bins")
    spec["path"] = path
    spec.setdefault("repeats", 5)
    spec.setdefault("first_layer", False)
    spec.setdefault("split", "validation")
    if spec["split"] not in SPLITS:
        raise ConfigError(f"wildcat.split: expected one of {list(SPLITS)}, "
                          f"got {spec['split']!r}")
    if not isinstance(spec["first_layer"], bool):
        raise ConfigError(f"wildcat.first_layer: expected true or false, "
                          f"got {spec['first_layer']!r}")
    if not isinstance(spec["repeats"], int) or spec["repeats"] < 1:
        raise ConfigError(f"wildcat.repeats: expected an integer >= 1, got {spec['repeats']!r}")
    margin = spec.get("margin")
    if margin is not None and not (isinstance(margin, float) and 0 < margin < 1):
        raise ConfigError(f"wildcat.margin: expected a fraction in (0, 1), got {margin!r}")
    return spec


def trained(config):
    """The task and its model with the weights the finished run `config` describes
    reports (with early stopping its best evaluation's)."""
    path = os.path.join(config["run"]["out"], CHECKPOINT)
    state = json.loads(checkpoint.read_metadata(path)["task_state"])
    task = make_task(config, state)
    load_weights(path, task.model)
    task.model.eval()
    return task


def replacement(method: Dict, rank: int, seed: int):
    """make_layer(old) for swap(): the layer of `method` (a [wildcat] methods table) at
    coreset rank `rank`, or, for the performer, at the memory of `rank` coreset keys."""
    def make(old):
        bias = old.w_q.bias is not None
        if method["method"] == PERFORMER:
            head_dim = old.dim // old.heads
            return PerformerAttention(
                old.dim, old.heads, kv_heads=old.kv_heads, seed=seed, scale=old.scale,
                features=equal_memory_features(rank, head_dim, head_dim), bias=bias)
        return WildcatAttention(old.dim, old.heads, kv_heads=old.kv_heads, rank=rank,
                                bins=method.get("bins", 1), seed=seed,
                                method=method["method"], scale=old.scale, bias=bias,
                                threads=1)
    return make


def swap(model, make_layer, first_only: bool = False) -> List:
    """Replaces every exact attention of the model's blocks (or only the first, the paper's
    "dominant layer" figure) by make_layer(old); returns the old layers, in block order, so
    that restore() puts them back."""
    old = []
    for module in model.modules():
        if isinstance(module, Block) and isinstance(module.attention, ExactAttention):
            if module.attention.rope:
                raise ValueError("wildcat swap: the model's exact attention uses rope, which "
                                 "the WildCat layer does not apply; its positions would be lost")
            old.append(module.attention)
            new = make_layer(module.attention)
            new.load_state_dict(module.attention.state_dict())
            module.attention = new.eval()
            if first_only:
                break
    if not old:
        raise ValueError("wildcat swap: the model has no exact attention layer")
    return old


def restore(model, old: List) -> None:
    layers = iter(old)
    for module in model.modules():
        if isinstance(module, Block) and isinstance(module.attention, REPLACEMENTS):
            module.attention = next(layers)


def interleaved_times(layers: Sequence, x: torch.Tensor, repeats: int) -> List[List[float]]:
    """Seconds of each layer(x), repeats calls each after one warm-up call each, the layers
    called in turn (a, b, a, b, ...) so that a change of the machine's load reaches all of
    them alike."""
    times: List[List[float]] = [[] for _ in layers]
    with torch.no_grad():
        for layer in layers:
            layer(x)
        for _ in range(repeats):
            for layer, mine in zip(layers, times):
                started = time.perf_counter()
                layer(x)
                mine.append(time.perf_counter() - started)
    return times


class _Seen(Exception):
    """Ends an evaluation once the first batch's input has been seen."""


def first_attention_input(task, split: str = "validation") -> torch.Tensor:
    """The input [B, T, dim] the first block's attention sees on the first batch of
    `split`."""
    block = next(m for m in task.model.modules() if isinstance(m, Block))
    seen = []

    def keep(module, args):
        seen.append(args[0].detach().clone())
        raise _Seen

    handle = block.attention.register_forward_pre_hook(keep)
    try:
        with torch.no_grad():
            task.evaluate(split)
    except _Seen:
        pass
    finally:
        handle.remove()
    return seen[0]


def score(task, split: str):
    """(metrics, correct) of the task's model on `split`: correct is the per-example
    correctness (a list of bools) where the task gives it (a classifier), else None."""
    with torch.no_grad():
        if hasattr(task, "outcomes"):
            metrics, correct = task.outcomes(split)
            return metrics, correct.tolist()
        return task.evaluate(split), None


def relative_errors(y: torch.Tensor, exact_y: torch.Tensor, class_token: bool) -> Dict:
    """||y - y_exact|| / ||y_exact|| of outputs [B, T, dim] over all rows (layer_error)
    and, with a class token, over its row 0 alone (cls_error)."""
    errors = {"layer_error": float((y - exact_y).norm() / exact_y.norm())}
    if class_token:
        errors["cls_error"] = float((y[:, 0] - exact_y[:, 0]).norm() / exact_y[:, 0].norm())
    return errors


def paired_test(correct, exact_correct, suffix: str = "") -> Dict:
    """McNemar's exact test of a swapped model's per-example correctness against the exact
    model's: p, discordant pairs, and how many each got right alone."""
    test = mcnemar(correct, exact_correct)
    return {f"mcnemar_p{suffix}": test["p"], f"discordant{suffix}": test["discordant"],
            f"only_swapped{suffix}": test["only_a"], f"only_exact{suffix}": test["only_b"]}


def run(spec: Dict, overrides=(), out_root: str = "runs/experiments",
        seeds=None) -> List[Dict]:
    """The rows of every finished source run (of `seeds`, default all). Each seed's rows are
    written to <out_root>/<name>/seed<k>.json when done, and a later call with the same
    settings reads them instead of measuring again."""
    source = load_experiment(spec["source"], out_root)
    variant = source.variant(spec["variant"])
    settings = {key: spec[key] for key in sorted(KEYS - PAGE_ONLY) if key in spec}
    settings["overrides"] = list(overrides)
    rows = []
    torch.set_num_threads(1)
    for seed in source.seeds if seeds is None else seeds:
        config = source.config(variant, seed, overrides)
        if not os.path.exists(os.path.join(config["run"]["out"], RESULT)):
            print(f"wildcat swap: {config['run']['out']} has not finished; skipped",
                  file=sys.stderr)
            continue
        path = os.path.join(out_root, spec["name"], f"seed{seed}.json")
        if os.path.exists(path):
            with open(path) as file:
                done = json.load(file)
            if done["settings"] == settings:
                rows += done["rows"]
                continue
        started = time.perf_counter()
        mine = run_seed(spec, config, seed)
        mine[0]["wall_s"] = time.perf_counter() - started
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as file:
            json.dump({"settings": settings, "rows": mine}, file, indent=1)
        os.replace(path + ".tmp", path)
        rows += mine
    return rows


def run_seed(spec: Dict, config: Dict, seed: int) -> List[Dict]:
    """The rows of one trained model: exact first, then each method at each rank."""
    metric, split, rows = spec["metric"], spec["split"], []
    first_metric = f"{metric}_first_layer"
    class_token = config["model"].get("pool") == "cls"  # the ViT's row 0
    task = trained(config)
    for module in task.model.modules():
        if isinstance(module, ExactAttention):
            module.threads = 1  # its C++ kernel on one thread, as the replacements'
    x = first_attention_input(task, split)
    exact_layer = next(m.attention for m in task.model.modules() if isinstance(m, Block))
    base, exact_correct = score(task, split)
    with torch.no_grad():
        exact_y = exact_layer(x)[0]
        q, k, v = exact_layer.project(x)  # [B, T, H, D], [B, T, Hkv, D] x 2

    def exact_core(_):
        return ops.exact_attention(q, k, v, scale=exact_layer.scale, causal=exact_layer.causal,
                                   window=exact_layer.window, threads=1)
    exact_times = []
    exact = {"seed": seed, "method": "exact", "label": "exact", "bins": 0,
             "rank": x.shape[1], metric: base[metric],
             **relative_errors(exact_y, exact_y, class_token)}
    if exact_correct is not None:
        exact.update(paired_test(exact_correct, exact_correct))
    if spec["first_layer"]:
        exact[first_metric] = base[metric]
        if exact_correct is not None:
            exact.update(paired_test(exact_correct, exact_correct, "_first_layer"))
    rows.append(exact)
    for method in spec["methods"]:
        for rank in spec["ranks"]:
            make = replacement(method, rank, seed)
            row = {"seed": seed, "method": method["method"],
                   "label": method.get("label", method["method"]),
                   "bins": method.get("bins", 1), "rank": rank}
            old = swap(task.model, make)
            first = next(m.attention for m in task.model.modules()
                         if isinstance(m, Block))
            if isinstance(first, PerformerAttention):
                row.update(bins=0, features=first.features)
            mine, theirs = interleaved_times([first, exact_layer], x, spec["repeats"])
            exact_times += theirs
            # The attention alone, without the projections both layers share.
            core, exact_cores = interleaved_times(
                [lambda _: first.core(q, k, v), exact_core], x, spec["repeats"])
            with torch.no_grad():
                row.update(relative_errors(first(x)[0], exact_y, class_token))
            result, correct = score(task, split)
            row[metric] = result[metric]
            if correct is not None:
                row.update(paired_test(correct, exact_correct))
            restore(task.model, old)
            if spec["first_layer"]:
                old = swap(task.model, make, first_only=True)
                result, correct = score(task, split)
                row[first_metric] = result[metric]
                if correct is not None:
                    row.update(paired_test(correct, exact_correct, "_first_layer"))
                restore(task.model, old)
            row.update(layer_s=statistics.median(mine), layer_min_s=min(mine),
                       exact_s=statistics.median(theirs), exact_min_s=min(theirs),
                       speedup=statistics.median(theirs) / statistics.median(mine),
                       speedup_min=min(theirs) / min(mine),
                       core_speedup=statistics.median(exact_cores) / statistics.median(core),
                       core_speedup_min=min(exact_cores) / min(core), tokens=x.shape[1])
            rows.append(row)
            print(f"seed {seed} {row['label']} r={rank}: {metric} {row[metric]:.4g}, "
                  f"{row['speedup']:.2f}x", flush=True)
    exact.update(layer_s=statistics.median(exact_times),
                 layer_min_s=min(exact_times), exact_s=statistics.median(exact_times),
                 exact_min_s=min(exact_times), speedup=1.0, speedup_min=1.0,
                 core_speedup=1.0, core_speedup_min=1.0, tokens=x.shape[1])
    return rows


def plot(spec: Dict, rows: List[Dict], path: str, scale: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = spec["metric"]
    series = [(metric, "-", "")]
    if spec["first_layer"]:
        series.append((f"{metric}_first_layer", "--", ", first layer only"))
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    exact = [r[metric] for r in rows if r["method"] == "exact"]
    for label in dict.fromkeys(r["label"] for r in rows if r["method"] != "exact"):
        mine = [r for r in rows if r["label"] == label]
        ranks = sorted({r["rank"] for r in mine})
        color = None
        for axis, key, style, suffix in [(axes[0], *s) for s in series] + \
                [(axes[1], "speedup", "-", "")]:
            stats = [mean_std([r[key] for r in mine if r["rank"] == k]) for k in ranks]
            line = axis.errorbar(ranks, [m for m, _ in stats],
                                 yerr=[0 if math.isnan(s) else s for _, s in stats],
                                 marker="o", capsize=3, linestyle=style, color=color,
                                 label=label + suffix)
            color = line[0].get_color()
    axes[0].axhline(mean_std(exact)[0], color="black", linestyle=":", label="exact")
    axes[1].axhline(1.0, color="black", linestyle=":")
    axes[0].set_ylabel(f"{spec['split']} {metric}")
    axes[1].set_ylabel("speed-up of the replaced layer vs exact (median)")
    for axis in axes:
        axis.set_xscale("log", base=2)
        axis.set_xlabel("coreset rank r")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle(f"{spec['name']}: {scale}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def source_params(source, variant: str, seeds) -> str:
    """"P (attention A)" parameter counts of the source runs (the same for every seed)."""
    with open(os.path.join(source.run_dir(variant, seeds[0]), RESULT)) as file:
        result = json.load(file)
    return f"{result['params']:,} parameters ({result['attention_params']:,} in attention)"


def unconverged_sources(source, variant: str, seeds) -> List[str]:
    """The source runs an evidence-protocol experiment did not count as converged (their
    models take no part in a verdict); none for a source without the protocol."""
    if source.protocol is None:
        return []
    return [f"source seed {seed}" for seed in seeds
            if not (read_result(source.run_dir(variant, seed)) or {})
            .get("convergence", {}).get("converged")]


def keeps_metric(spec: Dict, mine: List[Dict], exact: List[Dict],
                 not_converged: Sequence[str], lower_is_better: bool) -> str:
    """The pre-registered equivalence (wildcat.margin): the replaced model (every layer)
    matches the exact one of the same seed within +-margin relative, by the protocol's
    paired t-interval (protocol.decide's "matches")."""
    metric = spec["metric"]
    claim = Claim(text="", variant=mine[0]["label"], baseline="exact", rule="matches",
                  margin=spec["margin"])
    differences = paired_relative({r["seed"]: r[metric] for r in mine},
                                  {r["seed"]: r[metric] for r in exact})
    verdict = decide(claim, differences, lower_is_better, not_converged)
    if "mean" not in verdict:
        return f"**{verdict['verdict']}**: {verdict['reason']}"
    # The reason as protocol_report gives it: under "matches", "no difference" only says
    # the interval is wider than the margin, not that the metric is kept.
    return (f"**{verdict['verdict']}**: {100 * verdict['mean']:+.2f}% "
            f"[{100 * verdict['low']:+.2f}, {100 * verdict['high']:+.2f}], "
            f"{verdict['reason']}")


def page(spec: Dict, rows: List[Dict], docs: str, wall_s: float,
         out_root: str = "runs/experiments") -> str:
    name, metric = spec["name"], spec["metric"]
    source = load_experiment(spec["source"], out_root)
    config = source.config(source.variant(spec["variant"]), source.seeds[0])
    seeds = sorted({r["seed"] for r in rows})
    scale = (f"models of {spec['source']} variant {spec['variant']} (dim "
             f"{config['model']['dim']}, {config['model']['layers']} layers, "
             f"{config['train']['steps']} steps), T = {rows[0]['tokens']}")
    os.makedirs(docs, exist_ok=True)
    write_csv(rows, os.path.join(docs, f"{name}.csv"))
    plot(spec, rows, os.path.join(docs, f"{name}.png"), scale)
    split = spec["split"]
    paired = "mcnemar_p" in rows[0]
    class_token = "cls_error" in rows[0]
    suffixes = ["", "_first_layer"] if spec["first_layer"] else [""]
    head = ["method", "r", f"{split} {metric}, every layer replaced"]
    if spec["first_layer"]:
        head.append(f"{split} {metric}, first layer only")
    if paired:
        head += [f"McNemar p per seed (discordant pairs), {where}"
                 for where in ("every layer", "first layer only")[:len(suffixes)]]
    head.append("first layer's relative error, all rows")
    if class_token:
        head.append("class-token row")
    head += ["layer speed-up vs exact, median (min)", "attention alone, median (min)"]
    margin = spec.get("margin")
    if margin is not None:
        head.append(f"keeps {metric} within ±{margin:.0%}, every layer: verdict, paired "
                    f"change [95% t-interval]")
        exact_rows = [r for r in rows if r["method"] == "exact"]
        not_converged = unconverged_sources(source, spec["variant"], seeds)
        lower_is_better = source.lower_is_better
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    groups = dict.fromkeys((r["label"], r["rank"]) for r in rows)
    for label, rank in groups:
        mine = [r for r in rows if r["label"] == label and r["rank"] == rank]
        cells = [label, str(rank) if label != "exact" else "(all keys)",
                 fmt(*mean_std([r[metric] for r in mine]))]
        if spec["first_layer"]:
            cells.append(fmt(*mean_std([r[f"{metric}_first_layer"] for r in mine])))
        if paired:
            cells += [", ".join(f"{r['seed']}: {r['mcnemar_p' + s]:.2g} "
                                f"({r['discordant' + s]})" for r in mine) for s in suffixes]
        cells.append(fmt(*mean_std([r["layer_error"] for r in mine]), digits=2))
        if class_token:
            cells.append(fmt(*mean_std([r["cls_error"] for r in mine]), digits=2))
        cells += [f"{fmt(*mean_std([r[key] for r in mine]), digits=3)} "
                  f"({fmt(*mean_std([r[key + '_min'] for r in mine]), digits=3)})"
                  for key in ("speedup", "core_speedup")]
        if margin is not None:
            cells.append("" if label == "exact" else keeps_metric(
                spec, mine, exact_rows, not_converged, lower_is_better))
        lines.append("| " + " | ".join(cells) + " |")
    exact_ms = mean_std([1e3 * r["layer_s"] for r in rows if r["method"] == "exact"])
    notes = []
    if paired:
        notes.append(f"McNemar: the exact two-sided binomial test of the {split} images "
                     f"one model classifies right and the other wrong (the discordant "
                     f"pairs), the swapped model against the exact one of the same seed; "
                     f"per seed, p (discordant pairs).")
    if class_token:
        notes.append("The class-token row's error is the same ratio on row 0 alone, the "
                     "row the classifier reads.")
    if any(r["method"] == PERFORMER for r in rows):
        notes.append("Performer-style (FAVOR+, positive orthogonal random features, drawn "
                     "from the model's seed) at the memory of r coreset keys: m = "
                     "floor(r (Dk + Dv + 1) / (Dv + 1)) features, whose state m (Dv + 1) "
                     "fits the r (Dk + Dv + 1) numbers of a weighted coreset per head (m "
                     f"in `{name}.csv`).")
    path = os.path.join(docs, f"{name}.md")
    body = f"""# {name}

Config: `{spec['path']}`. Rerun (after the source runs have finished; timed on one
pinned core; measured seeds are read back from runs/experiments/{spec['name']}/):

```
taskset -c 1 python -m subquad.experiments.wildcat_swap {spec['path']}
```

Paper: {spec.get('paper', '')}.

Scale: {scale}; {source_params(source, spec['variant'], seeds)}; seeds {seeds} (one
trained model each, [{source.name}]({source.name}.md); WildCat's own seed = the model's).
The exact attention layers are replaced without retraining, in every layer{
', and in the first layer alone' if spec['first_layer'] else ''}. The speed-up
is the exact layer's time over the replaced first layer's, median (and min) of
{spec['repeats']} forward calls of each, interleaved, on the input [B, T, dim] the first
layer sees on the first {split} batch, 1 thread (the exact layer: {fmt(*exact_ms, digits=3)}
ms median); "attention alone" times the same way the attention of the first layer's q,
k, v without the projections (WildCat's coreset construction included); the relative
error is ||y - y_exact|| / ||y_exact|| of that layer's output on that input. The metric is
the task's evaluation of its {split} split. {' '.join(notes)} Commit
{git_commit()}; machine: {cpu_model()} (2 shared cores); wall time {wall_s / 60:.1f} min
(all seeds). Mean ± sample std over seeds; rows in `{name}.csv`.

{chr(10).join(lines)}

![{name}]({name}.png)

{NOTES}"""
    return write_page(path, body)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m subquad.experiments.wildcat_swap",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--docs", default="docs/results")
    parser.add_argument("--set", nargs="*", default=[], metavar="table.key=value",
                        help="overrides of the source runs' configs (must match theirs)")
    parser.add_argument("--out-root", default="runs/experiments",
                        help="where the source experiment's run directories are")
    parser.add_argument("--seeds", nargs="*", type=int,
                        help="only these seeds of the source (default: every seed)")
    args = parser.parse_args(argv)
    try:
        spec = load_swap(args.config)
        rows = run(spec, args.set, args.out_root, args.seeds)
        if not rows:
            raise ValueError(f"no finished runs of {spec['source']} variant {spec['variant']}")
        wall_s = sum(r["wall_s"] for r in rows if r["method"] == "exact")
        print(page(spec, rows, args.docs, wall_s, args.out_root))
    except (ConfigError, ValueError) as error:
        print(f"wildcat swap: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
