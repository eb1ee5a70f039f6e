"""Errors and integrity checks shared by the data loaders: a packaged file is read only
after its sha256 matches the digest recorded for the Debian package that ships it."""

import hashlib
import os
from typing import Optional


class DataError(ValueError):
    """A data file that is missing, corrupt, truncated or not in the expected format."""


def require_file(path: str, package: str) -> str:
    """`path` if it is a readable file; otherwise a DataError saying how to install it."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: not found; install the Debian package {package} "
                        f"(scripts/install.sh does)")
    return path


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: str, expected: Optional[str]) -> None:
    """Raise DataError unless the file's sha256 is `expected` (None skips the check: for
    files that are not the packaged ones, such as test fixtures)."""
    if expected is None:
        return
    actual = sha256_of(path)
    if actual != expected:
        raise DataError(f"{path}: sha256 {actual} does not match the packaged file's "
                        f"{expected}; the file is corrupt, truncated or from another "
                        f"version (reinstall its package)")
