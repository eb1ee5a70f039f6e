"""Optional dependencies: a subpackage checks the packages of its extra when it is imported,
so that a missing one is an ImportError naming the package and the extra that installs it
(pyproject.toml's [project.optional-dependencies]), not a ModuleNotFoundError deep inside
a call."""

import importlib.util
import sys
from typing import Iterable


class MissingDependency(ModuleNotFoundError):
    """An optional package that a subpackage of subquad needs is not installed."""


def is_available(module: str) -> bool:
    """Whether `module` (a top-level name) can be imported, without importing it."""
    if module in sys.modules:
        return sys.modules[module] is not None  # None: imports of it are refused
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(user: str, extra: str, modules: Iterable[str]) -> None:
    """Raises MissingDependency unless every module of `modules` is installed; `user` is
    what needs them (e.g. "subquad.llm"), `extra` the extra of subquad that installs them.
    Import names are the PyPI names of these packages (torch, tokenizers, gguf, ...)."""
    missing = [module for module in modules if not is_available(module)]
    if missing:
        names = ", ".join(missing)
        raise MissingDependency(
            f"{user} needs {'the package' if len(missing) == 1 else 'the packages'} {names}, "
            f"not installed: pip install 'subquad[{extra}]' (or pip install {' '.join(missing)})",
            name=missing[0])
