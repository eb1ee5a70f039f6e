"""WildCat at inference (Schroeder & Mackey): the exact attention of trained models (the
finished runs of one variant of an experiment) replaced by WildCat, uniform Nystrom or
uniform subsampling at several coreset ranks, with no retraining; the validation metric
of each, and the time of the replaced layer against the exact one on the same input.

    python -m subquad.experiments.wildcat_swap configs/experiments/wildcat_mlm.toml
        [--docs docs/results] [--set table.key=value ...]
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Dict, List

import torch

from ..layers.exact import ExactAttention
from ..layers.wildcat import WildcatAttention
from ..models.blocks import Block
from ..train import checkpoint
from ..train.config import ConfigError, tomllib
from ..train.loop import CHECKPOINT, make_optimizer
from ..train.tasks import make_task
from .report import NOTES, fmt, git_commit, mean_std, write_csv, write_page
from .run import RESULT, cpu_model
from .spec import load_experiment

KEYS = {"name", "source", "variant", "ranks", "methods", "repeats", "metric", "paper"}


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
    spec["path"] = path
    spec.setdefault("repeats", 5)
    return spec


def trained(config):
    """The task and its model with the checkpoint of the finished run `config` describes."""
    path = os.path.join(config["run"]["out"], CHECKPOINT)
    state = json.loads(checkpoint.read_metadata(path)["task_state"])
    task = make_task(config, state)
    checkpoint.load(path, task.model, make_optimizer(task.model, config["train"]))
    task.model.eval()
    return task


def swap(model, make_layer) -> List:
    """Replaces every exact attention of the model's blocks by make_layer(old); returns the
    old layers, in block order, so that restore() puts them back."""
    old = []
    for module in model.modules():
        if isinstance(module, Block) and isinstance(module.attention, ExactAttention):
            old.append(module.attention)
            new = make_layer(module.attention)
            new.load_state_dict(module.attention.state_dict())
            module.attention = new.eval()
    if not old:
        raise ValueError("wildcat swap: the model has no exact attention layer")
    return old


def restore(model, old: List) -> None:
    layers = iter(old)
    for module in model.modules():
        if isinstance(module, Block) and isinstance(module.attention, WildcatAttention):
            module.attention = next(layers)


def median_time(layer, x, repeats: int) -> float:
    """Median seconds of layer(x) over repeats, after one warm-up call."""
    with torch.no_grad():
        layer(x)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            layer(x)
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def first_attention_input(task) -> torch.Tensor:
    """The input [B, T, dim] the first block's attention sees on one validation batch."""
    block = next(m for m in task.model.modules() if isinstance(m, Block))
    seen = []
    handle = block.attention.register_forward_pre_hook(
        lambda module, args: seen.append(args[0].detach().clone()))
    with torch.no_grad():
        task.evaluate()
    handle.remove()
    return seen[0]


def run(spec: Dict, overrides=(), out_root: str = "runs/experiments") -> List[Dict]:
    source = load_experiment(spec["source"], out_root)
    variant = source.variant(spec["variant"])
    metric, rows = spec["metric"], []
    torch.set_num_threads(1)
    for seed in source.seeds:
        config = source.config(variant, seed, overrides)
        if not os.path.exists(os.path.join(config["run"]["out"], RESULT)):
            print(f"wildcat swap: {config['run']['out']} has not finished; skipped",
                  file=sys.stderr)
            continue
        task = trained(config)
        x = first_attention_input(task)
        exact_layer = next(m.attention for m in task.model.modules() if isinstance(m, Block))
        exact_s = median_time(exact_layer, x, spec["repeats"])
        with torch.no_grad():
            exact_y = exact_layer(x)[0]
        with torch.no_grad():
            base = task.evaluate()
        rows.append({"seed": seed, "method": "exact", "label": "exact", "bins": 0,
                     "rank": x.shape[1], metric: base[metric], "layer_error": 0.0,
                     "layer_s": exact_s,
                     "speedup": 1.0, "tokens": x.shape[1]})
        for method in spec["methods"]:
            for rank in spec["ranks"]:
                def make(old, method=method, rank=rank):
                    return WildcatAttention(old.dim, old.heads, kv_heads=old.kv_heads,
                                            rank=rank, bins=method.get("bins", 1), seed=seed,
                                            method=method["method"], scale=old.scale,
                                            bias=old.w_q.bias is not None, threads=1)
                old = swap(task.model, make)
                first = next(m.attention for m in task.model.modules()
                             if isinstance(m, Block))
                layer_s = median_time(first, x, spec["repeats"])
                with torch.no_grad():
                    error = float((first(x)[0] - exact_y).norm() / exact_y.norm())
                with torch.no_grad():
                    value = task.evaluate()[metric]
                restore(task.model, old)
                rows.append({"seed": seed, "method": method["method"],
                             "label": method.get("label", method["method"]),
                             "bins": method.get("bins", 1), "rank": rank, metric: value,
                             "layer_error": error, "layer_s": layer_s,
                             "speedup": exact_s / layer_s,
                             "tokens": x.shape[1]})
                print(f"seed {seed} {rows[-1]['label']} r={rank}: {metric} {value:.4g}, "
                      f"{rows[-1]['speedup']:.2f}x", flush=True)
    return rows


