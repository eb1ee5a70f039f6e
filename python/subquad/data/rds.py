"""Reads R's XDR serialization (formats 2 and 3) and R's lazy-load databases
(Rdata.rdb + Rdata.rdx, as installed R packages keep their data sets) without R.

The subset of R's object model that data packages use: NULL, symbols, pairlists,
logical, integer, double, character and generic vectors, raw vectors, attributes, the
back-references (REFSXP) R writes for repeated symbols and environments, and the compact
sequences of R >= 3.5 (ALTREP). Values come back as Python objects: NULL -> None,
character vectors -> lists of str (NA -> None), numeric vectors -> lists, named generic
vectors -> RList (a list with .names and .attributes), compact sequences -> CompactSequence
(as compact as in R: a claimed length of 10^9 builds nothing). Every other count is checked
against the bytes left before anything is built from it. The format is described in R's
src/main/serialize.c; anything outside the subset raises DataError naming the type.
"""

import gzip
import math
import struct
import zlib
from collections.abc import Sequence
from typing import Dict, List, Optional, Tuple

from .errors import DataError

# SEXP type codes (R's Rinternals.h) and the pseudo-types of the serialization format.
NILSXP, SYMSXP, LISTSXP, CLOSXP, ENVSXP = 0, 1, 2, 3, 4
LANGSXP, CHARSXP, LGLSXP, INTSXP, REALSXP = 6, 9, 10, 13, 14
CPLXSXP, STRSXP, VECSXP, EXPRSXP, RAWSXP = 15, 16, 19, 20, 24
REFSXP, NILVALUE_SXP, GLOBALENV_SXP, EMPTYENV_SXP, BASEENV_SXP = 255, 254, 253, 242, 241
ALTREP_SXP, ATTRLISTSXP, ATTRLANGSXP = 238, 239, 240
NA_INTEGER = -(2**31)
R_XLEN_T_MAX = 2**52  # R's longest vector (R_XLEN_T_MAX)
IS_OBJECT_BIT, HAS_ATTR_BIT, HAS_TAG_BIT = 1 << 8, 1 << 9, 1 << 10
UTF8_MASK, LATIN1_MASK, BYTES_MASK = 1 << 3, 1 << 2, 1 << 1


class RList(list):
    """An R generic vector: a list with its names (or None) and other attributes."""

    def __init__(self, items, names=None, attributes=None):
        super().__init__(items)
        self.names: Optional[List[Optional[str]]] = names
        self.attributes: Dict[str, object] = attributes or {}

    def as_dict(self) -> Dict[str, object]:
        if self.names is None:
            raise DataError("R list has no names")
        return dict(zip(self.names, self))


class CompactSequence(Sequence):
    """An R compact sequence (ALTREP compact_intseq / compact_realseq): start + i * step for
    i < length, held as the three numbers R serializes, however long it claims to be."""

    def __init__(self, length: int, start, step, kind=int):
        self.length, self.start, self.step, self.kind = length, start, step, kind

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.length))]
        if index < 0:
            index += self.length
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} of a compact sequence of {self.length}")
        return self.kind(self.start + index * self.step)

    def __eq__(self, other) -> bool:
        if not isinstance(other, (list, tuple, CompactSequence)) or len(other) != len(self):
            return False
        return all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        return f"CompactSequence({self.length}, start={self.start}, step={self.step})"


class _Environment:
    """An R environment read from the stream (kept only as a back-reference target)."""


