"""The study's records: one JSON line per cell in <out>/cells.jsonl, appended and flushed to
disk as each cell finishes, so a run killed at any point loses at most the cell in flight;
a torn line (killed mid-write; the next append starts a fresh line after it) is skipped
when read and counted in `torn`. A cell is identified by its key
(phase, task, document, press, settings, ratio) and is never computed twice.
"""

import json
import os
from typing import Dict, Iterator, List, Optional, Tuple

__all__ = ["CELLS", "Store", "cell_key"]

CELLS = "cells.jsonl"
KEY_FIELDS = ("phase", "task", "document", "press", "settings", "ratio")


def cell_key(record: Dict) -> Tuple:
    return tuple(json.dumps(record[f], sort_keys=True) for f in KEY_FIELDS)


class Store:
    def __init__(self, out: str):
        self.path = os.path.join(out, CELLS)
        os.makedirs(out, exist_ok=True)
        self.torn = 0
        self.records: List[Dict] = []
        for record in _read(self.path):
            if record is None:
                self.torn += 1
            else:
                self.records.append(record)
        self.done = {cell_key(r): r for r in self.records if r.get("type") == "cell"}

    def has(self, **key) -> bool:
        return cell_key(key) in self.done

    def get(self, **key) -> Dict:
        return self.done[cell_key(key)]

    def append(self, record: Dict) -> None:
        line = json.dumps(record, sort_keys=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            if handle.tell() > 0 and not _ends_with_newline(self.path):
                handle.write("\n")  # after a torn line: start a fresh one
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.records.append(record)
        if record.get("type") == "cell":
            self.done[cell_key(record)] = record


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"


def _read(path: str) -> Iterator[Optional[Dict]]:
    """The records of the file; None for a torn line."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    yield None
