"""CAT: subquad against the torch.fft port and scipy.fft, plus the FFT libraries alone.

The port is the three lines third-party ports of CAT write (roll convention, along the
sequence): `irfft(conj(rfft(softmax z)) * rfft v)`; its causal form (lag convention) is the
linear convolution by zero-padded length-2N transforms divided by the running softmax sum,
`irfft(rfft(e, 2N) rfft(v, 2N))[:N] / cumsum(e)` with `e = exp(z - max z)`. Layouts:
"sequence-last" has the data already as z [B, H, N], v [B, H, Dv, N] (the port's best
case); "incl. transposes" starts from subquad's [B, N, H], [B, N, H, Dv] and returns that
layout. One thread, same process, interleaved (harness.py), outputs checked equal first;
backward passes by torch autograd (time of the backward call alone, graph retained).
Writes docs/results/peers/cat.csv, fft.csv and the section of docs/perf/cat.md.
"""

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

import numpy as np
import scipy
import scipy.fft

try:
    import ducc0
except ImportError:  # optional: the FFT table then has no ducc0 column
    ducc0 = None
import torch

import harness
import subquad

LENGTHS = [256, 1024, 4096, 16384, 65536]
HEAD_DIMS = [64, 128]
HEADS = 8
FORWARD_TARGET, CAUSAL_RATIO_TARGET, BACKWARD_RATIO_TARGET, FFT_TARGET = 1.3, 2.5, 2.0, 1.2
FFT_LENGTHS, FFT_ROWS = [256, 1024, 4096, 16384, 65536], 64
PREEMPTED = 1.1  # wall-clock / CPU time above which a wall-clock minimum was preempted


def port(z, v):
    """z [..., N], v [..., Dv, N] -> [..., Dv, N]: out = corr(softmax z, v) (roll)."""
    n = z.shape[-1]
    s = torch.softmax(z, dim=-1)
    return torch.fft.irfft(torch.conj(torch.fft.rfft(s)).unsqueeze(-2) * torch.fft.rfft(v), n=n)


def port_causal(z, v):
    """z [..., N], v [..., Dv, N] -> [..., Dv, N]:
    out[i] = sum_{k <= i} e[k] v[i - k] / sum_{k <= i} e[k]."""
    n = z.shape[-1]
    e = torch.exp(z - z.max(dim=-1, keepdim=True).values)
    num = torch.fft.irfft(torch.fft.rfft(e, n=2 * n).unsqueeze(-2) * torch.fft.rfft(v, n=2 * n),
                          n=2 * n)[..., :n]
    return num / torch.cumsum(e, dim=-1).unsqueeze(-2)


def port_transposed(function):
    """The port from [B, N, H], [B, N, H, Dv] to [B, N, H, Dv], transposes included."""
    def run(z, v):
        out = function(z.transpose(1, 2), v.permute(0, 2, 3, 1).contiguous())  # [B, H, Dv, N]
        return out.permute(0, 3, 1, 2).contiguous()
    return run


def scipy_port(z, v):
    """NumPy z [..., N], v [..., Dv, N] float32 -> [..., Dv, N] by scipy.fft (pocketfft)."""
    n = z.shape[-1]
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    s = e / e.sum(axis=-1, keepdims=True)
    return scipy.fft.irfft(np.conj(scipy.fft.rfft(s))[..., None, :] * scipy.fft.rfft(v), n=n)


def seq_last_to_bnhd(x):
    """[B, H, Dv, N] -> [B, N, H, Dv]; [B, H, N] -> [B, N, H]."""
    x = torch.as_tensor(x)
    return x.permute(0, 3, 1, 2) if x.dim() == 4 else x.transpose(1, 2)