class _Reader:
    def __init__(self, data: bytes, source: str):
        self.data, self.position, self.source = data, 0, source
        self.references: List[object] = []

    def fail(self, what: str) -> DataError:
        return DataError(f"{self.source}: {what} at byte {self.position} of the R "
                         f"serialization")

    def take(self, count: int) -> bytes:
        end = self.position + count
        if count < 0 or end > len(self.data):
            raise self.fail(f"truncated: {count} more bytes needed, "
                            f"{len(self.data) - self.position} left")
        chunk = self.data[self.position:end]
        self.position = end
        return chunk

    def integer(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def length(self) -> int:
        length = self.integer()
        if length == -1:  # long vector: two more ints, upper and lower 32 bits
            upper, lower = struct.unpack(">II", self.take(8))
            length = (upper << 32) + lower
        if length < 0:
            raise self.fail(f"negative vector length {length}")
        return length

    def elements(self, smallest: int) -> int:
        """A vector length whose elements take at least `smallest` bytes each: checked
        against the bytes left before any element is read."""
        count = self.length()
        left = len(self.data) - self.position
        if count * smallest > left:
            raise self.fail(f"truncated: a vector of {count} elements needs at least "
                            f"{count * smallest} bytes, {left} left")
        return count

    def header(self) -> None:
        magic = self.take(2)
        if magic != b"X\n":
            raise self.fail(f"not an XDR R serialization (magic {magic!r}, expected b'X\\n')")
        version = self.integer()
        self.integer()  # the writer's R version
        self.integer()  # the minimal reader version
        if version == 3:
            self.take(self.integer())  # the writer's native encoding name
        elif version != 2:
            raise self.fail(f"serialization format {version} (expected 2 or 3)")

    def item(self):
        flags = self.integer()
        kind = flags & 0xFF
        if kind == NILVALUE_SXP:
            return None
        if kind in (GLOBALENV_SXP, EMPTYENV_SXP, BASEENV_SXP):
            return _Environment()
        if kind == REFSXP:
            index = flags >> 8 or self.integer()
            if not 1 <= index <= len(self.references):
                raise self.fail(f"back-reference {index} of {len(self.references)} objects")
            return self.references[index - 1]
        if kind == SYMSXP:
            name = self.item()
            self.references.append(name)
            return name
        if kind == ENVSXP:
            environment = _Environment()
            self.references.append(environment)
            self.integer()  # locked
            for _ in range(4):  # enclosure, frame, hash table, attributes
                self.item()
            return environment
        if kind in (LISTSXP, LANGSXP, ATTRLISTSXP, ATTRLANGSXP):
            return self.pairlist(flags)
        if kind == CHARSXP:
            return self.string(flags)
        if kind == ALTREP_SXP:
            return self.altrep()
        value = self.vector(kind)
        if flags & HAS_ATTR_BIT:
            attributes = self.attributes()
            if isinstance(value, RList):
                names = attributes.pop("names", None)
                value.names, value.attributes = names, attributes
        return value

    def pairlist(self, flags: int) -> RList:
        """A pairlist, walked iteratively along its cdr chain: (tag, value) cells."""
        items, names = [], []
        while True:
            if flags & HAS_ATTR_BIT:
                self.item()
            names.append(self.item() if flags & HAS_TAG_BIT else None)
            items.append(self.item())
            flags = self.integer()
            if flags & 0xFF == NILVALUE_SXP:
                return RList(items, names)
            if flags & 0xFF not in (LISTSXP, LANGSXP, ATTRLISTSXP, ATTRLANGSXP):
                raise self.fail(f"pairlist continued by type {flags & 0xFF}")

    def attributes(self) -> Dict[str, object]:
        flags = self.integer()
        if flags & 0xFF not in (LISTSXP, ATTRLISTSXP):
            raise self.fail(f"attributes of type {flags & 0xFF} (expected a pairlist)")
        cells = self.pairlist(flags)
        return dict(zip(cells.names, cells))

    def string(self, flags: int) -> Optional[str]:
        length = self.integer()
        if length == -1:
            return None  # NA_character_
        raw = self.take(length)
        encoding = "latin-1" if flags >> 12 & LATIN1_MASK else "utf-8"
        try:
            return raw.decode(encoding)
        except UnicodeDecodeError as error:
            raise self.fail(f"string not valid {encoding} ({error})") from None

    def vector(self, kind: int):
        if kind in (LGLSXP, INTSXP):
            count = self.length()
            values = list(struct.unpack(f">{count}i", self.take(4 * count)))
            return [None if v == NA_INTEGER else v for v in values]
        if kind == REALSXP:
            count = self.length()
            return list(struct.unpack(f">{count}d", self.take(8 * count)))
        if kind == CPLXSXP:
            count = self.length()
            parts = struct.unpack(f">{2 * count}d", self.take(16 * count))
            return [complex(parts[i], parts[i + 1]) for i in range(0, 2 * count, 2)]
        if kind == STRSXP:
            count = self.elements(4)  # each element a CHARSXP's flags at least
            values = []
            for _ in range(count):
                flags = self.integer()
                if flags & 0xFF != CHARSXP:
                    raise self.fail(f"character vector element of type {flags & 0xFF}")
                values.append(self.string(flags))
            return values
        if kind in (VECSXP, EXPRSXP):
            return RList([self.item() for _ in range(self.elements(4))])
        if kind == RAWSXP:
            return self.take(self.length())
        raise self.fail(f"unsupported R object type {kind}")

    def altrep(self):
        """Compact integer/double sequences (the only ALTREP classes data sets hold)."""
        info = self.item()  # pairlist (class symbol, package symbol, base type)
        state = self.item()
        self.item()  # attributes
        name = info[0] if isinstance(info, list) and info else None
        if name in ("compact_intseq", "compact_realseq"):
            if not (isinstance(state, list) and len(state) == 3 and all(
                    isinstance(x, (int, float)) and math.isfinite(x) for x in state)):
                raise self.fail(f"{name} state {state!r} is not (length, start, step)")
            count, start, step = state
            if count != int(count) or not 0 <= count <= R_XLEN_T_MAX:
                raise self.fail(f"{name} of length {count}")
            count = int(count)
            if name == "compact_intseq":
                last = start + (count - 1) * step if count else start
                if start != int(start) or step != int(step) or not all(
                        NA_INTEGER < x < 2**31 for x in (start, last)):
                    raise self.fail(f"compact_intseq from {start} by {step} is not an R integer "
                                    f"sequence")
                return CompactSequence(count, int(start), int(step), int)
            return CompactSequence(count, float(start), float(step), float)
        if name in ("wrap_integer", "wrap_real", "wrap_string", "wrap_logical"):
            return state[0]
        raise self.fail(f"unsupported ALTREP class {name!r}")


def unserialize(data: bytes, source: str = "<bytes>"):
    """The R object in `data` (an uncompressed XDR serialization)."""
    reader = _Reader(data, source)
    reader.header()
    value = reader.item()
    if reader.position != len(data):
        raise reader.fail(f"{len(data) - reader.position} trailing bytes after the object")
    return value


def read_rds(path: str):
    """An R object from a gzip-compressed serialization (an .rds file or an .rdx index)."""
    try:
        with gzip.open(path, "rb") as file:
            data = file.read()
    except (OSError, EOFError, zlib.error) as error:
        raise DataError(f"{path}: not a readable gzip file ({error})") from None
    return unserialize(data, path)


def lazy_load_index(rdx_path: str) -> Dict[str, Tuple[int, int]]:
    """Name -> (offset, length) in the .rdb, from a lazy-load .rdx index."""
    index = read_rds(rdx_path)
    if not isinstance(index, RList) or index.names is None or "variables" not in index.names:
        raise DataError(f"{rdx_path}: not a lazy-load index (no 'variables' entry)")
    variables = index.as_dict()["variables"]
    if not isinstance(variables, RList) or variables.names is None:
        raise DataError(f"{rdx_path}: 'variables' is not a named list")
    entries = {}
    for name, position in zip(variables.names, variables):
        if not isinstance(position, (list, CompactSequence)) or len(position) != 2:
            raise DataError(f"{rdx_path}: entry {name!r} is not an (offset, length) pair")
        entries[name] = (int(position[0]), int(position[1]))
    return entries


def lazy_load_object(rdb_path: str, offset: int, length: int, name: str = "?"):
    """The object stored at [offset, offset + length) of a lazy-load .rdb: a 4-byte
    big-endian uncompressed length followed by a zlib stream of the serialization."""
    with open(rdb_path, "rb") as file:
        file.seek(offset)
        record = file.read(length)
    source = f"{rdb_path} (object {name!r})"
    if len(record) != length or length < 4:
        raise DataError(f"{source}: truncated: {len(record)} of {length} bytes at offset "
                        f"{offset}")
    expected = struct.unpack(">I", record[:4])[0]
    try:
        data = zlib.decompress(record[4:])
    except zlib.error as error:
        raise DataError(f"{source}: corrupt zlib stream ({error})") from None
    if len(data) != expected:
        raise DataError(f"{source}: {len(data)} bytes decompressed, header says {expected}")
    return unserialize(data, source)
