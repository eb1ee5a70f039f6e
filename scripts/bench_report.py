#!/usr/bin/env python3
"""The report of `subquad bench` from its CSV (the source of truth): one plot per method
family (median time against N, log-log, every method its own colour and marker, the FFT
lower bounds dashed), the approximations' error against time per N with their Pareto front,
and a short summary: per method, at the largest N it was measured, its time, its speed-up
over exact attention in the same run, its error and the share of its time its FFT bound takes.

    scripts/bench_report.py [bench-out/bench.csv] [--out-dir DIR]

Needs only matplotlib (not the subquad package), so it runs before anything is installed.
"""

import argparse
import csv
import math
import os
import sys
import textwrap
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

# family key -> (short name, title, methods, transform-only bounds, the bound the summary
# divides by). The packed bounds are the transforms the kernels themselves run
# (src/cat/README.md, src/circulant2d/README.md).
FAMILIES = OrderedDict([
    ("cat", ("CAT", "CAT", ["cat", "cat-avgkey", "cat-causal"],
             ["fft-lower-bound", "fft-lower-bound-packed"], "fft-lower-bound-packed")),
    ("circulant2d", ("Circulant", "Circulant Attention", ["circulant2d"],
                     ["circulant2d-fft-bound", "circulant2d-fft-bound-packed"],
                     "circulant2d-fft-bound-packed")),
    ("wildcat", ("WildCat", "WildCat and its baselines (approximations of exact attention)",
                 ["wildcat", "wildcat-1bin", "uniform-nystrom", "uniform-subsample"], [], None)),
    ("structured", ("MLR", "MLR and sliding-window attention (causal)",
                    ["mlr", "sliding-window"], [], None)),
])
# The bound of a method that runs other transforms than its bound (causal CAT: float64
# transforms of length 2N) is not its bound.
NO_BOUND = {"cat-causal"}
# Below this relative error an approximation kept every key (its rank covers N).
ROUNDING_ERROR = 1e-4

# Colour and marker per method: distinct within every figure, the same in all of them.
STYLES = {
    "exact": ("#000000", "o"), "exact-causal": ("#7f7f7f", "s"),
    "cat": ("#1f77b4", "o"), "cat-avgkey": ("#2ca02c", "D"), "cat-causal": ("#ff7f0e", "^"),
    "fft-lower-bound": ("#9467bd", "v"), "fft-lower-bound-packed": ("#8c564b", "x"),
    "circulant2d": ("#d62728", "o"),
    "circulant2d-fft-bound": ("#9467bd", "v"), "circulant2d-fft-bound-packed": ("#8c564b", "x"),
    "wildcat": ("#d62728", "o"), "wildcat-1bin": ("#e377c2", "P"),
    "uniform-nystrom": ("#17becf", "s"), "uniform-subsample": ("#bcbd22", "^"),
    "mlr": ("#1f77b4", "o"), "sliding-window": ("#ff7f0e", "s"),
}
SPARE_STYLES = [("#8c564b", "h"), ("#e377c2", "*"), ("#17becf", "p"), ("#bcbd22", "<"),
                ("#7f7f7f", ">"), ("#9467bd", "d")]


Row = Dict[str, object]
Block = Tuple[int, int, int, int, str]  # batch, heads, head_dim, value_dim, inputs


def read_rows(path: str) -> Tuple[str, List[Row]]:
    """(the '# commit ...' line, the rows with numbers parsed)."""
    with open(path, newline="") as handle:
        meta = handle.readline().lstrip("# ").strip()
        rows = []
        for raw in csv.DictReader(handle):
            row: Row = dict(raw)
            for key in ("batch", "tokens", "heads", "head_dim", "value_dim", "threads",
                        "extra_bytes"):
                row[key] = int(raw[key])
            for key in ("median_s", "min_s", "spread", "gflops", "speedup", "max_abs_error",
                        "relative_error"):
                row[key] = float(raw[key])
            rows.append(row)
    return meta, rows


def block_of(row: Row) -> Block:
    return (row["batch"], row["heads"], row["head_dim"], row["value_dim"], row["inputs"])


def block_text(block: Block) -> str:
    batch, heads, head_dim, value_dim, inputs = block
    return f"B={batch} H={heads} D={head_dim} Dv={value_dim}, {inputs} inputs"


def has_time(row: Row) -> bool:
    return not str(row["status"]).startswith("skipped") and row["median_s"] > 0


def is_measured(row: Row) -> bool:
    return row["status"] == "measured"


def is_bound(method: str) -> bool:
    return "bound" in method


def family_of(method: str) -> Optional[str]:
    for key, (_, _, methods, bounds, _) in FAMILIES.items():
        if method in methods or method in bounds:
            return key
    return None


