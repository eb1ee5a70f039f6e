"""MKL (torch.fft inside the PyPI torch wheel) on the transform shapes of CAT: 64 real rows of
length N, r2c then c2r, float32, one thread. Two layouts: "rows" ([64, N], transform along the
contiguous axis) and "columns" ([N, 64], transform along dim 0: stride 64 across 64 columns,
CAT's [N, H * Dv] layout). Interleaved repetitions; prints min / median of CPU time and wall
clock per (layout, N). Run pinned: `taskset -c 1 .venv/bin/python benchmarks/peers/fft_mkl_shapes.py`.
The C++ side of the same table is `subquad_fft_columns_bench` (docs/perf/common.md).
"""

import argparse
import statistics
import time

import torch

LENGTHS = [256, 1024, 4096, 16384, 65536]
COLUMNS = 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--lengths", type=str, default=",".join(map(str, LENGTHS)))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, MKL {torch.backends.mkl.is_available()}, one thread")
    print("layout,N,cpu_min_ms,cpu_median_ms,wall_min_ms,wall_median_ms")
    for n in map(int, args.lengths.split(",")):
        generator = torch.Generator().manual_seed(n)
        rows = torch.randn(COLUMNS, n, generator=generator)  # [64, N]
        columns = torch.randn(n, COLUMNS, generator=generator)  # [N, 64]
        runs = {
            "rows": lambda: torch.fft.irfft(torch.fft.rfft(rows, dim=1), n=n, dim=1),
            "columns": lambda: torch.fft.irfft(torch.fft.rfft(columns, dim=0), n=n, dim=0),
        }
        # The round trip must give back the input times one (irfft normalises by 1/N).
        assert torch.allclose(runs["rows"](), rows, atol=1e-4)
        assert torch.allclose(runs["columns"](), columns, atol=1e-4)
        times = {name: ([], []) for name in runs}
        for _ in range(args.reps):
            for name, run in runs.items():  # interleaved
                cpu, wall = time.process_time(), time.perf_counter()
                run()
                times[name][0].append(time.process_time() - cpu)
                times[name][1].append(time.perf_counter() - wall)
        for name, (cpu, wall) in times.items():
            print(f"{name},{n},{min(cpu) * 1e3:.4g},{statistics.median(cpu) * 1e3:.4g},"
                  f"{min(wall) * 1e3:.4g},{statistics.median(wall) * 1e3:.4g}")


if __name__ == "__main__":
    main()
