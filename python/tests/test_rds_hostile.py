"""subquad.data.rds on hostile serializations: counts that claim more than the bytes hold
are refused before anything is built from them, and R's compact sequences (ALTREP) stay
compact, so that a claimed length of 10^9 builds no list; malformed compact-sequence
states are DataErrors."""

import struct
import time
import tracemalloc

import pytest

pytest.importorskip("torch")  # test_data's fixtures writer lives with the torch-needing tests

from subquad.data import DataError, rds  # noqa: E402
from test_data import _Writer  # noqa: E402


def _compact(writer, name, state, length_field=None):
    """An ALTREP compact sequence: info pairlist (class, package, type), state, no
    attributes. `state` is written as a REALSXP (what R writes), unless it is None."""
    writer.int(238)  # ALTREP_SXP
    writer.int(2)  # LISTSXP: (class symbol, package symbol, base type)
    writer.symbol(name)
    writer.int(2)
    writer.symbol("base")
    writer.int(2)
    writer.intsxp([13 if name == "compact_intseq" else 14])
    writer.int(254)
    if state is None:
        writer.int(254)  # NULL state
    else:
        writer.int(14)  # REALSXP
        writer.int(len(state) if length_field is None else length_field)
        writer.out += struct.pack(f">{len(state)}d", *state)
    writer.int(254)  # attributes: NULL


def _read(build):
    writer = _Writer()
    build(writer)
    return rds.unserialize(writer.serialized())


def test_compact_sequences_read_as_r_holds_them():
    ints = _read(lambda w: _compact(w, "compact_intseq", [5, 3, 2]))
    assert list(ints) == [3, 5, 7, 9, 11] and ints == [3, 5, 7, 9, 11]
    assert all(isinstance(x, int) for x in ints) and ints[-1] == 11 and ints[1:3] == [5, 7]
    reals = _read(lambda w: _compact(w, "compact_realseq", [3, 1.5, -1]))
    assert list(reals) == [1.5, 0.5, -0.5] and isinstance(reals[0], float)
    assert list(_read(lambda w: _compact(w, "compact_intseq", [0, 1, 1]))) == []


def test_a_billion_element_sequence_builds_nothing():
    tracemalloc.start()
    start = time.perf_counter()
    value = _read(lambda w: _compact(w, "compact_intseq", [1e9, 1, 1]))
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(value) == 10**9 and value[10**9 - 1] == 10**9
    assert seconds < 1 and peak < 64 << 20  # the list would be tens of GB


@pytest.mark.parametrize("name, state, match", [
    ("compact_intseq", [-1, 1, 1], "length -1"),
    ("compact_intseq", [2.5, 1, 1], "length 2.5"),
    ("compact_intseq", [2**53, 1, 1], "length"),
    ("compact_intseq", [float("nan"), 1, 1], "not \\(length, start, step\\)"),
    ("compact_intseq", [3, 1], "not \\(length, start, step\\)"),
    ("compact_intseq", None, "not \\(length, start, step\\)"),
    ("compact_intseq", [3, 0.5, 1], "not an R integer sequence"),
    ("compact_intseq", [3, 2**31 - 2, 1], "not an R integer sequence"),
    ("compact_realseq", [3, float("inf"), 1], "not \\(length, start, step\\)"),
])
def test_malformed_compact_sequences_are_data_errors(name, state, match):
    with pytest.raises(DataError, match=match):
        _read(lambda w: _compact(w, name, state))


@pytest.mark.parametrize("kind", [16, 19])  # STRSXP, VECSXP
def test_a_vector_claiming_more_elements_than_bytes_is_refused_at_once(kind):
    writer = _Writer()
    writer.int(kind)
    writer.int(-1)  # a long vector: the length in two more ints
    writer.out += struct.pack(">II", 1, 0)  # 2^32 elements
    writer.charsxp("only one")
    start = time.perf_counter()
    with pytest.raises(DataError, match="vector of 4294967296 elements needs at least"):
        rds.unserialize(writer.serialized())
    assert time.perf_counter() - start < 1
