"""A llama-architecture GGUF file, read with the `gguf` package and checked before use.

`read_gguf(path)` parses the header (gguf.GGUFReader), checks that every tensor lies
inside the file, that its name, shape and type are the ones the metadata implies, and
returns the config, the tokenizer metadata and a lazy tensor table; `GgufModelFile.tensor`
dequantizes one tensor to float32 with gguf.quants.dequantize. Any violation raises
GgufError (a ValueError) naming the file and what was wrong.
"""

import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

__all__ = ["GgufError", "LlamaConfig", "GgufModelFile", "read_gguf"]


class GgufError(ValueError):
    """A GGUF file that is missing, truncated, corrupt or not the expected model."""


@dataclass(frozen=True)
class LlamaConfig:
    """The llama hyper-parameters a GGUF file states (llama.* metadata keys)."""

    blocks: int  # llama.block_count
    dim: int  # llama.embedding_length
    ffn_dim: int  # llama.feed_forward_length
    heads: int  # llama.attention.head_count
    kv_heads: int  # llama.attention.head_count_kv
    head_dim: int  # dim / heads (= llama.rope.dimension_count when present)
    rope_base: float  # llama.rope.freq_base
    norm_eps: float  # llama.attention.layer_norm_rms_epsilon
    vocab: int  # llama.vocab_size, else the tokenizer's token count
    context_length: int  # llama.context_length
    tied_embeddings: bool  # no output.weight: the output projection is token_embd

    def __post_init__(self):
        if self.heads % self.kv_heads:
            raise GgufError(f"head_count {self.heads} is not a multiple of head_count_kv "
                            f"{self.kv_heads}")
        if self.head_dim * self.heads != self.dim or self.head_dim % 2:
            raise GgufError(f"embedding_length {self.dim} / head_count {self.heads} is not an "
                            f"even head dim")


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: Tuple[int, ...]  # NumPy order (outermost first): a linear weight is [out, in]
    kind: object  # gguf.GGMLQuantizationType
    data: np.ndarray  # the raw bytes or elements, a view of the memory map


TENSORS_PER_BLOCK = 9  # attn_norm, attn_q/k/v/output, ffn_norm, ffn_gate/up/down


def _expected_shapes(config: LlamaConfig) -> Dict[str, Tuple[int, ...]]:
    """Tensor name -> NumPy shape that a llama GGUF with this config must hold."""
    kv_dim = config.kv_heads * config.head_dim
    shapes = {"token_embd.weight": (config.vocab, config.dim),
              "output_norm.weight": (config.dim,)}
    if not config.tied_embeddings:
        shapes["output.weight"] = (config.vocab, config.dim)
    for block in range(config.blocks):
        prefix = f"blk.{block}."
        shapes.update({
            prefix + "attn_norm.weight": (config.dim,),
            prefix + "attn_q.weight": (config.dim, config.dim),
            prefix + "attn_k.weight": (kv_dim, config.dim),
            prefix + "attn_v.weight": (kv_dim, config.dim),
            prefix + "attn_output.weight": (config.dim, config.dim),
            prefix + "ffn_norm.weight": (config.dim,),
            prefix + "ffn_gate.weight": (config.ffn_dim, config.dim),
            prefix + "ffn_up.weight": (config.ffn_dim, config.dim),
            prefix + "ffn_down.weight": (config.dim, config.ffn_dim),
        })
    return shapes


class GgufModelFile:
    """A checked llama GGUF: config, metadata and tensors (dequantized on demand)."""

    def __init__(self, path: str, config: LlamaConfig, metadata: Dict[str, object],
                 tensors: Dict[str, TensorEntry]):
        self.path, self.config, self.metadata, self._tensors = path, config, metadata, tensors

    @property
    def tensor_names(self) -> List[str]:
        return list(self._tensors)

    def tensor_type(self, name: str) -> str:
        return self._entry(name).kind.name

    def tensor(self, name: str) -> np.ndarray:
        """The tensor `name` as float32, in NumPy order (a linear weight is [out, in])."""
        from gguf.quants import dequantize

        entry = self._entry(name)
        try:
            values = dequantize(entry.data, entry.kind)
        except Exception as error:  # the package's own message, with the tensor named
            raise GgufError(f"{self.path}: cannot dequantize {name} ({entry.kind.name}): "
                            f"{error}") from error
        values = np.array(values, dtype=np.float32).reshape(entry.shape)  # a writable copy
        if not np.isfinite(values).all():
            raise GgufError(f"{self.path}: tensor {name} holds non-finite values (corrupt)")
        return values

    def _entry(self, name: str) -> TensorEntry:
        if name not in self._tensors:
            raise KeyError(f"{self.path}: no tensor {name!r}")
        return self._tensors[name]


def _field(fields, path: str, key: str, required: bool = True):
    if key not in fields:
        if required:
            raise GgufError(f"{path}: metadata key {key!r} missing")
        return None
    try:
        return fields[key].contents()
    except Exception as error:
        raise GgufError(f"{path}: metadata key {key!r} unreadable: {error}") from error


