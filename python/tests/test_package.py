"""The package surface: every operator of the extension is exported by `subquad`, has a
docstring and a type stub, and the stub parses."""

import ast
import importlib.util
import pathlib

import pytest

import subquad
from subquad import _core


def public_names(module):
    return {name for name in dir(module) if not name.startswith("_")}


def test_every_extension_name_is_exported_and_documented():
    names = public_names(_core)
    assert names <= set(subquad.__all__)
    for name in names:
        assert getattr(_core, name).__doc__, name


def test_the_stub_declares_every_extension_name():
    stub = pathlib.Path(_core.__file__).with_name("_core.pyi")
    tree = ast.parse(stub.read_text())
    declared = {node.name for node in tree.body
                if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert public_names(_core) == declared
    assert pathlib.Path(_core.__file__).with_name("py.typed").exists()


def test_readme_examples_run():
    root = pathlib.Path(__file__).resolve().parents[2]
    for page in (root / "README.md", root / "docs" / "python.md"):
        blocks = [block.split("```", 1)[0] for block in page.read_text().split("```python\n")[1:]]
        assert blocks, page
        run_blocks(page.name, blocks)


def run_blocks(name, blocks):
    for block in blocks:
        if "import torch" in block:
            try:
                import torch  # noqa: F401
            except ImportError:
                continue
        exec(compile(block, name, "exec"), {})


def test_the_committed_stub_is_current():
    pytest.importorskip("nanobind.stubgen", reason="nanobind is not installed")
    tool = pathlib.Path(__file__).resolve().parents[1] / "tools" / "make_stub.py"
    spec = importlib.util.spec_from_file_location("make_stub", tool)
    make_stub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_stub)
    assert make_stub.stub_path().read_text() == make_stub.render_stub(), (
        "python/subquad/_core.pyi is stale: run python/tools/make_stub.py")