def contenders(N: int, D: int, causal: bool, backward: bool) -> List[harness.Contender]:
    generator = torch.Generator().manual_seed(N + D)
    z = torch.randn(1, N, HEADS, generator=generator)        # [B, N, H]
    v = torch.randn(1, N, HEADS, D, generator=generator)     # [B, N, H, Dv]
    dout = torch.randn(1, N, HEADS, D, generator=generator)
    zs, vs, douts = z.numpy(), v.numpy(), dout.numpy()
    zl, vl = z.transpose(1, 2).contiguous(), v.permute(0, 2, 3, 1).contiguous()
    doutl = dout.permute(0, 2, 3, 1).contiguous()
    function = port_causal if causal else port
    to_l = lambda outputs: [seq_last_to_bnhd(x) for x in outputs]  # noqa: E731

    if not backward:
        forward = subquad.cat_causal_forward if causal else subquad.cat_forward
        result = [
            harness.Contender("subquad", lambda: (forward(zs, vs, threads=1),)),
            harness.Contender("torch sequence-last", lambda: (function(zl, vl),), to_l),
            harness.Contender("torch incl. transposes",
                              lambda: (port_transposed(function)(z, v),)),
        ]
        if not causal:
            zn, vn = zl.numpy(), vl.numpy()
            result.append(harness.Contender("scipy sequence-last",
                                            lambda: (scipy_port(zn, vn),), to_l))
        return result

    if causal:
        out = subquad.cat_causal_forward(zs, vs, threads=1)
        run_subquad = lambda: subquad.cat_causal_backward(zs, vs, out, douts, threads=1)  # noqa
    else:
        run_subquad = lambda: subquad.cat_backward(zs, vs, douts, threads=1)  # noqa: E731
    zg, vg = zl.clone().requires_grad_(), vl.clone().requires_grad_()
    out_l = function(zg, vg)
    zt, vt = z.clone().requires_grad_(), v.clone().requires_grad_()
    out_t = port_transposed(function)(zt, vt)
    return [
        harness.Contender("subquad", run_subquad),
        harness.Contender("torch sequence-last", lambda: torch.autograd.grad(
            out_l, (zg, vg), doutl, retain_graph=True), to_l),
        harness.Contender("torch incl. transposes", lambda: torch.autograd.grad(
            out_t, (zt, vt), dout, retain_graph=True)),
    ]


def fft_contenders(N: int) -> List[harness.Contender]:
    x = torch.randn(FFT_ROWS, N, generator=torch.Generator().manual_seed(N))  # [rows, N]
    xn = x.numpy()
    return [
        harness.Contender("torch.fft (MKL)",
                          lambda: (torch.fft.irfft(torch.fft.rfft(x), n=N),)),
        harness.Contender("scipy.fft (pocketfft)",
                          lambda: (scipy.fft.irfft(scipy.fft.rfft(xn), n=N),)),
        harness.Contender("numpy.fft (pocketfft C)",
                          lambda: (np.fft.irfft(np.fft.rfft(xn), n=N),)),
    ] + ([] if ducc0 is None else [
        # ducc0 (pocketfft's C++ successor, SIMD across rows; usable from C++ as headers).
        harness.Contender("ducc0.fft", lambda: (ducc0.fft.c2r(
            ducc0.fft.r2c(xn, axes=(1,), nthreads=1), axes=(1,), lastsize=N, forward=False,
            inorm=2, nthreads=1),)),
    ])


def fftw_rows(cli: Path) -> Dict[int, Dict[str, float]]:
    """subquad's own FFTW rows: `subquad bench --methods fft-lower-bound[-packed]` with one
    head of 64 columns, i.e. 64 real rows r2c + c2r (packed: 32 complex rows)."""
    if not cli.exists():
        return {}
    with tempfile.TemporaryDirectory() as out_dir:
        command = [str(cli), "bench", "--methods", "fft-lower-bound,fft-lower-bound-packed",
                   "--lengths", ",".join(map(str, FFT_LENGTHS)), "--shapes", f"1x{FFT_ROWS}",
                   "--threads", "1", "--reps", "25", "--out-dir", out_dir]
        try:
            subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as error:
            print(f"subquad bench failed: {error}", file=sys.stderr)
            return {}
        result: Dict[int, Dict[str, float]] = {}
        with open(Path(out_dir) / "bench.csv") as f:
            for row in csv.DictReader(line for line in f if not line.startswith("#")):
                if row["method"].startswith("fft-lower-bound") and row["status"] == "measured":
                    result.setdefault(int(row["tokens"]), {})[row["method"]] = float(
                        row["min_s"])
        return result


