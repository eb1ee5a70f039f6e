"""Jane Austen's six novels from Debian's r-cran-janeaustenr, read from the package's R
lazy-load database (data/Rdata.rdb + Rdata.rdx) without R (see rds.py).

Each novel is a character vector of text lines (Project Gutenberg line breaks). The
split is by novel: the five others train; Persuasion is held out, its first half
validates and its second half tests (cut at the blank line nearest the middle, so no
paragraph is split)."""

import os
from typing import Dict

from .errors import DataError, require_file, verify_sha256
from .rds import RList, lazy_load_index, lazy_load_object

DIRECTORY = "/usr/lib/R/site-library/janeaustenr/data"
PACKAGE = "r-cran-janeaustenr"
SHA256 = {  # of the files r-cran-janeaustenr 1.0.0-1 installs
    "Rdata.rdb": "8fb5198960d0da724b1562f96e4221e5c1b41ff455000280b02c55980c3d8f21",
    "Rdata.rdx": "cab8cbe4ce965d3b42b35c03383bafccc0eb78151f70e4748ead45270470c22f",
}
NOVELS = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma",
          "northangerabbey", "persuasion")
HELD_OUT = "persuasion"


def load_novels(directory: str = DIRECTORY, verify: bool = True) -> Dict[str, str]:
    """Novel name (as in janeaustenr, e.g. "prideprejudice") -> its text, lines joined
    by newlines. verify=False skips the sha256 check (for fixtures)."""
    paths = {}
    for name in ("Rdata.rdb", "Rdata.rdx"):
        paths[name] = require_file(os.path.join(directory, name), PACKAGE)
        verify_sha256(paths[name], SHA256[name] if verify else None)
    index = lazy_load_index(paths["Rdata.rdx"])
    novels = {}
    for novel in NOVELS:
        if novel not in index:
            raise DataError(f"{paths['Rdata.rdx']}: no object {novel!r} (has "
                            f"{sorted(index)})")
        lines = lazy_load_object(paths["Rdata.rdb"], *index[novel], name=novel)
        if isinstance(lines, RList) or not isinstance(lines, list) or not all(
                isinstance(line, str) for line in lines):
            raise DataError(f"{paths['Rdata.rdb']}: {novel!r} is not a character vector "
                            f"without NA")
        novels[novel] = "\n".join(lines)
    return novels


def austen_splits(directory: str = DIRECTORY, verify: bool = True) -> Dict[str, str]:
    """{"train", "validation", "test"} -> text: train is the five novels other than
    Persuasion (in publication order, separated by blank lines); validation and test
    are Persuasion's two halves."""
    novels = load_novels(directory, verify)
    train = "\n\n".join(novels[name] for name in NOVELS if name != HELD_OUT)
    held_out = novels[HELD_OUT]
    middle = len(held_out) // 2
    before, after = held_out.rfind("\n\n", 0, middle), held_out.find("\n\n", middle)
    if before < 0 and after < 0:
        cut = middle
    elif before < 0 or (after >= 0 and after - middle < middle - before):
        cut = after
    else:
        cut = before
    return {"train": train, "validation": held_out[:cut], "test": held_out[cut:].lstrip("\n")}
