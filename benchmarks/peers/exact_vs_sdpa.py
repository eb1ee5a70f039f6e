"""Exact attention: subquad against torch.nn.functional.scaled_dot_product_attention.

One thread, same process, interleaved (benchmarks/peers/harness.py). subquad runs on
[B, N, H, D] arrays, SDPA on [B, H, N, D] tensors (its own fastest layout); outputs and
gradients are checked equal first. Flop model per (batch, head): forward 4 N M D (causal
half), backward 2.5x the forward (five tile products against two). The bfloat16 rows run
both in bfloat16: subquad on torch.bfloat16 tensors through DLPack (float32 accumulation,
float32 lse), SDPA on bfloat16 tensors.
Writes docs/results/peers/exact.csv and the peer-benchmark section of docs/perf/exact.md.
"""

import argparse
import sys
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils.dlpack

import harness
import subquad

LENGTHS = [64, 128, 256, 512, 1024, 4096, 16384]
HEAD_DIMS = [64, 128]
# (B, H, Hkv, largest N): B x H = 1 x 8 and 32 x 8, and GQA 4:1 (the training shapes); the
# largest N keeps the whole run within about a quarter of an hour of one core.
SHAPES = [(1, 8, 8, 16384), (32, 8, 8, 1024), (1, 8, 2, 1024), (32, 8, 2, 512)]
BF16_LENGTHS = [256, 1024, 4096]
# Rates used only to predict a point's run time before running it (to drop points that
# would blow the time budget); measured GFLOP/s are reported from the runs.
PREDICTION_GFLOPS = {"float32": 45.0, "bfloat16": 15.0}
FORWARD_TARGET, BACKWARD_TARGET, BF16_TARGET, BF16_GFLOPS_TARGET = 1.15, 1.3, 1.2, 600.0


@dataclass
class Point:
    B: int
    H: int
    Hkv: int
    N: int
    D: int
    causal: bool
    backward: bool
    dtype: str  # both contenders' dtype

    def flops(self) -> float:
        forward = 4.0 * self.N * self.N * self.D * self.B * self.H * (0.5 if self.causal else 1)
        return forward * (2.5 if self.backward else 1.0)

    def label(self) -> str:
        kind = ("causal " if self.causal else "") + ("backward" if self.backward else "forward")
        return (f"B={self.B} H={self.H} Hkv={self.Hkv} N={self.N} D={self.D} {kind} "
                f"{self.dtype}")


def points(quick: bool) -> List[Point]:
    lengths = [64, 256] if quick else LENGTHS
    result = []
    for B, H, Hkv, largest in SHAPES:
        for D in HEAD_DIMS:
            for N in (n for n in lengths if n <= largest):
                for backward in (False, True):
                    for causal in (False, True):
                        result.append(Point(B, H, Hkv, N, D, causal, backward, "float32"))
    for D in HEAD_DIMS:
        for N in ([256] if quick else BF16_LENGTHS):
            for backward in (False, True):
                for causal in (False, True):
                    result.append(Point(1, 8, 8, N, D, causal, backward, "bfloat16"))
    return result


def is_float32_backward(point: Point) -> bool:
    return point.backward and point.dtype == "float32"


def matches(row: dict, point: Point) -> bool:
    return (row["B"], row["H"], row["Hkv"], row["N"], row["D"], bool(row["causal"]),
            row["pass"] == "backward", row["sdpa_dtype"]) == (
        point.B, point.H, point.Hkv, point.N, point.D, point.causal, point.backward,
        point.dtype)


def predicted_seconds(point: Point, budget: harness.Budget) -> float:
    """Two contenders, one check call plus the timed rounds each."""
    call = point.flops() / (PREDICTION_GFLOPS[point.dtype] * 1e9)
    return 2 * (1 + budget_for(point, budget).min_reps) * call


def budget_for(point: Point, budget: harness.Budget) -> harness.Budget:
    """Two timed rounds for calls predicted to take over a second, else `budget`."""
    if point.flops() / (PREDICTION_GFLOPS[point.dtype] * 1e9) > 1.0:
        return harness.Budget(budget.target_s, 2, budget.max_reps, budget.warmup_s)
    return budget


