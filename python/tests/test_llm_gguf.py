"""subquad.llm's GGUF reader and tokenizer on tiny files written by the gguf package."""

import time
import tracemalloc

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

import tiny_gguf  # noqa: E402
from subquad.llm import GgufError, GgufTokenizer, read_gguf  # noqa: E402


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return tiny_gguf.write(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_reader_gives_config_and_tensors(tiny_path):
    file = read_gguf(str(tiny_path))
    config = file.config
    assert (config.blocks, config.dim, config.ffn_dim) == (tiny_gguf.BLOCKS, tiny_gguf.DIM,
                                                           tiny_gguf.FFN)
    assert (config.heads, config.kv_heads, config.head_dim) == (tiny_gguf.HEADS,
                                                                tiny_gguf.KV_HEADS,
                                                                tiny_gguf.HEAD_DIM)
    assert config.rope_base == 10000.0 and config.context_length == 512
    assert abs(config.norm_eps - 1e-5) < 1e-12
    assert config.tied_embeddings and config.vocab == len(tiny_gguf.vocabulary()[0])
    original = tiny_gguf.tensors()
    assert sorted(file.tensor_names) == sorted(original)
    # float32 tensors come back bit for bit; quantized ones within their block's step.
    np.testing.assert_array_equal(file.tensor("blk.1.attn_k.weight"),
                                  original["blk.1.attn_k.weight"])
    for name, kind, levels in (("token_embd.weight", "Q8_0", 127), ("blk.0.ffn_up.weight",
                                                                     "Q4_1", 15)):
        assert file.tensor_type(name) == kind
        values, reference = file.tensor(name), original[name]
        assert values.shape == reference.shape and values.dtype == np.float32
        blocks = reference.reshape(-1, 32)
        step = (blocks.max(1) - blocks.min(1)) / levels  # Q4_1's step; Q8_0's is smaller
        error = np.abs(values - reference).reshape(-1, 32).max(1)
        # half a step, plus the float16 rounding of the block's scale and minimum
        bound = step * 0.5 + np.abs(blocks).max(1) * 2.0 ** -10
        assert np.all(error <= bound) and np.any(error > 0)


@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.01, 0.5, 0.999])
def test_truncated_file_is_rejected(tiny_path, tmp_path, fraction):
    data = tiny_path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:int(len(data) * fraction)])
    with pytest.raises(GgufError, match="truncated|corrupt"):
        read_gguf(str(cut))


def test_corrupt_magic_is_rejected(tiny_path, tmp_path):
    data = bytearray(tiny_path.read_bytes())
    data[:4] = b"GGUX"
    bad = tmp_path / "magic.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(GgufError, match="not a readable GGUF"):
        read_gguf(str(bad))


def test_shape_against_metadata_is_checked(tmp_path):
    path = tiny_gguf.write(tmp_path / "shape.gguf", bad_shape="blk.1.attn_v.weight")
    with pytest.raises(GgufError, match="blk.1.attn_v.weight has shape"):
        read_gguf(str(path))


def test_missing_tensor_and_wrong_architecture_are_rejected(tmp_path):
    path = tiny_gguf.write(tmp_path / "missing.gguf", skip_tensor="blk.0.ffn_gate.weight")
    with pytest.raises(GgufError, match="missing .*blk.0.ffn_gate.weight"):
        read_gguf(str(path))
    path = tiny_gguf.write(tmp_path / "arch.gguf", architecture="gpt2")
    with pytest.raises(GgufError, match="general.architecture"):
        read_gguf(str(path))
    with pytest.raises(GgufError, match="no such file"):
        read_gguf(str(tmp_path / "absent.gguf"))


def test_tokenizer_round_trip_and_specials(tiny_path):
    tokenizer = GgufTokenizer(read_gguf(str(tiny_path)).metadata)
    text = ("Anne Elliot, with manners   and 1815 pounds\n\tthe inner \u00e9l\u00e8ve "
            "\u2014 \u4e2d\u6587 emoji \U0001F600 <|im_start|>user")
    ids = tokenizer.tokenize(text)
    assert tokenizer.detokenize(ids) == text
    # <|im_start|> is one control token, not its characters
    assert ids.count(1) == 1 and tokenizer.detokenize(ids[ids.index(1):]) == "<|im_start|>user"
    assert tokenizer.tokenize("the")[0] != tokenizer.tokenize(" the")[0]
    # digits are split one by one (the "smollm" pre-tokenizer)
    assert len(tokenizer.tokenize("1815")) == 4
    assert tokenizer.system_prompt == "You are a test model"
    prompt = tokenizer.chat([{"role": "user", "content": "Hi"}])
    assert prompt == ("<|im_start|>system\nYou are a test model<|im_end|>\n<|im_start|>user\n"
                      "Hi<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="ids"):
        tokenizer.detokenize([len(tiny_gguf.vocabulary()[0])])


def test_a_huge_block_count_is_refused_before_anything_is_built(tmp_path):
    """Counts are checked against the tensors present: 2^31 blocks once built 2^31 x 9
    expected tensor names before comparing."""
    path = tiny_gguf.write(tmp_path / "blocks.gguf", metadata={"llama.block_count": 2**31})
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(GgufError, match=r"block_count 2147483648 needs 9 tensors per block, "
                                        r"the file holds 20 tensors"):
        read_gguf(str(path))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert time.perf_counter() - start < 5 and peak < 64 << 20


def test_misaligned_and_overlapping_tensors_are_corrupt(tiny_path, tmp_path):
    import struct

    data = tiny_path.read_bytes()
    name = b"output_norm.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    at += 4 + 8 * struct.unpack_from("<I", data, at)[0] + 4  # n_dims, dims, type: the offset
    for offset, match in ((3, "alignment: corrupt"), (0, "overlap: corrupt")):
        bad = bytearray(data)
        bad[at:at + 8] = struct.pack("<Q", offset)
        path = tmp_path / f"offset{offset}.gguf"
        path.write_bytes(bytes(bad))
        with pytest.raises(GgufError, match=match):
            read_gguf(str(path))


def test_token_ids_of_the_metadata_are_tokens(tmp_path):
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        path = tiny_gguf.write(tmp_path / "ids.gguf", metadata={key: 10**6})
        with pytest.raises(GgufError, match=key.split(".")[-1] + " 1000000 is not a token id"):
            GgufTokenizer(read_gguf(str(path)).metadata, str(path))


def test_text_that_is_not_unicode_is_a_value_error(tiny_path):
    tokenizer = GgufTokenizer(read_gguf(str(tiny_path)).metadata)
    with pytest.raises(ValueError, match="not valid Unicode"):
        tokenizer.tokenize("caf\udce9")  # bytes b"caf\xe9" of argv, decoded by Python
