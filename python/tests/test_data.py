"""subquad.data: the loaders on the packaged files and on small fixtures written here (an R
lazy-load database, IDX files, ETT CSVs), corrupt and truncated files rejected with clear
errors, the in-context regression sampler and curriculum, and the tokenisers."""

import gzip
import os
import shutil
import struct
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from subquad import data  # noqa: E402
from subquad.data import austen, ett, fashion_mnist, mobydick, rds  # noqa: E402

AUSTEN_INSTALLED = os.path.isfile(os.path.join(austen.DIRECTORY, "Rdata.rdb"))
FASHION_INSTALLED = os.path.isdir(fashion_mnist.DIRECTORY)
needs_austen = pytest.mark.skipif(not AUSTEN_INSTALLED, reason="r-cran-janeaustenr missing "
                                  "(scripts/install.sh installs it)")
needs_fashion = pytest.mark.skipif(not FASHION_INSTALLED, reason="dataset-fashion-mnist "
                                   "missing (scripts/install.sh installs it)")


# --------------------------------------------------------------------------------------
# A minimal writer of R's XDR serialization (format 3), enough for the fixtures: named
# generic vectors, character and integer vectors, symbols written once and then as
# back-references, exactly as R writes them.


class _Writer:
    def __init__(self):
        self.out, self.symbols = bytearray(), {}

    def int(self, value):
        self.out += struct.pack(">i", value)

    def symbol(self, name):
        if name in self.symbols:
            self.int(255 | (self.symbols[name] << 8))  # REFSXP with the index packed
            return
        self.int(1)  # SYMSXP
        self.charsxp(name)
        self.symbols[name] = len(self.symbols) + 1

    def charsxp(self, text):
        raw = text.encode()
        self.int(9 | (1 << 3 << 12))  # CHARSXP, UTF-8
        self.int(len(raw))
        self.out += raw

    def names_attribute(self, names):
        self.int(2 | (1 << 10))  # LISTSXP with a tag
        self.symbol("names")
        self.strsxp(names)
        self.int(254)  # end of the pairlist

    def strsxp(self, values, names=None):
        self.int(16 | ((names is not None) << 9))
        self.int(len(values))
        for value in values:
            self.charsxp(value)
        if names is not None:
            self.names_attribute(names)

    def intsxp(self, values):
        self.int(13)
        self.int(len(values))
        for value in values:
            self.int(value)

    def named_list(self, items):
        self.int(19 | (1 << 9))  # VECSXP with attributes
        self.int(len(items))
        for value in items.values():
            value(self)
        self.names_attribute(list(items))

    def serialized(self):
        header = b"X\n" + struct.pack(">iii", 3, 0x040202, 0x030500)
        return header + struct.pack(">i", 5) + b"UTF-8" + bytes(self.out)


def write_lazy_load_db(directory, objects):
    """Rdata.rdb/.rdx holding character vectors `objects` (name -> list of str)."""
    rdb, positions = bytearray(), {}
    for name, lines in objects.items():
        writer = _Writer()
        writer.strsxp(lines)
        payload = writer.serialized()
        record = struct.pack(">I", len(payload)) + zlib.compress(payload)
        positions[name] = (len(rdb), len(record))
        rdb += record
    index = _Writer()
    index.named_list({
        "variables": lambda w: w.named_list(
            {name: (lambda w, p=p: w.intsxp(list(p))) for name, p in positions.items()}),
        "references": lambda w: w.named_list({}),
        "compressed": lambda w: w.intsxp([1]),
    })
    with open(os.path.join(directory, "Rdata.rdb"), "wb") as file:
        file.write(rdb)
    with gzip.open(os.path.join(directory, "Rdata.rdx"), "wb") as file:
        file.write(index.serialized())


NOVEL_LINES = {name: [name.upper(), "", f"the first line of {name}", "", "the last line"]
               for name in austen.NOVELS}


# --------------------------------------------------------------------------------------
# Jane Austen


