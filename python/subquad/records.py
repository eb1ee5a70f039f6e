"""Where and how a run was made, for its result record: the CPU model and core count, the
commit (with a flag when the working tree differs from it), and the load average."""

import os
import platform
import subprocess
from typing import Dict


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit(short: bool = True) -> str:
    """HEAD's hash, with "-dirty" when tracked files outside runs/ differ from it;
    "unknown" outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", *(["--short"] if short else []), "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        # Campaign records under runs/ change as runs train; they are not code.
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", ".", ":!runs"],
                               capture_output=True).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def load_average() -> float:
    """The 1-minute load average (the other work on the machine while a run trained)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def machine() -> Dict[str, object]:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "commit": git_commit()}
