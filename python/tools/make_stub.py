"""Writes python/subquad/_core.pyi, the type stub of the extension, from the installed
module: nanobind's stubgen output with a readable array alias; return types are the
bindings' own (typed returns, python/src/arrays.h), so nothing here lists functions.
Run after changing the bindings: .venv/bin/python python/tools/make_stub.py"""

import pathlib
import re

from nanobind.stubgen import StubGen

import subquad._core

ARRAY = "NDArray[Any]"

HEADER = '''from typing import Any

from numpy.typing import NDArray

# A CPU array of dtype float32 or float64: a NumPy array, or at run time any object that
# exports DLPack or the buffer protocol. Outputs are new NumPy arrays of the inputs' dtype.
Array = NDArray[Any]
'''


def render_stub() -> str:
    generator = StubGen(subquad._core)
    with subquad._views.original_methods():  # not the wrappers that materialise torch views
        generator.put(subquad._core)
    text = generator.get()
    text = text.replace("Annotated[NDArray, dict(device='cpu', writable=False)]", "Array")
    # Return types come from the bindings' signatures (python/src/arrays.h: ArrayResult,
    # ArrayPair, ...): a new NumPy array of the inputs' dtype.
    text = text.replace("Annotated[NDArray, dict(device='cpu')]", ARRAY)
    text = text.replace("from typing import Annotated\n\nfrom numpy.typing import NDArray\n",
                        HEADER)

    untyped = re.findall(r"def (\w+)\(.*\) -> (?:object|tuple):", text)
    if untyped:
        raise SystemExit("make_stub: give these bindings a typed return (python/src/arrays.h): "
                         + ", ".join(untyped))
    # A mutable default is what stubgen prints for an empty std::vector; stubs use "...".
    return re.sub(r"(Sequence\[\w+\]) = \[\]", r"\1 = ...", text)


def stub_path() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parents[1] / "subquad" / "_core.pyi"


if __name__ == "__main__":
    stub_path().write_text(render_stub())
