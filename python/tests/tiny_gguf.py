"""Tiny llama GGUF files written with the gguf package, for the subquad.llm tests.

A 2-block model (dim 32, 4 heads over 2 KV heads, head dim 8, FFN 64) with random weights
and a byte-level BPE vocabulary: the 256 byte symbols, a few merges and three ChatML
control tokens. token_embd is stored as Q8_0, one FFN weight as Q4_1, the rest float32.
"""

import numpy as np

DIM, HEADS, KV_HEADS, FFN, BLOCKS = 32, 4, 2, 64, 2
HEAD_DIM = DIM // HEADS
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s"]
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != "
            "'system' %}{{ '<|im_start|>system\nYou are a test model<|im_end|>\n' }}"
            "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
            "'<|im_end|>' + '\n'}}{% endfor %}")


def vocabulary():
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = SPECIALS + alphabet + [merge.replace(" ", "") for merge in MERGES]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, types


def tensors(seed: int = 0, vocab: int = None):
    """Name -> float32 array in NumPy order (a linear weight is [out, in])."""
    rng = np.random.default_rng(seed)
    vocab = len(vocabulary()[0]) if vocab is None else vocab
    kv = KV_HEADS * HEAD_DIM

    def weight(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    out = {"token_embd.weight": weight(vocab, DIM),
           "output_norm.weight": (1 + 0.1 * rng.standard_normal(DIM)).astype(np.float32)}
    for block in range(BLOCKS):
        p = f"blk.{block}."
        out.update({p + "attn_norm.weight": (1 + 0.1 * rng.standard_normal(DIM)).astype(
                        np.float32),
                    p + "attn_q.weight": weight(DIM, DIM), p + "attn_k.weight": weight(kv, DIM),
                    p + "attn_v.weight": weight(kv, DIM),
                    p + "attn_output.weight": weight(DIM, DIM),
                    p + "ffn_norm.weight": (1 + 0.1 * rng.standard_normal(DIM)).astype(
                        np.float32),
                    p + "ffn_gate.weight": weight(FFN, DIM), p + "ffn_up.weight": weight(FFN, DIM),
                    p + "ffn_down.weight": weight(DIM, FFN)})
    return out


def _value_type(value):
    """GGUF's type for a metadata value: unsigned 32 or 64 bits for counts, as llama.cpp's
    converter writes them."""
    import gguf

    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return gguf.GGUFValueType.UINT32 if value < 2**32 else gguf.GGUFValueType.UINT64
    return gguf.GGUFValueType.get_type(value)


def write(path, *, seed: int = 0, skip_tensor: str = None, bad_shape: str = None,
          architecture: str = "llama", heads: int = HEADS, context_length: int = 512,
          metadata: dict = None, nan_tensor: str = None):
    """Write the tiny model to `path`; the keyword arguments break it on purpose.
    metadata: key -> value stored instead of the default (None: the key is left out);
    a value is written with the type GGUF infers for it, or give (value, GGUFValueType).
    nan_tensor: a tensor whose first element is NaN."""
    import gguf
    from gguf.quants import quantize

    tokens, types = vocabulary()
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(BLOCKS)
    writer.add_context_length(context_length)
    writer.add_embedding_length(DIM)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(heads)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    for key, value in (metadata or {}).items():
        writer.kv_data[0].pop(key, None)
        if value is not None:
            value, kind = value if isinstance(value, tuple) else (value, _value_type(value))
            writer.add_key_value(key, value, kind, _value_type(value[0]) if isinstance(
                value, list) and value else None)
    for name, array in tensors(seed).items():
        if name == skip_tensor:
            continue
        if name == bad_shape:
            array = array[:, :-1].copy() if array.ndim == 2 else array[:-1].copy()
        if name == nan_tensor:
            array = array.copy()
            array.flat[0] = np.nan
        if name == "token_embd.weight":
            kind = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, quantize(array, kind), raw_dtype=kind)
        elif name == "blk.0.ffn_up.weight":
            kind = gguf.GGMLQuantizationType.Q4_1
            writer.add_tensor(name, quantize(array, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
