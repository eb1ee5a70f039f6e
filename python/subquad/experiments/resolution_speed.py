"""Whole-model inference time of ViTs as the patch grid grows (Han et al.: CA-DeiT against
DeiT as the resolution rises): the same ViT (width, depth, patch) with attention blocks
and with CA-DeiT (circulant2d) blocks, grid by grid. At each grid every model is warmed
up once, then each repeat times one forward of every model in the config's order
(A B C A B C ...), so slow drifts of a shared machine reach all of them alike; the page
reports the median and min-max and the counted FLOPs (flops.vit_forward_flops). Methods
marked `baseline = true` (e.g. DeiT with torch's scaled_dot_product_attention and with
subquad's exact kernel) are all reported; at each grid the faster of them (by median)
is the baseline of the speed-up and of the FLOP ratio (without any mark, the first
method is). Measuring some grids (--grids) replaces their rows in the existing CSV and
keeps the others, if those were measured with the same settings (else it refuses before
measuring).

    python -m subquad.experiments.resolution_speed configs/experiments/ca_speed_deit.toml
        [--docs docs/results] [--grids 14 32] [--repeats 11]

[speed] keys: name, grids, dim, heads, layers, patch, batch, repeats, threads (one count
for torch and the C++ kernels), methods; optional paper, channels (1), classes (10).
methods: tables of attention ("torch", "exact", "circulant2d", ...) and label; optional
heads (the model's own head count: CA-DeiT's one channel per head is heads = dim), pool
("mean" or "cls"; "mean" by default, circulant2d needs it) and baseline.
"""

import os
import statistics
from typing import Dict, List, Sequence

import torch

from ..layers.registry import ATTENTIONS
from ..models import ViTClassifier
from ..models.blocks import TORCH_ATTENTION
from ..models.vit import CIRCULANT2D, POOLS
from ..train.config import ConfigError
from ..records import git_commit
from .flops import vit_forward_flops
from .report import NOTES, write_csv, write_page
from .timing import (interleaved_times, kept_csv_rows, load_table, measurement_record,
                     positive_int, span, study_main)

KEYS = {"name", "grids", "dim", "heads", "layers", "patch", "batch", "repeats", "threads",
        "methods"}
OPTIONAL = {"paper": "", "channels": 1, "classes": 10}
POSITIVE = ("dim", "heads", "layers", "patch", "batch", "repeats", "threads", "channels",
            "classes")
METHOD_KEYS = {"attention", "label", "heads", "pool", "baseline"}
SETTINGS = ("dim", "layers", "patch", "batch", "threads", "channels", "classes")
NUMBERS = {"tokens": int, "heads": int, "median_s": float, "min_s": float, "max_s": float,
           "repeats": int, "params": int, "flops": int}  # the CSV's numeric columns


def check_methods(spec: Dict) -> None:
    """Fills each method's heads, pool and baseline; ConfigError naming
    speed.methods[i].<key> when one is wrong."""
    methods = spec["methods"]
    if not isinstance(methods, list) or len(methods) < 2 or not all(
            isinstance(m, dict) for m in methods):
        raise ConfigError(f"speed.methods: expected a list of at least two tables, got "
                          f"{methods!r}")
    for i, method in enumerate(methods):
        where = f"speed.methods[{i}]"
        unknown = sorted(set(method) - METHOD_KEYS)
        missing = sorted({"attention", "label"} - set(method))
        if unknown or missing:
            raise ConfigError(f"{where}: unknown key(s) {unknown}, missing key(s) {missing}; "
                              f"accepted: {sorted(METHOD_KEYS)}")
        if method["attention"] != TORCH_ATTENTION and method["attention"] not in ATTENTIONS:
            raise ConfigError(f"{where}.attention: expected {TORCH_ATTENTION!r} or a registered "
                              f"entry ({', '.join(ATTENTIONS)}), got {method['attention']!r}")
        method.setdefault("heads", spec["heads"])
        method.setdefault("pool", "mean")
        method.setdefault("baseline", False)
        if not positive_int(method["heads"]) or spec["dim"] % method["heads"]:
            raise ConfigError(f"{where}.heads: expected a divisor of dim = {spec['dim']}, got "
                              f"{method['heads']!r}")
        if method["pool"] not in POOLS:
            raise ConfigError(f"{where}.pool: expected one of {POOLS}, got {method['pool']!r}")
        if method["attention"] == CIRCULANT2D and method["pool"] != "mean":
            raise ConfigError(f"{where}.pool: circulant2d attends over the patch grid, which "
                              f"has no place for a class token; use 'mean'")
        if not isinstance(method["baseline"], bool):
            raise ConfigError(f"{where}.baseline: expected true or false, got "
                              f"{method['baseline']!r}")
    labels = [m["label"] for m in methods]
    if len(set(labels)) < len(labels):
        raise ConfigError(f"speed.methods: labels must differ, got {labels}")
    if not any(m["baseline"] for m in methods):
        methods[0]["baseline"] = True  # the older pages' form: the first is the baseline
    if all(m["baseline"] for m in methods):
        raise ConfigError("speed.methods: every method is marked baseline; leave at least "
                          "one to compare with them")