def test_lazy_load_fixture_round_trips_with_back_references(tmp_path):
    write_lazy_load_db(tmp_path, NOVEL_LINES)
    index = rds.lazy_load_index(str(tmp_path / "Rdata.rdx"))
    assert sorted(index) == sorted(austen.NOVELS)
    novels = data.load_novels(str(tmp_path), verify=False)
    assert novels["emma"] == "\n".join(NOVEL_LINES["emma"])


def test_austen_split_holds_out_persuasion_on_fixture(tmp_path):
    write_lazy_load_db(tmp_path, NOVEL_LINES)
    splits = data.austen_splits(str(tmp_path), verify=False)
    assert "PERSUASION" not in splits["train"] and "EMMA" in splits["train"]
    assert splits["validation"].startswith("PERSUASION")
    assert splits["test"].endswith("the last line")
    assert "PERSUASION" not in splits["test"]


def test_truncated_rdb_is_rejected(tmp_path):
    write_lazy_load_db(tmp_path, NOVEL_LINES)
    path = tmp_path / "Rdata.rdb"
    content = path.read_bytes()
    path.write_bytes(content[:len(content) - 7])
    with pytest.raises(data.DataError, match="truncated"):
        data.load_novels(str(tmp_path), verify=False)


def test_corrupt_zlib_stream_is_rejected(tmp_path):
    write_lazy_load_db(tmp_path, NOVEL_LINES)
    path = tmp_path / "Rdata.rdb"
    content = bytearray(path.read_bytes())
    content[10] ^= 0xFF  # inside the first object's zlib stream
    path.write_bytes(bytes(content))
    with pytest.raises(data.DataError, match="zlib|decompressed|serialization"):
        data.load_novels(str(tmp_path), verify=False)


def test_truncated_serialization_names_the_position():
    writer = _Writer()
    writer.strsxp(["a line", "another"])
    payload = writer.serialized()
    assert rds.unserialize(payload) == ["a line", "another"]
    with pytest.raises(data.DataError, match="truncated.*at byte"):
        rds.unserialize(payload[:-3])
    with pytest.raises(data.DataError, match="not an XDR"):
        rds.unserialize(b"A\n" + payload[2:])


def test_missing_package_says_how_to_install(tmp_path):
    with pytest.raises(data.DataError, match="r-cran-janeaustenr"):
        data.load_novels(str(tmp_path / "nowhere"))


@needs_austen
def test_packaged_novels():
    novels = data.load_novels()
    assert sorted(novels) == sorted(austen.NOVELS)
    assert novels["prideprejudice"].startswith("PRIDE AND PREJUDICE")
    assert "It is a truth universally acknowledged" in novels["prideprejudice"]
    assert novels["persuasion"].startswith("Persuasion")
    splits = data.austen_splits()
    assert "Sir Walter Elliot" not in splits["train"]
    assert "Sir Walter Elliot" in splits["validation"]
    assert abs(len(splits["validation"]) - len(splits["test"])) < 0.01 * len(novels["persuasion"])