def run(args) -> None:
    torch.set_num_threads(1)
    subquad.set_fft_effort("measure")  # as `subquad bench` does; planned in the warm-up
    budget = harness.Budget(target_s=args.target_seconds)
    environment = harness.Environment(versions={
        "torch": torch.__version__, "scipy": scipy.__version__, "numpy": np.__version__,
        "python": sys.version.split()[0],
        "torch FFT": "MKL" if torch.backends.mkl.is_available() else "pocketfft"})
    lengths = [256, 4096] if args.quick else LENGTHS
    rows = []
    for causal in (False, True):
        for backward in (False, True):
            for D in HEAD_DIMS:
                for N in lengths:
                    tolerance = 1e-2 if causal else 1e-4 if not backward else 1e-3
                    timings = harness.time_point(contenders(N, D, causal, backward),
                                                 tolerance=tolerance, budget=budget)
                    base = timings[0]
                    row = dict(N=N, H=HEADS, D=D, causal=int(causal),
                               pass_="backward" if backward else "forward", reps=base.reps,
                               subquad_min_s=base.min_s, subquad_median_s=base.median_s,
                               subquad_wall_min_s=base.wall_min_s)
                    for t in timings[1:]:
                        key = t.name.replace(" ", "_").replace(".", "")
                        row[f"{key}_min_s"] = t.min_s
                        row[f"{key}_median_s"] = t.median_s
                        row[f"{key}_speedup_min"] = t.min_s / base.min_s
                        row[f"{key}_speedup_median"] = t.median_s / base.median_s
                        row[f"{key}_max_rel_error"] = t.max_rel_error
                        row[f"{key}_wall_min_s"] = t.wall_min_s
                    rows.append(row)
                    print(f"N={N} D={D} causal={causal} backward={backward}: subquad "
                          f"{harness.ms(base.min_s)}; " + ", ".join(
                              f"{t.name} {t.min_s / base.min_s:.2f}x (err "
                              f"{t.max_rel_error:.1e})" for t in timings[1:]), flush=True)
    for row in rows:
        row["pass"] = row.pop("pass_")

    fft_rows = measure_ffts(args, budget)
    environment.finish()
    harness.write_csv("cat", environment, rows, quick=args.quick)
    harness.write_csv("fft", environment, fft_rows, quick=args.quick)
    if not (args.no_readme or args.quick):
        harness.replace_readme_section(harness.perf_page("cat"),
                                       readme_section(environment, rows, fft_rows))


def measure_ffts(args, budget: harness.Budget) -> List[Dict]:
    """The FFT libraries alone: FFTW through subquad's CLI first, then MKL and pocketfft
    interleaved."""
    fft_rows = []
    fftw = fftw_rows(Path(args.cli))
    for N in FFT_LENGTHS:
        timings = harness.time_point(fft_contenders(N), tolerance=1e-5, budget=budget)
        row = dict(N=N, rows=FFT_ROWS, reps=timings[0].reps)
        for t in timings:
            key = t.name.split(".")[0]  # torch, scipy
            row[f"{key}_min_s"] = t.min_s
            row[f"{key}_median_s"] = t.median_s
            row[f"{key}_wall_min_s"] = t.wall_min_s
        for method, seconds in fftw.get(N, {}).items():
            row[f"fftw_{method.replace('-', '_')}_min_s"] = seconds
        fft_rows.append(row)
        print(f"FFT N={N}: " + ", ".join(f"{t.name} {harness.ms(t.min_s)}" for t in timings)
              + "".join(f", FFTW {m} {harness.ms(s)}" for m, s in fftw.get(N, {}).items()),
              flush=True)
    return fft_rows


def fft_only(args) -> None:
    """Reruns the FFT rows alone (fft.csv) and re-renders the docs/perf/cat.md section with cat.csv."""
    torch.set_num_threads(1)
    environment = harness.Environment(versions={
        "torch": torch.__version__, "scipy": scipy.__version__, "python": sys.version.split()[0]})
    fft_rows = measure_ffts(args, harness.Budget(target_s=args.target_seconds))
    environment.finish()
    harness.write_csv("fft", environment, fft_rows, quick=args.quick)
    if not (args.no_readme or args.quick):
        cat_environment, rows = harness.read_csv("cat")
        harness.replace_readme_section(
            harness.perf_page("cat"),
            readme_section(cat_environment, rows, fft_rows, environment))