def families_in(rows: List[Row]) -> "OrderedDict[str, Tuple[str, List[str], List[str]]]":
    """family key -> (title, its methods present, the baselines they are measured against),
    in FAMILIES order; methods of no known family each form their own."""
    found: "OrderedDict[str, Tuple[str, List[str], List[str]]]" = OrderedDict()
    present = list(OrderedDict.fromkeys(r["method"] for r in rows if has_time(r)))
    baselines = {r["baseline"] for r in rows}
    for key, (_, title, methods, bounds, _) in FAMILIES.items():
        members = [m for m in methods + bounds if m in present]
        if any(m in methods for m in members):
            found[key] = (title, members, [])
    for method in present:
        if family_of(method) is None and method not in baselines:
            found[method] = (method, [method], [])
    for key, (title, members, _) in found.items():
        needed = OrderedDict.fromkeys(r["baseline"] for r in rows
                                      if r["method"] in members and r["baseline"] in present)
        found[key] = (title, members, [b for b in needed if b not in members])
    return found


def style_of(method: str, spare: Dict[str, Tuple[str, str]]) -> Tuple[str, str]:
    if method in STYLES:
        return STYLES[method]
    if method not in spare:
        spare[method] = SPARE_STYLES[len(spare) % len(SPARE_STYLES)]
    return spare[method]


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def grid(plt, panels: int, width: float = 6.4, height: float = 4.6):
    columns = min(panels, 3)
    lines = math.ceil(panels / columns)
    figure, axes = plt.subplots(lines, columns, figsize=(max(width * columns, 7.5), height * lines),
                                squeeze=False)
    for ax in axes.flat[panels:]:
        ax.set_visible(False)
    return figure, list(axes.flat)


def log_axis(axis, text) -> None:
    """Labels at 1, 2 and 5 times the powers of ten, written by `text`; unlabelled minor
    ticks (a narrow log range otherwise prints overlapping labels)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: text(value)))
    axis.set_minor_formatter(NullFormatter())


def heading(title: str, meta: str, panels: int) -> str:
    """The title over the CSV's '# commit ...' line, wrapped to the figure's width."""
    width = 80 * min(panels, 3)
    return "\n".join(textwrap.wrap(title, width) + textwrap.wrap(meta, width))