@needs_austen
def test_corrupt_packaged_copy_fails_the_checksum(tmp_path):
    for name in ("Rdata.rdb", "Rdata.rdx"):
        shutil.copy(os.path.join(austen.DIRECTORY, name), tmp_path / name)
    path = tmp_path / "Rdata.rdb"
    content = bytearray(path.read_bytes())
    content[len(content) // 2] ^= 0x01
    path.write_bytes(bytes(content))
    with pytest.raises(data.DataError, match="sha256"):
        data.load_novels(str(tmp_path))


# --------------------------------------------------------------------------------------
# Moby Dick (r-cran-tokenizers)

GUTENBERG_FIXTURE = ("\ufeffThe Project Gutenberg EBook of X\r\n\r\n*** START OF THIS PROJECT "
                     "GUTENBERG EBOOK X ***\r\n\r\nCall me Ishmael.\r\nSome years ago.\r\n\r\n"
                     "*** END OF THIS PROJECT GUTENBERG EBOOK X ***\r\nlicense\r\n")


def test_mobydick_fixture_is_the_body_between_the_markers(tmp_path):
    write_lazy_load_db(tmp_path, {"mobydick": [GUTENBERG_FIXTURE]})
    assert mobydick.load_mobydick(str(tmp_path), verify=False) == \
        "Call me Ishmael.\nSome years ago."
    write_lazy_load_db(tmp_path, {"mobydick": ["no markers here"]})
    with pytest.raises(data.DataError, match="START OF"):
        mobydick.load_mobydick(str(tmp_path), verify=False)
    write_lazy_load_db(tmp_path, {"mobydick": ["two", "strings"]})
    with pytest.raises(data.DataError, match="one string"):
        mobydick.load_mobydick(str(tmp_path), verify=False)
    with pytest.raises(data.DataError, match="r-cran-tokenizers"):
        mobydick.load_mobydick(str(tmp_path / "nowhere"))


@pytest.mark.skipif(not os.path.isfile(os.path.join(mobydick.DIRECTORY, "Rdata.rdb")),
                    reason="r-cran-tokenizers missing (scripts/install.sh installs it)")
def test_packaged_mobydick():
    text = mobydick.load_mobydick()
    assert "Call me Ishmael." in text[:30000] and "\r" not in text
    assert "Project Gutenberg License" not in text and len(text) > 1_200_000


# --------------------------------------------------------------------------------------
# Fashion-MNIST


def write_idx(path, array):
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as file:
        file.write(header + array.astype(np.uint8).tobytes())


def test_idx_fixture_and_truncation(tmp_path):
    images = np.arange(3 * 28 * 28).reshape(3, 28, 28) % 256
    labels = np.array([0, 9, 4])
    images_name, labels_name = fashion_mnist.FILES["test"]
    write_idx(tmp_path / images_name, images)
    write_idx(tmp_path / labels_name, labels)
    read_images, read_labels = data.load_fashion_mnist("test", str(tmp_path), verify=False)
    assert np.array_equal(read_images, images) and np.array_equal(read_labels, labels)
    with gzip.open(tmp_path / images_name, "rb") as file:
        content = file.read()
    with gzip.open(tmp_path / images_name, "wb") as file:
        file.write(content[:-100])
    with pytest.raises(data.DataError, match="truncated or corrupt"):
        data.load_fashion_mnist("test", str(tmp_path), verify=False)
    (tmp_path / labels_name).write_bytes(b"not gzip at all")
    with pytest.raises(data.DataError, match="gzip"):
        fashion_mnist.read_idx(str(tmp_path / labels_name))


@needs_fashion
def test_packaged_fashion_mnist_test_split():
    images, labels = data.load_fashion_mnist("test")
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8
    assert np.array_equal(np.bincount(labels), np.full(10, 1000))


@needs_fashion
def test_truncated_packaged_copy_fails_the_checksum(tmp_path):
    for name in fashion_mnist.FILES["test"]:
        shutil.copy(os.path.join(fashion_mnist.DIRECTORY, name), tmp_path / name)
    path = tmp_path / fashion_mnist.FILES["test"][1]
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(data.DataError, match="sha256"):
        data.load_fashion_mnist("test", str(tmp_path))


# --------------------------------------------------------------------------------------
# ETT


def test_packaged_ett_split_and_z_scores():
    for name in ("ETTh1", "ETTh2"):
        splits = data.load_ett(name)
        assert splits["train"].shape == (8640, 7)
        assert splits["validation"].shape == splits["test"].shape == (2880, 7)
        assert np.allclose(splits["train"].mean(axis=0), 0, atol=1e-4)
        assert np.allclose(splits["train"].std(axis=0), 1, atol=1e-4)
    inputs, targets = data.forecast_windows(splits, "test", 96, 24)
    assert inputs.shape == (2857, 96, 7) and targets.shape == (2857, 24, 7)
    assert np.array_equal(targets[0], splits["test"][:24])  # first target: test's first row
    assert np.array_equal(inputs[0][-1], splits["validation"][-1])


def test_ett_fixture_corrupt_rows_and_checksum(tmp_path):
    source = os.path.join(ett.DIRECTORY, "ETTh1.csv")
    with open(source) as file:
        lines = file.readlines()
    broken = tmp_path / "ETTh1.csv"
    broken.write_text("".join(lines[:100] + ["2016-07-05 03:00:00,1.0,2.0\n"] + lines[101:]))
    with pytest.raises(data.DataError, match="sha256"):
        data.load_ett("ETTh1", str(tmp_path))
    with pytest.raises(data.DataError, match=r"ETTh1.csv:101: 3 fields"):
        data.load_ett("ETTh1", str(tmp_path), verify=False)
    broken.write_text("".join(lines[:5000]))
    with pytest.raises(data.DataError, match="rows, the standard split needs"):
        data.load_ett("ETTh1", str(tmp_path), verify=False)


# --------------------------------------------------------------------------------------
# In-context regression and tokenisers


def test_linear_regression_samples_and_curriculum():
    generator = torch.Generator().manual_seed(0)
    xs, ys = data.sample_linear_regression(4, 7, 6, 3, generator)
    assert xs.shape == (4, 7, 6) and ys.shape == (4, 7)
    assert (xs[:, :, 3:] == 0).all() and (xs[:, :, :3] != 0).all()
    # y = w . x exactly: the 3 active coordinates of 3 points determine w per sequence.
    w = torch.linalg.solve(xs[:, :3, :3], ys[:, :3].unsqueeze(-1))
    assert torch.allclose((xs[:, :, :3] @ w).squeeze(-1), ys, atol=1e-4)
    curriculum = data.Curriculum(5, 20, 11, 41, interval=2000)
    assert curriculum.at(0) == (5, 11) and curriculum.at(3999) == (6, 13)
    assert curriculum.at(10**6) == (20, 41)
    with pytest.raises(ValueError, match="dims"):
        data.Curriculum(5, 4, 11, 41)


def test_prefix_least_squares_is_the_minimum_norm_fit_of_the_pairs_before():
    generator = torch.Generator().manual_seed(1)
    xs, ys = data.sample_linear_regression(3, 9, 6, 4, generator)  # 4 active dims
    predictions = data.prefix_least_squares(xs, ys)
    assert predictions.shape == ys.shape and (predictions[:, 0] == 0).all()
    # from 4 points on, w is determined: exact predictions; before, a real error remains
    assert torch.allclose(predictions[:, 4:], ys[:, 4:], atol=1e-4)
    assert ((predictions[:, 1:4] - ys[:, 1:4]).abs().amax(dim=1) > 1e-3).all()
    # i = 2: the minimum-norm w of two equations, by the normal equations in float64
    x, y = xs[0, :2].double(), ys[0, :2].double()
    w = x.T @ torch.linalg.solve(x @ x.T, y)
    assert torch.allclose(predictions[0, 2].double(), xs[0, 2].double() @ w, atol=1e-5)
    with pytest.raises(ValueError, match="xs, ys"):
        data.prefix_least_squares(xs, ys[:, :5])


def test_tokenisers_round_trip():
    text = "It is a truth universally acknowledged, that a single man in possession\n" * 20
    byte = data.ByteTokenizer()
    assert byte.decode(byte.encode("Élinor")) == "Élinor"
    bpe = data.BpeTokenizer.train([text], vocab_size=300)
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text and len(ids) < len(text) / 2
    assert 256 < bpe.vocab_size <= 300
    again = data.BpeTokenizer.from_json(bpe.to_json())
    assert np.array_equal(again.encode(text), ids)
    with pytest.raises(ValueError, match="tokenizer"):
        data.make_tokenizer("words", text)
