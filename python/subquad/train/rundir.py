"""A run directory holds one run, written by one process at a time: a CLAIM file names the
process that owns it (a claim whose process has died is taken over), and a trainer that
does not resume refuses a directory that already holds a run unless told to overwrite it.
Write failures (a full disk) name the file."""

import errno
import os
from typing import List, Optional

CLAIM = "CLAIM"


class RunFileError(OSError):
    """A file of a run that could not be written or read; the message names it."""

    def __init__(self, path: str, action: str, error: OSError):
        reason = error.strerror or str(error)
        super().__init__(error.errno, f"{path}: cannot {action} ({reason})")
        self.message = f"{path}: cannot {action} ({reason})"

    def __str__(self) -> str:
        return self.message


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as error:
        return error.errno == errno.EPERM
    return True


def owner(directory: str) -> Optional[int]:
    """The pid in directory's claim, None without one (or an unreadable one)."""
    try:
        with open(os.path.join(directory, CLAIM)) as file:
            return int(file.read().strip() or 0) or None
    except (OSError, ValueError):
        return None


def claim(directory: str) -> bool:
    """True if this process now owns `directory` (created, already its own, or taken over
    from a process that has died); False while another live process owns it."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, CLAIM)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pid = owner(directory)
            if pid and (pid == os.getpid() or _alive(pid)):
                return pid == os.getpid()
            try:
                os.remove(path)  # a dead process's claim
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w") as file:
            file.write(str(os.getpid()))
        return True
    return False


def release(directory: str) -> None:
    """Removes the claim of `directory` if this process holds it."""
    if owner(directory) == os.getpid():
        try:
            os.remove(os.path.join(directory, CLAIM))
        except FileNotFoundError:
            pass


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
