"""Metrics of a run: one JSON object per line in metrics.jsonl (the record), the same rows
as metrics.csv (columns: the union of the keys), and matplotlib PNG plots of the loss
curves of one run or of several runs side by side."""

import csv
import json
import os
from typing import Dict, Iterable, List

from ..data.errors import DataError
from .rundir import RunFileError

JSONL, CSV, LOSS_PNG = "metrics.jsonl", "metrics.csv", "loss.png"


class MetricsLog:
    """Appends rows {"step", "split", ...} to out/metrics.jsonl; write_csv() mirrors it."""

    def __init__(self, out: str, resume_step: int = -1):
        self.path = os.path.join(out, JSONL)
        self.out = out
        if resume_step >= 0 and os.path.exists(self.path):
            # Rows an interrupted run logged after its last checkpoint are redone.
            kept = [row for row in read_rows(self.path) if row["step"] <= resume_step]
            self._write(kept)
        elif resume_step < 0:
            self._write([])

    def _write(self, rows: List[Dict]) -> None:
        """Replaces the log with `rows` at once (a kill leaves the old or the new one)."""
        temporary = self.path + ".tmp"
        try:
            with open(temporary, "w") as file:
                file.writelines(json.dumps(row) + "\n" for row in rows)
            os.replace(temporary, self.path)
        except OSError as error:
            raise RunFileError(self.path, "write it", error) from None

    def append(self, row: Dict) -> None:
        try:
            with open(self.path, "a") as file:
                file.write(json.dumps(row) + "\n")
        except OSError as error:
            raise RunFileError(self.path, "write it", error) from None

    def write_csv(self) -> str:
        rows = read_rows(self.path)
        columns: List[str] = []
        for row in rows:
            columns += [key for key in row if key not in columns]
        path = os.path.join(self.out, CSV)
        with open(path, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
        return path


def read_rows(path: str) -> List[Dict]:
    """The rows of a metrics.jsonl. A last line without its newline that is not JSON is a
    row torn by a kill during its append, and left out; any other line that is not a JSON
    row is an error naming the file and the line."""
    with open(path) as file:
        lines = file.readlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            if number == len(lines) and not line.endswith("\n"):
                break  # torn
            raise DataError(f"{path}: line {number} is not a JSON row ({error})") from None
        if not isinstance(row, dict) or "step" not in row or "split" not in row:
            raise DataError(f"{path}: line {number} is not a metrics row (step, split, ...)")
        rows.append(row)
    return rows


def plot_runs(runs: Iterable[str], path: str, metric: str = "loss") -> str:
    """One PNG with the train and validation `metric` of each run directory against
    the step (log scale when the values span more than a decade)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    spans = []
    for run in runs:
        rows = read_rows(os.path.join(run, JSONL))
        label = os.path.basename(os.path.normpath(run))
        for split, style in (("train", "-"), ("validation", "--")):
            points = [(r["step"], r[metric]) for r in rows
                      if r["split"] == split and metric in r]
            if points:
                steps, values = zip(*points)
                axis.plot(steps, values, style, label=f"{label} {split}")
                spans += [min(values), max(values)]
    if spans and min(spans) > 0 and max(spans) > 10 * min(spans):
        axis.set_yscale("log")
    axis.set_xlabel("step")
    axis.set_ylabel(metric)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
