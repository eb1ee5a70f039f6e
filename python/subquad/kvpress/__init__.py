"""Coreset presses for NVIDIA's kvpress: CompressKV and uniform Nystrom keep int(S (1 - r))
entries per KV head with log-weights and folded values, and the "subquad" attention of
subquad.hf adds the log-weights to the scores, so that attention sees the weighted coreset.

    import subquad.hf, subquad.kvpress
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation=subquad.hf.register())
    press = subquad.kvpress.CompressKVPress(compression_ratio=0.75)
    pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)(
        context, question=question, press=press)
    with press(model):                     # or as kvpress's presses: compress a prefill
        model.model(ids, past_key_values=cache)

See docs/kvpress.md.
"""

from .._optional import require

require("subquad.kvpress", "kvpress", ["torch", "transformers", "kvpress"])

from .presses import CompressKVPress, CoresetPress, UniformNystromPress  # noqa: E402

__all__ = ["CompressKVPress", "CoresetPress", "UniformNystromPress"]