def contenders(point: Point) -> List[harness.Contender]:
    generator = torch.Generator().manual_seed(point.N * 131 + point.D)
    # [B, H, N, D]: SDPA's layout; subquad gets the same values as [B, N, H, D].
    q = torch.randn(point.B, point.H, point.N, point.D, generator=generator)
    k = torch.randn(point.B, point.Hkv, point.N, point.D, generator=generator)
    v = torch.randn(point.B, point.Hkv, point.N, point.D, generator=generator)
    dout = torch.randn(point.B, point.H, point.N, point.D, generator=generator)
    causal, gqa = point.causal, point.Hkv != point.H
    sdpa_dtype = getattr(torch, point.dtype)
    if point.dtype == "bfloat16":  # torch tensors through DLPack; outputs come back as DLPack
        qs, ks, vs, douts = (x.to(sdpa_dtype).transpose(1, 2).contiguous()
                             for x in (q, k, v, dout))
    else:
        qs, ks, vs, douts = (x.transpose(1, 2).contiguous().numpy() for x in (q, k, v, dout))

    def to_bnhd(tensors):
        return [t.detach().float().transpose(1, 2) for t in tensors]

    def subquad_outputs(arrays):
        return [a if isinstance(a, np.ndarray) else torch.utils.dlpack.from_dlpack(a).float()
                for a in arrays]

    qt, kt, vt = (x.to(sdpa_dtype).requires_grad_(point.backward) for x in (q, k, v))

    def sdpa_forward():
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=gqa)

    if not point.backward:
        return [
            harness.Contender("subquad", lambda: subquad.exact_attention_forward(
                qs, ks, vs, causal=causal, threads=1)[:1], subquad_outputs),
            harness.Contender("sdpa", lambda: (sdpa_forward(),), to_bnhd),
        ]
    out, lse = subquad.exact_attention_forward(qs, ks, vs, causal=causal, threads=1)
    if point.dtype == "bfloat16":
        out = torch.utils.dlpack.from_dlpack(out)
    sdpa_out = sdpa_forward()
    return [
        harness.Contender("subquad", lambda: subquad.exact_attention_backward(
            qs, ks, vs, out, lse, douts, causal=causal, threads=1), subquad_outputs),
        harness.Contender("sdpa", lambda: torch.autograd.grad(
            sdpa_out, (qt, kt, vt), dout, retain_graph=True), to_bnhd),
    ]


def run(args) -> None:
    torch.set_num_threads(1)
    budget = harness.Budget(target_s=args.target_seconds)
    environment = harness.Environment(versions={
        "torch": torch.__version__, "numpy": np.__version__, "python": sys.version.split()[0],
        "torch BLAS": "MKL" if torch.backends.mkl.is_available() else "no MKL",
        "torch CPU capability": torch.backends.cpu.get_cpu_capability()})
    rows, skipped = [], []
    for point in points(args.quick):
        if args.float32_backward_only and not is_float32_backward(point):
            continue
        if args.lengths and point.N not in args.lengths:
            continue
        predicted = predicted_seconds(point, budget)
        if predicted > args.point_limit:
            skipped.append((point, predicted))
            print(f"skip {point.label()}: predicted {predicted:.0f} s", flush=True)
            continue
        tolerance = 3e-2 if point.dtype == "bfloat16" else (2e-4 if not point.backward else 1e-3)
        timings = harness.time_point(contenders(point), tolerance=tolerance,
                                     budget=budget_for(point, budget))
        subquad_t, sdpa_t = timings
        row = dict(B=point.B, H=point.H, Hkv=point.Hkv, N=point.N, D=point.D,
                   causal=int(point.causal), pass_="backward" if point.backward else "forward",
                   sdpa_dtype=point.dtype, reps=subquad_t.reps,
                   subquad_min_s=subquad_t.min_s, subquad_median_s=subquad_t.median_s,
                   sdpa_min_s=sdpa_t.min_s, sdpa_median_s=sdpa_t.median_s,
                   speedup_min=sdpa_t.min_s / subquad_t.min_s,
                   speedup_median=sdpa_t.median_s / subquad_t.median_s,
                   subquad_gflops=point.flops() / subquad_t.min_s / 1e9,
                   sdpa_gflops=point.flops() / sdpa_t.min_s / 1e9,
                   max_rel_error=sdpa_t.max_rel_error,
                   subquad_wall_min_s=subquad_t.wall_min_s, sdpa_wall_min_s=sdpa_t.wall_min_s,
                   speedup_wall_min=sdpa_t.wall_min_s / subquad_t.wall_min_s)
        rows.append(row)
        print(f"{point.label()}: subquad {harness.ms(subquad_t.min_s)}, sdpa "
              f"{harness.ms(sdpa_t.min_s)}, speed-up {row['speedup_min']:.2f} "
              f"(err {sdpa_t.max_rel_error:.1e})", flush=True)
    environment.finish()
    for row in rows:
        row["pass"] = row.pop("pass_")
    if args.float32_backward_only and not args.quick:
        # The other rows as the previous run measured them, its environment named.
        previous_environment, previous = harness.read_csv("exact")
        measured = [p for p in points(False) if any(matches(row, p) for row in rows)]
        kept = [row for row in previous if not any(matches(row, p) for p in measured)
                and not (not args.lengths and row["pass"] == "backward"
                         and row["sdpa_dtype"] == "float32")]
        selection = ("the float32 backward ones" if not args.lengths else
                     "the float32 backward ones at N = "
                     + ", ".join(str(n) for n in args.lengths))
        environment = harness.RecordedEnvironment(
            environment.header_lines()
            + [f"rows other than {selection} carried over from the earlier run: "
               + "; ".join(previous_environment.header_lines())])
        rows = kept + rows
        budget = harness.Budget(target_s=args.target_seconds)
        skipped = [(p, predicted_seconds(p, budget)) for p in points(False)
                   if not any(matches(row, p) for row in rows)]
    harness.write_csv("exact", environment, rows, quick=args.quick)
    if not (args.no_readme or args.quick):
        harness.replace_readme_section(harness.perf_page("exact"),
                                       readme_section(environment, rows, skipped,
                                                      args.point_limit,
                                                      args.float32_backward_only))


