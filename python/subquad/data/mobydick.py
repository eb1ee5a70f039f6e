"""Herman Melville's *Moby Dick* from Debian's r-cran-tokenizers, read from the package's R
lazy-load database (data/Rdata.rdb + Rdata.rdx) without R (see rds.py).

The package ships the Project Gutenberg e-text (EBook #2701) as one string with CRLF line
breaks, Gutenberg's header and license included. `load_mobydick()` returns the book
itself: the text between the "*** START OF" and "*** END OF" markers, with LF line
breaks. No tokenizer or model of this project is fitted on it: it is held-out text, like
Persuasion."""

import os

from .errors import DataError, require_file, verify_sha256
from .rds import RList, lazy_load_index, lazy_load_object

DIRECTORY = "/usr/lib/R/site-library/tokenizers/data"
PACKAGE = "r-cran-tokenizers"
SHA256 = {  # of the files r-cran-tokenizers 0.3.0-1 installs
    "Rdata.rdb": "2a7581d1d9c2f49fd8c8493e556f984f4a5cdc071eeb6248b0fa719be6b088fe",
    "Rdata.rdx": "597c9d0f30a6fd0f70a87130d5b424e6cf690894efd8ac283e75cd44d58847cd",
}
START, END = "*** START OF", "*** END OF"


def gutenberg_body(text: str, source: str = "<text>") -> str:
    """The text between a Project Gutenberg e-text's START and END marker lines, with LF
    line breaks and no surrounding blank lines."""
    text = text.replace("\r\n", "\n")
    start, end = text.find(START), text.find(END)
    if start < 0 or end < 0 or end < start:
        raise DataError(f"{source}: no Project Gutenberg {START!r} ... {END!r} markers")
    begin = text.find("\n", start)
    if begin < 0 or begin > end:
        raise DataError(f"{source}: nothing after the {START!r} line")
    return text[begin:end].strip("\n")


def load_mobydick(directory: str = DIRECTORY, verify: bool = True) -> str:
    """The text of Moby Dick (LF line breaks, Gutenberg header and license removed).
    verify=False skips the sha256 check (for fixtures)."""
    paths = {}
    for name in ("Rdata.rdb", "Rdata.rdx"):
        paths[name] = require_file(os.path.join(directory, name), PACKAGE)
        verify_sha256(paths[name], SHA256[name] if verify else None)
    index = lazy_load_index(paths["Rdata.rdx"])
    if "mobydick" not in index:
        raise DataError(f"{paths['Rdata.rdx']}: no object 'mobydick' (has {sorted(index)})")
    value = lazy_load_object(paths["Rdata.rdb"], *index["mobydick"], name="mobydick")
    if isinstance(value, RList) or not isinstance(value, list) or len(value) != 1 or not \
            isinstance(value[0], str):
        raise DataError(f"{paths['Rdata.rdb']}: 'mobydick' is not a character vector of one "
                        f"string")
    return gutenberg_body(value[0].lstrip("\ufeff"), paths["Rdata.rdb"])
