"""Whole-model inference time of ViTs as the patch grid grows (Han et al.: CA-DeiT against
DeiT as the resolution rises): the same ViT (width, depth, patch) with attention blocks
and with CA-DeiT (circulant2d) blocks, one forward of a batch per repeat, median and
spread, both measured in the same run, grid by grid. Measuring some grids (--grids)
replaces their rows in the existing CSV and keeps the others, if those were measured
with the same settings (else it refuses before measuring).

    python -m subquad.experiments.resolution_speed configs/experiments/ca_speed.toml
        [--docs docs/results] [--grids 14 32]
"""

import argparse
import csv
import os
import statistics
import sys
import time
from typing import Dict, List, Sequence

import torch

from ..models import ViTClassifier
from ..train.config import ConfigError, tomllib
from ..records import cpu_model, git_commit
from .report import NOTES, write_csv, write_page

KEYS = {"name", "grids", "dim", "heads", "layers", "patch", "batch", "repeats", "threads",
        "methods", "paper"}
SETTINGS = ("dim", "heads", "layers", "patch", "batch", "threads")  # what a time depends on
NUMBERS = {"tokens": int, "median_s": float, "min_s": float, "max_s": float, "repeats": int,
           "params": int}  # the CSV's numeric columns


def load_speed(path: str) -> Dict:
    try:
        with open(path, "rb") as file:
            raw = tomllib.load(file)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read it ({error.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: not valid TOML ({error})") from None
    spec = raw.get("speed")
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: expected a [speed] table")
    unknown = sorted(set(spec) - KEYS)
    missing = sorted(KEYS - {"paper"} - set(spec))
    if unknown or missing:
        raise ConfigError(f"speed: unknown key(s) {unknown}, missing key(s) {missing}")
    spec["path"] = path
    return spec


def model_for(spec: Dict, method: Dict, grid: int) -> ViTClassifier:
    return ViTClassifier(grid * spec["patch"], spec["patch"], 1, 10, dim=spec["dim"],
                         heads=spec["heads"], layers=spec["layers"],
                         attention=method["attention"], pool="mean",
                         attention_options={method["attention"]: {"threads": spec["threads"]}}
                         if method["attention"] != "circulant2d" else None).eval()


def settings(spec: Dict) -> str:
    return ", ".join(f"{key} {spec[key]}" for key in SETTINGS)


def kept_rows(spec: Dict, grids: Sequence[int], docs: str) -> List[Dict]:
    """The rows of docs/<name>.csv that a measurement of `grids` keeps (the other grids);
    ConfigError when those were measured with other settings than spec's (or before the
    CSV recorded them): a page mixing them would compare unlike times."""
    path = os.path.join(docs, f"{spec['name']}.csv")
    if set(spec["grids"]) <= set(grids) or not os.path.exists(path):
        return []
    with open(path, newline="") as file:
        rows = [row for row in csv.DictReader(file)
                if int(row["grid"].split("x")[0]) not in grids]
    other = sorted({row["grid"] for row in rows if row.get("settings") != settings(spec)})
    if other:
        raise ConfigError(f"{path}: its rows of {', '.join(other)} were measured with other "
                          f"settings than {spec['path']} ({settings(spec)}), or before the "
                          f"CSV recorded them; measure every grid (without --grids), or "
                          f"write the subset elsewhere with --docs")
    for row in rows:
        row.update({key: cast(row[key]) for key, cast in NUMBERS.items()})
    return rows


def measure(spec: Dict, grids: List[int]) -> List[Dict]:
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    commit = git_commit()
    rows = []
    for grid in grids:
        images = torch.randn(spec["batch"], 1, grid * spec["patch"], grid * spec["patch"])
        for method in spec["methods"]:
            model = model_for(spec, method, grid)
            with torch.no_grad():
                model(images)  # warm-up (FFT plans, allocations)
                times = []
                for _ in range(spec["repeats"]):
                    started = time.perf_counter()
                    model(images)
                    times.append(time.perf_counter() - started)
            rows.append({"grid": f"{grid}x{grid}", "tokens": grid * grid,
                         "method": method["attention"], "label": method["label"],
                         "median_s": statistics.median(times), "min_s": min(times),
                         "max_s": max(times), "repeats": spec["repeats"],
                         "params": sum(p.numel() for p in model.parameters()),
                         "settings": settings(spec), "commit": commit})
            print(f"{grid}x{grid} {method['label']}: {rows[-1]['median_s'] * 1e3:.1f} ms",
                  flush=True)
    return rows


def page(spec: Dict, rows: List[Dict], docs: str, wall_s: float) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name = spec["name"]
    order = [m["attention"] for m in spec["methods"]]
    rows = sorted(rows, key=lambda r: (r["tokens"], order.index(r["method"])))
    os.makedirs(docs, exist_ok=True)
    write_csv(rows, os.path.join(docs, f"{name}.csv"))
    labels = [m["label"] for m in spec["methods"]]
    base, other = labels[0], labels[1]
    grids = list(dict.fromkeys(r["grid"] for r in rows))
    by = {(r["grid"], r["label"]): r for r in rows}
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for label in labels:
        mine = [by[(g, label)] for g in grids if (g, label) in by]
        axes[0].errorbar([r["tokens"] for r in mine], [r["median_s"] for r in mine],
                         yerr=[[r["median_s"] - r["min_s"] for r in mine],
                               [r["max_s"] - r["median_s"] for r in mine]],
                         marker="o", capsize=3, label=label)
    pairs = [g for g in grids if (g, base) in by and (g, other) in by]
    axes[1].plot([by[(g, base)]["tokens"] for g in pairs],
                 [by[(g, base)]["median_s"] / by[(g, other)]["median_s"] for g in pairs],
                 marker="o")
    axes[1].axhline(1.0, color="black", linestyle="--")
    axes[0].set_ylabel("whole-model forward time (s)")
    axes[1].set_ylabel(f"speed-up of {other} over {base}")
    for axis in axes:
        axis.set_xscale("log")
        axis.set_xlabel("tokens (patch grid)")
        axis.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=8)
    scale = (f"dim {spec['dim']}, {spec['layers']} layers, {spec['heads']} heads, batch "
             f"{spec['batch']}, {spec['threads']} thread")
    figure.suptitle(f"{name}: {scale}", fontsize=9)
    figure.tight_layout()
    figure.savefig(os.path.join(docs, f"{name}.png"), dpi=110)
    plt.close(figure)
    lines = [f"| grid | tokens | {base} median s (min-max) | {other} median s (min-max) | "
             f"speed-up |", "|---|---|---|---|---|"]
    for g in pairs:
        a, b = by[(g, base)], by[(g, other)]
        lines.append(f"| {g} | {a['tokens']} | {a['median_s']:.4g} ({a['min_s']:.3g}-"
                     f"{a['max_s']:.3g}) | {b['median_s']:.4g} ({b['min_s']:.3g}-"
                     f"{b['max_s']:.3g}) | {a['median_s'] / b['median_s']:.2f}x |")
    path = os.path.join(docs, f"{name}.md")
    params = {r["label"]: r["params"] for r in rows}
    body = f"""# {name}

Config: `{spec['path']}`. Rerun:

```
python -m subquad.experiments.resolution_speed {spec['path']}
```

Paper: {spec.get('paper', '')}.

Scale: {scale}; inference (no gradients), {spec['repeats']} repeats per point after a
warm-up, median and min-max; parameters {params}. Commit(s)
{', '.join(sorted({r.get('commit', 'unknown') for r in rows}))}; machine:
{cpu_model()} (2 cores shared with other jobs: absolute times are noisy, the two models
are measured back to back at each grid); wall time of the last measurement
{wall_s / 60:.1f} min.

{chr(10).join(lines)}

![{name}]({name}.png)

{NOTES}"""
    return write_page(path, body)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m subquad.experiments.resolution_speed",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--docs", default="docs/results")
    parser.add_argument("--grids", nargs="*", type=int, help="only these grid sides")
    parser.add_argument("--repeats", type=int, help="override speed.repeats")
    args = parser.parse_args(argv)
    try:
        spec = load_speed(args.config)
        if args.repeats:
            spec["repeats"] = args.repeats
        grids = args.grids or spec["grids"]
        kept = kept_rows(spec, grids, args.docs)  # refuses before any measurement
        started = time.perf_counter()
        rows = measure(spec, grids)
        print(page(spec, kept + rows, args.docs, time.perf_counter() - started))
    except (ConfigError, ValueError, OSError) as error:
        print(f"resolution speed: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