def _get(rows, **key):
    for row in rows:
        if all(row[name] == value for name, value in key.items()):
            return row
    return None


def readme_section(environment, rows, fft_rows, fft_environment=None) -> str:
    """fft_environment: the FFT rows' own run, when they were measured apart."""
    seq, trans, sci = "torch_sequence-last", "torch_incl_transposes", "scipy_sequence-last"
    lines = [
        "## Peer benchmark",
        "",
        "`scripts/peers.sh cat` (`benchmarks/peers/cat_vs_fft.py`): subquad on `[B, N, H, Dv]` "
        "against the torch.fft port `irfft(conj(rfft(softmax z)) * rfft v)` (causal: its "
        "zero-padded length-2N form) with the data already sequence-last (`[B, H, Dv, N]`, the "
        "port's best layout), the same port including the transposes from and to "
        "`[B, N, H, Dv]`, and the port on scipy.fft; B = 1, H = 8, one thread, same process, "
        "interleaved, outputs checked equal first. Figures are subquad's speed-up (peer time / "
        "subquad time, best of the interleaved repetitions; medians in "
        "`docs/results/peers/cat.csv`); **bold** misses the target (forward >= "
        f"{FORWARD_TARGET}x the sequence-last port).",
        "",
        harness.environment_paragraph(environment),
        "",
    ]
    met = {}
    for causal in (0, 1):
        for pass_ in ("forward", "backward"):
            table = []
            for D in HEAD_DIMS:
                for N in LENGTHS:
                    row = _get(rows, N=N, D=D, causal=causal, **{"pass": pass_})
                    if row is None:
                        continue
                    target = FORWARD_TARGET if (pass_ == "forward" and not causal) else None
                    cells = [D, N, harness.ms(row["subquad_min_s"]),
                             harness.ratio(row[f"{seq}_speedup_min"], target),
                             harness.ratio(row[f"{trans}_speedup_min"])]
                    if target:
                        good = met.setdefault("CAT forward >= 1.3x port", [0, 0])
                        good[0] += row[f"{seq}_speedup_min"] >= target
                        good[1] += 1
                    if not causal and pass_ == "forward":
                        cells.append(harness.ratio(row[f"{sci}_speedup_min"]))
                    cells.append(f"{row[f'{seq}_max_rel_error']:.1e}")
                    table.append(cells)
            if not table:
                continue
            title = ("Causal CAT" if causal else "CAT") + f" {pass_}"
            header = ["D", "N", "subquad", "torch sequence-last", "torch incl. transposes"]
            if not causal and pass_ == "forward":
                header.append("scipy.fft sequence-last")
            header.append("port's max rel. error")
            lines += [f"**{title}** (speed-up of subquad):", "",
                      harness.markdown_table(header, table), ""]

    ratio_rows = []
    for D in HEAD_DIMS:
        for N in LENGTHS:
            get = lambda c, p: _get(rows, N=N, D=D, causal=c, **{"pass": p})  # noqa: E731
            f, b, cf, cb = get(0, "forward"), get(0, "backward"), get(1, "forward"), \
                get(1, "backward")
            if not all((f, b, cf, cb)):
                continue
            causal_ratio = cf["subquad_min_s"] / f["subquad_min_s"]
            backward_ratio = b["subquad_min_s"] / f["subquad_min_s"]
            causal_backward_ratio = cb["subquad_min_s"] / cf["subquad_min_s"]
            if N >= 4096:
                good = met.setdefault("causal <= 2.5x non-causal (N >= 4096)", [0, 0])
                good[0] += causal_ratio <= CAUSAL_RATIO_TARGET
                good[1] += 1
            good = met.setdefault("backward <= 2x forward (both variants)", [0, 0])
            good[0] += (backward_ratio <= BACKWARD_RATIO_TARGET) + (
                causal_backward_ratio <= BACKWARD_RATIO_TARGET)
            good[1] += 2
            ratio_rows.append([
                D, N,
                harness.ratio(causal_ratio, CAUSAL_RATIO_TARGET if N >= 4096 else None,
                              at_most=True),
                harness.ratio(backward_ratio, BACKWARD_RATIO_TARGET, at_most=True),
                harness.ratio(causal_backward_ratio, BACKWARD_RATIO_TARGET, at_most=True)])
    lines += ["**subquad's own ratios** (time / time; targets: causal forward <= 2.5x the "
              "non-causal forward at N >= 4096, each backward <= 2x its forward):", "",
              harness.markdown_table(["D", "N", "causal fwd / fwd", "bwd / fwd",
                                      "causal bwd / causal fwd"], ratio_rows), ""]

    fft_table = []
    for row in fft_rows:
        fftw = row.get("fftw_fft_lower_bound_min_s")
        packed = row.get("fftw_fft_lower_bound_packed_min_s")
        mkl = row["torch_wall_min_s"]  # like with like: `subquad bench` times the wall clock
        # A wall-clock minimum well above the CPU time was preempted: no ratio from it.
        preempted = mkl > PREEMPTED * row["torch_min_s"]
        speedup = None if (preempted or not packed) else mkl / packed
        fft_table.append([row["N"], harness.ms(fftw), harness.ms(packed), harness.ms(mkl),
                          harness.ms(row["torch_min_s"]), harness.ms(row["scipy_wall_min_s"]),
                          harness.ms(row["scipy_min_s"]), harness.ms(row.get("numpy_min_s")),
                          harness.ms(row.get("ducc0_min_s")),
                          "preempted" if preempted else harness.ratio(speedup, FFT_TARGET)])
        if speedup is not None:
            good = met.setdefault("subquad's transform >= 1.2x MKL (wall clock)", [0, 0])
            good[0] += speedup >= FFT_TARGET
            good[1] += 1
    lines += [
        f"**FFT libraries alone**: {FFT_ROWS} rows of length N, float32, r2c + c2r. FFTW: "
        "subquad's `bench --methods fft-lower-bound` (64 real rows, one plan per row) and "
        "`fft-lower-bound-packed` (32 complex rows of column pairs: what CAT runs), wall-clock "
        "minimum of 25 repetitions, run just before the others; torch.fft, scipy.fft, numpy.fft "
        "and ducc0.fft (0.42, `nthreads=1`): one "
        "batched call each way, minima of the interleaved repetitions, wall clock and CPU "
        "time. The ratio compares wall clock with wall clock, and is left out ('preempted') "
        f"where MKL's wall-clock minimum exceeds its CPU time by more than "
        f"{(PREEMPTED - 1) * 100:.0f}%: the FFTW figure of the same length is then preempted "
        "too.", "",
        harness.markdown_table(["N", "FFTW real rows (wall)", "FFTW packed pairs (wall)",
                                "MKL (wall)", "MKL (CPU)", "pocketfft (wall)", "pocketfft (CPU)",
                                "numpy.fft (CPU)", "ducc0 (CPU)", "MKL / FFTW packed (wall)"],
                               fft_table), "",
        "Targets met: " + "; ".join(f"{name}: {good} of {total}"
                                    for name, (good, total) in met.items()) + ".",
    ]
    if fft_environment is not None:
        lines[-2:-2] = ["", "The FFT rows were measured in a run of their own:", "",
                        harness.environment_paragraph(fft_environment)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="N = 256, 4096 only (smoke test: CSVs to bench-out/peers, "
                        "no README)")
    parser.add_argument("--target-seconds", type=float, default=0.3,
                        help="timed seconds of the slowest contender per point (default 0.3)")
    parser.add_argument("--cli", default=str(harness.REPO / "build" / "subquad"),
                        help="subquad CLI for the FFTW rows (default build/subquad; skipped "
                        "when absent)")
    parser.add_argument("--no-readme", action="store_true", help="write the CSVs only")
    parser.add_argument("--readme-from-csv", action="store_true",
                        help="only re-render the README section from the CSVs of a run")
    parser.add_argument("--fft-only", action="store_true",
                        help="rerun the FFT libraries alone (fft.csv) and re-render the README")
    args = parser.parse_args()
    if args.fft_only:
        fft_only(args)
        return
    if args.readme_from_csv:
        environment, rows = harness.read_csv("cat")
        fft_environment, fft_rows = harness.read_csv("fft")
        separate = fft_environment.header_lines() != environment.header_lines()
        harness.replace_readme_section(
            harness.perf_page("cat"),
            readme_section(environment, rows, fft_rows, fft_environment if separate else None))
        return
    run(args)


if __name__ == "__main__":
    main()
