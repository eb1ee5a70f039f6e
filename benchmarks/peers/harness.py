"""One timing harness for the peer benchmarks: subquad and its peers side by side.

Every point runs all contenders in the same process on the same inputs: each is called once
and its outputs are checked against subquad's (the point fails loudly when they differ),
then warmed up, then timed in interleaved rounds (the order rotates every round, so drift of
the machine's load falls on all contenders alike). Each call is timed twice: by the wall
clock and by the process's CPU time. The benchmarks run pinned to one core with one thread,
so CPU time is the wall time less the time other processes held the core: on a shared,
oversubscribed machine it is the stabler figure, and the tables use it (wall-clock figures
are in the CSVs). Reported: min and median per contender; speed-up = peer time / subquad
time, from the minima (load only ever adds time) and from the medians.
"""

import csv
import datetime
import gc
import math
import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results" / "peers"
SMOKE_RESULTS = REPO / "bench-out" / "peers"  # --quick runs: git-ignored, pages untouched
BEGIN_MARK = "<!-- peer-benchmark:begin (written by benchmarks/peers; do not edit by hand) -->"
END_MARK = "<!-- peer-benchmark:end -->"


@dataclass
class Contender:
    """One implementation at one point. `run()` does one call and returns its outputs
    (arrays or tensors, in subquad's layout after `to_reference`)."""

    name: str
    run: Callable[[], Any]
    to_reference: Callable[[Any], Sequence[np.ndarray]] = lambda outputs: outputs


@dataclass
class Timing:
    name: str
    min_s: float  # CPU time of one call
    median_s: float
    wall_min_s: float
    wall_median_s: float
    reps: int
    max_rel_error: float  # against the first contender, max |x - ref| / max |ref|


@dataclass
class Budget:
    """Timed rounds per point: enough for `target_s` of the slowest contender, within
    [min_reps, max_reps]."""

    target_s: float = 0.3
    min_reps: int = 3
    max_reps: int = 40
    warmup_s: float = 0.05


def _as_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor (bfloat16 has no NumPy dtype)
        x = x.detach()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        return x.contiguous().numpy()
    return np.asarray(x)


def max_relative_error(reference: Sequence, outputs: Sequence) -> float:
    """max |out - ref| / max |ref| over all output arrays (shapes must match)."""
    worst = 0.0
    for ref, out in zip(reference, outputs, strict=True):
        ref, out = _as_numpy(ref).astype(np.float64), _as_numpy(out).astype(np.float64)
        if ref.shape != out.shape:
            raise AssertionError(f"shape {out.shape} differs from the reference's {ref.shape}")
        scale = float(np.max(np.abs(ref))) or 1.0
        worst = max(worst, float(np.max(np.abs(out - ref))) / scale)
    return worst


def _call(run: Callable[[], Any]) -> Tuple[float, float]:
    """(wall seconds, CPU seconds) of one call."""
    start, start_cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - start, time.process_time() - start_cpu


def time_point(contenders: List[Contender], *, tolerance: float,
               budget: Budget = Budget()) -> List[Timing]:
    """Checks every contender against the first, then times them interleaved."""
    reference = None
    errors, first_times = [], []
    for contender in contenders:
        start = time.perf_counter()
        outputs = contender.to_reference(contender.run())
        first_times.append(time.perf_counter() - start)
        if reference is None:
            reference = [_as_numpy(x).copy() for x in outputs]
            for ref in reference:
                if not np.all(np.isfinite(ref)) or not np.any(ref):
                    raise AssertionError(f"{contender.name}: output not finite or all zero")
            errors.append(0.0)
            continue
        error = max_relative_error(reference, outputs)
        if not error <= tolerance:
            raise AssertionError(
                f"{contender.name} differs from {contenders[0].name}: max relative error "
                f"{error:.3g} > {tolerance:.3g}")
        errors.append(error)
        del outputs

    # Warm-up: until each contender has run warmup_s (the check call counts).
    for contender, first in zip(contenders, first_times):
        spent = first
        while spent < budget.warmup_s:
            spent += _call(contender.run)[0]
    slowest = max(first_times)
    reps = int(min(budget.max_reps, max(budget.min_reps, math.ceil(budget.target_s / slowest))))

    times: Dict[str, List[Tuple[float, float]]] = {c.name: [] for c in contenders}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for round_index in range(reps):
            shift = round_index % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                times[contender.name].append(_call(contender.run))
    finally:
        if gc_was_enabled:
            gc.enable()
    result = []
    for contender, error in zip(contenders, errors):
        wall = [t[0] for t in times[contender.name]]
        cpu = [t[1] for t in times[contender.name]]
        result.append(Timing(contender.name, min(cpu), statistics.median(cpu), min(wall),
                             statistics.median(wall), reps, error))
    return result


# --------------------------------------------------------------------------------------
# The run's environment, CSV rows and README sections


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> List[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].split()
    except OSError:
        pass
    return []


def load_average() -> str:
    return "%.2f %.2f %.2f" % os.getloadavg()