def readme_from_csv(args) -> None:
    """Re-renders the README section from docs/results/peers/exact.csv (the skipped points
    follow from the same --point-limit)."""
    environment, rows = harness.read_csv("exact")
    budget = harness.Budget(target_s=args.target_seconds)
    skipped = [(p, predicted_seconds(p, budget)) for p in points(False)
               if predicted_seconds(p, budget) > args.point_limit]
    harness.replace_readme_section(harness.perf_page("exact"),
                                   readme_section(environment, rows, skipped, args.point_limit))


def _find(rows, **key) -> Optional[dict]:
    for row in rows:
        if all(row[name] == value for name, value in key.items()):
            return row
    return None


def readme_section(environment, rows, skipped, point_limit, merged=False) -> str:
    f32 = [r for r in rows if r["sdpa_dtype"] == "float32"]
    lines = [
        "## Peer benchmark",
        "",
        "`scripts/peers.sh exact` (`benchmarks/peers/exact_vs_sdpa.py`): subquad's "
        "`[B, N, H, D]` kernels against `torch.nn.functional.scaled_dot_product_attention` "
        "on `[B, H, N, D]` tensors (its fastest layout; `enable_gqa` for GQA), one thread, "
        "same process, interleaved, outputs and gradients checked equal first. Figures are "
        "subquad's speed-up, SDPA time / subquad time from the best of the interleaved "
        "repetitions (medians in `docs/results/peers/exact.csv`); **bold** misses the target "
        f"(forward >= {FORWARD_TARGET}, backward >= {BACKWARD_TARGET}). 'causal / full' is "
        "subquad's causal forward time over its non-causal forward time (target < 0.6 at "
        "N >= 256). B x H = 32 x 8 stops at N = 1024 and GQA at N = 1024 (1 x 8:2) and 512 "
        "(32 x 8:2) to keep the run short; N = 16384 only where a point is predicted to take "
        "under the per-point budget (list below).",
        "",
        harness.environment_paragraph(environment),
        "",
    ]
    table_rows = []
    met = {"forward": [0, 0], "backward": [0, 0], "causal_ratio": [0, 0]}
    for B, H, Hkv, _ in SHAPES:
        for D in HEAD_DIMS:
            for N in LENGTHS:
                key = dict(B=B, H=H, Hkv=Hkv, N=N, D=D)
                cells = []
                found = False
                for pass_ in ("forward", "backward"):
                    target = FORWARD_TARGET if pass_ == "forward" else BACKWARD_TARGET
                    for causal in (0, 1):
                        row = _find(f32, **key, causal=causal, **{"pass": pass_})
                        found |= row is not None
                        cells.append(harness.ratio(row and row["speedup_min"], target))
                        if row:
                            met[pass_][0] += row["speedup_min"] >= target
                            met[pass_][1] += 1
                if not found:
                    continue
                full = _find(f32, **key, causal=0, **{"pass": "forward"})
                causal_row = _find(f32, **key, causal=1, **{"pass": "forward"})
                causal_ratio = (causal_row["subquad_min_s"] / full["subquad_min_s"]
                                if full and causal_row else None)
                if causal_ratio is not None and N >= 256:
                    met["causal_ratio"][0] += causal_ratio < 0.6
                    met["causal_ratio"][1] += 1
                heads = f"{H}" if H == Hkv else f"{H}:{Hkv}"
                table_rows.append([
                    f"{B}x{heads}", D, N,
                    harness.ms(full and full["subquad_min_s"]),
                    f"{full['subquad_gflops']:.0f}" if full else "-",
                    *cells,
                    harness.ratio(causal_ratio, 0.6 if N >= 256 else None, at_most=True)])
    lines.append(harness.markdown_table(
        ["B x H(:Hkv)", "D", "N", "subquad forward", "GFLOP/s", "forward", "causal forward",
         "backward", "causal backward", "causal / full"], table_rows))
    lines += ["", "Targets met (float32): " + "; ".join(
        f"{name.replace('_', ' ')} {good} of {total}" for name, (good, total) in met.items())
        + "."]
    if skipped:
        budget_text = ("of the runs that measured the rows (environment lines above)" if merged
                       else f"of {point_limit:.0f} s")
        lines += ["", f"Not run (predicted to take longer than the per-point budget "
                  f"{budget_text}): " + "; ".join(
            f"{p.label()} (~{t:.0f} s)" for p, t in skipped) + "."]
    bf16 = [r for r in rows if r["sdpa_dtype"] == "bfloat16"]
    if bf16:
        table = []
        for D in HEAD_DIMS:
            for N in BF16_LENGTHS:
                cells, found = [], None
                for pass_ in ("forward", "backward"):
                    for causal in (0, 1):
                        row = _find(bf16, N=N, D=D, causal=causal, **{"pass": pass_})
                        found = found or row
                        target = BF16_TARGET if pass_ == "forward" else BACKWARD_TARGET
                        cells.append(harness.ratio(row and row["speedup_min"], target))
                full = _find(bf16, N=N, D=D, causal=0, **{"pass": "forward"})
                if found:
                    table.append([D, N, harness.ms(full and full["subquad_min_s"]),
                                  f"{full['subquad_gflops']:.0f}" if full else "-",
                                  f"{full['sdpa_gflops']:.0f}" if full else "-", *cells])
        lines += [
            "",
            "bfloat16 (both in bfloat16: subquad's portable kernel converts to float32 while "
            "packing tiles and accumulates in float32; outputs checked against SDPA's to "
            f"3e-2), B x H = 1 x 8. **bold** misses the target (forward >= {BF16_TARGET}x SDPA "
            f"bfloat16; backward as float32, >= {BACKWARD_TARGET}); the GFLOP/s target "
            f"({BF16_GFLOPS_TARGET:.0f} at N >= 1024, D = 64) needs native bfloat16 products "
            "(AMX, AVX-512 BF16), which this CPU lacks:",
            "",
            harness.markdown_table(
                ["D", "N", "subquad bf16 forward", "GFLOP/s", "SDPA bf16 GFLOP/s", "forward",
                 "causal forward", "backward", "causal backward"], table),
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a few small points (smoke test: CSV to bench-out/peers, "
                        "no README)")
    parser.add_argument("--point-limit", type=float, default=25.0,
                        help="skip points predicted to take longer (seconds, default 25)")
    parser.add_argument("--target-seconds", type=float, default=0.15,
                        help="timed seconds of the slowest contender per point (default 0.15)")
    parser.add_argument("--no-readme", action="store_true", help="write the CSV only")
    parser.add_argument("--float32-backward-only", action="store_true",
                        help="run only the float32 backward points; the other rows are "
                        "carried over from docs/results/peers/exact.csv")
    parser.add_argument("--lengths", type=int, nargs="+",
                        help="with --float32-backward-only: only these N (the other "
                        "float32 backward rows are carried over too)")
    parser.add_argument("--dry-run", action="store_true", help="list points and predictions")
    parser.add_argument("--readme-from-csv", action="store_true",
                        help="only re-render the README section from the CSV of a run")
    args = parser.parse_args()
    if args.readme_from_csv:
        readme_from_csv(args)
        return
    if args.dry_run:
        budget = harness.Budget(target_s=args.target_seconds)
        total = 0.0
        for point in points(args.quick):
            t = predicted_seconds(point, budget)
            keep = t <= args.point_limit
            total += t if keep else 0
            print(f"{'run ' if keep else 'skip'} {point.label()}: ~{t:.1f} s")
        print(f"predicted total ~{total / 60:.1f} min (plus at least {args.target_seconds} s "
              "x contenders per point)")
        return
    run(args)


if __name__ == "__main__":
    main()
