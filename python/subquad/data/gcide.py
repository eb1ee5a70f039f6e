"""GCIDE, the Collaborative International Dictionary of English 0.48 (Webster's Revised
Unabridged Dictionary of 1913 with WordNet 1.5 glosses and later additions), from Debian's
dict-gcide: the dictd database gcide.dict.dz (dictzip, which gzip reads) and gcide.index
(per headword: the headword, then its entry's offset and length in dictd's base 64).

Text: the index's distinct entries in file order, without the database's own "00-..."
records (URLs, licence notice), as dictd serves them (headword line, pronunciation between
backslashes, indented senses, character names such as "[beta]" kept), less two kinds of
markup: the braces around cross-references and the source tags ("[1913 Webster]",
"[WordNet 1.5 +PJC]": every bracket naming Webster, WordNet or PJC; a line that holds only
a tag goes with it). Entries are joined by one blank line. The file is UTF-8 except for
three Windows-1252 bytes; a line that is not UTF-8 is read as Windows-1252.

Split: the entries are dealt into PARTS consecutive parts of equal size (cut at entry
boundaries); in each part, the entries that start in its last 2% of characters are held
out, those in the first half of that 2% validate and the others test. So validation and
test (1% each) are pieces of about 8,000 characters spread over the whole alphabet."""

import gzip
import os
import re
import zlib
from typing import Dict, List, Tuple

from .errors import DataError, require_file, verify_sha256

DIRECTORY = "/usr/share/dictd"
PACKAGE = "dict-gcide"
SHA256 = {  # of the files dict-gcide 0.48.5+nmu2 installs
    "gcide.dict.dz": "3e6b2cdcbc1b3664c2f1466e3c8e44012e815c4c67fa83fa61f39777cd6e8517",
    "gcide.index": "e78de035e075f16dd686dd87a4dbf5b4525130d0550968a02d929f5ddf63a6a1",
}
BASE64 = {c: i for i, c in enumerate(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}
DATABASE_RECORD = "00-"  # headwords of dictd's own records (URL, licence, ...)
SOURCE_TAG = r"\[[^\[\]\n]*(?:Webster|WordNet|PJC)[^\[\]\n]*\]"
TAG_LINE = re.compile(r"^[ \t]*" + SOURCE_TAG + r"[ \t]*\n", re.MULTILINE)
TAG = re.compile(r"[ \t]*" + SOURCE_TAG)
PARTS = 50
HELD_OUT = (98, 99)  # percent of a part: train starts before the first, validation the second


def _base64(field: str, path: str, line: int) -> int:
    value = 0
    for digit in field:
        if digit not in BASE64:
            raise DataError(f"{path}:{line}: {field!r} is not a dictd base-64 number")
        value = value * 64 + BASE64[digit]
    return value


def read_index(path: str) -> List[Tuple[int, int, List[str]]]:
    """(offset, length, headwords) of every distinct entry of a dictd index, by offset."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 ({error})") from None
    records: Dict[Tuple[int, int], List[str]] = {}
    for number, line in enumerate(lines, start=1):
        fields = line.split("\t")
        if len(fields) != 3 or not fields[1] or not fields[2]:
            raise DataError(f"{path}:{number}: expected headword, offset and length "
                            f"separated by tabs, got {line!r}")
        span = (_base64(fields[1], path, number), _base64(fields[2], path, number))
        records.setdefault(span, []).append(fields[0])
    if not records:
        raise DataError(f"{path}: no entries")
    return [(offset, length, records[offset, length]) for offset, length in sorted(records)]


def _decode(entry: bytes) -> str:
    try:
        return entry.decode("utf-8")
    except UnicodeDecodeError:
        lines = entry.split(b"\n")
        return "\n".join(_decode_line(line) for line in lines)


def _decode_line(line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        return line.decode("cp1252", errors="replace")


def entry_text(entry: bytes) -> str:
    """An entry's text: decoded, source tags and cross-reference braces removed, no
    blank lines before or after."""
    text = TAG.sub("", TAG_LINE.sub("", _decode(entry)))
    return text.replace("{", "").replace("}", "").strip("\n")


def load_gcide(directory: str = DIRECTORY, verify: bool = True) -> List[str]:
    """The dictionary's entries (see the module's text), in file (alphabetical) order.
    verify=False skips the sha256 check (for fixtures)."""
    paths = {}
    for name in SHA256:
        paths[name] = require_file(os.path.join(directory, name), PACKAGE)
        verify_sha256(paths[name], SHA256[name] if verify else None)
    try:
        with gzip.open(paths["gcide.dict.dz"], "rb") as file:
            data = file.read()
    except (OSError, EOFError, zlib.error) as error:
        raise DataError(f"{paths['gcide.dict.dz']}: not a readable gzip (dictzip) file "
                        f"({error})") from None
    entries, end = [], 0
    for offset, length, headwords in read_index(paths["gcide.index"]):
        if offset < end or offset + length > len(data):
            raise DataError(f"{paths['gcide.index']}: entry {headwords[0]!r} at {offset} + "
                            f"{length} overlaps the previous one or ends past the "
                            f"{len(data)} bytes of {paths['gcide.dict.dz']} (truncated or "
                            f"from another version)")
        end = offset + length
        if all(word.startswith(DATABASE_RECORD) for word in headwords):
            continue
        text = entry_text(data[offset:end])
        if text:
            entries.append(text)
    if not entries:
        raise DataError(f"{paths['gcide.index']}: no dictionary entries")
    return entries


def split_entries(entries: List[str], parts: int = PARTS) -> Dict[str, str]:
    """{"train", "validation", "test"} -> entries joined by blank lines, split as the
    module says."""
    if parts < 1:
        raise ValueError(f"parts: expected >= 1, got {parts}")
    starts, total = [], 0
    for entry in entries:
        starts.append(total)
        total += len(entry) + 2  # and the blank line after it
    chosen: Dict[str, List[str]] = {"train": [], "validation": [], "test": []}
    for entry, start in zip(entries, starts):
        # In integers: the entry starts position / total of the way into its part.
        part = start * parts // total
        position = start * parts - part * total
        split = ("train" if 100 * position < HELD_OUT[0] * total else
                 "validation" if 100 * position < HELD_OUT[1] * total else "test")
        chosen[split].append(entry)
    return {split: "\n\n".join(texts) for split, texts in chosen.items()}


def gcide_splits(directory: str = DIRECTORY, verify: bool = True,
                 parts: int = PARTS) -> Dict[str, str]:
    """{"train", "validation", "test"} -> text (98%, 1%, 1% of the dictionary)."""
    return split_entries(load_gcide(directory, verify), parts)
