"""A run directory holds one run, written by one process at a time: a CLAIM file, locked by
the process that owns it, names it (a claim whose process has died is free), and a
trainer that does not resume refuses a directory that already holds a run unless told to
overwrite it. Write failures (a full disk) name the file."""

import fcntl
import os
from typing import Dict, List, Optional

CLAIM = "CLAIM"


class RunFileError(OSError):
    """A file of a run that could not be written or read; the message names it."""

    def __init__(self, path: str, action: str, error: OSError):
        reason = error.strerror or str(error)
        super().__init__(error.errno, f"{path}: cannot {action} ({reason})")
        self.message = f"{path}: cannot {action} ({reason})"

    def __str__(self) -> str:
        return self.message


def owner(directory: str) -> Optional[int]:
    """The pid in directory's claim, None without one (or an unreadable one)."""
    try:
        with open(os.path.join(directory, CLAIM)) as file:
            return int(file.read().strip() or 0) or None
    except (OSError, ValueError):
        return None


# The claims this process holds: the claim file's path -> its open, locked descriptor.
_held: Dict[str, int] = {}


def _claim_path(directory: str) -> str:
    return os.path.realpath(os.path.join(directory, CLAIM))


def holds(directory: str) -> bool:
    """True if this process holds directory's claim."""
    return _claim_path(directory) in _held


def claim(directory: str) -> bool:
    """True if this process now owns `directory` (newly, or already); False while another
    live process owns it. A claim is an exclusive lock on the CLAIM file, which holds the
    owner's pid for messages: the kernel drops the lock when its process dies, so a dead
    worker's claim is free at once, two workers can never both take one (a pid written
    into a file after creating it leaves a moment when the claim looks dead), and a pid
    reused after a reboot holds nothing."""
    os.makedirs(directory, exist_ok=True)
    path = _claim_path(directory)
    if path in _held:
        return True
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)  # the file its owner removed as it released the claim: open anew
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _held[path] = fd
    return True


def release(directory: str) -> None:
    """Gives up directory's claim if this process holds it."""
    path = _claim_path(directory)
    fd = _held.pop(path, None)
    if fd is None:
        return
    try:
        os.remove(path)  # while still locked: a waiting worker then sees no stale file
    except FileNotFoundError:
        pass
    os.close(fd)


def present(directory: str, names: List[str]) -> List[str]:
    """The files of `names` that exist in `directory`."""
    return [name for name in names if os.path.lexists(os.path.join(directory, name))]


def remove(directory: str, names: List[str]) -> None:
    for name in present(directory, names):
        path = os.path.join(directory, name)
        try:
            os.remove(path)
        except OSError as error:
            raise RunFileError(path, "remove it", error) from None
