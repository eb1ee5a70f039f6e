"""ETTh1 and ETTh2 (hourly electricity-transformer data, Zhou et al. 2021), shipped with
the package in ett/ (see ett/README.md), split the standard way: months 1-12 train, 13-16
validation, 17-20 test (30-day months, 24 rows a day), every channel z-scored with the
training rows' mean and standard deviation."""

import csv
import os
from typing import Dict, List, Tuple

import numpy as np

from .errors import DataError, verify_sha256

DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ett")
SHA256 = {
    "ETTh1": "f18de3ad269cef59bb07b5438d79bb3042d3be49bdeecf01c1cd6d29695ee066",
    "ETTh2": "a3dc2c597b9218c7ce1cd55eb77b283fd459a1d09d753063f944967dd6b9218b",
}
COLUMNS = ("HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT")
ROWS_PER_MONTH = 30 * 24
SPLIT_MONTHS = {"train": (0, 12), "validation": (12, 16), "test": (16, 20)}


def read_ett_csv(path: str) -> np.ndarray:
    """float64 [rows, 7]: the seven channels of an ETT CSV (the date column dropped)."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: not found")
    rows: List[List[float]] = []
    with open(path, newline="") as file:
        reader = csv.reader(file)
        header = next(reader, None)
        if header is None or tuple(header[1:]) != COLUMNS or header[0] != "date":
            raise DataError(f"{path}: header {header}, expected date + {list(COLUMNS)}")
        for line_number, row in enumerate(reader, start=2):
            if len(row) != 1 + len(COLUMNS):
                raise DataError(f"{path}:{line_number}: {len(row)} fields, expected "
                                f"{1 + len(COLUMNS)} (truncated or corrupt)")
            try:
                rows.append([float(value) for value in row[1:]])
            except ValueError as error:
                raise DataError(f"{path}:{line_number}: {error}") from None
    return np.asarray(rows, dtype=np.float64).reshape(-1, len(COLUMNS))


def load_ett(name: str = "ETTh1", directory: str = DIRECTORY,
             verify: bool = True) -> Dict[str, np.ndarray]:
    """{"train", "validation", "test"} -> float32 [rows, 7], z-scored on train; also
    "mean" and "std" [7] (the training statistics).

    Each later split starts where the previous one ends (callers that need input context
    before a split's first target prepend the end of the previous split themselves, see
    forecast_windows). verify=False skips the sha256 check (for fixtures)."""
    if name not in SHA256:
        raise ValueError(f"name: expected one of {sorted(SHA256)}, got {name!r}")
    path = os.path.join(directory, f"{name}.csv")
    if os.path.isfile(path):
        verify_sha256(path, SHA256[name] if verify else None)
    values = read_ett_csv(path)
    needed = SPLIT_MONTHS["test"][1] * ROWS_PER_MONTH
    if len(values) < needed:
        raise DataError(f"{path}: {len(values)} rows, the standard split needs {needed}")
    train_rows = values[:SPLIT_MONTHS["train"][1] * ROWS_PER_MONTH]
    mean, std = train_rows.mean(axis=0), train_rows.std(axis=0)
    if np.any(std == 0):
        raise DataError(f"{path}: a channel is constant over the training months")
    splits = {}
    for split, (first, last) in SPLIT_MONTHS.items():
        rows = values[first * ROWS_PER_MONTH:last * ROWS_PER_MONTH]
        splits[split] = ((rows - mean) / std).astype(np.float32)
    splits["mean"], splits["std"] = mean.astype(np.float32), std.astype(np.float32)
    return splits


def forecast_windows(splits: Dict[str, np.ndarray], split: str, context: int,
                     horizon: int) -> Tuple[np.ndarray, np.ndarray]:
    """Every (input [context, 7], target [horizon, 7]) window whose targets lie in
    `split`, as in Informer's loaders: the validation and test inputs may reach back into
    the previous split. Returns float32 [W, context, 7] and [W, horizon, 7]."""
    if context < 1 or horizon < 1:
        raise ValueError(f"context and horizon: expected >= 1, got {context}, {horizon}")
    order = ["train", "validation", "test"]
    if split not in order:
        raise ValueError(f"split: expected one of {order}, got {split!r}")
    series = np.concatenate([splits[s] for s in order[:order.index(split) + 1]])
    first_target = len(series) - len(splits[split])
    start = max(first_target - context, 0)
    count = len(series) - horizon - context - start + 1
    if count < 1:
        raise ValueError(f"split {split!r} ({len(splits[split])} rows) is too short for "
                         f"context {context} + horizon {horizon}")
    index = start + np.arange(count)[:, None]
    inputs = series[index + np.arange(context)]
    targets = series[index + context + np.arange(horizon)]
    return inputs.astype(np.float32), targets.astype(np.float32)