def plot_family(rows: List[Row], title: str, members: List[str], baselines: List[str],
                meta: str, path: str) -> None:
    """Median time against N, one panel per shape and inputs: the family's methods and the
    baselines solid, the bounds dashed, extrapolated points hollow."""
    plt = pyplot()
    shown = baselines + members
    blocks = list(OrderedDict.fromkeys(block_of(r) for r in rows
                                       if r["method"] in members and has_time(r)))
    figure, axes = grid(plt, len(blocks))
    spare: Dict[str, Tuple[str, str]] = {}
    for ax, block in zip(axes, blocks):
        for method in shown:
            points = sorted((r["tokens"], r["median_s"], is_measured(r)) for r in rows
                            if r["method"] == method and block_of(r) == block and has_time(r))
            if not points:
                continue
            colour, marker = style_of(method, spare)
            bound = is_bound(method)
            label = f"{method} (FFT lower bound)" if bound else method
            ax.plot([p[0] for p in points], [p[1] for p in points], color=colour,
                    linestyle="--" if bound else "-", linewidth=1.2 if bound else 1.8,
                    marker=marker, markersize=5 if bound else 6, label=label)
            hollow = [p for p in points if not p[2]]
            if hollow:  # extrapolated by the flop model: drawn over in white
                ax.plot([p[0] for p in hollow], [p[1] for p in hollow], linestyle="none",
                        marker=marker, markersize=6, markerfacecolor="white", color=colour)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        lengths = sorted({r["tokens"] for r in rows if block_of(r) == block and has_time(r)})
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.minorticks_off()
        log_axis(ax.yaxis, tick_time)
        ax.set_xlabel("N (tokens)")
        ax.set_ylabel("median time")
        ax.set_title(block_text(block), fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(loc="best", fontsize=8, framealpha=0.9)
    figure.suptitle(heading(f"{title}: median time, one run; hollow points extrapolated", meta,
                            len(blocks)), fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def pareto_front(points: List[Tuple[float, float]]) -> List[Tuple[float, float]]:
    """The (time, error) points no other point beats in both, by increasing time."""
    front, best = [], math.inf
    for time_s, error in sorted(points):
        if error < best:
            front.append((time_s, error))
            best = error
    return front


def plot_pareto(rows: List[Row], meta: str, path: str) -> bool:
    """Relative error against median time, one panel per shape, inputs and N, with exact
    attention's time as a line (its error is 0); False when no row has an error."""
    approximations = [r for r in rows if r["relative_error"] >= 0 and is_measured(r)]
    if not approximations:
        return False
    plt = pyplot()
    panels = list(OrderedDict.fromkeys((block_of(r), r["tokens"]) for r in approximations))
    figure, axes = grid(plt, len(panels), width=5.2, height=4.2)
    spare: Dict[str, Tuple[str, str]] = {}
    for ax, (block, tokens) in zip(axes, panels):
        here = [r for r in approximations if block_of(r) == block and r["tokens"] == tokens]
        errors = [max(r["relative_error"], 1e-12) for r in here]
        for r, error in zip(here, errors):
            colour, marker = style_of(r["method"], spare)
            ax.plot(r["median_s"], error, linestyle="none", color=colour, marker=marker,
                    markersize=8, label=r["method"])
        front = pareto_front([(r["median_s"], e) for r, e in zip(here, errors)])
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="#bbbbbb",
                linewidth=1, zorder=0, label="Pareto front")
        baseline = [r for r in rows if block_of(r) == block and r["tokens"] == tokens
                    and r["method"] == here[0]["baseline"] and has_time(r)]
        if baseline:
            ax.axvline(baseline[0]["median_s"], color="#000000", linestyle=":", linewidth=1.2,
                       label=f"{baseline[0]['method']} (error 0)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        log_axis(ax.xaxis, tick_time)
        log_axis(ax.yaxis, lambda value: f"{value:.3g}")
        ax.set_xlabel("median time")
        ax.set_ylabel("relative error vs exact")
        inputs = block[4]
        note = "\nGaussian inputs: these errors do not rank the methods" \
            if inputs == "gaussian" else ""
        if max(errors) < ROUNDING_ERROR:
            note += "\nrounding-level errors: the coresets keep every key at this N"
        ax.set_title(f"N = {tokens}, {block_text(block)}{note}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="best", fontsize=8, framealpha=0.9)
    figure.suptitle(heading("Approximations: error against time (lower left is better)", meta,
                            len(panels)), fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def tick_time(seconds: float) -> str:
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:g} {unit}"
    return f"{seconds / 1e-9:g} ns"


def time_text(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} us"


def summary_rows(rows: List[Row]) -> List[Tuple[str, ...]]:
    """Per family and method: the row at the largest measured N (an approximation's on the
    captured workload when it ran there, else the first shape), with its bound's share."""
    lines = []
    for key, (title, members, _) in families_in(rows).items():
        name, bound_name = FAMILIES[key][0::4] if key in FAMILIES else (key, None)
        for method in members:
            if is_bound(method):
                continue
            measured = [r for r in rows if r["method"] == method and is_measured(r)]
            if not measured:
                continue
            if any(r["inputs"] != "gaussian" for r in measured) and any(
                    r["relative_error"] >= 0 for r in measured):
                measured = [r for r in measured if r["inputs"] != "gaussian"]
            largest = max(r["tokens"] for r in measured)
            row = next(r for r in measured if r["tokens"] == largest)
            baseline = [r for r in rows if r["method"] == row["baseline"]
                        and block_of(r) == block_of(row) and r["tokens"] == largest]
            speedup = "-"
            if row["speedup"] > 0:
                speedup = f"{row['speedup']:.1f}x {row['baseline']}"
                if baseline and not is_measured(baseline[0]):
                    speedup += " (extrap.)"
            error = f"{row['relative_error']:.3f}" if row["relative_error"] >= 0 else "-"
            if row["relative_error"] >= 0 and row["inputs"] == "gaussian":
                error += " (Gaussian)"
            share = "-"
            bound = [r for r in rows if r["method"] == bound_name and block_of(r) == block_of(row)
                     and r["tokens"] == largest and is_measured(r)]
            if bound and method not in NO_BOUND:
                share = f"{bound[0]['median_s'] / row['median_s']:.0%}"
            shape = f"H={row['heads']} D={row['head_dim']}, {row['inputs']}"
            lines.append((name, method, str(largest), shape,
                          time_text(row["median_s"]), speedup, error, share))
    return lines


def summary_text(rows: List[Row]) -> str:
    header = ("family", "method", "N", "shape, inputs", "time", "speed-up", "rel err",
              "bound/time")
    table = [header] + summary_rows(rows)
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    text = ["Summary: each method at the largest N it was measured at (one run, "
            f"{rows[0]['threads'] if rows else 1} thread(s))"]
    for line in table:
        text.append("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    text += textwrap.wrap(
        "'speed-up': the baseline's time over the method's, same shape, N and run ('extrap.': "
        "the baseline's time extrapolated by its flop model). 'rel err': relative error against "
        "exact attention on sampled rows. 'bound/time': the share of the method's time that its "
        "FFT lower bound takes (the packed transforms the kernel runs, alone: "
        "fft-lower-bound-packed, circulant2d-fft-bound-packed).", 100)
    return "\n".join(text) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="?", default="bench-out/bench.csv")
    parser.add_argument("--out-dir", default=None, help="default: the CSV's folder")
    args = parser.parse_args(argv)
    out_dir = args.out_dir or os.path.dirname(os.path.abspath(args.csv))
    meta, rows = read_rows(args.csv)
    if not rows:
        print(f"bench_report: {args.csv} holds no rows", file=sys.stderr)
        return 1
    os.makedirs(out_dir, exist_ok=True)
    summary = summary_text(rows)
    print("\n" + summary, end="")
    written = [os.path.join(out_dir, "summary.txt")]
    with open(written[0], "w") as handle:
        handle.write(meta + "\n" + summary)
    for key, (title, members, baselines) in families_in(rows).items():
        written.append(os.path.join(out_dir, f"bench_{key}.png"))
        plot_family(rows, title, members, baselines, meta, written[-1])
    pareto = os.path.join(out_dir, "bench_pareto.png")
    if plot_pareto(rows, meta, pareto):
        written.append(pareto)
    print("wrote " + ", ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