def plot(spec: Dict, rows: List[Dict], path: str, scale: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = spec["metric"]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    exact = [r[metric] for r in rows if r["method"] == "exact"]
    for label in dict.fromkeys(r["label"] for r in rows if r["method"] != "exact"):
        mine = [r for r in rows if r["label"] == label]
        ranks = sorted({r["rank"] for r in mine})
        for axis, key in zip(axes, (metric, "speedup")):
            stats = [mean_std([r[key] for r in mine if r["rank"] == k]) for k in ranks]
            axis.errorbar(ranks, [m for m, _ in stats],
                          yerr=[0 if math.isnan(s) else s for _, s in stats],
                          marker="o", capsize=3, label=label)
    axes[0].axhline(mean_std(exact)[0], color="black", linestyle="--", label="exact")
    axes[1].axhline(1.0, color="black", linestyle="--")
    axes[0].set_yscale("log")
    axes[0].set_ylabel(f"validation {metric}")
    axes[1].set_ylabel("speed-up of the replaced layer vs exact")
    for axis in axes:
        axis.set_xscale("log", base=2)
        axis.set_xlabel("coreset rank r")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.suptitle(f"{spec['name']}: {scale}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def page(spec: Dict, rows: List[Dict], docs: str, wall_s: float) -> str:
    name, metric = spec["name"], spec["metric"]
    source = load_experiment(spec["source"])
    config = source.config(source.variant(spec["variant"]), source.seeds[0])
    seeds = sorted({r["seed"] for r in rows})
    scale = (f"models of {spec['source']} variant {spec['variant']} (dim "
             f"{config['model']['dim']}, {config['model']['layers']} layers, "
             f"{config['train']['steps']} steps), T = {rows[0]['tokens']}")
    os.makedirs(docs, exist_ok=True)
    write_csv(rows, os.path.join(docs, f"{name}.csv"))
    plot(spec, rows, os.path.join(docs, f"{name}.png"), scale)
    lines = [f"| method | r | val {metric} | first layer's relative error | "
             f"layer speed-up vs exact |", "|---|---|---|---|---|"]
    groups = dict.fromkeys((r["label"], r["rank"]) for r in rows)
    for label, rank in groups:
        mine = [r for r in rows if r["label"] == label and r["rank"] == rank]
        lines.append(f"| {label} | {rank if label != 'exact' else '(all keys)'} | "
                     f"{fmt(*mean_std([r[metric] for r in mine]))} | "
                     f"{fmt(*mean_std([r['layer_error'] for r in mine]), digits=2)} | "
                     f"{fmt(*mean_std([r['speedup'] for r in mine]), digits=3)} |")
    path = os.path.join(docs, f"{name}.md")
    body = f"""# {name}

Config: `{spec['path']}`. Rerun (after the source runs have finished):

```
python -m subquad.experiments.wildcat_swap {spec['path']}
```

Paper: {spec.get('paper', '')}.

Scale: {scale}; seeds {seeds} (one trained model each; WildCat's own seed = the model's).
Every exact attention layer is replaced, without retraining; the speed-up is the median
of {spec['repeats']} forward calls of the first replaced layer (input [B, T, dim] of one
validation batch, 1 thread) against the exact layer on the same input; the relative
error is ||y - y_exact|| / ||y_exact|| of that layer's output on that input. Commit
{git_commit()}; machine: {cpu_model()} (2 shared cores); wall time {wall_s / 60:.1f} min.
Mean ± sample std over seeds; rows in `{name}.csv`.

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
    args = parser.parse_args(argv)
    try:
        spec = load_swap(args.config)
        started = time.perf_counter()
        rows = run(spec, args.set, args.out_root)
        if not rows:
            raise ValueError(f"no finished runs of {spec['source']} variant {spec['variant']}")
        print(page(spec, rows, args.docs, time.perf_counter() - started))
    except (ConfigError, ValueError) as error:
        print(f"wildcat swap: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
