"""subquad's exact attention inside Hugging Face transformers models.

    import subquad.hf
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=subquad.hf.register())

register() adds an attention function named "subquad" to transformers' AttentionInterface
and its mask function to AttentionMaskInterface. CPU tensors run subquad.ops.exact_attention
(causal, GQA, padded batches, prefill and decode); anything else (other devices, dropout,
sliding windows, custom 4D masks) runs transformers' sdpa. See docs/hf.md.
"""

import sys

from .._optional import require

require("subquad.hf", "hf", ["torch", "transformers"])

from transformers import AttentionInterface, AttentionMaskInterface  # noqa: E402

from .attention import attention_forward  # noqa: E402
from .gguf_model import load_gguf_model  # noqa: E402
from .mask import KeyPadding, make_mask  # noqa: E402

__all__ = ["NAME", "KeyPadding", "attention_forward", "load_gguf_model", "make_mask", "register"]

NAME = "subquad"


def register() -> str:
    """Registers "subquad" with transformers (idempotent) and returns the name, for
    `attn_implementation=` or `model.set_attn_implementation`.

    kvpress patches the attention functions registered when it is imported, so that head-wise
    presses (AdaKV) can mask keys; once it is imported, "subquad" is registered patched the
    same way (else AdaKV's masked keys would silently take part in attention)."""
    forward = attention_forward
    patch = sys.modules.get("kvpress.attention_patch")
    if patch is not None:
        forward = patch.attention_patch(attention_forward)
    AttentionInterface.register(NAME, forward)
    AttentionMaskInterface.register(NAME, make_mask)
    return NAME
