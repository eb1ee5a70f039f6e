"""Causal CAT against non-causal CAT, subquad alone, in both layouts: the ratios of the targets
"causal forward at most 2.5x the non-causal forward at N >= 4096" and "each backward at most
2x its forward". Per N, eight calls (forward and backward, causal and not, [B, N, H, Dv] and
sequence-last memory) timed interleaved in one process, one thread (harness.py's method, CPU
times); ratios from the minima and from the medians. Needs NumPy only (no torch).
Writes docs/results/peers/cat_causal_ratios.csv and prints a table (no README section).
"""

import argparse
import gc
import statistics
import sys
import time
from typing import Callable, Dict, List

import numpy as np

import harness
import subquad

NAME = "cat_causal_ratios"
LENGTHS = [4096, 16384, 65536]
CAUSAL_TARGET = 2.5    # causal forward / non-causal forward, at most
BACKWARD_TARGET = 2.0  # backward / its forward, at most


def calls(N: int, H: int, D: int) -> Dict[str, Callable[[], object]]:
    rng = np.random.default_rng(N + D)
    z = rng.standard_normal((1, N, H), dtype=np.float32)
    v = rng.standard_normal((1, N, H, D), dtype=np.float32)
    g = rng.standard_normal((1, N, H, D), dtype=np.float32)
    layouts = {
        "standard": (z, v, g),
        # [B, N, H(, Dv)] views of [B, H(, Dv), N] memory, read in place.
        "sequence-last": (np.ascontiguousarray(z.transpose(0, 2, 1)).transpose(0, 2, 1),
                          np.ascontiguousarray(v.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2),
                          np.ascontiguousarray(g.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)),
    }
    result = {}
    for layout, (zl, vl, gl) in layouts.items():
        out = subquad.cat_causal_forward(zl, vl, threads=1)
        result[f"{layout} fwd"] = lambda zl=zl, vl=vl: subquad.cat_forward(zl, vl, threads=1)
        result[f"{layout} bwd"] = lambda zl=zl, vl=vl, gl=gl: subquad.cat_backward(
            zl, vl, gl, threads=1)
        result[f"{layout} causal fwd"] = lambda zl=zl, vl=vl: subquad.cat_causal_forward(
            zl, vl, threads=1)
        result[f"{layout} causal bwd"] = (
            lambda zl=zl, vl=vl, gl=gl, out=out: subquad.cat_causal_backward(
                zl, vl, out, gl, threads=1))
    return result


def time_interleaved(runs: Dict[str, Callable[[], object]], reps: int) -> Dict[str, List[float]]:
    """CPU seconds per call, `reps` rounds, the order rotated every round (after one warm-up
    call each, which also makes the FFT plans)."""
    for run in runs.values():
        run()
    names = list(runs)
    times: Dict[str, List[float]] = {name: [] for name in names}
    gc.disable()
    try:
        for round_index in range(reps):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.process_time()
                runs[name]()
                times[name].append(time.process_time() - start)
    finally:
        gc.enable()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=LENGTHS)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--csv", action="store_true", help="write the CSV")
    args = parser.parse_args()
    subquad.set_fft_effort("measure")
    environment = harness.Environment(versions={
        "numpy": np.__version__, "python": sys.version.split()[0]})
    rows = []
    for N in args.lengths:
        times = time_interleaved(calls(N, args.heads, args.head_dim), args.reps)
        for layout in ("standard", "sequence-last"):
            t = {kind: times[f"{layout} {kind}"] for kind in
                 ("fwd", "bwd", "causal fwd", "causal bwd")}
            row = dict(N=N, H=args.heads, D=args.head_dim, layout=layout, reps=args.reps)
            for kind, values in t.items():
                row[f"{kind.replace(' ', '_')}_min_s"] = min(values)
                row[f"{kind.replace(' ', '_')}_median_s"] = statistics.median(values)
            for stat in ("min", "median"):
                row[f"causal_over_fwd_{stat}"] = (row[f"causal_fwd_{stat}_s"] /
                                                  row[f"fwd_{stat}_s"])
                row[f"bwd_over_fwd_{stat}"] = row[f"bwd_{stat}_s"] / row[f"fwd_{stat}_s"]
                row[f"causal_bwd_over_causal_fwd_{stat}"] = (row[f"causal_bwd_{stat}_s"] /
                                                             row[f"causal_fwd_{stat}_s"])
            rows.append(row)
            print(f"N={N} {layout}: fwd {harness.ms(row['fwd_min_s'])}, causal fwd "
                  f"{harness.ms(row['causal_fwd_min_s'])}, bwd {harness.ms(row['bwd_min_s'])}, "
                  f"causal bwd {harness.ms(row['causal_bwd_min_s'])}; causal/fwd "
                  f"{row['causal_over_fwd_min']:.2f} / {row['causal_over_fwd_median']:.2f}, "
                  f"bwd/fwd {row['bwd_over_fwd_min']:.2f} / {row['bwd_over_fwd_median']:.2f}, "
                  f"causal bwd/fwd {row['causal_bwd_over_causal_fwd_min']:.2f} / "
                  f"{row['causal_bwd_over_causal_fwd_median']:.2f} (min / median)", flush=True)
    environment.finish()
    if args.csv:
        harness.write_csv(NAME, environment, rows)
    print(harness.environment_paragraph(environment))


if __name__ == "__main__":
    main()