def load_speed(path: str) -> Dict:
    spec = load_table(path, "speed", KEYS, OPTIONAL, POSITIVE)
    grids = spec["grids"]
    if not isinstance(grids, list) or not grids or not all(positive_int(g) for g in grids) \
            or len(set(grids)) < len(grids):
        raise ConfigError(f"speed.grids: expected a list of distinct grid sides >= 1, got "
                          f"{grids!r}")
    if spec["dim"] % spec["heads"]:
        raise ConfigError(f"speed.heads: expected a divisor of dim = {spec['dim']}, got "
                          f"{spec['heads']}")
    check_methods(spec)
    return spec


def model_for(spec: Dict, method: Dict, grid: int) -> ViTClassifier:
    attention = method["attention"]
    # torch's attention follows torch.set_num_threads; the C++ kernels take their own count
    options = None if attention == TORCH_ATTENTION else {attention: {"threads": spec["threads"]}}
    return ViTClassifier(grid * spec["patch"], spec["patch"], spec["channels"], spec["classes"],
                         dim=spec["dim"], heads=method["heads"], layers=spec["layers"],
                         attention=attention, pool=method["pool"],
                         attention_options=options).eval()


def settings(spec: Dict) -> str:
    """Everything a row's time depends on but its grid: a CSV keeps rows of one such."""
    models = "; ".join(f"{m['label']}: {m['attention']}, {m['heads']} heads, {m['pool']} pool"
                       for m in spec["methods"])
    return ", ".join(f"{key} {spec[key]}" for key in SETTINGS) + f"; {models}"


def kept_rows(spec: Dict, grids: Sequence[int], docs: str) -> List[Dict]:
    """The rows of docs/<name>.csv that a measurement of `grids` keeps (the other grids);
    ConfigError when those were measured with other settings than spec's (or before the
    CSV recorded them): a page mixing them would compare unlike times."""
    path = os.path.join(docs, f"{spec['name']}.csv")
    if set(spec["grids"]) <= set(grids):
        return []
    rows = kept_csv_rows(path, lambda row: int(row["grid"].split("x")[0]) not in grids,
                         settings(spec), spec["path"], NUMBERS, lambda row: row["grid"],
                         "grids")
    for row in rows:
        row["baseline"] = row["baseline"] == "True"
    return rows


def measure(spec: Dict, grids: List[int]) -> List[Dict]:
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    commit = git_commit()
    rows = []
    for grid in grids:
        side = grid * spec["patch"]
        images = torch.randn(spec["batch"], spec["channels"], side, side)
        models = [model_for(spec, method, grid) for method in spec["methods"]]
        calls = [lambda model=model: model(images) for model in models]
        with torch.no_grad():
            for call in calls:
                call()  # warm-up (FFT plans, allocations)
            times = interleaved_times(calls, spec["repeats"])
        for method, model, mine in zip(spec["methods"], models, times):
            rows.append({"grid": f"{grid}x{grid}", "tokens": grid * grid,
                         "method": method["attention"], "label": method["label"],
                         "heads": method["heads"], "baseline": method["baseline"],
                         "median_s": statistics.median(mine), "min_s": min(mine),
                         "max_s": max(mine), "repeats": spec["repeats"],
                         "params": sum(p.numel() for p in model.parameters()),
                         "flops": spec["batch"] * vit_forward_flops(model),
                         "settings": settings(spec), "commit": commit})
            print(f"{grid}x{grid} {method['label']}: {rows[-1]['median_s'] * 1e3:.1f} ms",
                  flush=True)
    return rows


def faster_baseline(rows: Sequence[Dict]) -> Dict:
    """The baseline row of one grid with the smallest median time (the first on a tie)."""
    return min((r for r in rows if r["baseline"]), key=lambda r: r["median_s"])


def ratios(rows: Sequence[Dict], labels: Sequence[str]) -> List[Dict]:
    """Per grid measured by every method: its faster baseline and, for each other method,
    the baseline's median time and FLOPs over the method's ({"grid", "tokens", "baseline",
    "rows": {label: row}, "speedup": {label: x}, "flop_ratio": {label: x}})."""
    by_grid: Dict[str, Dict[str, Dict]] = {}
    for row in rows:
        by_grid.setdefault(row["grid"], {})[row["label"]] = row
    out = []
    for grid, mine in by_grid.items():
        if set(labels) - set(mine):
            continue
        base = faster_baseline(list(mine.values()))
        others = [label for label in labels if not mine[label]["baseline"]]
        out.append({"grid": grid, "tokens": base["tokens"], "baseline": base, "rows": mine,
                    "speedup": {o: base["median_s"] / mine[o]["median_s"] for o in others},
                    "flop_ratio": {o: base["flops"] / mine[o]["flops"] for o in others}})
    return sorted(out, key=lambda r: r["tokens"])


