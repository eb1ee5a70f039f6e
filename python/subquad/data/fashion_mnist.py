"""Fashion-MNIST (Xiao et al. 2017) from Debian's dataset-fashion-mnist: the IDX files
(gzip) of the standard split, 60,000 training and 10,000 test 28 x 28 greyscale images in
10 classes. Each file's sha256 is checked before it is parsed."""

import gzip
import os
import struct
import zlib
from typing import Optional, Tuple

import numpy as np

from .errors import DataError, require_file, verify_sha256

DIRECTORY = "/usr/share/datasets/fashion-mnist"
PACKAGE = "dataset-fashion-mnist"
FILES = {  # split -> (images, labels)
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
SHA256 = {  # of the files dataset-fashion-mnist 0.0~git20200523.55506a9-1 installs
    "train-images-idx3-ubyte.gz":
        "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    "train-labels-idx1-ubyte.gz":
        "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    "t10k-images-idx3-ubyte.gz":
        "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    "t10k-labels-idx1-ubyte.gz":
        "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
}
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
           "Sneaker", "Bag", "Ankle boot")
IDX_UBYTE = 0x08  # the IDX type code of unsigned bytes


def read_idx(path: str) -> np.ndarray:
    """An IDX file (gzip-compressed) as a uint8 array of the shape its header states."""
    try:
        with gzip.open(path, "rb") as file:
            data = file.read()
    except (OSError, EOFError, zlib.error) as error:
        raise DataError(f"{path}: not a readable gzip file ({error})") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise DataError(f"{path}: not an IDX file (bad magic number)")
    if data[2] != IDX_UBYTE:
        raise DataError(f"{path}: IDX element type {data[2]:#x}, expected unsigned byte "
                        f"({IDX_UBYTE:#x})")
    rank = data[3]
    header = 4 + 4 * rank
    if len(data) < header:
        raise DataError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{rank}I", data[4:header])
    expected = int(np.prod(shape, dtype=np.int64))
    if len(data) - header != expected:
        raise DataError(f"{path}: {len(data) - header} data bytes, the header's shape "
                        f"{shape} needs {expected} (truncated or corrupt)")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def load_fashion_mnist(split: str = "train", directory: str = DIRECTORY,
                       verify: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 28, 28], labels int64 [N]) of split "train" or "test".

    verify=False skips the sha256 check (for files other than the packaged ones)."""
    if split not in FILES:
        raise ValueError(f"split: expected one of {sorted(FILES)}, got {split!r}")
    arrays = []
    for name in FILES[split]:
        path = require_file(os.path.join(directory, name), PACKAGE)
        verify_sha256(path, SHA256[name] if verify else None)
        arrays.append(read_idx(path))
    images, labels = arrays
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(f"{directory}: images {images.shape} and labels {labels.shape} "
                        f"do not pair up as [N, H, W] and [N]")
    if labels.max(initial=0) >= len(CLASSES):
        raise DataError(f"{directory}: label {labels.max()} outside 0..{len(CLASSES) - 1}")
    return images, labels.astype(np.int64)


def normalise(images: np.ndarray, mean: Optional[float] = None,
              std: Optional[float] = None) -> np.ndarray:
    """uint8 [N, H, W] -> float32 [N, 1, H, W], standardised (statistics of `images`
    unless given: pass the training set's for the test set)."""
    pixels = images.astype(np.float32) / 255.0
    mean = float(pixels.mean()) if mean is None else mean
    std = float(pixels.std()) if std is None else std
    return ((pixels - mean) / std)[:, None]
