"""CAT on sequence-last memory: subquad against the torch.fft port, both on the port's best
layout (z [B, H, N], v [B, H, Dv, N] contiguous; subquad reads them as [B, N, H, Dv] views in
place), with subquad on [B, N, H, Dv] in the same run (what the sequence-last path saves).

The port is cat_vs_fft.port (`irfft(conj(rfft(softmax z)) * rfft v)`), its backward torch
autograd. One thread, same process, interleaved (harness.py), outputs checked equal first.
Writes docs/results/peers/cat_sequence_last.csv and its section of docs/perf/cat.md.
"""

import argparse
import sys
from typing import List

import numpy as np
import torch

import harness
import subquad
from cat_vs_fft import FORWARD_TARGET, HEAD_DIMS, HEADS, LENGTHS, port, seq_last_to_bnhd

NAME = "cat_sequence_last"


def contenders(N: int, D: int, backward: bool) -> List[harness.Contender]:
    generator = torch.Generator().manual_seed(N + D)
    zl = torch.randn(1, HEADS, N, generator=generator)         # [B, H, N]
    vl = torch.randn(1, HEADS, D, N, generator=generator)      # [B, H, Dv, N]
    doutl = torch.randn(1, HEADS, D, N, generator=generator)
    # subquad's [B, N, H(, Dv)] views of the same memory, and contiguous copies.
    zq, vq, gq = (x.numpy().transpose(0, 2, 1) if x.dim() == 3 else
                  x.numpy().transpose(0, 3, 1, 2) for x in (zl, vl, doutl))
    zs, vs, gs = (np.ascontiguousarray(x) for x in (zq, vq, gq))
    to_l = lambda outputs: [seq_last_to_bnhd(x) for x in outputs]  # noqa: E731
    if not backward:
        return [
            harness.Contender("subquad sequence-last",
                              lambda: (subquad.cat_forward(zq, vq, threads=1),)),
            harness.Contender("torch sequence-last", lambda: (port(zl, vl),), to_l),
            harness.Contender("subquad [B, N, H, Dv]",
                              lambda: (subquad.cat_forward(zs, vs, threads=1),)),
        ]
    zg, vg = zl.clone().requires_grad_(), vl.clone().requires_grad_()
    out = port(zg, vg)
    return [
        harness.Contender("subquad sequence-last",
                          lambda: subquad.cat_backward(zq, vq, gq, threads=1)),
        harness.Contender("torch sequence-last", lambda: torch.autograd.grad(
            out, (zg, vg), doutl, retain_graph=True), to_l),
        harness.Contender("subquad [B, N, H, Dv]",
                          lambda: subquad.cat_backward(zs, vs, gs, threads=1)),
    ]


def run(args) -> None:
    torch.set_num_threads(1)
    subquad.set_fft_effort("measure")  # as `subquad bench` does; planned in the warm-up
    budget = harness.Budget(target_s=args.target_seconds)
    environment = harness.Environment(versions={
        "torch": torch.__version__, "numpy": np.__version__, "python": sys.version.split()[0],
        "torch FFT": "MKL" if torch.backends.mkl.is_available() else "pocketfft"})
    rows = []
    for backward in (False, True):
        for D in HEAD_DIMS:
            for N in ([256, 4096] if args.quick else LENGTHS):
                timings = harness.time_point(contenders(N, D, backward),
                                             tolerance=1e-3 if backward else 1e-4, budget=budget)
                base, torch_, standard = timings
                rows.append(dict(
                    N=N, H=HEADS, D=D, pass_="backward" if backward else "forward",
                    reps=base.reps, subquad_min_s=base.min_s, subquad_median_s=base.median_s,
                    subquad_wall_min_s=base.wall_min_s, torch_min_s=torch_.min_s,
                    torch_median_s=torch_.median_s, torch_wall_min_s=torch_.wall_min_s,
                    torch_max_rel_error=torch_.max_rel_error,
                    standard_min_s=standard.min_s, standard_median_s=standard.median_s,
                    speedup_min=torch_.min_s / base.min_s,
                    speedup_median=torch_.median_s / base.median_s,
                    layout_gain_min=standard.min_s / base.min_s,
                    layout_gain_median=standard.median_s / base.median_s))
                row = rows[-1]
                print(f"N={N} D={D} backward={backward}: subquad sequence-last "
                      f"{harness.ms(base.min_s)}, torch {row['speedup_min']:.2f}x / "
                      f"{row['speedup_median']:.2f}x (min / median), [B, N, H, Dv] "
                      f"{row['layout_gain_min']:.2f}x", flush=True)
    for row in rows:
        row["pass"] = row.pop("pass_")
    environment.finish()
    harness.write_csv(NAME, environment, rows, quick=args.quick)
    if not (args.no_readme or args.quick):
        harness.replace_readme_section(harness.perf_page("cat"),
                                       readme_section(environment, rows), name=NAME)


def readme_section(environment, rows) -> str:
    lines = [
        "### Peer benchmark on sequence-last memory",
        "",
        "`benchmarks/peers/cat_sequence_last.py`: subquad and the torch.fft port on the port's "
        "best layout, z `[B, H, N]` and v `[B, H, Dv, N]` contiguous (subquad reads them in "
        "place as `[B, N, H, Dv]` views); subquad on `[B, N, H, Dv]` in the same run. B = 1, "
        f"H = {HEADS}, one thread, same process, interleaved, outputs checked equal first. "
        "Speed-up = port time / subquad time (CPU times), from the minima and the medians of "
        f"the interleaved repetitions; **bold** misses the forward target ({FORWARD_TARGET}x). "
        "Layout gain = subquad on `[B, N, H, Dv]` / subquad sequence-last.",
        "",
        harness.environment_paragraph(environment),
        "",
    ]
    met = [0, 0]
    for pass_ in ("forward", "backward"):
        table = []
        for row in rows:
            if row["pass"] != pass_:
                continue
            target = FORWARD_TARGET if pass_ == "forward" else None
            if target:
                met[0] += row["speedup_min"] >= target
                met[1] += 1
            table.append([row["D"], row["N"], harness.ms(row["subquad_min_s"]),
                          harness.ms(row["torch_min_s"]),
                          harness.ratio(row["speedup_min"], target),
                          harness.ratio(row["speedup_median"], target),
                          harness.ratio(row["layout_gain_min"]),
                          harness.ratio(row["layout_gain_median"]),
                          f"{row['torch_max_rel_error']:.1e}"])
        lines += [f"**CAT {pass_}, sequence-last:**", "", harness.markdown_table(
            ["D", "N", "subquad (min)", "torch port (min)", "speed-up (min)",
             "speed-up (median)", "layout gain (min)", "layout gain (median)",
             "port's max rel. error"], table), ""]
    lines.append(f"Target CAT forward >= {FORWARD_TARGET}x the port on its best layout "
                 f"(minima): met at {met[0]} of {met[1]} points.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="N = 256, 4096 only (smoke test: CSV to bench-out/peers, no README)")
    parser.add_argument("--target-seconds", type=float, default=0.3,
                        help="timed seconds of the slowest contender per point (default 0.3)")
    parser.add_argument("--no-readme", action="store_true", help="write the CSV only")
    parser.add_argument("--readme-from-csv", action="store_true",
                        help="only re-render the README section from the CSV of a run")
    args = parser.parse_args()
    if args.readme_from_csv:
        environment, rows = harness.read_csv(NAME)
        harness.replace_readme_section(harness.perf_page("cat"),
                                       readme_section(environment, rows), name=NAME)
        return
    run(args)


if __name__ == "__main__":
    main()