def plot(spec: Dict, rows: Sequence[Dict], table: Sequence[Dict], path: str, scale: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for method in spec["methods"]:
        mine = sorted((r for r in rows if r["label"] == method["label"]),
                      key=lambda r: r["tokens"])
        axes[0].errorbar([r["tokens"] for r in mine], [r["median_s"] for r in mine],
                         yerr=[[r["median_s"] - r["min_s"] for r in mine],
                               [r["max_s"] - r["median_s"] for r in mine]],
                         marker="o", capsize=3, label=method["label"])
    tokens = [r["tokens"] for r in table]
    for label in (table[0]["speedup"] if table else []):
        line, = axes[1].plot(tokens, [r["speedup"][label] for r in table], marker="o",
                             label=f"{label}: time")
        axes[1].plot(tokens, [r["flop_ratio"][label] for r in table], marker="s",
                     linestyle=":", color=line.get_color(), label=f"{label}: FLOPs")
    axes[1].axhline(1.0, color="black", linestyle="--")
    axes[0].set_ylabel("whole-model forward time (s)")
    axes[1].set_ylabel("faster baseline / method (time, FLOPs)")
    for axis in axes:
        axis.set_xscale("log")
        axis.set_xlabel("tokens (patch grid)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    axes[0].set_yscale("log")
    figure.suptitle(f"{spec['name']}: {scale}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def page(spec: Dict, rows: List[Dict], docs: str, wall_s: float, cpu_s: float = float("nan"),
         loads: Sequence[float] = ()) -> str:
    name, methods = spec["name"], spec["methods"]
    labels = [m["label"] for m in methods]
    rows = sorted(rows, key=lambda r: (r["tokens"], labels.index(r["label"])))
    os.makedirs(docs, exist_ok=True)
    write_csv(rows, os.path.join(docs, f"{name}.csv"))
    table = ratios(rows, labels)
    models = "; ".join(f"{m['label']}: {m['attention']}, {m['heads']} heads, {m['pool']} "
                       f"pooling{' (baseline)' if m['baseline'] else ''}" for m in methods)
    scale = (f"dim {spec['dim']}, {spec['layers']} layers, patch {spec['patch']}, "
             f"{spec['channels']} channels, batch {spec['batch']}, {spec['threads']} thread(s)")
    plot(spec, rows, table, os.path.join(docs, f"{name}.png"), scale)
    others = [m["label"] for m in methods if not m["baseline"]]
    times = [f"| grid | tokens | {' | '.join(f'{label} median s (min-max)' for label in labels)} "
             f"| faster baseline |", "|---" * (len(labels) + 3) + "|"]
    speed = [f"| grid | tokens | baseline GFLOPs | "
             f"{' | '.join(f'{o} GFLOPs | {o} speed-up (time) | FLOP ratio' for o in others)} |",
             "|---" * (3 + 3 * len(others)) + "|"]
    for r in table:
        mine = r["rows"]
        times.append(f"| {r['grid']} | {r['tokens']} | "
                     f"{' | '.join(span(mine[label]) for label in labels)} | "
                     f"{r['baseline']['label']} |")
        speed.append(f"| {r['grid']} | {r['tokens']} | {r['baseline']['flops'] / 1e9:.3g} | "
                     + " | ".join(f"{mine[o]['flops'] / 1e9:.3g} | {r['speedup'][o]:.2f}x | "
                                  f"{r['flop_ratio'][o]:.2f}x" for o in others) + " |")
    params = {r["label"]: r["params"] for r in rows}
    body = f"""# {name}

Config: `{spec['path']}`. Rerun:

```
python -m subquad.experiments.resolution_speed {spec['path']}
```

Paper: {spec['paper']}.

Scale: {scale}. Models: {models}. Inference (no gradients), one warm-up forward of every
model, then {spec['repeats']} repeats at each grid, every model timed once per repeat in
turn (interleaved); median and min-max. The speed-up and the FLOP ratio are the faster
baseline's (by median, at that grid) over the method's; FLOPs are counted
(`flops.vit_forward_flops`). Parameters (largest grid) {params}.
{measurement_record(rows, wall_s, cpu_s, loads)}.

{chr(10).join(times)}

{chr(10).join(speed)}

![{name}]({name}.png)

{NOTES}"""
    return write_page(os.path.join(docs, f"{name}.md"), body)


def main(argv=None) -> int:
    return study_main(argv, "python -m subquad.experiments.resolution_speed", __doc__, "grids",
                      load_speed, kept_rows, measure, page, "resolution speed")


if __name__ == "__main__":
    sys.exit(main())
