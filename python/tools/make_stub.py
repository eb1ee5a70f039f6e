"""Writes python/subquad/_core.pyi, the type stub of the extension, from the installed
module: nanobind's stubgen output with a readable array alias and precise return types.
Run after changing the bindings: .venv/bin/python python/tools/make_stub.py"""

import pathlib
import re

from nanobind.stubgen import StubGen

import subquad._core

ARRAY = "NDArray[Any]"
GRADIENTS = f"tuple[{ARRAY}, {ARRAY}, {ARRAY}]"
PAIR = f"tuple[{ARRAY}, {ARRAY}]"

# Functions whose binding returns nb::object / nb::tuple: their Python return types.
RETURNS = {
    "exact_attention_forward": PAIR, "exact_attention_backward": GRADIENTS,
    "merge_attention": PAIR, "merge_attention_backward": f"tuple[{ARRAY}, {ARRAY}, {ARRAY}, {ARRAY}]", "circulant2d_forward": PAIR, "circulant2d_backward": GRADIENTS,
    "circulant2d_grid_for_tokens": "tuple[int, int]", "mlr_attention_forward": PAIR,
    "mlr_attention_backward": GRADIENTS, "step": ARRAY, "bilinear_mlr_project_forward": ARRAY,
    "bilinear_mlr_project_backward": f"tuple[{ARRAY}, list[{ARRAY}]]",
    "btt_project_forward": ARRAY, "btt_project_backward": GRADIENTS,
    "btt_factors": "tuple[int, int]", "apply": ARRAY, "dense": ARRAY, "cat_forward": ARRAY,
    "cat_backward": PAIR, "cat_avgkey_forward": ARRAY, "cat_avgkey_backward": GRADIENTS,
    "cat_causal_forward": ARRAY, "cat_causal_backward": PAIR, "append": ARRAY,
    "wildcat_attention": ARRAY, "keys": ARRAY, "values": ARRAY, "log_scales": ARRAY, "value_min": ARRAY,
    "value_max": ARRAY, "attend": ARRAY, "update": ARRAY,
}

HEADER = '''from typing import Any

from numpy.typing import NDArray

# A CPU array of dtype float32 or float64: a NumPy array, or at run time any object that
# exports DLPack or the buffer protocol. Outputs are new NumPy arrays of the inputs' dtype.
Array = NDArray[Any]
'''


def render_stub() -> str:
    generator = StubGen(subquad._core)
    generator.put(subquad._core)
    text = generator.get()
    text = text.replace("Annotated[NDArray, dict(device='cpu', writable=False)]", "Array")
    text = text.replace("from typing import Annotated\n\nfrom numpy.typing import NDArray\n",
                        HEADER)

    def precise_return(match):
        name, parameters, result = match.groups()
        if result in ("object", "tuple"):
            result = RETURNS[name]
        return f"def {name}({parameters}) -> {result}:"

    text = re.sub(r"def (\w+)\((.*)\) -> (\w+|[^:]+):", precise_return, text)
    # A mutable default is what stubgen prints for an empty std::vector; stubs use "...".
    return re.sub(r"(Sequence\[\w+\]) = \[\]", r"\1 = ...", text)


def stub_path() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parents[1] / "subquad" / "_core.pyi"


if __name__ == "__main__":
    stub_path().write_text(render_stub())