def commit() -> str:
    """The commit subquad was built from (recorded by scripts/peers.sh), else HEAD; marked
    when the library's sources differed from it (what was built was then the working tree).
    SUBQUAD_BUILD_COMMIT overrides both, for a run against a build that .venv does not
    hold (its subquad shadowed through PYTHONPATH)."""
    if os.environ.get("SUBQUAD_BUILD_COMMIT"):
        return "subquad built from " + os.environ["SUBQUAD_BUILD_COMMIT"]
    recorded = REPO / ".venv" / "subquad-build-commit"
    if recorded.exists() and recorded.read_text().strip():
        return "subquad built from " + recorded.read_text().strip()
    head = _git("rev-parse", "--short=12", "HEAD")
    changed = _git("status", "--porcelain", "--", "src", "include", "python", "cmake",
                   "CMakeLists.txt")
    return head + (" plus uncommitted changes to the sources" if changed else "")


@dataclass
class Environment:
    commit: str = field(default_factory=commit)
    cpu: str = field(default_factory=cpu_model)
    cores: int = field(default_factory=lambda: os.cpu_count() or 0)
    affinity: str = field(
        default_factory=lambda: ",".join(str(c) for c in sorted(os.sched_getaffinity(0))))
    started: str = field(default_factory=lambda: datetime.datetime.now(
        datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    load_start: str = field(default_factory=load_average)
    load_end: str = ""
    versions: Dict[str, str] = field(default_factory=dict)

    def finish(self) -> None:
        self.load_end = load_average()

    def header_lines(self) -> List[str]:
        simd = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in cpu_flags()]
        versions = ", ".join(f"{name} {version}" for name, version in self.versions.items())
        return [
            f"commit {self.commit}; {self.started}",
            f"CPU {self.cpu} ({self.cores} cores, {' '.join(simd) or 'no AVX2'}); "
            f"pinned to CPU {self.affinity}; one thread everywhere",
            versions,
            f"load average (1, 5, 15 min) {self.load_start} at the start, {self.load_end} at "
            "the end: the machine is shared with other jobs; times are CPU times of the "
            "pinned process (wall-clock in the CSV), which still carry the cache and "
            "memory-bandwidth share of the other jobs",
        ]


def write_csv(name: str, environment: Environment, rows: List[Dict[str, Any]], *,
              quick: bool = False) -> Path:
    """docs/results/peers/<name>.csv (bench-out/peers/ for --quick runs), preceded by '#'
    lines describing the run."""
    folder = SMOKE_RESULTS if quick else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.csv"
    columns: List[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    with path.open("w") as f:
        for line in environment.header_lines():
            f.write(f"# {line}\n")
        f.write(",".join(columns) + "\n")
        for row in rows:
            f.write(",".join(_csv_cell(row.get(c, "")) for c in columns) + "\n")
    return path


class RecordedEnvironment:
    """The environment of an earlier run, from the '#' lines of its CSV."""

    def __init__(self, lines: List[str]):
        self.lines = lines

    def header_lines(self) -> List[str]:
        return self.lines


def read_csv(name: str) -> Tuple[RecordedEnvironment, List[Dict[str, Any]]]:
    """What write_csv wrote to docs/results/peers/<name>.csv: (environment, rows), numbers
    parsed (for re-rendering a README section without rerunning)."""
    lines = (RESULTS / f"{name}.csv").read_text().splitlines()
    header = [line[2:] for line in lines if line.startswith("# ")]
    table = list(csv.reader(line for line in lines if not line.startswith("#")))
    rows = [{key: _parse(value) for key, value in zip(table[0], row) if value != ""}
            for row in table[1:]]
    return RecordedEnvironment(header), rows


def _parse(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _csv_cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value)
    return f'"{text}"' if "," in text else text


def perf_page(family: str) -> Path:
    """docs/perf/<family>.md: the family's measurements, where the peer sections live (its
    README in src/<family>/ keeps the math and links there)."""
    return REPO / "docs" / "perf" / f"{family}.md"


def replace_readme_section(readme: Path, markdown: str, name: str = "") -> None:
    """Replaces (or appends) the delimited peer-benchmark section of `readme`; `name` tells a
    second section of one README (its own markers) from the first."""
    text = readme.read_text()
    begin = BEGIN_MARK.replace("peer-benchmark:", f"peer-benchmark:{name}:") if name else BEGIN_MARK
    end = END_MARK.replace("peer-benchmark:", f"peer-benchmark:{name}:") if name else END_MARK
    block = f"{begin}\n{markdown.rstrip()}\n{end}\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + block + (("\n" + tail) if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    readme.write_text(text)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def ms(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def ratio(value: Optional[float], target: Optional[float] = None, *, at_most=False) -> str:
    """A speed-up (or ratio) to 2 decimals, bold when it misses `target`."""
    if value is None:
        return "-"
    text = f"{value:.2f}"
    if target is not None and ((value > target) if at_most else (value < target)):
        text = f"**{text}**"
    return text


def environment_paragraph(environment: Environment) -> str:
    return "\n".join(f"- {line}" for line in environment.header_lines())