def _positive_int(path: str, key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise GgufError(f"{path}: {key} must be a positive integer, got {value!r}")
    return int(value)


def read_gguf(path: str) -> GgufModelFile:
    """Parse and check the llama GGUF at `path` (see the module docstring)."""
    import gguf

    if os.path.isdir(path):
        raise GgufError(f"{path}: is a directory, not a GGUF file")
    if not os.path.isfile(path):
        raise GgufError(f"{path}: no such file")
    size = os.path.getsize(path)
    try:
        reader = gguf.GGUFReader(path)
    except Exception as error:  # the reader runs off the end of a truncated header, etc.
        raise GgufError(f"{path}: not a readable GGUF file ({type(error).__name__}: "
                        f"{error}); the file is truncated or corrupt") from error
    fields = reader.fields
    architecture = _field(fields, path, "general.architecture")
    if architecture != "llama":
        raise GgufError(f"{path}: general.architecture must be 'llama', got {architecture!r}")

    def integer(key, required=True):
        value = _field(fields, path, key, required)
        return None if value is None else _positive_int(path, key, value)

    def real(key):
        value = _field(fields, path, key)
        if not isinstance(value, (float, np.floating)) or not np.isfinite(value) or value <= 0:
            raise GgufError(f"{path}: {key} must be a positive float, got {value!r}")
        return float(value)

    names = [tensor.name for tensor in reader.tensors]
    if len(set(names)) != len(names):
        raise GgufError(f"{path}: duplicate tensor names")
    dim, heads = integer("llama.embedding_length"), integer("llama.attention.head_count")
    tokens = _field(fields, path, "tokenizer.ggml.tokens", required=False)
    vocab = integer("llama.vocab_size", required=False)
    if vocab is None:
        if tokens is None:
            raise GgufError(f"{path}: neither llama.vocab_size nor tokenizer.ggml.tokens")
        vocab = len(tokens)
    head_dim = dim // heads
    rope_dims = integer("llama.rope.dimension_count", required=False)
    if rope_dims is not None and rope_dims != head_dim:
        raise GgufError(f"{path}: llama.rope.dimension_count {rope_dims} != head dim "
                        f"{head_dim} (partial RoPE is not supported)")
    blocks = integer("llama.block_count")
    # Counts against what the file holds before anything is built from them: a block count
    # of 2^31 once made 2^31 x 9 expected tensor names.
    if TENSORS_PER_BLOCK * blocks > len(names):
        raise GgufError(f"{path}: llama.block_count {blocks} needs {TENSORS_PER_BLOCK} tensors "
                        f"per block, the file holds {len(names)} tensors")
    try:
        config = LlamaConfig(
            blocks=blocks, dim=dim,
            ffn_dim=integer("llama.feed_forward_length"), heads=heads,
            kv_heads=integer("llama.attention.head_count_kv"), head_dim=head_dim,
            rope_base=real("llama.rope.freq_base"),
            norm_eps=real("llama.attention.layer_norm_rms_epsilon"), vocab=vocab,
            context_length=integer("llama.context_length"),
            tied_embeddings="output.weight" not in names)
    except GgufError as error:
        if str(error).startswith(f"{path}: "):
            raise
        raise GgufError(f"{path}: {error}") from None
    if tokens is not None and len(tokens) != vocab:
        raise GgufError(f"{path}: {len(tokens)} tokenizer tokens but vocab_size {vocab}")

    expected = _expected_shapes(config)
    missing = sorted(set(expected) - set(names))
    extra = sorted(set(names) - set(expected) - {"rope_freqs.weight"})
    if missing or extra:
        raise GgufError(f"{path}: tensors do not match the metadata: missing {missing[:5]}, "
                        f"unexpected {extra[:5]}")
    tensors = {}
    for tensor in reader.tensors:
        if tensor.name not in expected:
            continue
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))  # ggml ne -> NumPy
        if shape != expected[tensor.name]:
            raise GgufError(f"{path}: tensor {tensor.name} has shape {list(shape)}, the "
                            f"metadata implies {list(expected[tensor.name])}")
        kind = tensor.tensor_type
        if kind not in gguf.GGML_QUANT_SIZES:
            raise GgufError(f"{path}: tensor {tensor.name} has unknown type {kind}")
        block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        elements = int(np.prod(shape))
        if shape[-1] % block:
            raise GgufError(f"{path}: tensor {tensor.name}: row of {shape[-1]} is not a "
                            f"multiple of the {kind.name} block of {block}")
        want_bytes = elements // block * block_bytes
        end = int(tensor.data_offset) + want_bytes
        if end > size:
            raise GgufError(f"{path}: tensor {tensor.name} ends at byte {end} but the file has "
                            f"{size} bytes: the file is truncated")
        if int(tensor.n_bytes) != want_bytes or tensor.data.nbytes != want_bytes:
            raise GgufError(f"{path}: tensor {tensor.name} holds {tensor.data.nbytes} bytes, "
                            f"{kind.name} {list(shape)} needs {want_bytes}: corrupt")
        if (int(tensor.data_offset) - reader.data_offset) % reader.alignment:
            raise GgufError(f"{path}: tensor {tensor.name} starts at byte "
                            f"{int(tensor.data_offset)}, not on the file's {reader.alignment}-byte "
                            f"alignment: corrupt")
        tensors[tensor.name] = TensorEntry(tensor.name, shape, kind, tensor.data)
    # Each tensor's bytes are its own: no two overlap.
    spans = sorted((int(t.data_offset), int(t.data_offset) + int(t.n_bytes), t.name)
                   for t in reader.tensors if t.name in tensors)
    for (_, end, name), (start, _, following) in zip(spans, spans[1:]):
        if start < end:
            raise GgufError(f"{path}: tensors {name} and {following} overlap: corrupt")
    metadata = {key: _field(fields, path, key) for key in fields
                if not key.startswith("GGUF.")}
    return GgufModelFile(path, config, metadata, tensors)


def chat_system_prompt(template: Optional[str]) -> Optional[str]:
    """The default system message a ChatML template inserts (None when it has none)."""
    if not template:
        return None
    match = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", template, re.S)
    return match.group(1) if match else None
