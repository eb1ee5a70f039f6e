"""The GCIDE loader (subquad.data.gcide) on small dictd fixtures written here: markup
removal, decoding, refusal of truncated, corrupt or mismatched files, and the split; and
on the installed dict-gcide when it is there."""

import gzip
import os

import pytest

from subquad.data import DataError, gcide, gcide_splits

DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
INSTALLED = all(os.path.isfile(os.path.join(gcide.DIRECTORY, name)) for name in gcide.SHA256)


def base64(value: int) -> str:
    digits = ""
    while True:
        digits = DIGITS[value % 64] + digits
        value //= 64
        if value == 0:
            return digits


def write_dictionary(directory, records, index_extra=()):
    """records: (headwords, entry bytes); writes gcide.dict.dz (gzip) and gcide.index the
    way dictd does (entries separated by one newline)."""
    data, index = b"", []
    for headwords, entry in records:
        offset = len(data)
        data += entry + b"\n"
        index += [f"{word}\t{base64(offset)}\t{base64(len(entry))}" for word in headwords]
    with gzip.open(os.path.join(directory, "gcide.dict.dz"), "wb") as file:
        file.write(data)
    with open(os.path.join(directory, "gcide.index"), "w", encoding="utf-8") as file:
        file.write("\n".join(index + list(index_extra)) + "\n")


RECORDS = [
    (["00-database-url", "00-gcide-url"], b"\n\n00-database-url\n   ftp://ftp.gnu.org\n"),
    (["Abb", "abb"], b"Abb \\Abb\\, n.\n   Wool for the warp. See {Warp}.\n   [1913 Webster]\n"
                     b"   2. Yarn.\n   [1913 Webster]\n"),
    (["Zoo"], b"Zoo \\Zoo\\, n.\n   A park. [Colloq.] [WordNet 1.5 +PJC]\n\n   Syn: menagerie\n"
              b"        [WordNet 1.5]\n"),
    (["Cafe"], b"Caf\xe9 \\Ca*f\xe9\\, n.\n   A coffee house\x92s room.\n"),
]


def test_entries_without_markup(tmp_path):
    write_dictionary(tmp_path, RECORDS)
    entries = gcide.load_gcide(str(tmp_path), verify=False)
    assert entries == [
        "Abb \\Abb\\, n.\n   Wool for the warp. See Warp.\n   2. Yarn.",
        "Zoo \\Zoo\\, n.\n   A park. [Colloq.]\n\n   Syn: menagerie",
        "Caf\u00e9 \\Ca*f\u00e9\\, n.\n   A coffee house\u2019s room.",  # Windows-1252 line
    ]


def test_truncated_or_corrupt_files_are_refused(tmp_path):
    write_dictionary(tmp_path, RECORDS * 50)
    path = tmp_path / "gcide.dict.dz"
    whole = path.read_bytes()
    path.write_bytes(whole[:len(whole) // 2])  # a cut gzip stream (EOFError in gzip)
    with pytest.raises(DataError, match="gzip"):
        gcide.load_gcide(str(tmp_path), verify=False)
    path.write_bytes(whole[:10] + bytes(len(whole) - 10))  # corrupt deflate data
    with pytest.raises(DataError, match="gzip"):
        gcide.load_gcide(str(tmp_path), verify=False)
    with gzip.open(path, "wb") as file:  # a complete gzip holding part of the entries
        file.write(b"x" * 100)
    with pytest.raises(DataError, match="ends past"):
        gcide.load_gcide(str(tmp_path), verify=False)


def test_bad_index_checksum_and_missing_files(tmp_path):
    write_dictionary(tmp_path, RECORDS, index_extra=["Oops\tA*\tB"])
    with pytest.raises(DataError, match="base-64"):
        gcide.load_gcide(str(tmp_path), verify=False)
    write_dictionary(tmp_path, RECORDS, index_extra=["no tabs here"])
    with pytest.raises(DataError, match="tabs"):
        gcide.load_gcide(str(tmp_path), verify=False)
    write_dictionary(tmp_path, RECORDS)
    with pytest.raises(DataError, match="sha256"):
        gcide.load_gcide(str(tmp_path), verify=True)
    os.remove(tmp_path / "gcide.index")
    with pytest.raises(DataError, match="dict-gcide"):
        gcide.load_gcide(str(tmp_path), verify=False)


def test_split_is_deterministic_disjoint_and_covering(tmp_path):
    records = [([f"w{i:04d}"], f"w{i:04d} \\w\\, n.\n   Sense {i:04d}.\n".encode())
               for i in range(1000)]
    write_dictionary(tmp_path, records)
    entries = gcide.load_gcide(str(tmp_path), verify=False)
    splits = gcide_splits(str(tmp_path), verify=False, parts=5)
    assert splits == gcide.split_entries(entries, parts=5)
    pieces = {name: text.split("\n\n") for name, text in splits.items()}
    assert sorted(sum(pieces.values(), [])) == sorted(entries)  # each entry once
    # Equal entries: of every 200 (a part), the last 2% are held out, 1% each.
    assert len(pieces["validation"]) == len(pieces["test"]) == 10
    assert pieces["validation"][:2] == [entries[196], entries[197]]
    assert pieces["test"][:2] == [entries[198], entries[199]]
    assert pieces["train"][196] == entries[200]
    with pytest.raises(ValueError, match="parts"):
        gcide.split_entries(entries, parts=0)


@pytest.mark.skipif(not INSTALLED, reason="dict-gcide missing (scripts/install.sh)")
def test_installed_gcide():
    splits = gcide_splits()
    sizes = {name: len(text) for name, text in splits.items()}
    assert 30_000_000 < sizes["train"] < 40_000_000
    for name in ("validation", "test"):
        assert 0.009 < sizes[name] / sizes["train"] < 0.011
    assert splits["validation"].startswith("Agouara \\A*gou\"a*ra\\, n.")
    for text in splits.values():
        assert "[1913 Webster]" not in text and "{" not in text and "\ufffd" not in text
